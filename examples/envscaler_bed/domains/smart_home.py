"""Smart-home domain of the lopd study bed: lights, thermostats, door security (main) and garden
irrigation (transfer). Each entry of ENVS follows the bed's domain-module contract (stdlib only)."""

from domains._common import (call as _call, check as _check, tool as _tool,
                             report_tool as _report_tool)


def _pick(rng, weighted):
    """One key of ``weighted`` (key -> weight), drawn with ``rng``."""
    keys = list(weighted)
    return rng.choices(keys, weights=[weighted[k] for k in keys])[0]


def _ids(rng, prefix, lo, hi, n):
    """``n`` distinct ids like ``L-12`` with numbers in [lo, hi]."""
    return [f"{prefix}-{k}" for k in rng.sample(range(lo, hi + 1), n)]


# ----------------------------------------------------------------------------- lights

LIGHTS_CODE = '''from typing import Dict


class SmartLights:
    def __init__(self, init_config: dict):
        """Lights of a home. State: lights: light_id -> {light_id, room, on, brightness (1-100)}."""
        self.lights: Dict[str, dict] = {}

    def _switch(self, light_id, on):
        if not isinstance(light_id, str) or light_id not in self.lights:
            return {"success": False, "error": "unknown light " + repr(light_id)}
        self.lights[light_id]["on"] = on
        return {"success": True, "data": dict(self.lights[light_id])}

    def list_lights(self, room: str) -> dict:
        """The lights whose room equals ``room`` (case-insensitive)."""
        if not isinstance(room, str):
            return {"success": False, "error": "room must be a string"}
        hits = [dict(v) for v in self.lights.values() if v["room"].lower() == room.strip().lower()]
        if not hits:
            return {"success": False, "error": "no lights in room " + repr(room)}
        return {"success": True, "data": hits}

    def turn_on(self, light_id: str) -> dict:
        """Switch a light on (keeps its brightness)."""
        return self._switch(light_id, True)

    def turn_off(self, light_id: str) -> dict:
        """Switch a light off."""
        return self._switch(light_id, False)

    def set_brightness(self, light_id: str, level: int) -> dict:
        """Set the brightness (integer 1-100); the light is switched on."""
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 100:
            return {"success": False, "error": "level must be an integer from 1 to 100"}
        result = self._switch(light_id, True)
        if result["success"]:
            self.lights[light_id]["brightness"] = result["data"]["brightness"] = level
        return result
'''

HOME_ROOMS = ["kitchen", "hallway", "bedroom", "office", "porch", "garage", "bathroom", "dining room",
              "study", "nursery", "attic", "den", "laundry", "playroom"]


def _light_off(lid):
    return _check(f"Is light {lid} off?", f"final_state['lights'][{lid!r}]['on'] is False")


def _light_on(lid, level):
    """Light ``lid`` is on at brightness ``level`` (for a plain switch-on: its unchanged brightness)."""
    return _check(f"Is light {lid} on at brightness {level}?",
                  f"final_state['lights'][{lid!r}]['on'] is True"
                  f" and final_state['lights'][{lid!r}]['brightness'] == {level}")


def _new_level(rng, light):
    return rng.choice([v for v in range(5, 100, 5) if v != light["brightness"]])


