"""ACEBench's Travel API (the airline of its agent multi-turn tasks 20-29) as a deterministic state machine.

Re-implements the ``Travel`` class of github.com/ACEBench/ACEBench (``scenariosen/travel.py`` under
``model_inference``; for ``language="zh"`` ``scenarioszh/travel.py``: the same logic with Chinese city
and cabin names, cancellation reason and messages, :mod:`.acebench_platforms_zh`): three users (id, password, cash and bank balance, membership level),
eleven flights, four reservations, and the functions get_user_details, get_flight_details,
get_reservation_details, find_transfer_flights, reserve_flight, modify_flight and cancel_reservation
with the same rules, return values and messages:

* booking pays the ticket of the chosen cabin plus 50 yuan per checked bag above the free allowance
  (regular 1 economy / 2 business, silver 2 / 3, gold 3 / 3) from the cash or bank balance; the
  new reservation is ``res_<n+1>`` and carries no origin/destination (as upstream);
* modifying may change the flight (same origin and destination, no price change), the cabin (the
  price difference, taken on the flight held before the call as upstream does, is paid or refunded
  with the reservation's or the new payment method; the cabin changes even when the balance is
  short, as upstream) and add bags (fee on the total above the allowance of the new cabin);
* cancelling refunds the ticket to the cash balance (10% fee within 24 h of departure on upstream's
  clock, 2024-07-14 06:00; the airline's own cancellation is free) and, as upstream, leaves the
  reservation in the list.

Deviations, so that bad arguments give an error result where upstream crashes or silently
mis-prices: arguments are checked before anything changes (strings, integer bag counts >= 0,
cabins "Economy Class" / "Business Class" (zh: "经济舱" / "商务舱"), payment methods "cash" / "bank"), and a failed login or
an unknown flight in reserve_flight is an error result. Seats are not checked (upstream neither).
"""
from __future__ import annotations

import copy
import inspect
import json
from datetime import datetime, timedelta
from typing import Any

from stages.envs.acebench_platforms_zh import AIRLINE_CANCELLED_ZH, CABINS_ZH, CITIES_ZH, TRAVEL_TEXT_ZH
from stages.envs.base import AGENTIC_RULES

SYSTEM_PROMPT = ("You are an AI airline agent: you book, change and cancel flight reservations for the user with "
                 "the tools you are given. The current time is July 15, 2024, 08:00 (Beijing time). " + AGENTIC_RULES)

_USERS = {"user1": ("Eve", "password123", 2000.0, 50000.0, "regular"),
          "user2": ("Frank", "password456", 8000.0, 8000.0, "silver"),
          "user3": ("Grace", "password789", 1000.0, 5000.0, "gold")}
