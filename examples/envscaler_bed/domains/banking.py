"""Banking and payments environments of the lopd study bed (lopd's own, in the EnvScaler format).

Four environments: current accounts and transfers, payment cards (freeze, limits), bill payments
and standing orders (role "main"), and a loan desk (role "transfer", used by no train task).
Each entry of :data:`ENVS` follows the bed's domain-module contract: the class source as a string,
terse tool schemas, and ``make_task(rng)`` returning a fresh initial state, the task text, check
functions and the reference tool calls. Amounts are whole euros (integers). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool

FIRST_NAMES = ["Ada", "Ben", "Chloe", "Dario", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
               "Kira", "Lena", "Marco", "Nadia", "Omar", "Priya", "Rosa", "Sven", "Tara", "Yusuf"]
LAST_NAMES = ["Moreno", "Novak", "Okafor", "Petrov", "Quinn", "Rossi", "Sato", "Tanaka", "Ulrich",
              "Vidal", "Weber", "Young", "Zhou", "Berg", "Costa", "Duarte", "Ekstrom", "Fischer"]


def _ids(rng: random.Random, letters: str, k: int, digits: int = 3) -> list[str]:
    """``k`` distinct ids like "K-417" (a letter from ``letters``, ``digits`` digits)."""
    out: list[str] = []
    while len(out) < k:
        new = f"{rng.choice(letters)}-{rng.randint(10 ** (digits - 1), 10 ** digits - 1)}"
        if new not in out:
            out.append(new)
    return out


def _people(rng: random.Random, k: int) -> list[str]:
    """``k`` distinct full names with distinct first names."""
    return [f"{f} {rng.choice(LAST_NAMES)}" for f in rng.sample(FIRST_NAMES, k)]


def _say(rng: random.Random, templates: list[str], **fields: object) -> str:
    """One of ``templates`` (chosen by ``rng``), filled with ``fields``."""
    return rng.choice(templates).format(**fields)


def _pick(rng: random.Random, kinds: list) -> object:
    """Half the tasks single-call (the first three kinds), half multi-call (the rest)."""
    return rng.choice(kinds[:3]) if rng.random() < 0.5 else rng.choice(kinds[3:])


# ----------------------------------------------------------------------------- accounts and transfers

ACCOUNTS_CODE = '''\
class BankAccounts:
    def __init__(self, init_config: dict):
        """Current accounts. State: accounts: account_id -> {account_id, owner, balance} (whole euros);
        ledger: one entry per booking, in order."""
        self.accounts = {}
        self.ledger = []

    def _check(self, account_id, amount):
        if str(account_id) not in self.accounts:
            return f"unknown account {account_id}"
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return "amount must be a positive whole number"
        return None

    def find_accounts(self, owner: str) -> dict:
        """Accounts whose owner name contains ``owner`` (case-insensitive)."""
        q = str(owner).lower()
        return {"success": True, "data": [a for a in self.accounts.values() if q in a["owner"].lower()]}

    def deposit(self, account_id: str, amount: int) -> dict:
        """Pay ``amount`` into the account."""
        error = self._check(account_id, amount)
        if error:
            return {"success": False, "error": error}
        self.accounts[account_id]["balance"] += amount
        self.ledger.append(["deposit", account_id, amount])
        return {"success": True, "data": self.accounts[account_id]}

    def withdraw(self, account_id: str, amount: int) -> dict:
        """Take ``amount`` out of the account; fails above the balance."""
        error = self._check(account_id, amount)
        if error:
            return {"success": False, "error": error}
        if self.accounts[account_id]["balance"] < amount:
            return {"success": False, "error": f"insufficient funds in {account_id}"}
        self.accounts[account_id]["balance"] -= amount
        self.ledger.append(["withdraw", account_id, amount])
        return {"success": True, "data": self.accounts[account_id]}

    def transfer(self, source: str, target: str, amount: int) -> dict:
        """Move ``amount`` from the source account to the target account."""
        error = self._check(source, amount) or self._check(target, amount)
        if error:
            return {"success": False, "error": error}
        if source == target:
            return {"success": False, "error": "source and target are the same account"}
        if self.accounts[source]["balance"] < amount:
            return {"success": False, "error": f"insufficient funds in {source}"}
        self.accounts[source]["balance"] -= amount
        self.accounts[target]["balance"] += amount
        self.ledger.append(["transfer", source, target, amount])
        return {"success": True, "data": [self.accounts[source], self.accounts[target]]}
'''


def _accounts_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    ids = _ids(rng, "A", n)
    accounts = {a: {"account_id": a, "owner": o, "balance": rng.randint(50, 3000)}
                for a, o in zip(ids, _people(rng, n))}
    a, b = rng.sample(ids, 2)

    def balance_is(acc: str, value: int) -> dict:
        return _check(f"Is the balance of {acc} {value}?", f'final_state["accounts"]["{acc}"]["balance"] == {value}')

    def moved(src: str, dst: str, k: int) -> dict:
        s, d = accounts[src]["balance"] - k, accounts[dst]["balance"] + k
        return _check(f"Did {k} move from {src} to {dst}?",
                      f'final_state["accounts"]["{src}"]["balance"] == {s} and '
                      f'final_state["accounts"]["{dst}"]["balance"] == {d}')

    def some(acc: str) -> int:  # an amount the account can pay
        return rng.randint(1, min(accounts[acc]["balance"], 900) // 5) * 5

    def deposit() -> tuple:
        k = rng.randint(1, 200) * 5
        text = _say(rng, ["Deposit {k} euros into account {a}.", "Put {k} euros in cash into account {a}.",
                           "Credit account {a} with a deposit of {k}.", "A customer hands over {k} euros for account {a}. Book the deposit."], k=k, a=a)
        return text, [balance_is(a, accounts[a]["balance"] + k)], [_call("deposit", account_id=a, amount=k)]

    def withdraw() -> tuple:
        k = some(a)
        text = _say(rng, ["Withdraw {k} euros from account {a}.",
                          "The owner of account {a} takes out {k} euros in cash; record the withdrawal.",
                           "Pay out {k} euros from account {a}.", "Debit {k} euros from account {a} as a cash withdrawal."], k=k, a=a)
        return text, [balance_is(a, accounts[a]["balance"] - k)], [_call("withdraw", account_id=a, amount=k)]

    def transfer() -> tuple:
        k = some(a)
        text = _say(rng, ["Transfer {k} euros from account {a} to account {b}.", "Move {k} euros from {a} to {b}.",
                           "Send {k} euros from account {a} to account {b}.", "Account {b} should receive {k} euros from account {a}."], k=k, a=a, b=b)
        return text, [moved(a, b, k)], [_call("transfer", source=a, target=b, amount=k)]

    def find_deposit() -> tuple:
        k, owner = rng.randint(1, 200) * 5, accounts[a]["owner"]
        text = _say(rng, ["Find the account of {owner} and deposit {k} euros into it.",
                          "{owner} brought {k} euros in cash; look up their account and deposit the money.", "Search for the account owned by {owner}, then credit it with {k} euros.", "There is a cash deposit of {k} euros for {owner}. Which account is theirs? Put the money there."],
                    k=k, owner=owner)
        calls = [_call("find_accounts", owner=owner), _call("deposit", account_id=a, amount=k)]
        return text, [balance_is(a, accounts[a]["balance"] + k)], calls

    def find_transfer() -> tuple:
        k, owner = some(a), accounts[b]["owner"]
        text = _say(rng, ["Transfer {k} euros from account {a} to the account of {owner}.",
                          "Look up the account of {owner} and send it {k} euros from account {a}.", "{owner} is owed {k} euros from account {a}. Find where their account is and transfer it.", "Pay {k} euros out of account {a} into whichever account belongs to {owner}."],
                    k=k, a=a, owner=owner)
        calls = [_call("find_accounts", owner=owner), _call("transfer", source=a, target=b, amount=k)]
        return text, [moved(a, b, k)], calls

    def two() -> tuple:
        k, m = rng.randint(1, 200) * 5, some(b)
        text = _say(rng, ["Deposit {k} euros into {a} and withdraw {m} euros from {b}.",
                          "Withdraw {m} euros from account {b}, then deposit {k} euros into account {a}.", "Two cash jobs: account {a} gets a {k} euro deposit and account {b} a {m} euro withdrawal.", "Deposit: {k} euros to {a}. Withdrawal: {m} euros from {b}. Book both."],
                    k=k, m=m, a=a, b=b)
        calls = [_call("deposit", account_id=a, amount=k), _call("withdraw", account_id=b, amount=m)]
        checks = [balance_is(a, accounts[a]["balance"] + k), balance_is(b, accounts[b]["balance"] - m)]
        return text, checks, calls if text.startswith("Deposit") else calls[::-1]

    text, checks, calls = _pick(rng, [deposit, withdraw, transfer, find_deposit, find_transfer, two])()
    return {"init_config": {"accounts": accounts}, "task": text, "checklist_with_func": checks,
            "reference_actions": calls}


ACCOUNTS = {
    "env_id": "bed_banking_accounts",
    "env_class_name": "BankAccounts",
    "role": "main",
    "environment_introduction": "A bank's account desk: customer accounts with balances in whole euros.",
    "constraints_rules": ["Withdrawals and transfers cannot exceed the balance."],
    "tools": [
        _tool("find_accounts", "Find accounts by owner name.", owner="string"),
        _tool("deposit", "Pay money into an account.", account_id="string", amount="integer"),
        _tool("withdraw", "Take money out of an account.", account_id="string", amount="integer"),
        _tool("transfer", "Move money between accounts.", source="string", target="string", amount="integer"),
    ],
    "env_class_code": ACCOUNTS_CODE,
    "make_task": _accounts_task,
}


# ----------------------------------------------------------------------------- cards

CARDS_CODE = '''\
class CardService:
    def __init__(self, init_config: dict):
        """Payment cards. State: cards: card_id -> {card_id, holder, status, limit}
        (status active | frozen; limit: daily spending limit in whole euros)."""
        self.cards = {}

    def find_cards(self, holder: str) -> dict:
        """Cards whose holder name contains ``holder`` (case-insensitive)."""
        q = str(holder).lower()
        return {"success": True, "data": [c for c in self.cards.values() if q in c["holder"].lower()]}

    def _set_status(self, card_id, old, new):
        card = self.cards.get(str(card_id))
        if card is None:
            return {"success": False, "error": f"unknown card {card_id}"}
        if card["status"] != old:
            return {"success": False, "error": f"card {card_id} is {card['status']}, not {old}"}
        card["status"] = new
        return {"success": True, "data": card}

    def freeze_card(self, card_id: str) -> dict:
        """Freeze an active card."""
        return self._set_status(card_id, "active", "frozen")

    def unfreeze_card(self, card_id: str) -> dict:
        """Reactivate a frozen card."""
        return self._set_status(card_id, "frozen", "active")

    def set_limit(self, card_id: str, limit: int) -> dict:
        """Set the card's daily limit (whole euros, 50 to 5000)."""
        card = self.cards.get(str(card_id))
        if card is None:
            return {"success": False, "error": f"unknown card {card_id}"}
        if not isinstance(limit, int) or isinstance(limit, bool) or not 50 <= limit <= 5000:
            return {"success": False, "error": "limit must be a whole number from 50 to 5000"}
        card["limit"] = limit
        return {"success": True, "data": card}
