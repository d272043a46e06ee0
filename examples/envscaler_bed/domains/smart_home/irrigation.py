"""A garden's watering zones (role "transfer", used by no train task).

One environment of the bed's smart-home domain (see ``__init__``). Stdlib only.
"""
from domains._common import call as _call, check as _check, tool as _tool
from ._draws import pick as _pick, ids as _ids


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


IRRIGATION = {
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
}
