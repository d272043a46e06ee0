"""ACEBench's English phone platform (BaseApi, MessageApi, ReminderApi, FoodPlatform) as one executable
state, played by :class:`stages.core.envs.acebench.AceBenchEnv`.

Re-implements the four ``phone_platform`` classes of ACEBench's repository
(model_inference/multi_step/scenariosen/phone_platform/) with the same initial data, functions,
return values and error messages (simplification: wifi / device login are one shared device state
instead of a copy per class instance).
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

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