'''


def _cards_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    ids = _ids(rng, "C", n)
    cards = {}
    for i, (c, h) in enumerate(zip(ids, _people(rng, n))):  # the first two: one active, one frozen
        status = ["active", "frozen"][i % 2] if i < 2 else rng.choice(["active", "active", "frozen"])
        cards[c] = {"card_id": c, "holder": h, "status": status, "limit": rng.randint(2, 40) * 50}
    active = [c for c in ids if cards[c]["status"] == "active"]
    frozen = [c for c in ids if cards[c]["status"] == "frozen"]
    a, f = rng.choice(active), rng.choice(frozen)

    def status_is(card: str, status: str) -> dict:
        return _check(f"Is card {card} {status}?", f'final_state["cards"]["{card}"]["status"] == "{status}"')

    def limit_is(card: str, limit: int) -> dict:
        return _check(f"Is the daily limit of {card} {limit}?", f'final_state["cards"]["{card}"]["limit"] == {limit}')

    def new_limit(card: str) -> int:
        return rng.choice([x * 50 for x in range(2, 61) if x * 50 != cards[card]["limit"]])

    def freeze() -> tuple:
        text = _say(rng, ["Freeze card {a}.", "Card {a} was stolen; freeze it right away.",
                          "Block card {a} by freezing it.", "Put a freeze on card {a} so it cannot be used."], a=a)
        return text, [status_is(a, "frozen")], [_call("freeze_card", card_id=a)]

    def unfreeze() -> tuple:
        text = _say(rng, ["Unfreeze card {f}.", "Card {f} was found again; unfreeze it.",
                          "Reactivate the frozen card {f}.", "Lift the freeze on card {f}."], f=f)
        return text, [status_is(f, "active")], [_call("unfreeze_card", card_id=f)]

    def limit() -> tuple:
        c = rng.choice(ids)
        v = new_limit(c)
        text = _say(rng, ["Set the daily limit of card {c} to {v} euros.",
                          "Change the spending limit of card {c} to {v}.",
                           "Card {c} needs a daily limit of {v} euros.", "Make {v} euros the new daily spending cap for card {c}."], c=c, v=v)
        return text, [limit_is(c, v)], [_call("set_limit", card_id=c, limit=v)]

    def find_freeze() -> tuple:
        holder = cards[a]["holder"]
        text = _say(rng, ["{holder} lost their card. Find it and freeze it.",
                           "Look up the card of {holder} and freeze it; they think it was stolen.", "Someone may be using the card of {holder}. Search for it and block it with a freeze.", "Freeze whatever card {holder} holds; first find it."], holder=holder)
        return text, [status_is(a, "frozen")], [_call("find_cards", holder=holder), _call("freeze_card", card_id=a)]

    def find_limit() -> tuple:
        c = rng.choice(ids)
        holder, v = cards[c]["holder"], new_limit(c)
        text = _say(rng, ["Find the card of {holder} and set its daily limit to {v} euros.",
                          "{holder} wants a daily limit of {v} euros; look up their card and change it.", "Search the cards for {holder} and give that card a {v} euro daily limit.", "The card holder {holder} asked for a new daily cap of {v} euros. Find the card and update it."],
                    holder=holder, v=v)
        return text, [limit_is(c, v)], [_call("find_cards", holder=holder), _call("set_limit", card_id=c, limit=v)]

    def two() -> tuple:
        if rng.random() < 0.5:
            v = new_limit(f)
            text = _say(rng, ["Unfreeze card {f} and set its daily limit to {v} euros.",
                               "Reactivate card {f} with a new daily limit of {v}.", "Unfreeze card {f}; its daily limit should then be {v} euros.", "Card {f} is frozen. Make it active again and change its daily limit to {v} euros."], f=f, v=v)
            calls = [_call("unfreeze_card", card_id=f), _call("set_limit", card_id=f, limit=v)]
            return text, [status_is(f, "active"), limit_is(f, v)], calls
        text = _say(rng, ["Freeze card {a} and unfreeze card {f}.", "Unfreeze card {f}, then freeze card {a}.", "Freeze card {a}; card {f} on the other hand should be unfrozen.", "Freeze card {a} and reactivate card {f}, which is frozen now."],
                    a=a, f=f)
        calls = [_call("freeze_card", card_id=a), _call("unfreeze_card", card_id=f)]
        checks = [status_is(a, "frozen"), status_is(f, "active")]
        return text, checks, calls if text.startswith("Freeze") else calls[::-1]

    text, checks, calls = _pick(rng, [freeze, unfreeze, limit, find_freeze, find_limit, two])()
    return {"init_config": {"cards": cards}, "task": text, "checklist_with_func": checks, "reference_actions": calls}


CARDS = {
    "env_id": "bed_banking_cards",
    "env_class_name": "CardService",
    "role": "main",
    "environment_introduction": "A bank's card service: payment cards with a status and a daily limit in euros.",
    "constraints_rules": ["Only active cards can be frozen; only frozen cards can be unfrozen."],
    "tools": [
        _tool("find_cards", "Find cards by holder name.", holder="string"),
        _tool("freeze_card", "Freeze a card.", card_id="string"),
        _tool("unfreeze_card", "Unfreeze a card.", card_id="string"),
        _tool("set_limit", "Set a card's daily limit.", card_id="string", limit="integer"),
    ],
    "env_class_code": CARDS_CODE,
    "make_task": _cards_task,
}


# ----------------------------------------------------------------------------- bills and standing orders

BILLS_CODE = '''\
class BillPayments:
    def __init__(self, init_config: dict):
        """Bill payments. State: payees: payee_id -> {payee_id, name, due} (amount owed, whole euros);
        standing_orders: order_id -> {order_id, payee_id, amount, day, active} (monthly payments)."""
        self.payees = {}
        self.standing_orders = {}

    def _check(self, payee_id, amount):
        if str(payee_id) not in self.payees:
            return f"unknown payee {payee_id}"
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return "amount must be a positive whole number"
        return None

    def find_payee(self, name: str) -> dict:
        """Payees whose name contains ``name`` (case-insensitive)."""
        q = str(name).lower()
        return {"success": True, "data": [p for p in self.payees.values() if q in p["name"].lower()]}

    def pay_bill(self, payee: str, amount: int) -> dict:
        """Pay ``amount`` towards what is due to the payee (its id); fails above the amount due."""
        error = self._check(payee, amount)
        if error:
            return {"success": False, "error": error}
        entry = self.payees[payee]
        if amount > entry["due"]:
            return {"success": False, "error": f"only {entry['due']} is due to {payee}"}
        entry["due"] -= amount
        return {"success": True, "data": entry}

    def add_standing_order(self, payee: str, amount: int, day: int) -> dict:
        """Start a monthly payment of ``amount`` to the payee (its id) on ``day`` (1-28) of each month."""
        error = self._check(payee, amount)
        if error:
            return {"success": False, "error": error}
        if not isinstance(day, int) or isinstance(day, bool) or not 1 <= day <= 28:
            return {"success": False, "error": "day must be a whole number from 1 to 28"}
        number = max([int(k[3:]) for k in self.standing_orders] + [100]) + 1
        order = {"order_id": f"SO-{number}", "payee_id": payee, "amount": amount, "day": day, "active": True}
        self.standing_orders[order["order_id"]] = order
        return {"success": True, "data": order}

    def cancel_standing_order(self, order_id: str) -> dict:
        """Stop an active standing order."""
        order = self.standing_orders.get(str(order_id))
        if order is None:
            return {"success": False, "error": f"unknown standing order {order_id}"}
        if not order["active"]:
            return {"success": False, "error": f"standing order {order_id} is already cancelled"}
        order["active"] = False
        return {"success": True, "data": order}