def lights_task(rng):
    """A lights task: switch or dim lights by id, or by room (list_lights first)."""
    rooms = rng.sample(HOME_ROOMS, 4)
    ids = _ids(rng, "L", 1, 99, rng.randint(5, 7))
    lights = {}
    for i, lid in enumerate(ids):  # rooms[0] holds two lights, rooms[1] exactly one
        room = rooms[0] if i < 2 else rooms[1] if i == 2 else rng.choice(rooms[2:])
        lights[lid] = {"light_id": lid, "room": room, "on": rng.random() < 0.5,
                       "brightness": rng.choice(range(10, 101, 10))}
    pair, single, others = ids[:2], ids[2], ids[3:]
    kind = _pick(rng, {"off": 2, "on": 2, "level": 2.5, "room_level": 1.5, "room_switch": 1,
                       "room_all_off": 1.5, "two": 1.5})
    if kind in ("off", "on"):
        lid = rng.choice(ids)
        lights[lid]["on"] = kind == "off"
        texts = (["Turn off light {l}.", "Please switch off the light {l}.", "Light {l} is still on. Turn it off.", "Light {l} should be dark now."]
                 if kind == "off" else
                 ["Turn on light {l}.", "Switch light {l} on, please.", "Could you turn on the light {l}?", "I need light {l} on."])
        text = rng.choice(texts).format(l=lid)
        checks = [_light_on(lid, lights[lid]["brightness"]) if kind == "on" else _light_off(lid)]
        actions = [_call("turn_" + kind, light_id=lid)]
    elif kind == "level":
        lid = rng.choice(ids)
        v = _new_level(rng, lights[lid])
        text = rng.choice(["Set light {l} to {v}% brightness.", "Change the brightness of light {l} to {v}.",
                           "Put light {l} at brightness {v}.", "Dim or brighten light {l} until it is at {v}%."]).format(l=lid, v=v)
        checks, actions = [_light_on(lid, v)], [_call("set_brightness", light_id=lid, level=v)]
    elif kind == "room_level":
        v = _new_level(rng, lights[single])
        text = rng.choice(["Set the {r} light to {v}% brightness.", "Make the light in the {r} {v}% bright.",
                           "Change the brightness of the {r} light to {v}.", "The {r} needs its light at {v}% brightness; list the lights there and adjust it."]).format(r=rooms[1], v=v)
        checks = [_light_on(single, v)]
        actions = [_call("list_lights", room=rooms[1]), _call("set_brightness", light_id=single, level=v)]
    elif kind == "room_switch":
        on = not lights[single]["on"]
        texts = (["Turn on the light in the {r}.", "Switch on the {r} light, please.", "It is dark in the {r}. Find its light and switch it on.", "Look up the light of the {r} and turn it on."] if on else
                 ["Turn off the light in the {r}.", "The {r} light is on; switch it off.", "Find the light of the {r} and switch it off.", "Nobody needs the {r} light any more. Look it up and turn it off."])
        text = rng.choice(texts).format(r=rooms[1])
        checks = [_light_on(single, lights[single]["brightness"]) if on else _light_off(single)]
        actions = [_call("list_lights", room=rooms[1]), _call("turn_" + ("on" if on else "off"), light_id=single)]
    elif kind == "room_all_off":
        for lid in pair:
            lights[lid]["on"] = True
        text = rng.choice(["Turn off all the lights in the {r}.", "Switch off every light in the {r}.",
                           "Nobody is in the {r}: turn its lights off.", "Every lamp of the {r} should be off. List them and switch each off."]).format(r=rooms[0])
        checks = [_light_off(lid) for lid in pair]
        actions = [_call("list_lights", room=rooms[0])] + [_call("turn_off", light_id=lid) for lid in pair]
    else:  # two changes by id
        a, b = rng.sample(others + [single], 2)
        lights[a]["on"] = False
        v = _new_level(rng, lights[b])
        text = rng.choice(["Turn on light {a} and set light {b} to {v}% brightness.",
                           "Switch {a} on, then change the brightness of {b} to {v}.", "Two light changes: {b} goes to {v}% brightness and {a} is switched on.", "Light {a} must be on. Light {b} should shine at {v}%."]).format(a=a, b=b, v=v)
        checks = [_light_on(a, lights[a]["brightness"]), _light_on(b, v)]
        actions = [_call("turn_on", light_id=a), _call("set_brightness", light_id=b, level=v)]
    order = ids[:]
    rng.shuffle(order)
    return {"init_config": {"lights": {lid: lights[lid] for lid in order}}, "task": text,
            "checklist_with_func": checks, "reference_actions": actions}


# ----------------------------------------------------------------------------- thermostats

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


# ----------------------------------------------------------------------------- door security

