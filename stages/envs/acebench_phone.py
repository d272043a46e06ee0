"""ACEBench's phone platform (BaseApi, MessageApi, ReminderApi, FoodPlatform) as one executable
state, played by :class:`stages.envs.acebench.AceBenchEnv`, in English or Chinese.

Re-implements the four ``phone_platform`` classes of ACEBench's repository
(model_inference/multi_step/scenariosen/phone_platform/ and, for ``language="zh"``, scenarioszh/) with
the same initial data, functions, return values and error messages (simplification: wifi / device
login are one shared device state instead of a copy per class instance). The Chinese classes differ
from the English ones in data and messages (:mod:`.acebench_platforms_zh`) and in three points of
logic, kept here: ReminderApi also has ``mark_as_notified`` and ``search_reminders``, an order needs
a balance above (not just up to) its total, and ``search_orders`` matches merchant names only.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from stages.envs.acebench_platforms_zh import INBOX_ZH, MENUS_ZH, PHONE_TEXT_ZH, REMINDERS_ZH

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
_MENUS = {"Domino's": {"Margherita Pizza": 68.0, "Super Supreme Pizza": 88.0},
          "Rice Village Bibimbap": {"Stone Pot Bibimbap": 35.0, "Korean Beef Bibimbap": 45.0},
          "Haidilao": {"Beef Rolls": 68.0, "Seafood Platter": 88.0},
          "Heytea": {"Cheese Milk Tea": 25.0, "Four Seasons Spring Milk Tea": 22.0},
          "Hema Fresh": {"Organic Vegetable Pack": 15.0, "Fresh Gift Pack": 99.0},
          "Jiutian BBQ": {"Korean Grilled Beef": 128.0, "Grilled Pork Belly": 78.0}}
_TEXT = {
    "wifi_on": "Wi-Fi has been turned on", "device_on": "Device has been logged in",
    "send_offline": "Device not logged in, unable to send message",
    "send_no_wifi": "Wi-Fi is turned off, cannot send messages at this time",
    "inbox_full": "Inbox capacity is full. You need to ask the user which message to delete.",
    "no_pair": "Sender or receiver does not exist", "sent": "Message successfully sent to {receiver}.",
    "delete_offline": "Device not logged in, unable to delete message", "no_message_id": "Message ID does not exist",
    "message_deleted": "Message ID {message_id} has been successfully deleted.",
    "view_offline": "Device not logged in, unable to view message information", "no_sender": "Sender does not exist",
    "no_receiver": "Receiver does not exist", "no_records": "No related message records found",
    "no_user": "User does not exist", "no_keyword": "No messages found containing the keyword",
    "latest_offline": "Device not logged in, unable to retrieve the latest sent message ID.",
    "earliest_offline": "Device not logged in, unable to retrieve the earliest sent message ID.",
    "no_messages": "No message records found", "latest_is": "The latest message ID is {message_id}",
    "earliest_is": "The earliest message ID is {message_id}",
    "reminder_offline": "The device is not logged in, so you cannot view notifications",
    "no_title": "No reminder found with the title '{title}'.",
    "add_offline": "Device not logged in. Unable to add a new reminder.",
    "reminders_full": "Reminder capacity is full. Unable to add a new reminder.",
    "reminder_added": "Reminder '{title}' was successfully added.",
    "remove_offline": "Device not logged in. Unable to delete the specified reminder.",
    "no_reminder_id": "Reminder ID does not exist.", "reminder_deleted": "Reminder ID {reminder_id} was successfully deleted.",
    "no_reminders": "No reminders found.",
    "food_no_wifi": "Wi-Fi is not enabled, unable to login", "wrong_password": "Incorrect password",
    "already_in": "{username} is already logged in", "logged_in": "User {username} has successfully logged in!",
    "nobody_in": "No users are currently logged in to the food platform",
    "not_in": "User {username} is not logged in to the food platform", "no_merchant": "Merchant does not exist",
    "bad_quantity": "Invalid quantity {quantity} for product {product}",
    "no_product": "Product {product} does not exist in {merchant}'s menu",
    "too_poor": "Insufficient balance to place the order",
    "ordered": "Food delivery order successfully placed with {merchant}. Total amount: {total} yuan",
    "unknown_merchant": "Merchant '{merchant}' does not exist", "no_orders": "User has no order records",
    "no_match": "No matching orders found",
}
_DATA = {"en": (_INBOX, _REMINDERS, _MENUS, _TEXT), "zh": (INBOX_ZH, REMINDERS_ZH, MENUS_ZH, PHONE_TEXT_ZH)}
_CAPACITY = 6
_FUNCTIONS = ("turn_on_wifi", "login_device", "send_message", "delete_message", "view_messages_between_users",
              "search_messages", "get_latest_message_id", "get_earliest_message_id", "view_reminder_by_title",
              "add_reminder", "delete_reminder", "view_all_reminders",
              "login_food_platform", "view_logged_in_users", "check_balance", "add_food_delivery_order",
              "get_products", "view_orders", "search_orders")
_FUNCTIONS_ZH = _FUNCTIONS + ("mark_as_notified", "search_reminders")  # only the Chinese ReminderApi has them


def _err(message: str) -> dict[str, Any]:
    return {"status": False, "message": message}


class PhonePlatform:
    """Executable state of ACEBench's BaseApi + MessageApi + ReminderApi + FoodPlatform.

    The public methods are the platform's functions (documented by the tool schemas in the data);
    each returns ACEBench's result value (``{"status": bool, ...}`` dicts, lists, or a balance).
    Deviations: messages sent during the episode carry no time and are skipped by
    ``get_latest_message_id`` / ``get_earliest_message_id`` (upstream crashes on them); where the
    Chinese classes raise (``search_reminders`` finding a reminder, ``search_orders`` reaching an order
    of another merchant), the call returns an error result naming upstream's exception.

    Args:
        initial_config: the task's ``initial_config`` (``{"BaseApi": {"wifi", "logged_in"}}``;
            ``FoodPlatform.logged_in_users`` is honoured too).
        language: "en" (scenariosen) or "zh" (scenarioszh): data, messages and the points of logic
            of the module docstring.

    Raises:
        KeyError: another language.
    """

    def __init__(self, initial_config: dict[str, Any], language: str = "en"):
        inbox, reminders, self.menus, self.text = _DATA[language]
        self.zh, self.functions = language == "zh", _FUNCTIONS_ZH if language == "zh" else _FUNCTIONS
        base = initial_config.get("BaseApi", {})
        self.wifi, self.logged_in = bool(base.get("wifi", False)), bool(base.get("logged_in", True))
        self.inbox = {i + 1: {"sender_id": s, "receiver_id": r, "message": m, "time": t}
                      for i, (s, r, m, t) in enumerate(inbox)}
        self.message_id_counter = len(self.inbox)
        self.reminder_list = {i + 1: {"reminder_id": rid, "title": t, "description": d, "time": tm, "notified": False}
                              for i, (rid, t, d, tm) in enumerate(reminders)}
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
        if name not in self.functions:
            return _err(f"Function {name} does not exist")
        try:
            return getattr(self, name)(**args)
        except TypeError as err:
            return _err(f"Invalid arguments for {name}: {err}")

    def _say(self, key: str, **values: Any) -> str:
        return self.text[key].format(**values)

    def _ok(self, key: str, **values: Any) -> dict[str, Any]:
        return {"status": True, "message": self._say(key, **values)}

    def _no(self, key: str, **values: Any) -> dict[str, Any]:
        return _err(self._say(key, **values))

    def turn_on_wifi(self):
        self.wifi = True
        return self._ok("wifi_on")

    def login_device(self):
        self.logged_in = True
        return self._ok("device_on")

    def _uid(self, name):
        return _USERS[name][0] if name in _USERS else None

    def send_message(self, sender_name, receiver_name, message):
        if not self.logged_in:
            return self._no("send_offline")
        if not self.wifi:
            return self._no("send_no_wifi")
        if len(self.inbox) >= _CAPACITY:
            return self._no("inbox_full")
        if sender_name not in _USERS or receiver_name not in _USERS:
            return self._no("no_pair")
        self.message_id_counter += 1
        self.inbox[self.message_id_counter] = {"sender_id": self._uid(sender_name),
                                               "receiver_id": self._uid(receiver_name), "message": message}
        return self._ok("sent", receiver=receiver_name)

    def delete_message(self, message_id):
        if not self.logged_in:
            return self._no("delete_offline")
        if message_id not in self.inbox:
            return self._no("no_message_id")
        del self.inbox[message_id]
        return self._ok("message_deleted", message_id=message_id)

    def view_messages_between_users(self, sender_name, receiver_name):
        if not self.logged_in:
            return self._no("view_offline")
        if sender_name not in _USERS:
            return self._no("no_sender")
        if receiver_name not in _USERS:
            return self._no("no_receiver")
        found = [{"id": i, "sender": sender_name, "receiver": receiver_name, "message": m["message"]}
                 for i, m in self.inbox.items()
                 if m["sender_id"] == self._uid(sender_name) and m["receiver_id"] == self._uid(receiver_name)]
        return {"status": True, "messages": found} if found else self._no("no_records")

    def search_messages(self, user_name, keyword):
        if user_name not in _USERS:
            return self._no("no_user")
        uid = self._uid(user_name)
        found = [{"id": i, **{k: m[k] for k in ("sender_id", "receiver_id", "message")}}
                 for i, m in self.inbox.items()
                 if uid in (m["sender_id"], m["receiver_id"]) and str(keyword).lower() in m["message"].lower()]
        return {"status": True, "messages": found} if found else self._no("no_keyword")

    def _extreme_message_id(self, latest: bool):
        which = "latest" if latest else "earliest"
        if not self.logged_in:
            return self._no(f"{which}_offline")
        dated = [(datetime.strptime(m["time"], "%Y-%m-%d"), i) for i, m in self.inbox.items() if "time" in m]
        if not dated:
            return self._no("no_messages")
        pick = (max if latest else min)(dated, key=lambda x: x[0])[1]
        return {"status": True, "message": self._say(f"{which}_is", message_id=pick), "message_id": pick}

    def get_latest_message_id(self):
        return self._extreme_message_id(latest=True)

    def get_earliest_message_id(self):
        return self._extreme_message_id(latest=False)

    def view_reminder_by_title(self, title):
        if not self.logged_in:
            return self._no("reminder_offline")
        hit = next((r for r in self.reminder_list.values() if r["title"] == title), None)
        return {"status": True, "reminder": hit} if hit else self._no("no_title", title=title)

    def add_reminder(self, title, description, time):
        if not self.logged_in:
            return self._no("add_offline")
        if len(self.reminder_list) >= _CAPACITY:
            return self._no("reminders_full")
        self.reminder_id_counter += 1
        rid = self.reminder_id_counter
        self.reminder_list[rid] = {"reminder_id": rid, "title": title, "description": description, "time": time,
                                   "notified": False}
        return self._ok("reminder_added", title=title)

    def delete_reminder(self, reminder_id):
        if not self.logged_in:
            return self._no("remove_offline")
        if reminder_id not in self.reminder_list:
            return self._no("no_reminder_id")
        del self.reminder_list[reminder_id]
        return self._ok("reminder_deleted", reminder_id=reminder_id)

    def view_all_reminders(self):
        items = [{k: r[k] for k in ("title", "description", "time", "notified")} for r in self.reminder_list.values()]
        return {"status": True, "reminders": items} if items else self._no("no_reminders")

    def mark_as_notified(self, reminder_id):
        if reminder_id not in self.reminder_list:
            return self._no("no_reminder_id")
        self.reminder_list[reminder_id]["notified"] = True
        return self._ok("notified", reminder_id=reminder_id)

    def search_reminders(self, keyword):
        kw = str(keyword).lower()
        if any(kw in r["title"].lower() or kw in r["description"].lower() for r in self.reminder_list.values()):
            # upstream formats each hit's time with strftime, but the times are strings
            return _err("Error during execution: 'str' object has no attribute 'strftime'")
        return self._no("no_reminder_keyword")

    def login_food_platform(self, username, password):
        if not self.wifi:
            return self._no("food_no_wifi")
        if username not in self.users:
            return self._no("no_user")
        if self.users[username]["password"] != password:
            return self._no("wrong_password")
        if username in self.logged_in_users:
            return self._no("already_in", username=username)
        self.logged_in_users.append(username)
        return self._ok("logged_in", username=username)

    def view_logged_in_users(self):
        if not self.logged_in_users:
            return self._no("nobody_in")
        return {"status": True, "logged_in_users": self.logged_in_users}

    def check_balance(self, user_name):
        return self.users[user_name]["balance"] if user_name in self.users else 0.0

    def add_food_delivery_order(self, username, merchant_name, items):
        if username not in self.logged_in_users:
            return self._no("not_in", username=username)
        if merchant_name not in self.menus:
            return self._no("no_merchant")
        if not isinstance(items, (list, dict, str)):  # upstream iterates items: other types raise
            return _err(f"Invalid items {items!r}: expected a list of objects with product and quantity")
        total, lines = 0.0, []
        for item in items:
            if not isinstance(item, dict):
                return _err(f"Invalid item {item!r}: expected an object with product and quantity")
            product, quantity = item.get("product"), item.get("quantity", 1)
            if not isinstance(quantity, int) or quantity <= 0:
                return self._no("bad_quantity", quantity=quantity, product=product)
            price = self.menus[merchant_name].get(product)
            if price is None:
                return self._no("no_product", product=product, merchant=merchant_name)
            total += price * quantity
            lines.append({"product": product, "quantity": quantity, "price_per_unit": price})
        balance = self.users[username]["balance"]
        if total > balance or (self.zh and total == balance):  # the Chinese class refuses an order of the whole balance
            return self._no("too_poor")
        self.users[username]["balance"] -= total
        self.orders.append({"user_name": username, "merchant_name": merchant_name, "items": lines,
                            "total_price": total})
        return self._ok("ordered", merchant=merchant_name, total=total)

    def get_products(self, merchant_name):
        if merchant_name not in self.menus:
            return self._no("unknown_merchant", merchant=merchant_name)
        return [{"product": p, "price": v} for p, v in self.menus[merchant_name].items()]

    def view_orders(self, user_name):
        mine = [o for o in self.orders if o["user_name"] == user_name]
        return {"status": True, "orders": mine} if mine else self._no("no_orders")

    def search_orders(self, keyword):
        kw = str(keyword).lower()
        if self.zh and any(kw not in o["merchant_name"].lower() and o["items"] for o in self.orders):
            # the Chinese class lower()s each item of another merchant's order, and the items are objects
            return _err("Error during execution: 'dict' object has no attribute 'lower'")
        hits = [o for o in self.orders if kw in o["merchant_name"].lower()
                or any(kw in i["product"].lower() for i in o["items"])]
        return {"status": True, "orders": hits} if hits else self._no("no_match")
