"""A home's thermostats, one per room: targets and modes (role "main").

One environment of the bed's smart-home domain (see ``__init__``). Stdlib only.
"""
from domains._common import call as _call, check as _check, tool as _tool, report_tool as _report_tool
from ._draws import pick as _pick


THERMO_CODE = '''from typing import Dict


class ThermostatHub:
    def __init__(self, init_config: dict):
        """One thermostat per room. State: rooms: room_id -> {room_id, name, target (celsius), mode}."""
        self.rooms: Dict[str, dict] = {}

    def get_room(self, room_id: str) -> dict:
        """One room's thermostat."""
        if (err := self._unknown(room_id)):
            return err
        return {"success": True, "data": dict(self.rooms[room_id])}

    def find_room(self, name: str) -> dict:
        """Rooms whose name contains ``name`` (case-insensitive)."""
        if not isinstance(name, str) or not name.strip():
            return {"success": False, "error": "name must be a non-empty string"}
        hits = [dict(r) for r in self.rooms.values() if name.strip().lower() in r["name"].lower()]
        if not hits:
            return {"success": False, "error": "no room named " + repr(name)}
        return {"success": True, "data": hits}

    def _unknown(self, room_id):
        if isinstance(room_id, str) and room_id in self.rooms:
            return None
        return {"success": False, "error": "unknown room " + repr(room_id)}

    def set_temperature(self, room_id: str, celsius: int) -> dict:
        """Set a room's target temperature (whole degrees, 10-30)."""
        if (err := self._unknown(room_id)):
            return err
        if isinstance(celsius, bool) or not isinstance(celsius, (int, float)) or not 10 <= celsius <= 30:
            return {"success": False, "error": "celsius must be a number from 10 to 30"}
        if celsius != int(celsius):
            return {"success": False, "error": "celsius must be a whole number"}
        self.rooms[room_id]["target"] = int(celsius)
        return {"success": True, "data": dict(self.rooms[room_id])}

    def set_mode(self, room_id: str, mode: str) -> dict:
        """Set a room's mode: heat, cool, auto or off."""
        if (err := self._unknown(room_id)):
            return err
        if mode not in ("heat", "cool", "auto", "off"):
            return {"success": False, "error": "mode must be heat, cool, auto or off"}
        self.rooms[room_id]["mode"] = mode
        return {"success": True, "data": dict(self.rooms[room_id])}
'''
THERMO_REPORT = _report_tool("rooms", "room_id", "room")  # an extra tool no task needs

THERMO_NAMES = ["kitchen", "living room", "nursery", "office", "bathroom", "guest room", "den", "attic",
                "gym", "hallway", "studio", "laundry", "cellar", "library"]
MODES = ["heat", "cool", "auto", "off"]


def _target_is(rid, t):
    return _check(f"Is the target of {rid} {t} degrees?", f"final_state['rooms'][{rid!r}]['target'] == {t}")


def _mode_is(rid, mode):
    return _check(f"Is {rid} in {mode} mode?", f"final_state['rooms'][{rid!r}]['mode'] == {mode!r}")


def _mode_text(rng, rid, mode):
    if mode == "off":
        return rng.choice(["Turn the thermostat in {r} off.", "Switch room {r} to off mode.", "Room {r} needs no heating or cooling now; set its mode to off.", "Shut the thermostat of room {r} off."]).format(r=rid)
    return rng.choice(["Switch room {r} to {m} mode.", "Put the thermostat of {r} in {m} mode.",
                       "Set the mode of room {r} to {m}.", "Room {r} should run in {m} mode."]).format(r=rid, m=mode)