'''

PAYEES = ["Volta Power", "AquaCity Water", "Nimbus Telecom", "City Council", "Skyline Internet", "Harbor Gas",
          "Metro Transit", "Oakwood Lettings", "Brightside Insurance", "Pulse Gym", "Northwind Mobile",
          "Civic Parking"]


def _bills_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    ids = _ids(rng, "P", n, digits=2)
    payees = {p: {"payee_id": p, "name": nm, "due": rng.randint(20, 400)}
              for p, nm in zip(ids, rng.sample(PAYEES, n))}
    so_ids = [f"SO-{x}" for x in rng.sample(range(101, 400), rng.randint(2, 3))]
    standing_orders = {o: {"order_id": o, "payee_id": rng.choice(ids), "amount": rng.randint(2, 60) * 5,
                           "day": rng.randint(1, 28), "active": True} for o in so_ids}
    standing_orders[so_ids[-1]]["active"] = rng.random() < 0.5
    a, b = rng.sample(ids, 2)
    so = so_ids[0]

    def due_is(p: str, value: int) -> dict:
        return _check(f"Is {value} due to {p}?", f'final_state["payees"]["{p}"]["due"] == {value}')

    def scheduled(p: str, k: int, d: int) -> dict:
        return _check(f"Is there an active standing order of {k} to {p} on day {d}?",
                      f'any(o["payee_id"] == "{p}" and o["amount"] == {k} and o["day"] == {d} '
                      'and o["active"] is True '
                      'for o in final_state["standing_orders"].values())')

    def cancelled(o: str) -> dict:
        return _check(f"Is standing order {o} cancelled?",
                      f'final_state["standing_orders"]["{o}"]["active"] is False')

    def part(p: str) -> int:  # an amount up to what is due
        return rng.randint(5, payees[p]["due"])

    def new_order(p: str) -> tuple:  # amount and day no active standing order of ``p`` already has
        taken = {(o["amount"], o["day"]) for o in standing_orders.values() if o["payee_id"] == p and o["active"]}
        while (pick := (rng.randint(2, 19) * 5, rng.randint(1, 28))) in taken:
            pass
        return pick

    def pay() -> tuple:
        k = part(a)
        text = _say(rng, ["Pay {k} euros to payee {a}.", "Pay a bill of {k} euros to {a}.",
                           "Send a payment of {k} euros to payee {a}.", "Payee {a} is owed {k} euros; settle that amount now."], k=k, a=a)
        return text, [due_is(a, payees[a]["due"] - k)], [_call("pay_bill", payee=a, amount=k)]

    def schedule() -> tuple:
        k, d = new_order(a)
        text = _say(rng, ["Set up a standing order of {k} euros to payee {a} on day {d} of each month.",
                           "Pay {a} {k} euros every month on day {d} with a standing order.", "Create a monthly standing order: payee {a}, {k} euros, day {d}.", "From now on, {k} euros should go to {a} on day {d} of every month. Set that up."], k=k, a=a, d=d)
        return text, [scheduled(a, k, d)], [_call("add_standing_order", payee=a, amount=k, day=d)]

    def cancel() -> tuple:
        text = _say(rng, ["Cancel standing order {so}.", "Stop the monthly payment {so}.",
                           "The customer no longer wants standing order {so}; cancel it.", "Remove the standing order {so} from the account."], so=so)
        return text, [cancelled(so)], [_call("cancel_standing_order", order_id=so)]

    def find_pay() -> tuple:
        k, name = part(a), payees[a]["name"]
        text = _say(rng, ["Pay {k} euros to {name}; look up the payee first.",
                           "Find the payee {name} and pay them {k} euros.", "Settle {k} euros of the bill from {name}. Their payee id is unknown, so search for it.", "A bill from {name} for {k} euros came in. Look the payee up and pay it."], k=k, name=name)
        calls = [_call("find_payee", name=name), _call("pay_bill", payee=a, amount=k)]
        return text, [due_is(a, payees[a]["due"] - k)], calls

    def find_schedule() -> tuple:
        (k, d), name = new_order(a), payees[a]["name"]
        text = _say(rng, ["Find the payee {name} and set up a standing order of {k} euros to them on day {d}.",
                          "Look up {name} and pay them {k} euros monthly on day {d} with a standing order.", "Search for the payee {name}, then create a standing order paying them {k} euros on day {d}.", "{name} should get {k} euros on day {d} of each month. Find the payee and set up the order."],
                    k=k, d=d, name=name)
        calls = [_call("find_payee", name=name), _call("add_standing_order", payee=a, amount=k, day=d)]
        return text, [scheduled(a, k, d)], calls

    def two() -> tuple:
        k = part(b)
        text = _say(rng, ["Cancel standing order {so} and pay {k} euros to payee {b}.",
                           "Pay {k} euros to {b}, then cancel standing order {so}.", "Two jobs: end standing order {so}, and send {k} euros to payee {b}.", "Standing order {so} must stop. Also settle {k} euros with payee {b}."], so=so, k=k, b=b)
        calls = [_call("cancel_standing_order", order_id=so), _call("pay_bill", payee=b, amount=k)]
        checks = [cancelled(so), due_is(b, payees[b]["due"] - k)]
        return text, checks, calls if text.startswith("Cancel") else calls[::-1]

    text, checks, calls = _pick(rng, [pay, schedule, cancel, find_pay, find_schedule, two])()
    return {"init_config": {"payees": payees, "standing_orders": standing_orders}, "task": text,
            "checklist_with_func": checks, "reference_actions": calls}


BILLS = {
    "env_id": "bed_banking_bills",
    "env_class_name": "BillPayments",
    "role": "main",
    "environment_introduction": "Online banking bill payments: payees with an amount due, and monthly standing "
                                "orders.",
    "constraints_rules": ["A payment cannot exceed the amount due.", "Standing orders run on day 1-28."],
    "tools": [
        _tool("find_payee", "Find payees by name.", name="string"),
        _tool("pay_bill", "Pay money to a payee (by payee id).", payee="string", amount="integer"),
        _tool("add_standing_order", "Start a monthly payment to a payee id.", payee="string", amount="integer",
              day="integer"),
        _tool("cancel_standing_order", "Stop a standing order.", order_id="string"),
    ],
    "env_class_code": BILLS_CODE,
    "make_task": _bills_task,
}


# ----------------------------------------------------------------------------- loan desk (transfer)

LOANS_CODE = '''\
class LoanDesk:
    def __init__(self, init_config: dict):
        """A loan desk. State: loans: loan_id -> {loan_id, borrower, balance, status} (active | closed);
        applications: app_id -> {app_id, applicant, amount, status} (pending | approved | rejected)."""
        self.loans = {}
        self.applications = {}

    def find_loans(self, borrower: str) -> dict:
        """Loans whose borrower name contains ``borrower`` (case-insensitive)."""
        q = str(borrower).lower()
        return {"success": True, "data": [x for x in self.loans.values() if q in x["borrower"].lower()]}

    def repay_loan(self, loan_id: str, amount: int) -> dict:
        """Record a repayment; a loan repaid in full is closed."""
        loan = self.loans.get(str(loan_id))
        if loan is None:
            return {"success": False, "error": f"unknown loan {loan_id}"}
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return {"success": False, "error": "amount must be a positive whole number"}
        if loan["status"] != "active" or amount > loan["balance"]:
            return {"success": False, "error": f"loan {loan_id} has {loan['balance']} left to repay"}
        loan["balance"] -= amount
        if loan["balance"] == 0:
            loan["status"] = "closed"
        return {"success": True, "data": loan}

    def _decide(self, app_id, status):
        app = self.applications.get(str(app_id))
        if app is None:
            return {"success": False, "error": f"unknown application {app_id}"}
        if app["status"] != "pending":
            return {"success": False, "error": f"application {app_id} is already {app['status']}"}
        app["status"] = status
        return {"success": True, "data": app}

    def approve_application(self, app_id: str) -> dict:
        """Approve a pending loan application."""
        return self._decide(app_id, "approved")

    def reject_application(self, app_id: str) -> dict:
        """Reject a pending loan application."""
        return self._decide(app_id, "rejected")
