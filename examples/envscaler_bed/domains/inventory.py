"""Inventory and stock environments of the lopd study bed (lopd's own, in the EnvScaler format).

Four environments: a warehouse's stock, a web shop's orders, a restaurant pantry with supplier
orders (role "main"), and an equipment rental desk (role "transfer", used by no train task).
Each entry of :data:`ENVS` follows the bed's domain-module contract: the class source as a string,
terse tool schemas, and ``make_task(rng)`` returning a fresh initial state, the task text, check
functions and the reference tool calls. Stdlib only.
"""
from __future__ import annotations

import random

FIRST_NAMES = ["Ada", "Ben", "Chloe", "Dario", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
               "Kira", "Lena", "Marco", "Nadia", "Omar", "Priya", "Rosa", "Sven", "Tara", "Yusuf"]
LAST_NAMES = ["Moreno", "Novak", "Okafor", "Petrov", "Quinn", "Rossi", "Sato", "Tanaka", "Ulrich",
              "Vidal", "Weber", "Young", "Zhou", "Berg", "Costa", "Duarte", "Ekstrom", "Fischer"]


def _tool(name: str, description: str, /, **params: str) -> dict:
    """An OpenAI-style function schema; ``params`` maps argument name -> JSON type, all required."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in params.items()},
                       "required": list(params)}}}


def _check(item: str, expr: str) -> dict:
    """A checklist entry whose check function returns the boolean ``expr`` over ``final_state``."""
    return {"check_item": item, "check_func": f"def check_func(final_state):\n    return {expr}\n"}


def _call(name: str, /, **arguments: object) -> dict:
    return {"name": name, "arguments": arguments}


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


def _pick(rng: random.Random, kinds: list) -> object:
    """Half the tasks single-call (the first three kinds), half multi-call (the rest)."""
    return rng.choice(kinds[:3]) if rng.random() < 0.5 else rng.choice(kinds[3:])


# ----------------------------------------------------------------------------- warehouse

WAREHOUSE_CODE = '''\
class WarehouseStock:
    def __init__(self, init_config: dict):
        """A warehouse's stock. State: items: sku -> {sku, name, qty, bin}."""
        self.items = {}

    def _qty(self, sku, qty):
        if sku not in self.items:
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
        if sku not in self.items:
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
        text = rng.choice(["Receive {k} units of {a} into stock.", "A delivery of {k} units of item {a} arrived; add them to stock.",
                           "Add {k} units to the stock of {a}."]).format(k=k, a=a)
        return text, [qty_is(a, items[a]["qty"] + k)], [_call("add_stock", sku=a, qty=k)]

    def remove() -> tuple:
        k = rng.randint(1, items[a]["qty"])
        text = rng.choice(["Remove {k} units of {a} from stock; they are damaged.", "Take {k} units of {a} out of stock for an order.",
                           "Write off {k} units of item {a}."]).format(k=k, a=a)
        return text, [qty_is(a, items[a]["qty"] - k)], [_call("remove_stock", sku=a, qty=k)]

    def move() -> tuple:
        nb = new_bin(a)
        text = rng.choice(["Move item {a} to bin {nb}.", "Relocate {a} to bin {nb}.", "Store {a} in bin {nb} from now on."])
        return text.format(a=a, nb=nb), [bin_is(a, nb)], [_call("move_item", sku=a, bin=nb)]

    def find_add() -> tuple:
        k, name = rng.randint(2, 60), items[a]["name"]
        text = rng.choice(["Find the item named {name} and add {k} units to its stock.",
                           "We received {k} units of {name}; look up its SKU and add them to stock."]).format(k=k, name=name)
        calls = [_call("find_item", name=name), _call("add_stock", sku=a, qty=k)]
        return text, [qty_is(a, items[a]["qty"] + k)], calls

    def find_move() -> tuple:
        nb, name = new_bin(a), items[a]["name"]
        text = rng.choice(["Look up the SKU of the {name} and move it to bin {nb}.",
                           "The {name} should be kept in bin {nb}; find the item and move it."]).format(name=name, nb=nb)
        return text, [bin_is(a, nb)], [_call("find_item", name=name), _call("move_item", sku=a, bin=nb)]

    def two() -> tuple:
        k, m, nb = rng.randint(2, 60), rng.randint(1, items[b]["qty"]), new_bin(b)
        if rng.random() < 0.5:
            text = rng.choice(["Add {k} units of {a} and move {b} to bin {nb}.",
                               "Move {b} to bin {nb}, then receive {k} units of {a}."]).format(k=k, a=a, b=b, nb=nb)
            checks = [qty_is(a, items[a]["qty"] + k), bin_is(b, nb)]
            calls = [_call("add_stock", sku=a, qty=k), _call("move_item", sku=b, bin=nb)]
            if text.startswith("Move"):
                calls.reverse()
            return text, checks, calls
        text = rng.choice(["Add {k} units of {a} and remove {m} units of {b}.",
                           "Restock {a} with {k} units, and take {m} units of {b} out of stock."]).format(k=k, m=m, a=a, b=b)
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