# flight_no, origin, destination, departure, arrival, seats, economy price, business price (yuan)
_FLIGHTS = [
    ("CA1234", "Beijing", "Shanghai", "2024-07-15 08:00:00", "2024-07-15 10:30:00", 5, 1200, 3000),
    ("MU5678", "Shanghai", "Beijing", "2024-07-16 09:00:00", "2024-07-16 11:30:00", 3, 1900, 3000),
    ("CZ4321", "Shanghai", "Beijing", "2024-07-16 20:00:00", "2024-07-16 22:00:00", 8, 2500, 4000),
    ("CZ4352", "Shanghai", "Beijing", "2024-07-17 20:00:00", "2024-07-17 22:00:00", 8, 1600, 2500),
    ("MU3561", "Beijing", "Nanjing", "2024-07-18 08:00:00", "2024-07-18 10:00:00", 8, 1500, 4000),
    ("MU1566", "Beijing", "Nanjing", "2024-07-18 20:00:00", "2024-07-18 22:00:00", 8, 1500, 4000),
    ("CZ1765", "Nanjing", "Shenzhen", "2024-07-17 20:30:00", "2024-07-17 22:00:00", 8, 1500, 2500),
    ("CZ1765", "Nanjing", "Shenzhen", "2024-07-18 12:30:00", "2024-07-18 15:00:00", 8, 1500, 2500),
    ("MH1765", "Xiamen", "Chengdu", "2024-07-17 12:30:00", "2024-07-17 15:00:00", 8, 1500, 2500),
    ("MH2616", "Chengdu", "Xiamen", "2024-07-18 18:30:00", "2024-07-18 21:00:00", 8, 1500, 2500),
    ("MH2616", "Chengdu", "Fuzhou", "2024-07-16 18:30:00", "2024-07-16 21:00:00", 8, 1500, 2500),
]
# reservation_id, user_id, flight_no, payment, cabin, bags, origin, destination (res_4's flight is not listed)
_RESERVATIONS = [
    ("res_1", "user1", "CA1234", "bank", "Economy Class", 1, "Beijing", "Shanghai"),
    ("res_2", "user1", "MU5678", "bank", "Business Class", 1, "Shanghai", "Beijing"),
    ("res_3", "user2", "MH1765", "bank", "Business Class", 1, "Xiamen", "Chengdu"),
    ("res_4", "user2", "MU2616", "bank", "Business Class", 1, "Chengdu", "Xiamen"),
]
_FREE_BAGS = {"regular": (1, 2), "silver": (2, 3), "gold": (3, 3)}  # (economy, business)
_BAG_FEE = 50
_CABINS = ("Economy Class", "Business Class")
_TEXT = {
    "no_direct": "There are no direct flights that meet the criteria.", "bad_login": "Incorrect username or password.",
    "no_id": "Please provide a valid reservation ID or user ID",
    "no_transfer": "No connecting flights that meet the criteria were found.",
    "auth_failed": "Authentication failed. Please check your user ID and password.",
    "too_poor": "Your {method} balance is insufficient. Please consider using another payment method.",
    "booked": "Booking successful. Reservation ID: {reservation_id}. Total cost: {cost} yuan (including baggage fees).",
    "no_reservation": "Reservation not found or user ID does not match.", "no_flight": "Flight information not found.",
    "flight_changed": "Flight number has been changed.",
    "change_failed": "Flight change failed: Invalid new flight number or destination does not match.",
    "cabin_paid": "Cabin change successful. Price difference paid: {amount}.",
    "cabin_too_poor": "Insufficient balance to pay the cabin price difference.",
    "cabin_refunded": "Cabin change successful. Price difference refunded: {amount}.",
    "bags_paid": "Baggage has been added. Additional fee to be paid: {amount}.",
    "bags_too_poor": "Insufficient balance to pay the additional baggage fees.",
    "no_fee": "Modification completed with no additional fees.", "bad_user": "Invalid user ID.",
    "not_yours": "Invalid reservation ID or it does not belong to the user.", "bad_flight": "Invalid flight information.",
    "flown": "The flight segment has been used and cannot be canceled.",
    "airline_cancelled": "The flight has been canceled. Your reservation will be canceled free of charge, and {price} "
                         "yuan has been refunded.",
    "free_cancel": "More than 24 hours before departure. Free cancellation successful, {price} yuan has been refunded.",
    "fee_cancel": "Less than 24 hours before departure. A cancellation fee of {fee} yuan has been deducted, and "
                  "{refund} yuan has been refunded.",
}
# per language: messages, (economy, business) cabin names, the free-cancellation reason, city names
_LANGUAGE = {"en": (_TEXT, _CABINS, "The airline has canceled the flight.", {}),
             "zh": (TRAVEL_TEXT_ZH, CABINS_ZH, AIRLINE_CANCELLED_ZH, CITIES_ZH)}
_PAYMENTS = ("cash", "bank")
_INT_ARGS = ("baggage_count", "add_baggage")
_CLOCK = datetime(2024, 7, 14, 6, 0, 0)  # upstream's "now" for cancellations
_TIME = "%Y-%m-%d %H:%M:%S"


def _error(message: str) -> dict[str, str]:
    return {"status": "error", "message": message}