'''


def _loans_task(rng: random.Random) -> dict:
    n_loans, n_apps = rng.randint(3, 4), rng.randint(2, 3)
    people = _people(rng, n_loans + n_apps)
    loan_ids, app_ids = _ids(rng, "L", n_loans), _ids(rng, "Q", n_apps)
    loans = {x: {"loan_id": x, "borrower": p, "balance": rng.randint(10, 400) * 10, "status": "active"}
             for x, p in zip(loan_ids, people)}
    applications = {x: {"app_id": x, "applicant": p, "amount": rng.randint(5, 200) * 100, "status": "pending"}
                    for x, p in zip(app_ids, people[n_loans:])}
    if n_apps == 3:  # x and y stay pending
        applications[app_ids[-1]]["status"] = rng.choice(["pending", "approved", "rejected"])
    loan = rng.choice(loan_ids)
    x, y = app_ids[0], app_ids[1]
    bal = loans[loan]["balance"]

    def loan_is(balance: int) -> dict:
        return _check(f"Does loan {loan} have {balance} left?",
                      f'final_state["loans"]["{loan}"]["balance"] == {balance}')

    def closed() -> dict:
        return _check(f"Is loan {loan} repaid and closed?",
                      f'final_state["loans"]["{loan}"]["balance"] == 0 and '
                      f'final_state["loans"]["{loan}"]["status"] == "closed"')

    def decided(app: str, status: str) -> dict:
        return _check(f"Is application {app} {status}?",
                      f'final_state["applications"]["{app}"]["status"] == "{status}"')

    def repay() -> tuple:
        k = rng.randint(1, bal // 10 - 1) * 10
        text = _say(rng, ["Record a repayment of {k} euros on loan {loan}.",
                          "Loan {loan}: the borrower paid back {k} euros; record it."], k=k, loan=loan)
        return text, [loan_is(bal - k)], [_call("repay_loan", loan_id=loan, amount=k)]

    def approve() -> tuple:
        text = _say(rng, ["Approve loan application {x}.", "Application {x} passed the credit check; approve it."],
                    x=x)
        return text, [decided(x, "approved")], [_call("approve_application", app_id=x)]

    def reject() -> tuple:
        text = _say(rng, ["Reject loan application {x}.", "Application {x} failed the credit check; reject it."], x=x)
        return text, [decided(x, "rejected")], [_call("reject_application", app_id=x)]

    def find_repay() -> tuple:
        k, who = rng.randint(1, bal // 10 - 1) * 10, loans[loan]["borrower"]
        text = _say(rng, ["{who} paid {k} euros towards their loan. Find the loan and record the repayment.",
                           "Look up the loan of {who} and record a repayment of {k} euros."], k=k, who=who)
        calls = [_call("find_loans", borrower=who), _call("repay_loan", loan_id=loan, amount=k)]
        return text, [loan_is(bal - k)], calls

    def find_close() -> tuple:
        who = loans[loan]["borrower"]
        text = _say(rng, ["{who} repaid the remaining {bal} euros of their loan. Find the loan and record it.",
                          "Look up the loan of {who} and record the final repayment of {bal} euros."],
                    bal=bal, who=who)
        return text, [closed()], [_call("find_loans", borrower=who), _call("repay_loan", loan_id=loan, amount=bal)]

    def two() -> tuple:
        text = _say(rng, ["Approve application {x} and reject application {y}.",
                           "Reject loan application {y}, then approve application {x}."], x=x, y=y)
        calls = [_call("approve_application", app_id=x), _call("reject_application", app_id=y)]
        checks = [decided(x, "approved"), decided(y, "rejected")]
        return text, checks, calls if text.startswith("Approve") else calls[::-1]

    text, checks, calls = _pick(rng, [repay, approve, reject, find_repay, find_close, two])()
    return {"init_config": {"loans": loans, "applications": applications}, "task": text,
            "checklist_with_func": checks, "reference_actions": calls}


LOANS = {
    "env_id": "bed_banking_loans",
    "env_class_name": "LoanDesk",
    "role": "transfer",
    "environment_introduction": "A bank's loan desk: loans with a balance left to repay, and loan applications.",
    "constraints_rules": ["A repayment cannot exceed the loan balance.", "Only pending applications can be decided."],
    "tools": [
        _tool("find_loans", "Find loans by borrower name.", borrower="string"),
        _tool("repay_loan", "Record a loan repayment.", loan_id="string", amount="integer"),
        _tool("approve_application", "Approve a loan application.", app_id="string"),
        _tool("reject_application", "Reject a loan application.", app_id="string"),
    ],
    "env_class_code": LOANS_CODE,
    "make_task": _loans_task,
}

ENVS = [ACCOUNTS, CARDS, BILLS, LOANS]