# ----------------------------------------------------------------------------- shop orders

SHOP_CODE = '''\
class ShopOrders:
    def __init__(self, init_config: dict):
        """A web shop. State: products: sku -> {sku, name, stock};
        orders: order_id -> {order_id, customer, sku, qty, status} (pending | shipped | cancelled)."""
        self.products = {}
        self.orders = {}

    def find_orders(self, customer: str) -> dict:
        """Orders whose customer name contains ``customer`` (case-insensitive)."""
        q = str(customer).lower()
        return {"success": True, "data": [o for o in self.orders.values() if q in o["customer"].lower()]}

    def _pending(self, order_id):
        order = self.orders.get(order_id)
        if order is None:
            return None, f"unknown order {order_id}"
        if order["status"] != "pending":
            return None, f"order {order_id} is {order['status']}, not pending"
        return order, None

    def ship_order(self, order_id: str) -> dict:
        """Ship a pending order; takes its quantity out of the product's stock."""
        order, error = self._pending(order_id)
        if error:
            return {"success": False, "error": error}
        product = self.products[order["sku"]]
        if product["stock"] < order["qty"]:
            return {"success": False, "error": f"only {product['stock']} units of {order['sku']} in stock"}
        product["stock"] -= order["qty"]
        order["status"] = "shipped"
        return {"success": True, "data": order}

    def cancel_order(self, order_id: str) -> dict:
        """Cancel a pending order."""
        order, error = self._pending(order_id)
        if error:
            return {"success": False, "error": error}
        order["status"] = "cancelled"
        return {"success": True, "data": order}

    def restock(self, sku: str, qty: int) -> dict:
        """Add ``qty`` units to a product's stock."""
        if sku not in self.products:
            return {"success": False, "error": f"unknown sku {sku}"}
        if not isinstance(qty, int) or isinstance(qty, bool) or qty <= 0:
            return {"success": False, "error": "qty must be a positive integer"}
        self.products[sku]["stock"] += qty
        return {"success": True, "data": self.products[sku]}
'''

PRODUCTS = ["desk lamp", "wool scarf", "tea kettle", "yoga mat", "phone case", "water bottle", "backpack",
            "notebook", "umbrella", "coffee mug", "bike light", "face cream"]


