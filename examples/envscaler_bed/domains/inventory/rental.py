"""An equipment rental desk (role "transfer", used by no train task).

One environment of the bed's inventory domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, people as _people, say as _say, pick as _pick


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