def thermostat_task(rng):
    """A thermostat task: set temperature or mode by room id, or by room name (find_room first)."""
    n = rng.randint(4, 6)
    rids = [f"R-{k}" for k in rng.sample([f * 100 + r for f in (1, 2, 3) for r in range(1, 30)], n)]
    names = rng.sample(THERMO_NAMES, n)
    rooms = {rid: {"room_id": rid, "name": name, "target": rng.randint(17, 24), "mode": rng.choice(MODES)}
             for rid, name in zip(rids, names)}
    rid, other = rng.sample(rids, 2)
    room = rooms[rid]
    new_t = rng.choice([t for t in range(16, 27) if t != room["target"]])
    new_mode = rng.choice([m for m in MODES if m != room["mode"]])
    kind = _pick(rng, {"temp": 2.5, "mode": 2.5, "name_temp": 1.5, "relative": 1, "relative_id": 0.7,
                       "temp_mode": 1, "two_temps": 1})
    if kind == "temp":
        text = rng.choice(["Set the thermostat in room {r} to {t} degrees.",
                           "Change the target temperature of {r} to {t}.",
                           "Room {r} should be kept at {t} degrees.", "Make {t} degrees the target of room {r}."]).format(r=rid, t=new_t)
        checks, actions = [_target_is(rid, new_t)], [_call("set_temperature", room_id=rid, celsius=new_t)]
    elif kind == "mode":
        text = _mode_text(rng, rid, new_mode)
        checks, actions = [_mode_is(rid, new_mode)], [_call("set_mode", room_id=rid, mode=new_mode)]
    elif kind == "name_temp":
        text = rng.choice(["Set the {n} to {t} degrees.", "Please make the {n} {t} degrees.",
                           "Change the {n} thermostat to {t} degrees.", "Look up the {n} and give it a target of {t} degrees."]).format(n=room["name"], t=new_t)
        checks = [_target_is(rid, new_t)]
        actions = [_call("find_room", name=room["name"]), _call("set_temperature", room_id=rid, celsius=new_t)]
    elif kind in ("relative", "relative_id"):  # read the current target first
        d = rng.randint(1, 3) * rng.choice([1, -1])
        deg = f"{abs(d)} degree" + ("s" if abs(d) > 1 else "")
        if kind == "relative":
            text = (rng.choice(["Raise the {n} temperature by {d}.", "The {n} is cold: turn it up {d}.", "Find the {n} and raise its target by {d}.", "Make the {n} warmer by {d}; check its target first."])
                    if d > 0 else
                    rng.choice(["Lower the {n} temperature by {d}.", "The {n} is too warm: turn it down {d}.", "Find the {n} and lower its target by {d}.", "Make the {n} cooler by {d}; check its target first."])
                    ).format(n=room["name"], d=deg)
            actions = [_call("find_room", name=room["name"])]
        else:
            text = rng.choice(["Raise the target of room {r} by {d}." if d > 0 else
                               "Lower the target of room {r} by {d}.",
                               "Change room {r}'s temperature by {s}."]).format(r=rid, d=deg, s=f"{d:+d}" + deg[1:])
            actions = [_call("get_room", room_id=rid)]
        checks = [_target_is(rid, room["target"] + d)]
        actions.append(_call("set_temperature", room_id=rid, celsius=room["target"] + d))
    elif kind == "temp_mode":
        if new_mode == "off":
            new_mode = rng.choice([m for m in MODES if m not in ("off", room["mode"])])
        text = rng.choice(["Set room {r} to {t} degrees and switch it to {m} mode.",
                           "Put room {r} in {m} mode at {t} degrees.", "Two thermostat changes for room {r}: target {t} degrees, mode {m}.", "Room {r} should run in {m} mode with a target of {t} degrees."]).format(r=rid, t=new_t, m=new_mode)
        checks = [_target_is(rid, new_t), _mode_is(rid, new_mode)]
        actions = [_call("set_temperature", room_id=rid, celsius=new_t), _call("set_mode", room_id=rid, mode=new_mode)]
    else:
        t2 = rng.choice([t for t in range(16, 27) if t != rooms[other]["target"]])
        text = rng.choice(["Set room {a} to {t} degrees and room {b} to {u} degrees.",
                           "Change the thermostats: {a} to {t} degrees, {b} to {u} degrees.", "Two targets change: room {b} gets {u} degrees and room {a} gets {t} degrees.", "Room {a} should be at {t} degrees. Room {b} should be at {u} degrees."]
                          ).format(a=rid, t=new_t, b=other, u=t2)
        checks = [_target_is(rid, new_t), _target_is(other, t2)]
        actions = [_call("set_temperature", room_id=rid, celsius=new_t),
                   _call("set_temperature", room_id=other, celsius=t2)]
    return {"init_config": {"rooms": rooms}, "task": text, "checklist_with_func": checks, "reference_actions": actions}


THERMOSTATS = {
    "env_id": "bed_smart_home_thermostats",
    "env_class_name": "ThermostatHub",
    "role": "main",
    "environment_introduction": "A smart home's thermostats, one per room; room ids look like R-204.",
    "constraints_rules": ["Temperatures are whole degrees Celsius from 10 to 30."],
    "tools": [
        _tool("get_room", "Show one room's thermostat.", room_id="string"),
        _tool("find_room", "Find rooms by name.", name="string"),
        _tool("set_temperature", "Set a room's target temperature.", room_id="string", celsius="integer"),
        _tool("set_mode", "Set a room's mode: heat, cool, auto or off.", room_id="string", mode="string"),
        THERMO_REPORT[1],
    ],
    "env_class_code": THERMO_CODE + THERMO_REPORT[0],
    "make_task": thermostat_task,
}
