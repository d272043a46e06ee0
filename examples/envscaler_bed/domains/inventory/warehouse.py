"""A warehouse's stock: items with a SKU, a quantity and a storage bin (role "main").

One environment of the bed's inventory domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, say as _say, pick as _pick


WAREHOUSE_CODE = '''\
class WarehouseStock:
    def __init__(self, init_config: dict):
        """A warehouse's stock. State: items: sku -> {sku, name, qty, bin}."""
        self.items = {}

    def _qty(self, sku, qty):
        if str(sku) not in self.items:
            return f"unknown sku {sku}"
        if not isinstance(qty, int) or isinstance(qty, bool) or qty <= 0:
            return "qty must be a positive integer"
        return None

    def find_item(self, name: str) -> dict:
        """Items whose name contains ``name`` (case-insensitive)."""
        q = str(name).lower()
        return {"success": True, "data": [i for i in self.items.values() if q in i["name"].lower()]}

    def add_stock(self, sku: str, qty: int) -> dict:
        """Add ``qty`` units to the item's stock."""
        error = self._qty(sku, qty)
        if error:
            return {"success": False, "error": error}
        self.items[sku]["qty"] += qty
        return {"success": True, "data": self.items[sku]}

    def remove_stock(self, sku: str, qty: int) -> dict:
        """Take ``qty`` units out of stock; fails when fewer are in stock."""
        error = self._qty(sku, qty)
        if error:
            return {"success": False, "error": error}
        if self.items[sku]["qty"] < qty:
            return {"success": False, "error": f"only {self.items[sku]['qty']} units of {sku} in stock"}
        self.items[sku]["qty"] -= qty
        return {"success": True, "data": self.items[sku]}

    def move_item(self, sku: str, bin: str) -> dict:
        """Store the item in another bin."""
        if str(sku) not in self.items:
            return {"success": False, "error": f"unknown sku {sku}"}
        if not isinstance(bin, str) or not bin.strip():
            return {"success": False, "error": "bin must be a non-empty string"}
        self.items[sku]["bin"] = bin.strip().upper()
        return {"success": True, "data": self.items[sku]}