def _shop_task(rng: random.Random) -> dict:
    skus = _ids(rng, "BCFGHLPS", rng.randint(3, 4))
    products = {s: {"sku": s, "name": nm, "stock": rng.randint(0, 40)} for s, nm in zip(skus, rng.sample(PRODUCTS, len(skus)))}
    n = rng.randint(4, 6)
    oids = _ids(rng, "O", n)
    customers = _people(rng, n)
    orders = {o: {"order_id": o, "customer": c, "sku": rng.choice(skus), "qty": rng.randint(1, 5),
                  "status": rng.choice(["pending", "pending", "shipped", "cancelled"])} for o, c in zip(oids, customers)}
    pending = [o for o in oids if orders[o]["status"] == "pending"]
    while len(pending) < 2:  # at least two pending orders, each shippable from stock
        o = rng.choice([x for x in oids if x not in pending])
        orders[o]["status"] = "pending"
        pending.append(o)
    for o in pending:
        products[orders[o]["sku"]]["stock"] = max(products[orders[o]["sku"]]["stock"], 6)
    a, b = rng.sample(pending, 2)
    sku = rng.choice(skus)

    def shipped(o: str, stock: int) -> dict:
        s = orders[o]["sku"]
        return _check(f"Is order {o} shipped, leaving {stock} units of {s}?",
                      f'final_state["orders"]["{o}"]["status"] == "shipped" and final_state["products"]["{s}"]["stock"] == {stock}')

    def cancelled(o: str) -> dict:
        return _check(f"Is order {o} cancelled?", f'final_state["orders"]["{o}"]["status"] == "cancelled"')

    def stock_is(s: str, stock: int) -> dict:
        return _check(f"Does {s} have {stock} units in stock?", f'final_state["products"]["{s}"]["stock"] == {stock}')

    def after_ship(o: str) -> int:
        return products[orders[o]["sku"]]["stock"] - orders[o]["qty"]

    def ship() -> tuple:
        text = rng.choice(["Ship order {a}.", "Order {a} is packed; mark it as shipped.", "Please send out order {a} today."])
        return text.format(a=a), [shipped(a, after_ship(a))], [_call("ship_order", order_id=a)]

    def cancel() -> tuple:
        text = rng.choice(["Cancel order {a}.", "The customer withdrew order {a}; cancel it.", "Order {a} was placed by mistake. Cancel it."])
        return text.format(a=a), [cancelled(a)], [_call("cancel_order", order_id=a)]

    def restock() -> tuple:
        k = rng.randint(5, 50)
        text = rng.choice(["Restock {s} with {k} units.", "Add {k} units of product {s} to stock.",
                           "A supplier delivered {k} units of {s}; restock it."]).format(s=sku, k=k)
        return text, [stock_is(sku, products[sku]["stock"] + k)], [_call("restock", sku=sku, qty=k)]

    def find_one() -> tuple:
        who = orders[a]["customer"]
        if rng.random() < 0.5:
            text = rng.choice(["{who} wants to cancel their pending order. Find it and cancel it.",
                               "Find the pending order of {who} and cancel it."]).format(who=who)
            return text, [cancelled(a)], [_call("find_orders", customer=who), _call("cancel_order", order_id=a)]
        text = rng.choice(["Find the pending order of {who} and ship it.",
                           "{who} is waiting for their pending order; look it up and ship it."]).format(who=who)
        return text, [shipped(a, after_ship(a))], [_call("find_orders", customer=who), _call("ship_order", order_id=a)]

    def two_orders() -> tuple:
        text = rng.choice(["Ship order {a} and cancel order {b}.", "Cancel order {b}, then ship order {a}."]).format(a=a, b=b)
        calls = [_call("ship_order", order_id=a), _call("cancel_order", order_id=b)]
        return text, [shipped(a, after_ship(a)), cancelled(b)], calls if text.startswith("Ship") else calls[::-1]

    def restock_cancel() -> tuple:
        k = rng.randint(5, 50)
        text = rng.choice(["Restock {s} with {k} units and cancel order {b}.",
                           "Cancel order {b}, and add {k} units of {s} to stock."]).format(s=sku, k=k, b=b)
        calls = [_call("restock", sku=sku, qty=k), _call("cancel_order", order_id=b)]
        checks = [stock_is(sku, products[sku]["stock"] + k), cancelled(b)]
        return text, checks, calls if text.startswith("Restock") else calls[::-1]

    text, checks, calls = _pick(rng, [ship, cancel, restock, find_one, two_orders, restock_cancel])()
    return {"init_config": {"products": products, "orders": orders}, "task": text,
            "checklist_with_func": checks, "reference_actions": calls}


SHOP = {
    "env_id": "bed_inventory_shop_orders",
    "env_class_name": "ShopOrders",
    "role": "main",
    "environment_introduction": "A web shop's order desk: customer orders for products, and product stock.",
    "constraints_rules": ["Only pending orders can be shipped or cancelled.", "Shipping takes the order's quantity from stock."],
    "tools": [
        _tool("find_orders", "Find orders by customer name.", customer="string"),
        _tool("ship_order", "Ship a pending order.", order_id="string"),
        _tool("cancel_order", "Cancel a pending order.", order_id="string"),
        _tool("restock", "Add units to a product's stock.", sku="string", qty="integer"),
    ],
    "env_class_code": SHOP_CODE,
    "make_task": _shop_task,
}

ENVS = [WAREHOUSE, SHOP]
