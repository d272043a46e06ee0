"""A restaurant pantry: ingredient stock and purchase orders to suppliers (role "main").

One environment of the bed's inventory domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, say as _say, pick as _pick


PANTRY_CODE = '''\
class PantrySupply:
    def __init__(self, init_config: dict):
        """A restaurant pantry. State: ingredients: code -> {code, name, qty, supplier};
        purchase_orders: po_id -> {po_id, code, qty, status} (open | received)."""
        self.ingredients = {}
        self.purchase_orders = {}

    def _check(self, code, qty):
        if str(code) not in self.ingredients:
            return f"unknown ingredient code {code}"
        if not isinstance(qty, int) or isinstance(qty, bool) or qty <= 0:
            return "qty must be a positive integer"
        return None

    def find_ingredient(self, name: str) -> dict:
        """Ingredients whose name contains ``name`` (case-insensitive)."""
        q = str(name).lower()
        return {"success": True, "data": [i for i in self.ingredients.values() if q in i["name"].lower()]}

    def use_stock(self, code: str, qty: int) -> dict:
        """Record that the kitchen used ``qty`` units; fails when fewer are in the pantry."""
        error = self._check(code, qty)
        if error:
            return {"success": False, "error": error}
        item = self.ingredients[code]
        if item["qty"] < qty:
            return {"success": False, "error": f"only {item['qty']} units of {code} in the pantry"}
        item["qty"] -= qty
        return {"success": True, "data": item}

    def order_stock(self, code: str, qty: int) -> dict:
        """Open a purchase order for ``qty`` units with the ingredient's supplier."""
        error = self._check(code, qty)
        if error:
            return {"success": False, "error": error}
        number = max([int(p[3:]) for p in self.purchase_orders] + [100]) + 1
        po = {"po_id": f"PO-{number}", "code": code, "qty": qty, "status": "open"}
        self.purchase_orders[po["po_id"]] = po
        return {"success": True, "data": po}

    def receive_order(self, po_id: str) -> dict:
        """Book an open purchase order's delivery into the pantry."""
        po = self.purchase_orders.get(str(po_id))
        if po is None:
            return {"success": False, "error": f"unknown purchase order {po_id}"}
        if po["status"] != "open":
            return {"success": False, "error": f"purchase order {po_id} is already {po['status']}"}
        po["status"] = "received"
        self.ingredients[po["code"]]["qty"] += po["qty"]
        return {"success": True, "data": po}
