"""A home's lights: switch and dim them by id or by room (role "main").

One environment of the bed's smart-home domain (see ``__init__``). Stdlib only.
"""
from domains._common import call as _call, check as _check, tool as _tool
from ._draws import pick as _pick, ids as _ids


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


LIGHTS = {
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
}
