"""ACEBench agent tasks (multi-step and multi-turn) against minimal executable copies of its platforms.

Data (``--data-dir``, e.g. ``ACEBench/data_all/data_en``; from github.com/ACEBench/ACEBench
``data_all/data_en``): ``data_agent_multi_step.json`` and ``data_agent_multi_turn.json`` (JSON lines:
id, question, initial_config, function, involved_classes) and ``possible_answer/<same name>`` (id,
ground_truth = list of ``{ClassName: end-state attributes}``, mile_stone = list of call-path steps
such as ``"[login_food_platform(username='Eve', password='password123')]"``, or a list of such
lists when several paths are accepted).

Two platforms, picked by the task's involved classes: :class:`PhonePlatform` re-implements the four
English ``phone_platform`` classes of ACEBench's repository (BaseApi, MessageApi, ReminderApi,
FoodPlatform) with the same initial data, functions, return values and error messages
(simplification: wifi / device login are one shared device state instead of a copy per class
instance); :class:`stages.core.envs.acebench_travel.TravelPlatform` re-implements its ``Travel``
class (flights, reservations; multi-turn tasks 20-29). Scoring (:mod:`stages.core.envs.acebench_score`)
re-implements ACEBench's ``agent_eval``: end-to-end state match and process accuracy.

``episode_rules="official"`` (the default) plays and scores as ACEBench does: its checker and exact
process strings, a multi-step reply without a call answered with ACEBench's nudge (the episode goes
on until "finish conversation" or the step cap), the agent's "finish conversation" ending any
episode after its first message, the multi-turn agent told the phone / airline policy
(:mod:`.acebench_prompts`), a simulated user of up to 1,000 tokens whose whole reply is kept.
``"lenient"`` is lopd's earlier play and scoring (see :mod:`.acebench_score`).

The released answers are not fully consistent (some milestones name products that do not exist,
some end states disagree with their milestone); scores inherit that noise, as they do upstream.

Multi-turn tasks are served when the environment has a ``user_model``: a simulated user
(:mod:`stages.core.envs.acebench_multi`, with ACEBench's phone or travel user rules) opens the
dialogue and answers every agent message without a tool call; "finish conversation" or the step
cap ends it, scored like multi-step. All 30 multi-turn tasks run (20 phone, 10 Travel).
"""
from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from schemas import Message, Task, ToolCall
from stages.core.envs import acebench_single
from stages.core.envs.acebench_prompts import FINISH_RULE, agent_policy
from stages.core.envs.acebench_score import (end_to_end, official_end_to_end, official_process, official_result,
                                             process_accuracy, step_text)
from stages.core.data.inputs import read_utf8
from stages.core.envs.acebench_travel import SYSTEM_PROMPT as TRAVEL_SYSTEM_PROMPT
from stages.core.envs.acebench_travel import TravelPlatform
from stages.core.envs.base import AGENTIC_RULES, EnvError, StepResult, register
from stages.core.envs.envscaler_rules import EPISODE_RULES
from stages.core.text.toolcalls import ToolCallParseError, parse_tool_calls

_HINT = "pass --data-dir <ACEBench>/data_all/data_en (git clone github.com/ACEBench/ACEBench)"
SYSTEM_PROMPT = "You are an AI agent operating a phone for the user with the tools you are given. " + AGENTIC_RULES
_USERS = {"Eve": ("USR100", "U100", "password123", 500.0), "Frank": ("USR101", "U101", "password456", 300.0),
          "Grace": ("USR102", "U102", "password789", 150.0), "Helen": ("USR103", "U103", "password321", 800.0),
          "Isaac": ("USR104", "U104", "password654", 400.0), "Jack": ("USR105", "U105", "password654", 120.0)}
