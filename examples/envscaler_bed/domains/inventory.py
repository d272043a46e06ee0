"""Inventory and stock environments of the lopd study bed (lopd's own, in the EnvScaler format).

Four environments: a warehouse's stock, a web shop's orders, a restaurant pantry with supplier
orders (role "main"), and an equipment rental desk (role "transfer", used by no train task).
Each entry of :data:`ENVS` follows the bed's domain-module contract: the class source as a string,
terse tool schemas, and ``make_task(rng)`` returning a fresh initial state, the task text, check
functions and the reference tool calls. Stdlib only.
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


# ----------------------------------------------------------------------------- warehouse

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
        order = self.orders.get(str(order_id))
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
        if str(sku) not in self.products:
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
    products = {s: {"sku": s, "name": nm, "stock": rng.randint(0, 40)}
                for s, nm in zip(skus, rng.sample(PRODUCTS, len(skus)))}
    n = rng.randint(4, 6)
    oids = _ids(rng, "O", n)
    customers = _people(rng, n)
    orders = {o: {"order_id": o, "customer": c, "sku": rng.choice(skus), "qty": rng.randint(1, 5),
                  "status": rng.choice(["pending", "pending", "shipped", "cancelled"])}
              for o, c in zip(oids, customers)}
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
                      f'final_state["orders"]["{o}"]["status"] == "shipped" and '
                      f'final_state["products"]["{s}"]["stock"] == {stock}')

    def cancelled(o: str) -> dict:
        return _check(f"Is order {o} cancelled?", f'final_state["orders"]["{o}"]["status"] == "cancelled"')

    def stock_is(s: str, stock: int) -> dict:
        return _check(f"Does {s} have {stock} units in stock?", f'final_state["products"]["{s}"]["stock"] == {stock}')

    def after_ship(o: str) -> int:
        return products[orders[o]["sku"]]["stock"] - orders[o]["qty"]

    def ship() -> tuple:
        text = _say(rng, ["Ship order {a}.", "Order {a} is packed; mark it as shipped.",
                          "Please send out order {a} today.", "Mark order {a} as shipped; it leaves the shop today."], a=a)
        return text, [shipped(a, after_ship(a))], [_call("ship_order", order_id=a)]

    def cancel() -> tuple:
        text = _say(rng, ["Cancel order {a}.", "The customer withdrew order {a}; cancel it.",
                          "Order {a} was placed by mistake. Cancel it.", "Call off order {a}."], a=a)
        return text, [cancelled(a)], [_call("cancel_order", order_id=a)]

    def restock() -> tuple:
        k = rng.randint(5, 50)
        text = _say(rng, ["Restock {s} with {k} units.", "Add {k} units of product {s} to stock.",
                           "A supplier delivered {k} units of {s}; restock it.", "Product {s} gets {k} more units in stock."], s=sku, k=k)
        return text, [stock_is(sku, products[sku]["stock"] + k)], [_call("restock", sku=sku, qty=k)]

    def find_one() -> tuple:
        who = orders[a]["customer"]
        if rng.random() < 0.5:
            text = _say(rng, ["{who} wants to cancel their pending order. Find it and cancel it.",
                               "Find the pending order of {who} and cancel it.", "Search the orders of {who}; cancel the one that is still pending.", "The pending order placed by {who} must be cancelled. Look it up first."], who=who)
            return text, [cancelled(a)], [_call("find_orders", customer=who), _call("cancel_order", order_id=a)]
        text = _say(rng, ["Find the pending order of {who} and ship it.",
                           "{who} is waiting for their pending order; look it up and ship it.", "Search for the orders of {who} and send out the one that is pending.", "Ship the pending order of {who}. You need its order id first."], who=who)
        calls = [_call("find_orders", customer=who), _call("ship_order", order_id=a)]
        return text, [shipped(a, after_ship(a))], calls

    def two_orders() -> tuple:
        text = _say(rng, ["Ship order {a} and cancel order {b}.", "Cancel order {b}, then ship order {a}.", "Two order changes: {a} is shipped and {b} is cancelled.", "Order {a} leaves today. Order {b} is called off."], a=a, b=b)
        calls = [_call("ship_order", order_id=a), _call("cancel_order", order_id=b)]
        return text, [shipped(a, after_ship(a)), cancelled(b)], calls if text.startswith("Ship") else calls[::-1]

    def restock_cancel() -> tuple:
        k = rng.randint(5, 50)
        text = _say(rng, ["Restock {s} with {k} units and cancel order {b}.",
                           "Cancel order {b}, and add {k} units of {s} to stock.", "Two jobs: cancel order {b}; product {s} gets {k} more units.", "Product {s} was delivered: {k} units. Also, order {b} is cancelled."], s=sku, k=k, b=b)
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
    "constraints_rules": ["Only pending orders can be shipped or cancelled.",
                          "Shipping takes the order's quantity from stock."],
    "tools": [
        _tool("find_orders", "Find orders by customer name.", customer="string"),
        _tool("ship_order", "Ship a pending order.", order_id="string"),
        _tool("cancel_order", "Cancel a pending order.", order_id="string"),
        _tool("restock", "Add units to a product's stock.", sku="string", qty="integer"),
    ],
    "env_class_code": SHOP_CODE,
    "make_task": _shop_task,
}


# ----------------------------------------------------------------------------- restaurant pantry

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


# ----------------------------------------------------------------------------- equipment rental (transfer)

RENTAL_CODE = '''\
class EquipmentRental:
    def __init__(self, init_config: dict):
        """An equipment rental desk. State: equipment: item_id -> {item_id, name, status, renter}
        (status available | rented | repair); customers: customer_id -> {customer_id, name}."""
        self.equipment = {}
        self.customers = {}

    def find_equipment(self, name: str) -> dict:
        """Equipment whose name contains ``name`` (case-insensitive)."""
        q = str(name).lower()
        return {"success": True, "data": [e for e in self.equipment.values() if q in e["name"].lower()]}

    def rent_out(self, item_id: str, customer_id: str) -> dict:
        """Rent an available item to a customer."""
        item = self.equipment.get(str(item_id))
        if item is None:
            return {"success": False, "error": f"unknown item {item_id}"}
        if str(customer_id) not in self.customers:
            return {"success": False, "error": f"unknown customer {customer_id}"}
        if item["status"] != "available":
            return {"success": False, "error": f"item {item_id} is {item['status']}"}
        item["status"], item["renter"] = "rented", customer_id
        return {"success": True, "data": item}

    def check_in(self, item_id: str) -> dict:
        """Take back a rented item; it becomes available."""
        item = self.equipment.get(str(item_id))
        if item is None:
            return {"success": False, "error": f"unknown item {item_id}"}
        if item["status"] != "rented":
            return {"success": False, "error": f"item {item_id} is not rented"}
        item["status"], item["renter"] = "available", None
        return {"success": True, "data": item}

    def send_to_repair(self, item_id: str) -> dict:
        """Send an item that is not rented out to repair."""
        item = self.equipment.get(str(item_id))
        if item is None:
            return {"success": False, "error": f"unknown item {item_id}"}
        if item["status"] != "available":
            return {"success": False, "error": f"item {item_id} is {item['status']}, not available"}
        item["status"] = "repair"
        return {"success": True, "data": item}
'''

EQUIPMENT = ["concrete mixer", "pressure washer", "chainsaw", "ladder", "generator", "floor sander", "tile cutter",
             "hedge trimmer", "scaffold tower", "carpet cleaner", "jackhammer", "leaf blower"]


def _rental_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    item_ids = _ids(rng, "E", n)
    cust_ids = _ids(rng, "C", rng.randint(3, 4), digits=2)
    customers = {c: {"customer_id": c, "name": nm} for c, nm in zip(cust_ids, _people(rng, len(cust_ids)))}
    equipment = {}
    for i, (e, nm) in enumerate(zip(item_ids, rng.sample(EQUIPMENT, n))):
        status = ["available", "rented"][i % 2] if i < 4 else rng.choice(["available", "rented", "repair"])
        renter = rng.choice(cust_ids) if status == "rented" else None
        equipment[e] = {"item_id": e, "name": nm, "status": status, "renter": renter}
    free = [e for e in item_ids if equipment[e]["status"] == "available"]
    rented = [e for e in item_ids if equipment[e]["status"] == "rented"]
    a, r, c = rng.choice(free), rng.choice(rented), rng.choice(cust_ids)

    def rented_to(e: str, cust: str) -> dict:
        return _check(f"Is {e} rented to {cust}?",
                      f'final_state["equipment"]["{e}"]["status"] == "rented" and '
                      f'final_state["equipment"]["{e}"]["renter"] == "{cust}"')

    def status_is(e: str, status: str) -> dict:
        return _check(f"Is {e} {status}?", f'final_state["equipment"]["{e}"]["status"] == "{status}"')

    def rent() -> tuple:
        text = _say(rng, ["Rent item {a} to customer {c}.", "Customer {c} takes item {a}; rent it out to them."],
                    a=a, c=c)
        return text, [rented_to(a, c)], [_call("rent_out", item_id=a, customer_id=c)]

    def back() -> tuple:
        text = _say(rng, ["Item {r} was brought back; check it in.", "Check in the returned item {r}."], r=r)
        return text, [status_is(r, "available")], [_call("check_in", item_id=r)]

    def repair() -> tuple:
        text = _say(rng, ["Item {a} is broken; send it to repair.", "Send item {a} to the repair shop."], a=a)
        return text, [status_is(a, "repair")], [_call("send_to_repair", item_id=a)]

    def find_rent() -> tuple:
        name = equipment[a]["name"]
        text = _say(rng, ["Customer {c} wants the {name}. Find it and rent it to them.",
                           "Look up the {name} and rent it out to customer {c}."], c=c, name=name)
        calls = [_call("find_equipment", name=name), _call("rent_out", item_id=a, customer_id=c)]
        return text, [rented_to(a, c)], calls

    def back_repair() -> tuple:
        text = _say(rng, ["Item {r} came back damaged: check it in and send it to repair.",
                           "Check in item {r}, then send it to repair."], r=r)
        checks = [_check(f"Is {r} no longer rented?", f'final_state["equipment"]["{r}"]["renter"] is None'),
                  status_is(r, "repair")]
        return text, checks, [_call("check_in", item_id=r), _call("send_to_repair", item_id=r)]

    def back_rent() -> tuple:
        text = _say(rng, ["Check in item {r} and rent item {a} to customer {c}.",
                           "Rent {a} to customer {c}, and check in the returned item {r}."], r=r, a=a, c=c)
        calls = [_call("check_in", item_id=r), _call("rent_out", item_id=a, customer_id=c)]
        return text, [status_is(r, "available"), rented_to(a, c)], calls if text.startswith("Check") else calls[::-1]

    text, checks, calls = _pick(rng, [rent, back, repair, find_rent, back_repair, back_rent])()
    return {"init_config": {"equipment": equipment, "customers": customers}, "task": text,
            "checklist_with_func": checks, "reference_actions": calls}


RENTAL = {
    "env_id": "bed_inventory_rental",
    "env_class_name": "EquipmentRental",
    "role": "transfer",
    "environment_introduction": "An equipment rental desk: tools and machines rented out to customers.",
    "constraints_rules": ["Only available items can be rented out or sent to repair."],
    "tools": [
        _tool("find_equipment", "Find equipment by name.", name="string"),
        _tool("rent_out", "Rent an item to a customer.", item_id="string", customer_id="string"),
        _tool("check_in", "Take back a rented item.", item_id="string"),
        _tool("send_to_repair", "Send an item to repair.", item_id="string"),
    ],
    "env_class_code": RENTAL_CODE,
    "make_task": _rental_task,
}

ENVS = [WAREHOUSE, SHOP, PANTRY, RENTAL]