SECURITY_CODE = '''from typing import Dict


class HomeSecurity:
    def __init__(self, init_config: dict):
        """Door locks and an alarm. State: doors: door_id -> {door_id, name, locked};
        alarm: "off" | "home" | "away"; codes: user name -> 4-digit code (str)."""
        self.doors: Dict[str, dict] = {}
        self.alarm: str = "off"
        self.codes: Dict[str, str] = {}

    def list_doors(self) -> dict:
        """All doors with their lock state."""
        return {"success": True, "data": [dict(d) for d in self.doors.values()]}

    def _set_lock(self, door_id, locked):
        if not isinstance(door_id, str) or door_id not in self.doors:
            return {"success": False, "error": "unknown door " + repr(door_id)}
        self.doors[door_id]["locked"] = locked
        return {"success": True, "data": dict(self.doors[door_id])}

    def lock_door(self, door_id: str) -> dict:
        """Lock a door."""
        return self._set_lock(door_id, True)

    def unlock_door(self, door_id: str) -> dict:
        """Unlock a door."""
        return self._set_lock(door_id, False)

    def add_code(self, user: str, code: str) -> dict:
        """Give ``user`` a 4-digit code (replaces their old one)."""
        if isinstance(code, int) and not isinstance(code, bool):
            code = str(code)
        if not isinstance(user, str) or not user.strip():
            return {"success": False, "error": "user must be a non-empty string"}
        if not isinstance(code, str) or len(code) != 4 or not code.isdigit():
            return {"success": False, "error": "code must be 4 digits"}
        self.codes[user.strip()] = code
        return {"success": True, "data": {"user": user.strip()}}

    def set_alarm(self, mode: str, code: str) -> dict:
        """Set the alarm mode (off, home or away); ``code`` must be one of the user codes."""
        if mode not in ("off", "home", "away"):
            return {"success": False, "error": "mode must be off, home or away"}
        if isinstance(code, int) and not isinstance(code, bool):
            code = str(code)
        if not isinstance(code, str) or code not in self.codes.values():
            return {"success": False, "error": "wrong code"}
        self.alarm = mode
        return {"success": True, "data": {"alarm": mode}}
'''

DOOR_NAMES = ["front door", "back door", "garage door", "patio door", "side gate", "cellar door", "shed door",
              "balcony door", "kitchen door", "porch door"]
USERS = ["Maya", "Omar", "Lena", "Ravi", "Sofia", "Tom", "Nina", "Igor", "Zoe", "Ken", "Aisha", "Pablo"]


def _locked_is(did, locked):
    return _check(f"Is door {did} {'locked' if locked else 'unlocked'}?",
                  f"final_state['doors'][{did!r}]['locked'] is {locked}")


def _alarm_is(mode):
    return _check(f"Is the alarm in {mode} mode?", f"final_state['alarm'] == {mode!r}")


def _code_is(user, code):
    return _check(f"Is {user}'s code {code}?", f"final_state['codes'].get({user!r}) == {code!r}")


def _alarm_text(rng, mode, user, code):
    if mode == "off":
        return rng.choice(["Switch the alarm off using code {c}.", "Disarm the alarm; {u}'s code is {c}.", "Turn the alarm off. The code to use is {c}.", "The alarm must be off; use {u}'s code {c}."]
                          ).format(u=user, c=code)
    return rng.choice(["Set the alarm to {m} mode with code {c}.", "Arm the alarm in {m} mode; {u}'s code is {c}.",
                       "Use code {c} to put the alarm in {m} mode.", "The alarm should be in {m} mode; the code is {c}."]).format(m=mode, u=user, c=code)