_INBOX = [
    ("USR100", "USR101", "Hey Frank, don't forget about our meeting on 2024-06-11 at 4 PM in Conference Room 1.",
     "2024-06-09"),
    ("USR101", "USR102", 'Can you help me order a "Margherita Pizza" delivery? The merchant is Domino\'s.', "2024-03-09"),
    ("USR102", "USR103", 'Please check the milk tea delivery options available from Heytea and purchase a cheaper milk '
     'tea for me. After making the purchase, remember to reply to me with "Already bought."', "2023-12-05"),
    ("USR103", "USR102", "No problem Helen, I can assist you.", "2024-09-09"),
    ("USR104", "USR105", "Isaac, are you available for a call?", "2024-06-06"),
    ("USR105", "USR104", "Yes Jack, let's do it in 30 minutes.", "2024-01-15"),
]
_REMINDERS = [
    (1001, "Doctor's Appointment", "Visit Dr. Smith for a checkup.", "2024-07-15 09:30"),
    (1002, "Team Meeting", "Monthly project review with the team.", "2024-07-17 11:00"),
    (1003, "To-do list", 'First, help Frank place a food delivery order at "Hema Fresh," ordering two "Fresh Gift '
     'Packs." Then, send a message to Frank saying, "The price of the purchased goods is () yuan." Replace the '
     "parentheses with the actual amount, keeping one decimal place.", "2024-07-16 11:00"),
]
_MENUS = {"Domino's": ("M100", "Pizza", {"Margherita Pizza": 68.0, "Super Supreme Pizza": 88.0}),
          "Rice Village Bibimbap": ("M101", "Bibimbap", {"Stone Pot Bibimbap": 35.0, "Korean Beef Bibimbap": 45.0}),
          "Haidilao": ("M102", "Hotpot", {"Beef Rolls": 68.0, "Seafood Platter": 88.0}),
          "Heytea": ("M103", "Milk Tea", {"Cheese Milk Tea": 25.0, "Four Seasons Spring Milk Tea": 22.0}),
          "Hema Fresh": ("M104", "Fresh Grocery", {"Organic Vegetable Pack": 15.0, "Fresh Gift Pack": 99.0}),
          "Jiutian BBQ": ("M105", "BBQ", {"Korean Grilled Beef": 128.0, "Grilled Pork Belly": 78.0})}
_CAPACITY = 6
NUDGE = "Please do not ask me any questions, use the known conditions to solve the problem"  # ACEBench's words
FINISH = "finish conversation"


def _err(message: str) -> dict[str, Any]:
    return {"status": False, "message": message}


