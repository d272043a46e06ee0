"""Bill payments and standing orders (role "main").

One environment of the bed's banking domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, say as _say, pick as _pick


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