def security_task(rng):
    """A security task: lock/unlock doors by id or name (list_doors first), add user codes, set the alarm
    with a code."""
    n = rng.randint(4, 6)
    dids = _ids(rng, "D", 1, 99, n)
    doors = {did: {"door_id": did, "name": name, "locked": rng.random() < 0.5}
             for did, name in zip(dids, rng.sample(DOOR_NAMES, n))}
    users = rng.sample(USERS, rng.randint(2, 4))
    codes = {u: str(c) for u, c in zip(users, rng.sample(range(1000, 10000), len(users)))}
    alarm = rng.choice(["off", "home", "away"])
    did = rng.choice(dids)
    door = doors[did]
    user = rng.choice(users)
    mode = rng.choice([m for m in ("off", "home", "away") if m != alarm])
    new_user = rng.choice([u for u in USERS if u not in users])
    new_code = str(rng.choice([c for c in range(1000, 10000) if str(c) not in codes.values()]))
    kind = _pick(rng, {"lock": 2, "unlock": 1.5, "alarm": 1.5, "code": 1.5, "name_lock": 2, "door_alarm": 1.5,
                       "name_alarm": 1, "code_alarm": 1})
    if kind in ("lock", "unlock", "name_lock"):
        lock = kind != "unlock" if kind != "name_lock" else rng.random() < 0.6
        door["locked"] = not lock
        if kind == "name_lock":
            texts = (["Lock the {n}.", "Make sure the {n} is locked.", "Please lock the {n} for the night.", "List the doors and lock the {n}."] if lock
                     else ["Unlock the {n}.", "Unlock the {n} for the delivery.", "Please open the lock of the {n}.", "List the doors and unlock the {n}."])
        else:
            texts = (["Lock door {d}.", "Please lock the door {d}.", "Door {d} is unlocked. Lock it.", "Secure door {d} by locking it."] if lock
                     else ["Unlock door {d}.", "Please unlock {d} for the plumber.",
                           "Unlock the door {d}; a guest is arriving.", "Open the lock of door {d}."])
        text = rng.choice(texts).format(d=did, n=door["name"])
        checks = [_locked_is(did, lock)]
        actions = [_call("lock_door" if lock else "unlock_door", door_id=did)]
        if kind == "name_lock":
            actions.insert(0, _call("list_doors"))
    elif kind == "alarm":
        text = _alarm_text(rng, mode, user, codes[user])
        checks, actions = [_alarm_is(mode)], [_call("set_alarm", mode=mode, code=codes[user])]
    elif kind == "code":
        who = rng.choice([new_user, user])
        texts = (["Give {u} the door code {c}.", "Add a user code {c} for {u}.", "{u} is moving in; their code is {c}.", "Register code {c} as the code of {u}."]
                 if who == new_user else ["Change {u}'s code to {c}.", "Set a new code for {u}: {c}.", "{u} will use the code {c} from now on.", "Replace the code of {u} with {c}."])
        text = rng.choice(texts).format(u=who, c=new_code)
        checks, actions = [_code_is(who, new_code)], [_call("add_code", user=who, code=new_code)]
    elif kind == "code_alarm":
        mode = rng.choice([m for m in ("home", "away") if m != alarm])
        text = rng.choice(["Add code {c} for {u}, then use it to set the alarm to {m} mode.",
                           "Give {u} the code {c} and arm the alarm in {m} mode with it.", "Two jobs: {u} gets code {c}, and that code sets the alarm to {m} mode.", "Register {c} for {u}. Then the alarm goes to {m} mode with that code."]
                          ).format(u=new_user, c=new_code, m=mode)
        checks = [_code_is(new_user, new_code), _alarm_is(mode)]
        actions = [_call("add_code", user=new_user, code=new_code), _call("set_alarm", mode=mode, code=new_code)]
    else:  # lock a door (by id, or by name after list_doors) and arm the alarm
        door["locked"] = False
        mode = rng.choice([m for m in ("home", "away") if m != alarm])
        if kind == "door_alarm":
            text = rng.choice(["Lock door {d} and set the alarm to {m} mode with code {c}.",
                               "Lock {d}, then put the alarm in {m} mode (code {c}).", "Two jobs: door {d} is locked and the alarm goes to {m} mode with code {c}.", "With code {c}, arm the alarm in {m} mode. Door {d} must be locked too."]
                              ).format(d=did, m=mode, c=codes[user])
            actions = [_call("lock_door", door_id=did)]
        else:
            text = rng.choice(["Lock the {n} and set the alarm to {m} mode; the code is {c}.",
                               "Lock the {n}, then use code {c} to put the alarm in {m} mode.", "Find the {n} and lock it; the alarm then goes to {m} mode with code {c}.", "Two jobs: the {n} is locked, and code {c} arms the alarm in {m} mode."]
                              ).format(n=door["name"], m=mode, c=codes[user])
            actions = [_call("list_doors"), _call("lock_door", door_id=did)]
        checks = [_locked_is(did, True), _alarm_is(mode)]
        actions.append(_call("set_alarm", mode=mode, code=codes[user]))
    return {"init_config": {"doors": doors, "alarm": alarm, "codes": codes}, "task": text,
            "checklist_with_func": checks, "reference_actions": actions}