class PhonePlatform:
    """Executable state of ACEBench's BaseApi + MessageApi + ReminderApi + FoodPlatform.

    The public methods are the platform's functions (documented by the tool schemas in the data);
    each returns ACEBench's result value (``{"status": bool, ...}`` dicts, lists, or a balance).
    Deviation: messages sent during the episode carry no time and are skipped by
    ``get_latest_message_id`` / ``get_earliest_message_id`` (upstream crashes on them).

    Args:
        initial_config: the task's ``initial_config`` (``{"BaseApi": {"wifi", "logged_in"}}``;
            ``FoodPlatform.logged_in_users`` is honoured too).
    """

    FUNCTIONS = ("turn_on_wifi", "login_device", "send_message", "delete_message", "view_messages_between_users",
                 "search_messages", "get_latest_message_id", "get_earliest_message_id", "view_reminder_by_title",
                 "add_reminder", "delete_reminder", "view_all_reminders",
                 "login_food_platform", "view_logged_in_users", "check_balance", "add_food_delivery_order",
                 "get_products", "view_orders", "search_orders")

    def __init__(self, initial_config: dict[str, Any]):
        base = initial_config.get("BaseApi", {})
        self.wifi, self.logged_in = bool(base.get("wifi", False)), bool(base.get("logged_in", True))
        self.inbox = {i + 1: {"sender_id": s, "receiver_id": r, "message": m, "time": t}
                      for i, (s, r, m, t) in enumerate(_INBOX)}
        self.message_id_counter = len(self.inbox)
        self.reminder_list = {i + 1: {"reminder_id": rid, "title": t, "description": d, "time": tm, "notified": False}
                              for i, (rid, t, d, tm) in enumerate(_REMINDERS)}
        self.reminder_id_counter = len(self.reminder_list)
        self.users = {n: {"user_id": fid, "password": pw, "balance": bal} for n, (_, fid, pw, bal) in _USERS.items()}
        self.logged_in_users = list(initial_config.get("FoodPlatform", {}).get("logged_in_users", []))
        self.orders: list[dict[str, Any]] = []

    def state(self) -> dict[str, dict[str, Any]]:
        """End state per ACEBench class, JSON-normalised (dict keys become strings)."""
        return json.loads(json.dumps({
            "BaseApi": {"wifi": self.wifi, "logged_in": self.logged_in},
            "MessageApi": {"inbox": self.inbox},
            "ReminderApi": {"reminder_list": self.reminder_list},
            "FoodPlatform": {"users": self.users, "logged_in_users": self.logged_in_users, "orders": self.orders},
        }))

    def call(self, name: str, args: dict[str, Any]) -> Any:
        """Execute one function; unknown names and bad arguments come back as error results."""
        if name not in self.FUNCTIONS:
            return _err(f"Function {name} does not exist")
        try:
            return getattr(self, name)(**args)
        except TypeError as err:
            return _err(f"Invalid arguments for {name}: {err}")

    def turn_on_wifi(self):
        self.wifi = True
        return {"status": True, "message": "Wi-Fi has been turned on"}

    def login_device(self):
        self.logged_in = True
        return {"status": True, "message": "Device has been logged in"}

    def _uid(self, name):
        return _USERS[name][0] if name in _USERS else None

    def send_message(self, sender_name, receiver_name, message):
        if not self.logged_in:
            return _err("Device not logged in, unable to send message")
        if not self.wifi:
            return _err("Wi-Fi is turned off, cannot send messages at this time")
        if len(self.inbox) >= _CAPACITY:
            return _err("Inbox capacity is full. You need to ask the user which message to delete.")
        if sender_name not in _USERS or receiver_name not in _USERS:
            return _err("Sender or receiver does not exist")
        self.message_id_counter += 1
        self.inbox[self.message_id_counter] = {"sender_id": self._uid(sender_name),
                                               "receiver_id": self._uid(receiver_name), "message": message}
        return {"status": True, "message": f"Message successfully sent to {receiver_name}."}

    def delete_message(self, message_id):
        if not self.logged_in:
            return _err("Device not logged in, unable to delete message")
        if message_id not in self.inbox:
            return _err("Message ID does not exist")
        del self.inbox[message_id]
        return {"status": True, "message": f"Message ID {message_id} has been successfully deleted."}

    def view_messages_between_users(self, sender_name, receiver_name):
        if not self.logged_in:
            return _err("Device not logged in, unable to view message information")
        if sender_name not in _USERS:
            return _err("Sender does not exist")
        if receiver_name not in _USERS:
            return _err("Receiver does not exist")
        found = [{"id": i, "sender": sender_name, "receiver": receiver_name, "message": m["message"]}
                 for i, m in self.inbox.items()
                 if m["sender_id"] == self._uid(sender_name) and m["receiver_id"] == self._uid(receiver_name)]
        return {"status": True, "messages": found} if found else _err("No related message records found")

    def search_messages(self, user_name, keyword):
        if user_name not in _USERS:
            return _err("User does not exist")
        uid = self._uid(user_name)
        found = [{"id": i, **{k: m[k] for k in ("sender_id", "receiver_id", "message")}}
                 for i, m in self.inbox.items()
                 if uid in (m["sender_id"], m["receiver_id"]) and str(keyword).lower() in m["message"].lower()]
        return {"status": True, "messages": found} if found else _err("No messages found containing the keyword")

    def _extreme_message_id(self, latest: bool):
        which = "latest" if latest else "earliest"
        if not self.logged_in:
            return _err(f"Device not logged in, unable to retrieve the {which} sent message ID.")
        dated = [(datetime.strptime(m["time"], "%Y-%m-%d"), i) for i, m in self.inbox.items() if "time" in m]
        if not dated:
            return _err("No message records found")
        pick = (max if latest else min)(dated, key=lambda x: x[0])[1]
        return {"status": True, "message": f"The {which} message ID is {pick}", "message_id": pick}

    def get_latest_message_id(self):
        return self._extreme_message_id(latest=True)

    def get_earliest_message_id(self):
        return self._extreme_message_id(latest=False)

    def view_reminder_by_title(self, title):
        if not self.logged_in:
            return _err("The device is not logged in, so you cannot view notifications")
        hit = next((r for r in self.reminder_list.values() if r["title"] == title), None)
        return {"status": True, "reminder": hit} if hit else _err(f"No reminder found with the title '{title}'.")

    def add_reminder(self, title, description, time):
        if not self.logged_in:
            return _err("Device not logged in. Unable to add a new reminder.")
        if len(self.reminder_list) >= _CAPACITY:
            return _err("Reminder capacity is full. Unable to add a new reminder.")
        self.reminder_id_counter += 1
        rid = self.reminder_id_counter
        self.reminder_list[rid] = {"reminder_id": rid, "title": title, "description": description, "time": time,
                                   "notified": False}
        return {"status": True, "message": f"Reminder '{title}' was successfully added."}

    def delete_reminder(self, reminder_id):
        if not self.logged_in:
            return _err("Device not logged in. Unable to delete the specified reminder.")
        if reminder_id not in self.reminder_list:
            return _err("Reminder ID does not exist.")
        del self.reminder_list[reminder_id]
        return {"status": True, "message": f"Reminder ID {reminder_id} was successfully deleted."}

    def view_all_reminders(self):
        items = [{k: r[k] for k in ("title", "description", "time", "notified")} for r in self.reminder_list.values()]
        return {"status": True, "reminders": items} if items else _err("No reminders found.")

    def login_food_platform(self, username, password):
        if not self.wifi:
            return _err("Wi-Fi is not enabled, unable to login")
        if username not in self.users:
            return _err("User does not exist")
        if self.users[username]["password"] != password:
            return _err("Incorrect password")
        if username in self.logged_in_users:
            return _err(f"{username} is already logged in")
        self.logged_in_users.append(username)
        return {"status": True, "message": f"User {username} has successfully logged in!"}

    def view_logged_in_users(self):
        if not self.logged_in_users:
            return _err("No users are currently logged in to the food platform")
        return {"status": True, "logged_in_users": self.logged_in_users}

    def check_balance(self, user_name):
        return self.users[user_name]["balance"] if user_name in self.users else 0.0

    def add_food_delivery_order(self, username, merchant_name, items):
        if username not in self.logged_in_users:
            return _err(f"User {username} is not logged in to the food platform")
        if merchant_name not in _MENUS:
            return _err("Merchant does not exist")
        if not isinstance(items, (list, dict, str)):  # upstream iterates items: other types raise
            return _err(f"Invalid items {items!r}: expected a list of objects with product and quantity")
        total, lines = 0.0, []
        for item in items:
            if not isinstance(item, dict):
                return _err(f"Invalid item {item!r}: expected an object with product and quantity")
            product, quantity = item.get("product"), item.get("quantity", 1)
            if not isinstance(quantity, int) or quantity <= 0:
                return _err(f"Invalid quantity {quantity} for product {product}")
            price = _MENUS[merchant_name][2].get(product)
            if price is None:
                return _err(f"Product {product} does not exist in {merchant_name}'s menu")
            total += price * quantity
            lines.append({"product": product, "quantity": quantity, "price_per_unit": price})
        if total > self.users[username]["balance"]:
            return _err("Insufficient balance to place the order")
        self.users[username]["balance"] -= total
        self.orders.append({"user_name": username, "merchant_name": merchant_name, "items": lines,
                            "total_price": total})
        return {"status": True,
                "message": f"Food delivery order successfully placed with {merchant_name}. Total amount: {total} yuan"}

    def get_products(self, merchant_name):
        if merchant_name not in _MENUS:
            return _err(f"Merchant '{merchant_name}' does not exist")
        return [{"product": p, "price": v} for p, v in _MENUS[merchant_name][2].items()]

    def view_orders(self, user_name):
        mine = [o for o in self.orders if o["user_name"] == user_name]
        return {"status": True, "orders": mine} if mine else _err("User has no order records")

    def search_orders(self, keyword):
        kw = str(keyword).lower()
        hits = [o for o in self.orders if kw in o["merchant_name"].lower()
                or any(kw in i["product"].lower() for i in o["items"])]
        return {"status": True, "orders": hits} if hits else _err("No matching orders found")


