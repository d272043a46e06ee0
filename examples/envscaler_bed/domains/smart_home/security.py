"""A home's door locks, user codes and alarm (role "main").

One environment of the bed's smart-home domain (see ``__init__``). Stdlib only.
"""
from domains._common import call as _call, check as _check, tool as _tool
from ._draws import pick as _pick, ids as _ids


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


SECURITY = {
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
}