# ----------------------------------------------------------------------------- irrigation (transfer)

IRRIGATION_CODE = '''from typing import Dict, List


class GardenIrrigation:
    def __init__(self, init_config: dict):
        """Garden watering zones. State: zones: zone_id -> {zone_id, name, minutes (daily), enabled};
        runs: manual runs [{zone_id, minutes}] in order."""
        self.zones: Dict[str, dict] = {}
        self.runs: List[dict] = []

    def _invalid(self, zone_id, minutes=1):
        if not isinstance(zone_id, str) or zone_id not in self.zones:
            return {"success": False, "error": "unknown zone " + repr(zone_id)}
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 60:
            return {"success": False, "error": "minutes must be an integer from 1 to 60"}
        return None

    def list_zones(self) -> dict:
        """All zones."""
        return {"success": True, "data": [dict(z) for z in self.zones.values()]}

    def set_duration(self, zone_id: str, minutes: int) -> dict:
        """Set a zone's daily watering time (1-60 minutes)."""
        if (err := self._invalid(zone_id, minutes)):
            return err
        self.zones[zone_id]["minutes"] = minutes
        return {"success": True, "data": dict(self.zones[zone_id])}

    def disable_zone(self, zone_id: str) -> dict:
        """Stop a zone's daily watering."""
        if (err := self._invalid(zone_id)):
            return err
        self.zones[zone_id]["enabled"] = False
        return {"success": True, "data": dict(self.zones[zone_id])}

    def run_zone(self, zone_id: str, minutes: int) -> dict:
        """Water an enabled zone now for ``minutes`` (1-60)."""
        if (err := self._invalid(zone_id, minutes)):
            return err
        if not self.zones[zone_id]["enabled"]:
            return {"success": False, "error": "zone " + zone_id + " is disabled"}
        self.runs.append({"zone_id": zone_id, "minutes": minutes})
        return {"success": True, "data": {"zone_id": zone_id, "minutes": minutes}}
'''

ZONE_NAMES = ["front lawn", "back lawn", "rose bed", "vegetable patch", "herb garden", "hedge", "orchard",
              "flower border", "greenhouse", "berry bushes"]


def _duration_is(zid, m):
    return _check(f"Does zone {zid} water {m} minutes a day?", f"final_state['zones'][{zid!r}]['minutes'] == {m}")


def _disabled(zid):
    return _check(f"Is zone {zid} disabled?", f"final_state['zones'][{zid!r}]['enabled'] is False")


def _ran(zid, m):
    return _check(f"Did zone {zid} run for {m} minutes?",
                  f"{{'zone_id': {zid!r}, 'minutes': {m}}} in final_state['runs']")