# ---- data -------------------------------------------------------------------------------------------------

_TYPE_NAMES = {"dict": "object", "float": "number", "list": "array", "tuple": "array", "int": "integer",
               "str": "string", "bool": "boolean", "any": "string"}


def _schema(fn: dict[str, Any]) -> dict[str, Any]:
    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (_TYPE_NAMES.get(v, v) if k == "type" and isinstance(v, str) else fix(v))
                    for k, v in node.items()}
        return [fix(x) for x in node] if isinstance(node, list) else node

    return fix(fn)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise EnvError(f"acebench: {path} not found; {_HINT}")
    try:
        return [json.loads(line) for line in read_utf8(path, EnvError).splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise EnvError(f"{path}: not valid JSON lines ({err.msg} at line {err.lineno})") from None


SIMULATED = frozenset({"BaseApi", "MessageApi", "ReminderApi", "FoodPlatform", "Travel"})


def load_tasks(data_dir: Path | None, part: str = "multi_step") -> list[Task]:
    """ACEBench agent tasks of ``part`` ("multi_step" | "multi_turn"; test split) with their
    possible answers and involved classes in the metadata.

    Raises:
        EnvError: missing data folder/files, a row without the needed fields, or a class not simulated.
    """
    if data_dir is None:
        raise EnvError(f"acebench: no data; {_HINT}")
    root = Path(data_dir)
    name = f"data_agent_{part}.json"
    rows = _lines(root / name)
    answers = {a.get("id"): a for a in _lines(root / "possible_answer" / name)}
    tasks = []
    for row in rows:
        where = f"{root / name} id {row.get('id')}"
        classes = row.get("involved_classes")
        if not isinstance(classes, list) or not set(classes) <= SIMULATED:
            raise EnvError(f"{where}: involved_classes must list classes of {sorted(SIMULATED)}, got {classes!r}")
        answer = answers.get(row.get("id"))
        if answer is None or not {"ground_truth", "mile_stone"} <= answer.keys():
            raise EnvError(f"{where}: no possible answer with ground_truth and mile_stone")
        if not {"question", "function", "initial_config"} <= row.keys():
            raise EnvError(f"{where}: needs fields question, function, initial_config")
        tasks.append(Task(
            task_id=row["id"], env="acebench", split="test", prompt=row["question"],
            tools=json.dumps([_schema(f) for f in row["function"]]),
            metadata=json.dumps({"initial_config": row["initial_config"], "ground_truth": answer["ground_truth"],
                                 "mile_stone": answer["mile_stone"], "part": part, "involved_classes": classes}),
        ))
    return tasks


@register("acebench")
class AceBenchEnv:
    """ACEBench agent episodes on :class:`PhonePlatform`, or on the Travel platform for tasks involving "Travel";
    tasks of the normal and special categories, when their files are in the data folder, are one reply each
    (:mod:`.acebench_single`, checked by :mod:`.acebench_ast`).

    An action with tool calls is executed (one tool message per call). An action without calls:
    in a multi-turn episode it goes to the simulated user, whose answer is the next user message;
    in a multi-step one it ends the episode (lenient rules) or gets ACEBench's nudge (official
    rules). "finish conversation" (from the user, or under the official rules from the agent after
    its first message) and the step cap end any episode. Reward = 1 when end-to-end holds, else
    the process accuracy; ``info`` has ``end_to_end``, ``process_accuracy``, the mismatches and the
    rules.

    Args:
        data_dir: ACEBench's ``data_en`` folder.
        max_turns: agent actions per episode (20 = ACEBench's 40 dialogue messages).
        user_model: the simulated user's model; None: multi-step tasks only.
        episode_rules: ``"official"`` (ACEBench's) or ``"lenient"`` (module docstring).

    Raises:
        EnvError: an unknown ``episode_rules``.
    """

    name = "acebench"
    default_rules = "official"

    def __init__(self, data_dir: Path | None = None, max_turns: int = 20, user_model: str | None = None,
                 episode_rules: str = "official"):
        if episode_rules not in EPISODE_RULES:
            raise EnvError(f"acebench: episode_rules must be one of {', '.join(EPISODE_RULES)}, got {episode_rules!r}")
        self.data_dir, self.max_turns, self.user_model = data_dir, max_turns, user_model
        self.episode_rules = episode_rules
        self._task: Task | None = None
        self._user = None
        self.data_notes: list[str] = []  # rows of the single-turn files left out, one line each

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """The multi-step tasks, then (with a user model) the multi-turn ones, then the normal and special
        ones found in the data folder; only ``split="test"`` exists.

        Raises:
            EnvError: another split, or missing/malformed data.
        """
        if split != "test":
            raise EnvError(f"acebench: only split 'test' exists, got {split!r}")
        tasks = load_tasks(self.data_dir)
        if self.user_model:
            tasks += load_tasks(self.data_dir, "multi_turn")
        single, self.data_notes = acebench_single.load_single_turn(self.data_dir)
        tasks += single
        return tasks[:limit] if limit is not None else tasks

    def reset(self, task: Task) -> list[Message]:
        """Fresh platform from the task's initial_config; system prompt + the user's request (multi-turn:
        the simulated user's opening line).

        Raises:
            EnvError: a multi-turn task without a user model.
        """
        self._task, self._steps, self._texts, self._called, self._user = task, [], [], False, None
        if task.meta.get("part") in acebench_single.PARTS:
            return acebench_single.opening(task)
        classes = task.meta.get("involved_classes", [])
        travel = "Travel" in classes
        platform = TravelPlatform if travel else PhonePlatform
        self.platform = platform(copy.deepcopy(task.meta["initial_config"]))
        prompt = TRAVEL_SYSTEM_PROMPT if travel else SYSTEM_PROMPT
        if self.episode_rules == "official":  # ACEBench's episodes end on "finish conversation"
            prompt = prompt.replace(AGENTIC_RULES, FINISH_RULE)
        if task.meta.get("part") == "multi_turn":
            if not self.user_model:
                raise EnvError(f"{task.task_id}: a multi-turn task needs a user model (--user-model)")
            from stages.core.envs.acebench_multi import SimulatedUser

            official = self.episode_rules == "official"
            self._user = SimulatedUser(self.user_model, task.prompt, classes, max_new_tokens=1000 if official else 64,
                                       whole_reply=official)
            policy = agent_policy(classes) if official else ""
            system = Message(role="system", content=f"{prompt}\n\n{policy}" if policy else prompt)
            return [system, Message(role="user", content=self._user.opening())]
        return [Message(role="system", content=prompt), Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        """Execute the action's calls, or answer / score an action without calls (class docstring)."""
        if self._task is None:
            raise EnvError("acebench: step() before reset()")
        if self._task.meta.get("part") in acebench_single.PARTS:  # one reply, checked by ACEBench's rules
            return acebench_single.judge(self._task, action)
        official = self.episode_rules == "official"
        turn = len(self._steps) + 1
        if official and turn > 1 and FINISH in action:  # ACEBench ends on it before executing anything
            self._steps.append([])
            return self._finish([])
        try:
            calls = parse_tool_calls(action)
        except ToolCallParseError as err:
            if not official:
                self._steps.append([])
                hint = Message(role="user", content=f"Your tool call could not be read ({err}). "
                                                    "Use the <tool_call> format.")
                return self._finish([]) if len(self._steps) >= self.max_turns else StepResult([hint], info={"parse_error": str(err)})
            calls = []  # upstream: a message that does not decode is no call
        if not calls:
            return self._no_call(action, turn)
        self._steps.append(calls)
        self._texts.append(step_text(action, calls))
        self._called = True
        obs = [Message(role="tool", name=c.name, content=json.dumps(self.platform.call(c.name, c.args), default=str))
               for c in calls]
        if len(self._steps) >= self.max_turns:
            return self._finish(calls)
        return StepResult(obs, tool_calls=calls)

    def _no_call(self, action: str, turn: int) -> StepResult:
        """An action without calls: the user answers (multi-turn), ACEBench's nudge (official
        multi-step), or the end (lenient multi-step)."""
        official = self.episode_rules == "official"
        self._steps.append([])
        if self._user is None:
            if not official:
                return self._finish([])
            self._texts.append(step_text(action, []))  # upstream records every multi-step message
            if len(self._steps) >= self.max_turns:
                return self._finish([])
            return StepResult([Message(role="user", content=NUDGE)])
        said = self._user.reply(action)
        ends = (turn > 1 and FINISH in said) if official else self._user.finished(said)
        if ends or len(self._steps) >= self.max_turns:
            return self._finish([])
        return StepResult([Message(role="user", content=said)])

    def score(self) -> dict[str, Any]:
        """Scores of the episode so far: end_to_end, process_accuracy, mismatches, the rules."""
        meta = self._task.meta
        if self.episode_rules == "official":
            result = official_result(self.platform.state(), meta.get("involved_classes", []), self._called)
            ok, errors = official_end_to_end(result, meta["ground_truth"])
            process = 1.0 if ok else official_process(self._texts, meta["mile_stone"])
        else:
            ok, errors = end_to_end(self.platform.state(), meta["ground_truth"])
            process = 1.0 if ok else process_accuracy(self._steps, meta["mile_stone"])
        return {"end_to_end": ok, "process_accuracy": process, "mismatches": errors[:10], "success": ok,
                "episode_rules": self.episode_rules}

    def _finish(self, calls: list[ToolCall]) -> StepResult:
        info = self.score()
        return StepResult([], reward=1.0 if info["end_to_end"] else info["process_accuracy"], done=True,
                          tool_calls=calls, info=info)

    def close(self) -> None:
        """Nothing to release."""