class TravelPlatform:
    """Executable state of ACEBench's Travel class (module docstring).

    The public methods are its functions (documented by the tool schemas in the data); each returns
    ACEBench's result value (strings, flight/reservation lists, or ``{"status": "error", ...}``).

    Args:
        initial_config: the task's ``initial_config`` (empty for every Travel task; unused, as upstream).
        language: "en" (scenariosen) or "zh" (scenarioszh: Chinese cities, cabins "经济舱" / "商务舱", the
            reason "航空公司取消航班", Chinese messages).

    Raises:
        KeyError: another language.
    """

    FUNCTIONS = ("get_user_details", "get_flight_details", "get_reservation_details", "find_transfer_flights",
                 "reserve_flight", "modify_flight", "cancel_reservation")

    def __init__(self, initial_config: dict[str, Any] | None = None, language: str = "en"):
        self.text, self.cabins, self.airline_cancelled, cities = _LANGUAGE[language]
        self.users = {uid: {"user_name": n, "password": pw, "cash_balance": cash, "bank_balance": bank,
                            "membership_level": level} for uid, (n, pw, cash, bank, level) in _USERS.items()}
        self.flights = [{"flight_no": no, "origin": o, "destination": d, "depart_time": dep, "arrival_time": arr,
                         "status": "available", "seats_available": seats, "economy_price": eco,
                         "business_price": bus} for no, o, d, dep, arr, seats, eco, bus in _FLIGHTS]
        for row in self.flights:
            row["origin"], row["destination"] = cities.get(row["origin"], row["origin"]), cities.get(
                row["destination"], row["destination"])
        self.reservations = [{"reservation_id": rid, "user_id": uid, "flight_no": no, "payment_method": pay,
                              "cabin": self.cabins[_CABINS.index(cabin)], "baggage": bags, "origin": cities.get(o, o),
                              "destination": cities.get(d, d)}
                             for rid, uid, no, pay, cabin, bags, o, d in _RESERVATIONS]

    def state(self) -> dict[str, dict[str, Any]]:
        """End state of the ``Travel`` class, JSON-normalised."""
        return json.loads(json.dumps({"Travel": {"users": self.users, "flights": self.flights,
                                                 "reservations": self.reservations}}))

    def call(self, name: str, args: dict[str, Any]) -> Any:
        """Execute one function; unknown names and bad arguments come back as error results, unchanged state."""
        if name not in self.FUNCTIONS:
            return _error(f"Function {name} does not exist")
        method = getattr(self, name)
        try:
            bound = inspect.signature(method).bind(**args)
        except TypeError as err:
            return _error(f"Invalid arguments for {name}: {err}")
        optional = {p.name for p in inspect.signature(method).parameters.values() if p.default is not p.empty}
        given = {k: v for k, v in bound.arguments.items() if v is not None or k not in optional}  # null: not given
        for key, value in given.items():
            if key in _INT_ARGS:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    return _error(f"Invalid arguments for {name}: {key} must be a whole number >= 0, got {value!r}")
            elif not isinstance(value, str):
                return _error(f"Invalid arguments for {name}: {key} must be a string, got {value!r}")
        for key, allowed in (("cabin", self.cabins), ("new_cabin", self.cabins), ("payment_method", _PAYMENTS),
                             ("new_payment_method", _PAYMENTS)):
            if key in given and given[key] not in allowed:
                return _error(f"Invalid arguments for {name}: {key} must be one of {', '.join(allowed)}")
        return method(**given)

    def _flight(self, flight_no: str, available: bool = False) -> dict[str, Any] | None:
        return next((f for f in self.flights if f["flight_no"] == flight_no
                     and (not available or f["status"] == "available")), None)

    def _reservation(self, user_id: str, reservation_id: str) -> dict[str, Any] | None:
        return next((r for r in self.reservations
                     if r["reservation_id"] == reservation_id and r["user_id"] == user_id), None)

    def get_user_details(self, user_id, password):
        user = self.users.get(user_id)
        if user is None or user["password"] != password:
            return _error(self.text["bad_login"])
        return {k: v for k, v in user.items() if k != "password"}

    def get_flight_details(self, origin=None, destination=None):
        hits = [dict(f) for f in self.flights
                if (not origin or f["origin"] == origin) and (not destination or f["destination"] == destination)]
        return hits or self.text["no_direct"]

    def get_reservation_details(self, reservation_id=None, user_id=None):
        if reservation_id:
            mine = [r for r in self.reservations if r["reservation_id"] == reservation_id]
        elif user_id:
            mine = [r for r in self.reservations if r["user_id"] == user_id]
        else:
            return _error(self.text["no_id"])
        return [{**r, "flight_info": copy.deepcopy(self._flight(r["flight_no"]))} for r in mine]

    def find_transfer_flights(self, origin_city, transfer_city, destination_city):
        legs = [f for f in self.flights if f["status"] == "available"]
        pairs = [{"first_leg": dict(a), "second_leg": dict(b)}
                 for a in legs if a["origin"] == origin_city and a["destination"] == transfer_city
                 for b in legs if b["origin"] == transfer_city and b["destination"] == destination_city
                 and datetime.strptime(a["arrival_time"], _TIME) < datetime.strptime(b["depart_time"], _TIME)]
        return pairs or self.text["no_transfer"]

    def _free_bags(self, user: dict[str, Any], cabin: str) -> int:
        """The free allowance of the user's level in ``cabin``; 0 for a cabin of neither name (as upstream)."""
        return _FREE_BAGS[user["membership_level"]][self.cabins.index(cabin)] if cabin in self.cabins else 0

    def _price(self, flight: dict[str, Any], cabin: str) -> int:
        """The ticket price: the economy price for the economy cabin, else the business one (as upstream)."""
        return flight["economy_price" if cabin == self.cabins[0] else "business_price"]

    def reserve_flight(self, user_id, password, flight_no, cabin, payment_method, baggage_count):
        user = self.users.get(user_id)
        if user is None or user["password"] != password:
            return self.text["auth_failed"]
        flight = self._flight(flight_no, available=True)
        if flight is None:
            return _error(f"Flight {flight_no} does not exist or is not available.")
        cost = self._price(flight, cabin) + max(baggage_count - self._free_bags(user, cabin), 0) * _BAG_FEE
        balance = f"{payment_method}_balance"
        if cost > user[balance]:
            return self.text["too_poor"].format(method=payment_method)
        user[balance] -= cost
        flight["seats_available"] -= 1
        reservation_id = f"res_{len(self.reservations) + 1}"
        self.reservations.append({"reservation_id": reservation_id, "user_id": user_id, "flight_no": flight_no,
                                  "payment_method": payment_method, "cabin": cabin, "baggage": baggage_count})
        return self.text["booked"].format(reservation_id=reservation_id, cost=cost)

    def _pay(self, user: dict[str, Any], method: str, amount: float) -> bool:
        """Take ``amount`` (negative: refund) from the method's balance; False when it would go below 0."""
        if user[f"{method}_balance"] - amount < 0:
            return False
        user[f"{method}_balance"] -= amount
        return True

    def modify_flight(self, user_id, reservation_id, new_flight_no=None, new_cabin=None, add_baggage=0,
                      new_payment_method=None):
        reservation = self._reservation(user_id, reservation_id)
        if reservation is None:
            return self.text["no_reservation"]
        current = self._flight(reservation["flight_no"])
        if current is None:
            return self.text["no_flight"]
        method, user, said = new_payment_method or reservation["payment_method"], self.users[user_id], []
        if new_flight_no and new_flight_no != reservation["flight_no"]:
            new = self._flight(new_flight_no)
            if new is None or (new["origin"], new["destination"]) != (current["origin"], current["destination"]):
                return self.text["change_failed"]
            reservation["flight_no"] = new_flight_no
            said.append(self.text["flight_changed"])
        if new_cabin and new_cabin != reservation["cabin"]:
            prices = dict(zip(self.cabins, (current["economy_price"], current["business_price"])))
            difference = prices[new_cabin] - prices.get(reservation["cabin"], 0)
            reservation["cabin"] = new_cabin
            if difference > 0:
                said.append(self.text["cabin_paid"].format(amount=difference) if self._pay(user, method, difference)
                            else self.text["cabin_too_poor"])
            elif difference < 0:
                self._pay(user, method, difference)
                said.append(self.text["cabin_refunded"].format(amount=-difference))
        if add_baggage > 0:
            total = reservation.get("baggage", 0) + add_baggage
            fee = max(0, total - self._free_bags(user, reservation["cabin"])) * _BAG_FEE
            if fee > 0:
                said.append(self.text["bags_paid"].format(amount=fee) if self._pay(user, method, fee)
                            else self.text["bags_too_poor"])
            reservation["baggage"] = total
        return " ".join(said) or self.text["no_fee"]

    def cancel_reservation(self, user_id, reservation_id, reason):
        user = self.users.get(user_id)
        if user is None:
            return self.text["bad_user"]
        reservation = self._reservation(user_id, reservation_id)
        if reservation is None:
            return self.text["not_yours"]
        flight = self._flight(reservation["flight_no"])
        if flight is None:
            return self.text["bad_flight"]
        departure = datetime.strptime(flight["depart_time"], _TIME)
        if _CLOCK > departure:
            return self.text["flown"]
        price = self._price(flight, reservation["cabin"])
        if reason == self.airline_cancelled:
            user["cash_balance"] += price
            return self.text["airline_cancelled"].format(price=price)
        if departure - _CLOCK > timedelta(days=1):
            user["cash_balance"] += price
            return self.text["free_cancel"].format(price=price)
        fee = price * 0.1
        user["cash_balance"] += price - fee
        return self.text["fee_cancel"].format(fee=fee, refund=price - fee)