def irrigation_task(rng):
    """An irrigation task: daily duration, disabling, or a manual run, by zone id or name (list_zones first)."""
    n = rng.randint(4, 6)
    zids = _ids(rng, "Z", 1, 99, n)
    zones = {zid: {"zone_id": zid, "name": name, "minutes": rng.choice(range(5, 45, 5)), "enabled": rng.random() < 0.7}
             for zid, name in zip(zids, rng.sample(ZONE_NAMES, n))}
    zid, other = rng.sample(zids, 2)
    zone = zones[zid]
    m = rng.choice([v for v in range(3, 41) if v != zone["minutes"]])
    kind = _pick(rng, {"duration": 2, "disable": 1.5, "run": 2, "name_run": 1.5, "name_duration": 1.5, "two": 1.5})
    if kind == "duration":
        text = rng.choice(["Set zone {z} to water for {m} minutes a day.",
                           "Change the watering time of {z} to {m} minutes.",
                           "Zone {z} should get {m} minutes of water each day."]).format(z=zid, m=m)
        checks, actions = [_duration_is(zid, m)], [_call("set_duration", zone_id=zid, minutes=m)]
    elif kind == "disable":
        zone["enabled"] = True
        text = rng.choice(["Disable zone {z}.", "Stop the daily watering of zone {z}; it rained.",
                           "Turn off the schedule of zone {z}."]).format(z=zid)
        checks, actions = [_disabled(zid)], [_call("disable_zone", zone_id=zid)]
    elif kind in ("run", "name_run"):
        zone["enabled"] = True
        if kind == "run":
            text = rng.choice(["Water zone {z} now for {m} minutes.", "Run zone {z} for {m} minutes right away."]
                              ).format(z=zid, m=m)
            actions = [_call("run_zone", zone_id=zid, minutes=m)]
        else:
            text = rng.choice(["Water the {n} now for {m} minutes.", "The {n} looks dry: run it for {m} minutes now."]
                              ).format(n=zone["name"], m=m)
            actions = [_call("list_zones"), _call("run_zone", zone_id=zid, minutes=m)]
        checks = [_ran(zid, m)]
    elif kind == "name_duration":
        text = rng.choice(["The {n} needs {m} minutes of water a day.",
                           "Set the daily watering of the {n} to {m} minutes."]
                          ).format(n=zone["name"], m=m)
        checks = [_duration_is(zid, m)]
        actions = [_call("list_zones"), _call("set_duration", zone_id=zid, minutes=m)]
    else:
        zones[other]["enabled"] = True
        text = rng.choice(["Disable zone {o} and set zone {z} to {m} minutes a day.",
                           "Stop watering zone {o}, and give zone {z} {m} minutes daily."]).format(o=other, z=zid, m=m)
        checks = [_disabled(other), _duration_is(zid, m)]
        actions = [_call("disable_zone", zone_id=other), _call("set_duration", zone_id=zid, minutes=m)]
    return {"init_config": {"zones": zones, "runs": []}, "task": text, "checklist_with_func": checks,
            "reference_actions": actions}


ENVS = [
    {
        "env_id": "bed_smart_home_lights",
        "env_class_name": "SmartLights",
        "role": "main",
        "environment_introduction": "A smart home's lights (ids like L-12), each in a room, with a brightness.",
        "constraints_rules": [],
        "tools": [
            _tool("list_lights", "List the lights in a room.", room="string"),
            _tool("turn_on", "Switch a light on.", light_id="string"),
            _tool("turn_off", "Switch a light off.", light_id="string"),
            _tool("set_brightness", "Set a light's brightness (1-100).", light_id="string", level="integer"),
        ],
        "env_class_code": LIGHTS_CODE,
        "make_task": lights_task,
    },
    {
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
    },
    {
        "env_id": "bed_smart_home_security",
        "env_class_name": "HomeSecurity",
        "role": "main",
        "environment_introduction": "A smart home's door locks (ids like D-7) and its alarm.",
        "constraints_rules": ["Setting the alarm (off, home or away) needs a valid user code."],
        "tools": [
            _tool("list_doors", "List all doors."),
            _tool("lock_door", "Lock a door.", door_id="string"),
            _tool("unlock_door", "Unlock a door.", door_id="string"),
            _tool("add_code", "Give a user a 4-digit code.", user="string", code="string"),
            _tool("set_alarm", "Set the alarm mode.", mode="string", code="string"),
        ],
        "env_class_code": SECURITY_CODE,
        "make_task": security_task,
    },
    {
        "env_id": "bed_smart_home_irrigation",
        "env_class_name": "GardenIrrigation",
        "role": "transfer",
        "environment_introduction": "A garden's watering zones (ids like Z-4), each watered daily for some minutes.",
        "constraints_rules": ["A disabled zone cannot run."],
        "tools": [
            _tool("list_zones", "List all zones."),
            _tool("set_duration", "Set a zone's daily watering minutes.", zone_id="string", minutes="integer"),
            _tool("disable_zone", "Stop a zone's daily watering.", zone_id="string"),
            _tool("run_zone", "Water a zone now.", zone_id="string", minutes="integer"),
        ],
        "env_class_code": IRRIGATION_CODE,
        "make_task": irrigation_task,
    },
]