'''

MATERIALS = ["steel", "brass", "copper", "oak", "pine", "rubber", "nylon", "glass", "zinc", "cotton"]
PARTS = ["hinge", "bolt", "washer", "bracket", "pipe", "hose", "valve", "spring", "clamp", "gasket", "rope"]


def _bin(rng: random.Random) -> str:
    return f"{rng.choice('ABCDEFGH')}{rng.randint(1, 9)}"


def _warehouse_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    skus = _ids(rng, "ABCDKMNPRT", n)
    names = rng.sample([f"{m} {p}" for m in MATERIALS for p in PARTS], n)
    items = {s: {"sku": s, "name": nm, "qty": rng.randint(6, 90), "bin": _bin(rng)} for s, nm in zip(skus, names)}
    a, b = rng.sample(skus, 2)

    def qty_is(sku: str, qty: int) -> dict:
        return _check(f"Does {sku} have {qty} units?", f'final_state["items"]["{sku}"]["qty"] == {qty}')

    def bin_is(sku: str, new_bin: str) -> dict:
        return _check(f"Is {sku} in bin {new_bin}?", f'final_state["items"]["{sku}"]["bin"] == "{new_bin}"')

    def new_bin(sku: str) -> str:
        while (nb := _bin(rng)) == items[sku]["bin"]:
            pass
        return nb

    def add() -> tuple:
        k = rng.randint(2, 60)
        text = _say(rng, ["Receive {k} units of {a} into stock.",
                          "A delivery of {k} units of item {a} arrived; add them to stock.",
                           "Add {k} units to the stock of {a}.", "Stock of item {a} goes up by {k} units after a delivery."], k=k, a=a)
        return text, [qty_is(a, items[a]["qty"] + k)], [_call("add_stock", sku=a, qty=k)]

    def remove() -> tuple:
        k = rng.randint(1, items[a]["qty"])
        text = _say(rng, ["Remove {k} units of {a} from stock; they are damaged.",
                          "Take {k} units of {a} out of stock for an order.",
                           "Write off {k} units of item {a}.", "Reduce the stock of {a} by {k} units."], k=k, a=a)
        return text, [qty_is(a, items[a]["qty"] - k)], [_call("remove_stock", sku=a, qty=k)]

    def move() -> tuple:
        nb = new_bin(a)
        text = _say(rng, ["Move item {a} to bin {nb}.", "Relocate {a} to bin {nb}.", "Keep {a} in bin {nb} from now on.", "Item {a} belongs in bin {nb}; put it there."],
                    a=a, nb=nb)
        return text, [bin_is(a, nb)], [_call("move_item", sku=a, bin=nb)]

    def find_add() -> tuple:
        k, name = rng.randint(2, 60), items[a]["name"]
        text = _say(rng, ["Find the item named {name} and add {k} units to its stock.",
                           "We received {k} units of {name}; look up its SKU and add them to stock.", "Search for the {name}, then increase its stock by {k} units.", "A delivery of {k} {name} units came in. Which SKU is it? Book them into stock."], k=k, name=name)
        calls = [_call("find_item", name=name), _call("add_stock", sku=a, qty=k)]
        return text, [qty_is(a, items[a]["qty"] + k)], calls

    def find_move() -> tuple:
        nb, name = new_bin(a), items[a]["name"]
        text = _say(rng, ["Look up the SKU of the {name} and move it to bin {nb}.",
                           "The {name} should be kept in bin {nb}; find the item and move it.", "Search the catalogue for the {name} and relocate it to bin {nb}.", "Bin {nb} is the new home of the {name}. Find its SKU and move it."], name=name, nb=nb)
        return text, [bin_is(a, nb)], [_call("find_item", name=name), _call("move_item", sku=a, bin=nb)]

    def two() -> tuple:
        k, m, nb = rng.randint(2, 60), rng.randint(1, items[b]["qty"]), new_bin(b)
        if rng.random() < 0.5:
            text = _say(rng, ["Add {k} units of {a} and move {b} to bin {nb}.",
                               "Move {b} to bin {nb}, then receive {k} units of {a}.", "Two warehouse jobs: item {b} goes to bin {nb}, and the stock of {a} rises by {k} units.", "Relocate {b} to bin {nb}. Also book a delivery of {k} units of {a}."], k=k, a=a, b=b, nb=nb)
            checks = [qty_is(a, items[a]["qty"] + k), bin_is(b, nb)]
            calls = [_call("add_stock", sku=a, qty=k), _call("move_item", sku=b, bin=nb)]
            if text.startswith("Move"):
                calls.reverse()
            return text, checks, calls
        text = _say(rng, ["Add {k} units of {a} and remove {m} units of {b}.",
                           "Restock {a} with {k} units, and take {m} units of {b} out of stock.", "Two stock changes: {a} gains {k} units and {b} loses {m} units.", "Book {k} incoming units of {a}. Remove {m} units of {b} as well."], k=k, m=m, a=a, b=b)
        checks = [qty_is(a, items[a]["qty"] + k), qty_is(b, items[b]["qty"] - m)]
        return text, checks, [_call("add_stock", sku=a, qty=k), _call("remove_stock", sku=b, qty=m)]

    text, checks, calls = _pick(rng, [add, remove, move, find_add, find_move, two])()
    return {"init_config": {"items": items}, "task": text, "checklist_with_func": checks, "reference_actions": calls}


WAREHOUSE = {
    "env_id": "bed_inventory_warehouse",
    "env_class_name": "WarehouseStock",
    "role": "main",
    "environment_introduction": "A warehouse stock system: items have a SKU, a name, a quantity and a storage bin.",
    "constraints_rules": ["Stock cannot go below zero."],
    "tools": [
        _tool("find_item", "Find items by name.", name="string"),
        _tool("add_stock", "Add units to an item's stock.", sku="string", qty="integer"),
        _tool("remove_stock", "Take units out of stock.", sku="string", qty="integer"),
        _tool("move_item", "Move an item to another bin.", sku="string", bin="string"),
    ],
    "env_class_code": WAREHOUSE_CODE,
    "make_task": _warehouse_task,
}
