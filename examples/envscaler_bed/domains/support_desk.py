"""Support-desk domain of the lopd study bed: tickets, customer accounts, refunds and IT help.

Three "main" environments and a "transfer" one (IT help: no train task uses it), in the EnvScaler
table format (see the bed README). Each entry of ``ENVS`` carries the class source, terse tool
schemas and ``make_task(rng)``, which draws a fresh initial state and one task (text, check
functions, reference actions) from ``rng``. Stdlib only.
"""
import random

from domains._common import (call as _call, check as _check, task as _task, tool as _tool,
                             report_tool as _report_tool)

FIRST = ["Ada", "Ben", "Cora", "Dev", "Elif", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kira", "Liam",
         "Mona", "Nils", "Omar", "Pia", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Vic", "Wen", "Yara"]
LAST = ["Moreno", "Baker", "Chen", "Dubois", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jensen",
        "Kowal", "Lopez", "Mensah", "Novak", "Okafor", "Park", "Quist", "Rossi", "Silva", "Tanaka"]
SUBJECTS = ["printer jam", "VPN drops", "login loop", "slow laptop", "broken monitor", "email bounce",
            "missing invoice", "lost badge", "noisy fan", "wifi outage", "disk full", "calendar sync",
            "expired license", "frozen screen", "dead mouse", "blocked port", "stuck update", "bad password",
            "no sound", "crashing app", "lost file", "phone sync", "slow server", "spam filter", "cracked screen",
            "printer toner", "locked folder", "webcam off"]
PRIORITIES = ["low", "normal", "high", "urgent"]
PLANS = ["basic", "plus", "pro"]
DOMAINS = ["mail.com", "web.io"]
ITEMS = ["lamp", "kettle", "backpack", "headset", "blender", "jacket", "tent", "clock", "speaker", "mug"]
GROUPS = ["vpn", "wiki", "git", "finance", "payroll", "sales", "hr", "design"]


def _ids(rng: random.Random, prefix: str, n: int, digits: int = 4) -> list:
    """``n`` distinct ids like "T-2041" (``digits`` digits, no leading zero; many digits make two
    tasks of an environment rarely share an id)."""
    return [f"{prefix}-{k}" for k in rng.sample(range(10 ** (digits - 1), 10 ** digits), n)]


def _names(rng: random.Random, n: int) -> list:
    """``n`` distinct "First Last" names."""
    firsts, lasts = rng.sample(FIRST, n), rng.sample(LAST, n)
    return [f"{a} {b}" for a, b in zip(firsts, lasts)]


def _kind(rng: random.Random, single: list, multi: list) -> str:
    """Half the tasks are single-call kinds, half multi-call kinds."""
    return rng.choice(single) if rng.random() < 0.5 else rng.choice(multi)


# ----------------------------------------------------------------------------- tickets

TICKETS_CODE = '''from typing import Dict


class TicketQueue:
    """Support tickets (subject, status, priority, agent id or None) and agents (id -> name)."""

    PRIORITIES = ("low", "normal", "high", "urgent")

    def __init__(self, init_config: dict):
        self.tickets: Dict[str, dict] = {}
        self.agents: Dict[str, str] = {}

    def search_tickets(self, query: str) -> dict:
        q = str(query).lower()
        hits = [dict(t, ticket_id=k) for k, t in self.tickets.items() if q and q in t["subject"].lower()]
        return {"success": True, "data": hits}

    def assign_ticket(self, ticket_id: str, agent_id: str) -> dict:
        if ticket_id not in self.tickets:
            return {"success": False, "error": f"unknown ticket {ticket_id}"}
        if agent_id not in self.agents:
            return {"success": False, "error": f"unknown agent {agent_id}"}
        self.tickets[ticket_id]["agent"] = agent_id
        return {"success": True, "data": {"ticket_id": ticket_id, "agent": agent_id}}

    def set_priority(self, ticket_id: str, priority: str) -> dict:
        if ticket_id not in self.tickets:
            return {"success": False, "error": f"unknown ticket {ticket_id}"}
        if priority not in self.PRIORITIES:
            return {"success": False, "error": "priority must be low, normal, high or urgent"}
        self.tickets[ticket_id]["priority"] = priority
        return {"success": True, "data": {"ticket_id": ticket_id, "priority": priority}}

    def close_ticket(self, ticket_id: str) -> dict:
        if ticket_id not in self.tickets:
            return {"success": False, "error": f"unknown ticket {ticket_id}"}
        if self.tickets[ticket_id]["status"] == "closed":
            return {"success": False, "error": f"ticket {ticket_id} is already closed"}
        self.tickets[ticket_id]["status"] = "closed"
        return {"success": True, "data": {"ticket_id": ticket_id, "status": "closed"}}
'''


def tickets_task(rng: random.Random) -> dict:
    """A ticket queue (5-7 open tickets, 3 agents) and one priority/assign/close task."""
    n = rng.randint(5, 7)
    tids, aids = _ids(rng, "T", n), _ids(rng, "A", 3, 2)
    agents = dict(zip(aids, _names(rng, 3)))
    tickets = {t: {"subject": s, "status": "open", "priority": rng.choice(PRIORITIES), "agent": rng.choice(aids + [None])}
               for t, s in zip(tids, rng.sample(SUBJECTS, n))}
    init = {"tickets": tickets, "agents": agents}
    t = rng.choice(tids)
    ticket = tickets[t]
    a = rng.choice([x for x in aids if x != ticket["agent"]])
    p = rng.choice([x for x in PRIORITIES if x != ticket["priority"]])
    prio = _check(f"Is ticket {t} {p} priority?", f"final_state['tickets'][{t!r}]['priority'] == {p!r}")
    agent = _check(f"Is ticket {t} assigned to {a}?", f"final_state['tickets'][{t!r}]['agent'] == {a!r}")
    closed = _check(f"Is ticket {t} closed?", f"final_state['tickets'][{t!r}]['status'] == 'closed'")
    kind = _kind(rng, ["priority", "assign", "close"], ["find_close", "assign_priority", "find_assign"])
    if kind == "priority":
        return _task(rng, ["Set ticket {t} to {p} priority.", "Change the priority of ticket {t} to {p}.",
                           "Ticket {t} should be marked {p}.", "Give ticket {t} the priority {p}."],
                     [prio], [_call("set_priority", ticket_id=t, priority=p)], init, t=t, p=p)
    if kind == "assign":
        return _task(rng, ["Assign ticket {t} to agent {a}.", "Hand ticket {t} over to agent {a}.",
                           "Agent {a} will take ticket {t}; assign it.", "Route ticket {t} to agent {a}."],
                     [agent], [_call("assign_ticket", ticket_id=t, agent_id=a)], init, t=t, a=a)
    if kind == "close":
        return _task(rng, ["Close ticket {t}.", "Ticket {t} is solved; close it.", "Mark ticket {t} as closed.", "Resolve and close ticket {t}."],
                     [closed], [_call("close_ticket", ticket_id=t)], init, t=t)
    subject = ticket["subject"]
    if kind == "find_close":
        return _task(rng, ["Find the ticket about '{s}' and close it.",
                           "The '{s}' issue is fixed. Look up its ticket and close it.", "Search the tickets for '{s}' and close the one you find.", "Close the ticket whose subject is '{s}'; you need its id first."],
                     [closed], [_call("search_tickets", query=subject), _call("close_ticket", ticket_id=t)], init, s=subject)
    if kind == "assign_priority":
        return _task(rng, ["Assign ticket {t} to agent {a} and set it to {p} priority.",
                           "Give ticket {t} to agent {a}, then mark it {p}.", "Two changes to ticket {t}: agent {a} owns it now, and its priority is {p}.", "Ticket {t} is {p} priority and belongs to agent {a} from now on."],
                     [agent, prio],
                     [_call("assign_ticket", ticket_id=t, agent_id=a), _call("set_priority", ticket_id=t, priority=p)],
                     init, t=t, a=a, p=p)
    return _task(rng, ["Find the ticket about '{s}' and assign it to agent {a}.",
                       "Agent {a} should handle the '{s}' ticket. Look it up and assign it.", "Search for the ticket about '{s}' and route it to agent {a}.", "Find the '{s}' ticket; agent {a} takes it over."],
                 [agent], [_call("search_tickets", query=subject), _call("assign_ticket", ticket_id=t, agent_id=a)],
                 init, s=subject, a=a)


# ----------------------------------------------------------------------------- accounts

ACCOUNTS_CODE = '''from typing import Dict


class CustomerAccounts:
    """Customer accounts: name, email, plan (basic | plus | pro) and an active flag."""

    PLANS = ("basic", "plus", "pro")

    def __init__(self, init_config: dict):
        self.customers: Dict[str, dict] = {}

    def find_customer(self, name: str) -> dict:
        q = str(name).lower()
        hits = [dict(c, customer=k) for k, c in self.customers.items() if q and q in c["name"].lower()]
        return {"success": True, "data": hits}

    def change_plan(self, customer: str, plan: str) -> dict:
        c = self.customers.get(customer)
        if c is None:
            return {"success": False, "error": f"unknown customer {customer}"}
        if plan not in self.PLANS or not c["active"]:
            return {"success": False, "error": "plan must be basic, plus or pro, on an active account"}
        c["plan"] = plan
        return {"success": True, "data": {"customer": customer, "plan": plan}}

    def update_email(self, customer: str, email: str) -> dict:
        c = self.customers.get(customer)
        if c is None:
            return {"success": False, "error": f"unknown customer {customer}"}
        if not isinstance(email, str) or email.count("@") != 1 or " " in email:
            return {"success": False, "error": "not an email address"}
        c["email"] = email
        return {"success": True, "data": {"customer": customer, "email": email}}

    def close_account(self, customer: str) -> dict:
        c = self.customers.get(customer)
        if c is None:
            return {"success": False, "error": f"unknown customer {customer}"}
        c["active"] = False
        return {"success": True, "data": {"customer": customer, "active": False}}
'''


def accounts_task(rng: random.Random) -> dict:
    """Customer accounts (4-6, all active) and one plan/email/close task."""
    n = rng.randint(4, 6)
    cids, names = _ids(rng, "C", n), _names(rng, n)
    customers = {c: {"name": nm, "email": f"{nm.split()[0].lower()}@{rng.choice(DOMAINS)}",
                     "plan": rng.choice(PLANS), "active": True} for c, nm in zip(cids, names)}
    init = {"customers": customers}
    c = rng.choice(cids)
    cust = customers[c]
    p = rng.choice([x for x in PLANS if x != cust["plan"]])
    first, last = cust["name"].lower().split()
    e = rng.choice([f"{first}.{last[0]}", f"{first[0]}{last}", f"{last}{rng.randint(1, 9)}"]) + "@" + rng.choice(DOMAINS)
    plan = _check(f"Is customer {c} on the {p} plan?", f"final_state['customers'][{c!r}]['plan'] == {p!r}")
    email = _check(f"Is customer {c}'s email {e}?", f"final_state['customers'][{c!r}]['email'] == {e!r}")
    closed = _check(f"Is customer {c}'s account closed?", f"final_state['customers'][{c!r}]['active'] is False")
    kind = _kind(rng, ["plan", "email", "close"], ["find_plan", "plan_email", "find_email"])
    if kind == "plan":
        return _task(rng, ["Move customer {c} to the {p} plan.", "Switch customer {c} to the {p} plan.",
                           "Customer {c} wants the {p} plan; change it.", "Put customer {c} on the {p} plan."],
                     [plan], [_call("change_plan", customer=c, plan=p)], init, c=c, p=p)
    if kind == "email":
        return _task(rng, ["Change the email of customer {c} to {e}.", "Customer {c} has a new email address: {e}.",
                           "Update customer {c}'s email to {e}.", "Replace the email of customer {c} with {e}."],
                     [email], [_call("update_email", customer=c, email=e)], init, c=c, e=e)
    if kind == "close":
        return _task(rng, ["Close the account of customer {c}.", "Customer {c} is leaving; close their account.",
                           "Shut down customer account {c}.", "Close customer {c}."],
                     [closed], [_call("close_account", customer=c)], init, c=c)
    if kind == "find_plan":
        return _task(rng, ["Find the customer named {name} and switch them to the {p} plan.",
                           "{name} wants to move to the {p} plan. Look up their account and change it.", "Search the customers for {name} and put them on the {p} plan.", "Change the plan of {name} to {p}; you only know the name."],
                     [plan], [_call("find_customer", name=cust["name"]), _call("change_plan", customer=c, plan=p)],
                     init, name=cust["name"], p=p)
    if kind == "plan_email":
        return _task(rng, ["Customer {c} wants the {p} plan and a new email, {e}.",
                           "For customer {c}: change the plan to {p} and the email to {e}.", "Two updates to customer {c}: email {e}, plan {p}.", "Put customer {c} on the {p} plan, and give the account the email {e}."],
                     [plan, email],
                     [_call("change_plan", customer=c, plan=p), _call("update_email", customer=c, email=e)],
                     init, c=c, p=p, e=e)
    return _task(rng, ["Find {name}'s account and set its email to {e}.",
                       "{name} has a new email address, {e}. Look up the customer and update it.", "Search for the customer {name}, then change their email to {e}.", "Update the email of {name} to {e}; find the customer id first."],
                 [email], [_call("find_customer", name=cust["name"]), _call("update_email", customer=c, email=e)],
                 init, name=cust["name"], e=e)


# ----------------------------------------------------------------------------- refunds

REFUNDS_CODE = '''from typing import Dict


class RefundDesk:
    """Orders: customer name, item, price paid and refunded (whole dollars), return_open flag."""

    def __init__(self, init_config: dict):
        self.orders: Dict[str, dict] = {}

    def find_orders(self, customer: str) -> dict:
        q = str(customer).lower()
        hits = [dict(o, order_id=k) for k, o in self.orders.items() if q and q in o["customer"].lower()]
        return {"success": True, "data": hits}

    def refund(self, order_id: str, amount: int) -> dict:
        o = self.orders.get(order_id)
        if o is None:
            return {"success": False, "error": f"unknown order {order_id}"}
        left = o["paid"] - o["refunded"]
        if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount <= left:
            return {"success": False, "error": f"amount must be 1..{left} dollars"}
        o["refunded"] += amount
        return {"success": True, "data": {"order_id": order_id, "refunded": o["refunded"]}}

    def open_return(self, order_id: str) -> dict:
        o = self.orders.get(order_id)
        if o is None:
            return {"success": False, "error": f"unknown order {order_id}"}
        if o["return_open"]:
            return {"success": False, "error": f"order {order_id} already has a return"}
        o["return_open"] = True
        return {"success": True, "data": {"order_id": order_id, "return_open": True}}
'''
REFUNDS_REPORT = _report_tool("orders", "order_id", "order")  # an extra tool no task needs


def refunds_task(rng: random.Random) -> dict:
    """Orders (5-7, 3 customers, no refunds or returns yet) and one refund/return task."""
    n = rng.randint(5, 7)
    oids, names = _ids(rng, "O", n), _names(rng, 3)
    items = rng.sample(ITEMS, n)  # distinct items: "Ada's lamp" names one order
    orders = {o: {"customer": rng.choice(names), "item": it, "paid": rng.randint(12, 90), "refunded": 0,
                  "return_open": False} for o, it in zip(oids, items)}
    init = {"orders": orders}
    o = rng.choice(oids)
    order = orders[o]
    name, item, paid = order["customer"], order["item"], order["paid"]
    amount = rng.randint(5, paid - 2)
    refunded = lambda a: _check(f"Has order {o} been refunded {a} dollars?", f"final_state['orders'][{o!r}]['refunded'] == {a}")
    returned = _check(f"Is a return open for order {o}?", f"final_state['orders'][{o!r}]['return_open'] is True")
    kind = _kind(rng, ["refund", "return"], ["find_refund", "return_refund", "find_return"])
    if kind == "refund":
        return _task(rng, ["Refund {a} dollars on order {o}.", "Give the customer of order {o} a {a} dollar refund.",
                           "Order {o} gets a partial refund of {a} dollars.", "Pay back {a} dollars on order {o}."],
                     [refunded(amount)], [_call("refund", order_id=o, amount=amount)], init, o=o, a=amount)
    if kind == "return":
        return _task(rng, ["Open a return for order {o}.", "The customer wants to send back order {o}; open a return.",
                           "Start a return on order {o}.", "Order {o} is being sent back. Open the return."],
                     [returned], [_call("open_return", order_id=o)], init, o=o)
    if kind == "find_refund":
        return _task(rng, ["{name}'s {item} arrived broken. Find the order and refund it in full.",
                           "Look up {name}'s order of a {item} and refund the whole price.", "Search the orders of {name} for the {item} and refund every dollar paid.", "The {item} that {name} bought must be refunded in full. Find that order first."],
                     [refunded(paid)], [_call("find_orders", customer=name), _call("refund", order_id=o, amount=paid)],
                     init, name=name, item=item)
    if kind == "return_refund":
        return _task(rng, ["Open a return for order {o} and refund {a} dollars on it.",
                           "Order {o} is coming back: start a return and refund {a} dollars.", "Two jobs on order {o}: a refund of {a} dollars, and an open return.", "Refund {a} dollars on order {o}. A return must also be opened for it."],
                     [returned, refunded(amount)],
                     [_call("open_return", order_id=o), _call("refund", order_id=o, amount=amount)], init, o=o, a=amount)
    return _task(rng, ["{name} wants to send back the {item}. Find the order and open a return.",
                       "Start a return for {name}'s {item} order; look the order up first.", "Search the orders of {name} and open a return on the {item}.", "The {item} that {name} ordered is coming back. Find the order and start a return."],
                 [returned], [_call("find_orders", customer=name), _call("open_return", order_id=o)],
                 init, name=name, item=item)


# ----------------------------------------------------------------------------- IT help desk

IT_CODE = '''from typing import Dict


class ITHelpDesk:
    """Staff user accounts: name, locked flag, password resets issued, access groups."""

    def __init__(self, init_config: dict):
        self.users: Dict[str, dict] = {}

    def find_user(self, name: str) -> dict:
        q = str(name).lower()
        hits = [dict(u, user_id=k) for k, u in self.users.items() if q and q in u["name"].lower()]
        return {"success": True, "data": hits}

    def reset_password(self, user_id: str) -> dict:
        u = self.users.get(user_id)
        if u is None:
            return {"success": False, "error": f"unknown user {user_id}"}
        u["resets"] += 1
        return {"success": True, "data": {"user_id": user_id, "temporary_password_sent": True}}

    def unlock_user(self, user_id: str) -> dict:
        u = self.users.get(user_id)
        if u is None:
            return {"success": False, "error": f"unknown user {user_id}"}
        if not u["locked"]:
            return {"success": False, "error": f"user {user_id} is not locked"}
        u["locked"] = False
        return {"success": True, "data": {"user_id": user_id, "locked": False}}

    def grant_access(self, user_id: str, group: str) -> dict:
        u = self.users.get(user_id)
        if u is None:
            return {"success": False, "error": f"unknown user {user_id}"}
        if not isinstance(group, str) or not group.isalpha():
            return {"success": False, "error": "group must be a word like vpn"}
        if group in u["groups"]:
            return {"success": False, "error": f"user {user_id} is already in {group}"}
        u["groups"].append(group)
        return {"success": True, "data": {"user_id": user_id, "groups": u["groups"]}}
'''


def it_task(rng: random.Random) -> dict:
    """Staff accounts (4-6) and one reset/unlock/grant task."""
    n = rng.randint(4, 6)
    uids, names = _ids(rng, "U", n), _names(rng, n)
    users = {u: {"name": nm, "locked": rng.random() < 0.3, "resets": rng.randint(0, 2),
                 "groups": sorted(rng.sample(GROUPS, rng.randint(1, 3)))} for u, nm in zip(uids, names)}
    init = {"users": users}
    u = rng.choice(uids)
    user = users[u]
    g = rng.choice([x for x in GROUPS if x not in user["groups"]])
    name = user["name"]
    reset = _check(f"Was a new password issued to {u}?", f"final_state['users'][{u!r}]['resets'] == {user['resets'] + 1}")
    unlocked = _check(f"Is user {u} unlocked?", f"final_state['users'][{u!r}]['locked'] is False")
    granted = _check(f"Is user {u} in the {g} group?", f"{g!r} in final_state['users'][{u!r}]['groups']")
    kind = _kind(rng, ["reset", "unlock", "grant"], ["find_unlock_reset", "find_grant", "unlock_grant"])
    if kind in ("unlock", "find_unlock_reset", "unlock_grant"):
        user["locked"] = True
    if kind == "reset":
        return _task(rng, ["Reset the password of user {u}.", "User {u} forgot their password; reset it.",
                           "Send user {u} a new password."],
                     [reset], [_call("reset_password", user_id=u)], init, u=u)
    if kind == "unlock":
        return _task(rng, ["Unlock the account of user {u}.", "User {u} is locked out; unlock them.",
                           "Please unlock user {u}."],
                     [unlocked], [_call("unlock_user", user_id=u)], init, u=u)
    if kind == "grant":
        return _task(rng, ["Give user {u} access to the {g} group.", "Add user {u} to the {g} group.",
                           "User {u} needs {g} access; grant it."],
                     [granted], [_call("grant_access", user_id=u, group=g)], init, u=u, g=g)
    if kind == "find_unlock_reset":
        return _task(rng, ["{name} is locked out. Find their account, unlock it and reset the password.",
                           "Look up {name}'s user account, unlock it, then send a new password."],
                     [unlocked, reset],
                     [_call("find_user", name=name), _call("unlock_user", user_id=u), _call("reset_password", user_id=u)],
                     init, name=name)
    if kind == "find_grant":
        return _task(rng, ["Find {name}'s account and add it to the {g} group.",
                           "{name} needs {g} access. Look up their user id and grant it."],
                     [granted], [_call("find_user", name=name), _call("grant_access", user_id=u, group=g)],
                     init, name=name, g=g)
    return _task(rng, ["Unlock user {u} and grant them access to the {g} group.",
                       "User {u} is locked out and also needs {g} access: unlock them and add the group."],
                 [unlocked, granted],
                 [_call("unlock_user", user_id=u), _call("grant_access", user_id=u, group=g)], init, u=u, g=g)


ENVS = [
    {"env_id": "bed_support_tickets", "env_class_name": "TicketQueue", "role": "main",
     "environment_introduction": "A support ticket queue: find tickets, assign them to agents, set priority and close them.",
     "constraints_rules": ["Priorities: low, normal, high, urgent."],
     "tools": [_tool("search_tickets", "Find tickets by subject text.", query="string"),
               _tool("assign_ticket", "Assign a ticket to an agent.", ticket_id="string", agent_id="string"),
               _tool("set_priority", "Set a ticket's priority.", ticket_id="string", priority="string"),
               _tool("close_ticket", "Close a ticket.", ticket_id="string")],
     "env_class_code": TICKETS_CODE, "make_task": tickets_task},
    {"env_id": "bed_support_accounts", "env_class_name": "CustomerAccounts", "role": "main",
     "environment_introduction": "Customer accounts of a subscription service: plan, email and status.",
     "constraints_rules": ["Plans: basic, plus, pro.", "Closed accounts cannot change plan."],
     "tools": [_tool("find_customer", "Find customers by name.", name="string"),
               _tool("change_plan", "Change a customer's plan.", customer="string", plan="string"),
               _tool("update_email", "Change a customer's email.", customer="string", email="string"),
               _tool("close_account", "Close a customer's account.", customer="string")],
     "env_class_code": ACCOUNTS_CODE, "make_task": accounts_task},
    {"env_id": "bed_support_refunds", "env_class_name": "RefundDesk", "role": "main",
     "environment_introduction": "A shop's refunds and returns desk: look up orders, refund money and open returns.",
     "constraints_rules": ["Refunds are whole dollars, at most what was paid minus earlier refunds."],
     "tools": [_tool("find_orders", "List a customer's orders by name.", customer="string"),
               _tool("refund", "Refund dollars on an order.", order_id="string", amount="integer"),
               _tool("open_return", "Open a return for an order.", order_id="string"), REFUNDS_REPORT[1]],
     "env_class_code": REFUNDS_CODE + REFUNDS_REPORT[0], "make_task": refunds_task},
    {"env_id": "bed_support_it", "env_class_name": "ITHelpDesk", "role": "transfer",
     "environment_introduction": "An IT help desk for staff accounts: passwords, lockouts and access groups.",
     "constraints_rules": ["Group names are single lowercase words such as vpn or wiki."],
     "tools": [_tool("find_user", "Find users by name.", name="string"),
               _tool("reset_password", "Send a user a new password.", user_id="string"),
               _tool("unlock_user", "Unlock a locked account.", user_id="string"),
               _tool("grant_access", "Add a user to an access group.", user_id="string", group="string")],
     "env_class_code": IT_CODE, "make_task": it_task},
]
