"""A web shop's orders and product stock (role "main").

One environment of the bed's inventory domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, people as _people, say as _say, pick as _pick


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