'''

INGREDIENTS = ["basil", "flour", "olive oil", "rice", "tomatoes", "butter", "garlic", "lemons", "sugar", "cream",
               "onions", "parmesan", "saffron", "thyme", "chickpeas", "honey"]
SUPPLIERS = ["Greenleaf", "Miller & Sons", "Costa Foods", "Alpine Dairy", "Sunfield", "Harbor Market"]


def _pantry_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    codes = _ids(rng, "G", n, digits=2)
    ingredients = {c: {"code": c, "name": nm, "qty": rng.randint(0, 30), "supplier": rng.choice(SUPPLIERS)}
                   for c, nm in zip(codes, rng.sample(INGREDIENTS, n))}
    po_ids = [f"PO-{x}" for x in rng.sample(range(101, 400), rng.randint(2, 3))]
    purchase_orders = {p: {"po_id": p, "code": rng.choice(codes), "qty": rng.randint(5, 40), "status": "open"}
                       for p in po_ids}
    purchase_orders[po_ids[-1]]["status"] = rng.choice(["open", "received"])
    a, b = rng.sample(codes, 2)
    po = po_ids[0]
    for c in (a, b):
        ingredients[c]["qty"] = max(ingredients[c]["qty"], 4)

    def qty_is(code: str, qty: int) -> dict:
        return _check(f"Does {code} have {qty} units?", f'final_state["ingredients"]["{code}"]["qty"] == {qty}')

    def ordered(code: str, qty: int) -> dict:
        return _check(f"Is there an open purchase order for {qty} units of {code}?",
                      f'any(p["code"] == "{code}" and p["qty"] == {qty} and p["status"] == "open" '
                      'for p in final_state["purchase_orders"].values())')

    def received(p: str) -> dict:
        code = purchase_orders[p]["code"]
        qty = ingredients[code]["qty"] + purchase_orders[p]["qty"]
        return _check(f"Is {p} received, bringing {code} to {qty} units?",
                      f'final_state["purchase_orders"]["{p}"]["status"] == "received" and '
                      f'final_state["ingredients"]["{code}"]["qty"] == {qty}')

    def new_qty(code: str) -> int:  # a quantity no open purchase order of ``code`` already has
        taken = {p["qty"] for p in purchase_orders.values() if p["code"] == code and p["status"] == "open"}
        return rng.choice([k for k in range(5, 41) if k not in taken])

    def order() -> tuple:
        k = new_qty(a)
        text = _say(rng, ["Order {k} units of {a} from its supplier.",
                          "Place a purchase order for {k} units of ingredient {a}.",
                           "We are running low on {a}; order {k} more units.", "Buy {k} units of ingredient {a} from the supplier."], k=k, a=a)
        return text, [ordered(a, k)], [_call("order_stock", code=a, qty=k)]

    def receive() -> tuple:
        text = _say(rng, ["Purchase order {po} has arrived; receive it.",
                          "Book the delivery of {po} into the pantry.",
                           "Receive purchase order {po}.", "The goods of purchase order {po} are here. Book them in."], po=po)
        return text, [received(po)], [_call("receive_order", po_id=po)]

    def use() -> tuple:
        k = rng.randint(1, ingredients[a]["qty"])
        text = _say(rng, ["The kitchen used {k} units of {a}; record it.",
                          "Take {k} units of {a} out of the pantry for tonight's service.",
                           "Record that {k} units of {a} were used.", "Reduce the pantry stock of {a} by {k} units used in cooking."], k=k, a=a)
        return text, [qty_is(a, ingredients[a]["qty"] - k)], [_call("use_stock", code=a, qty=k)]

    def find_order() -> tuple:
        k, name = new_qty(a), ingredients[a]["name"]
        text = _say(rng, ["Find the ingredient {name} and order {k} units of it.",
                           "We are low on {name}: look up the ingredient code and order {k} units.", "Search the pantry for {name}, then place an order for {k} units of it.", "Buy {k} units of {name} from the supplier. You need its code first."], k=k, name=name)
        return text, [ordered(a, k)], [_call("find_ingredient", name=name), _call("order_stock", code=a, qty=k)]

    def find_use() -> tuple:
        name = ingredients[a]["name"]
        k = rng.randint(1, ingredients[a]["qty"])
        text = _say(rng, ["The kitchen used {k} units of {name}. Look up its code and record the use.",
                           "Find the ingredient {name} and take {k} units of it out of the pantry.", "Search for {name} and reduce its stock by the {k} units the cooks used.", "Tonight's menu used {k} units of {name}. Look up the code and book the use."], k=k, name=name)
        calls = [_call("find_ingredient", name=name), _call("use_stock", code=a, qty=k)]
        return text, [qty_is(a, ingredients[a]["qty"] - k)], calls

    def two() -> tuple:
        k = rng.randint(1, ingredients[b]["qty"])
        rb = ingredients[b]["qty"] - k + (purchase_orders[po]["qty"] if purchase_orders[po]["code"] == b else 0)
        text = _say(rng, ["Receive purchase order {po} and record that the kitchen used {k} units of {b}.",
                           "Take {k} units of {b} out of the pantry, then receive {po}.", "Two pantry jobs: book in purchase order {po}, and record {k} units of {b} as used.", "Purchase order {po} arrived. The kitchen also used {k} units of {b}. Record both."], po=po, k=k, b=b)
        checks = [received(po), qty_is(b, rb)]
        if purchase_orders[po]["code"] == b:  # both change b's quantity: the receipt check is the status alone
            checks[0] = _check(f"Is {po} received?",
                               f'final_state["purchase_orders"]["{po}"]["status"] == "received"')
        calls = [_call("receive_order", po_id=po), _call("use_stock", code=b, qty=k)]
        return text, checks, calls if text.startswith("Receive") else calls[::-1]

    text, checks, calls = _pick(rng, [order, receive, use, find_order, find_use, two])()
    return {"init_config": {"ingredients": ingredients, "purchase_orders": purchase_orders}, "task": text,
            "checklist_with_func": checks, "reference_actions": calls}


PANTRY = {
    "env_id": "bed_inventory_pantry",
    "env_class_name": "PantrySupply",
    "role": "main",
    "environment_introduction": "A restaurant pantry: ingredient stock and purchase orders to suppliers.",
    "constraints_rules": ["Receiving an open purchase order adds its units to the pantry."],
    "tools": [
        _tool("find_ingredient", "Find ingredients by name.", name="string"),
        _tool("use_stock", "Record units used by the kitchen.", code="string", qty="integer"),
        _tool("order_stock", "Order units from the supplier.", code="string", qty="integer"),
        _tool("receive_order", "Receive a purchase order.", po_id="string"),
    ],
    "env_class_code": PANTRY_CODE,
    "make_task": _pantry_task,
}
