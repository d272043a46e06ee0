"""Calendar and scheduling environments of the lopd study bed (stdlib only).

Four environments: team meetings and meeting rooms (main, pilot), clinic appointments (main) and
a gym class timetable (transfer: no train task uses it). See ``ENVS`` at the end.
"""
from __future__ import annotations

import random

from domains._common import (call as _call, check as _check, tool as _tool,
                             report_tool as _report_tool)

DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri"]
HOURS = list(range(8, 18))
FIRST = ["Ada", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jin", "Kai", "Lena", "Mo", "Nia",
         "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wes", "Yara", "Zoe"]
LAST = ["Moreno", "Okafor", "Lind", "Sato", "Novak", "Reyes", "Kaur", "Berg", "Costa", "Haddad", "Ivanova",
        "Park", "Silva", "Weber"]


def _ids(rng: random.Random, prefix: str, n: int, low: int = 100, high: int = 1000) -> list[str]:
    return [f"{prefix}-{k}" for k in rng.sample(range(low, high), n)]


def _names(rng: random.Random, n: int) -> list[str]:
    return [f"{f} {rng.choice(LAST)}" for f in rng.sample(FIRST, n)]


def _other(rng: random.Random, pool: list, *avoid: object) -> object:
    return rng.choice([x for x in pool if x not in avoid])


def _hh(hour: int) -> str:  # 13 -> "13:00"
    return f"{hour:02d}:00"


def _when(rng: random.Random, day: str, hour: int) -> str:
    return rng.choice([f"{day} at {_hh(hour)}", f"{day} {_hh(hour)}", f"{_hh(hour)} on {day}"])


# ----------------------------------------------------------------------------- meetings

MEETINGS_CODE = '''
class MeetingCalendar:
    def __init__(self, init_config: dict):
        self.meetings = {}

    def _get(self, meeting_id):
        m = self.meetings.get(meeting_id)
        if m is None:
            return None, {"success": False, "error": f"no meeting {meeting_id}"}
        if m["status"] != "scheduled":
            return None, {"success": False, "error": f"meeting {meeting_id} is cancelled"}
        return m, None

    def find_meetings(self, title: str) -> dict:
        q = str(title).lower()
        hits = [dict(m, meeting_id=k) for k, m in sorted(self.meetings.items()) if q in m["title"].lower()]
        return {"success": True, "data": hits}

    def move_meeting(self, meeting_id: str, day: str, hour: int) -> dict:
        m, err = self._get(meeting_id)
        if err:
            return err
        if day not in ("Mon", "Tue", "Wed", "Thu", "Fri") or type(hour) is not int or not 8 <= hour <= 17:
            return {"success": False, "error": "day must be Mon-Fri and hour an integer from 8 to 17"}
        m["day"], m["hour"] = day, hour
        return {"success": True, "data": dict(m, meeting_id=meeting_id)}

    def cancel_meeting(self, meeting_id: str) -> dict:
        m, err = self._get(meeting_id)
        if err:
            return err
        m["status"] = "cancelled"
        return {"success": True, "data": dict(m, meeting_id=meeting_id)}

    def add_attendee(self, meeting_id: str, name: str) -> dict:
        m, err = self._get(meeting_id)
        if err:
            return err
        if not isinstance(name, str) or not name.strip() or name in m["attendees"]:
            return {"success": False, "error": f"{name!r} is not a new attendee"}
        m["attendees"].append(name)
        return {"success": True, "data": dict(m, meeting_id=meeting_id)}
'''

MEETING_TITLES = ["Budget sync", "Design review", "Sprint planning", "Hiring panel", "Roadmap chat", "Vendor call",
                  "Team lunch", "Security audit", "Launch prep", "Board prep", "Retro", "Onboarding", "QA triage",
                  "Sales huddle", "Data review", "All hands"]


def _meetings_task(rng: random.Random) -> dict:
    n = rng.randint(4, 7)
    ids, titles = _ids(rng, "M", n, 10, 100), rng.sample(MEETING_TITLES, n)  # 2 digits: a move fits 48 tokens
    people = _names(rng, 7)
    meetings = {i: {"title": t, "day": rng.choice(DAYS), "hour": rng.choice(HOURS), "status": "scheduled",
                    "attendees": rng.sample(people[:5], rng.randint(1, 3))} for i, t in zip(ids, titles)}
    a, b = ids[0], ids[1]
    day, hour = _other(rng, DAYS, meetings[a]["day"]), _other(rng, HOURS, meetings[a]["hour"])
    when = _when(rng, day, hour)
    title_a, title_b = meetings[a]["title"], meetings[b]["title"]
    moved = _check(f"Is {a} on {day} at {_hh(hour)}?",
                   f"final_state['meetings'][{a!r}] == dict({meetings[a]!r}, day={day!r}, hour={hour!r})")
    off_a = _check(f"Is {a} cancelled?", f"final_state['meetings'][{a!r}]['status'] == 'cancelled'")
    off_b = _check(f"Is {b} cancelled?", f"final_state['meetings'][{b!r}]['status'] == 'cancelled'")
    guest = _other(rng, people, *meetings[a]["attendees"])
    invited = _check(f"Does {guest} attend {a}?", f"final_state['meetings'][{a!r}] == dict({meetings[a]!r}, "
                                                  f"attendees={meetings[a]['attendees'] + [guest]!r})")
    move, invite = _call("move_meeting", meeting_id=a, day=day, hour=hour), _call("add_attendee", meeting_id=a, name=guest)
    cancel_a, cancel_b = _call("cancel_meeting", meeting_id=a), _call("cancel_meeting", meeting_id=b)
    kind = rng.choice([0, 0, 0, 1, 1, 1, 7, 7, 2, 3, 4, 5, 6, 8])  # about half single-call tasks
    if kind == 0:
        text = rng.choice([f"Move meeting {a} to {when}.", f"Reschedule {a} to {when}.",
                           f"Please shift meeting {a} so it starts {when}.", f"The new time for meeting {a} is {when}; update it."])
        checks, ref = [moved], [move]
    elif kind == 1:
        text = rng.choice([f"Cancel meeting {b}.", f"Meeting {b} is off; cancel it.", f"Please call off meeting {b}.", f"Take meeting {b} off the calendar by cancelling it."])
        checks, ref = [off_b], [cancel_b]
    elif kind == 2:
        text = rng.choice([f"Find the '{title_a}' meeting and move it to {when}.",
                           f"The '{title_a}' meeting has to move to {when}. Look it up and reschedule it.", f"Search the calendar for '{title_a}' and put that meeting at {when}.", f"Reschedule whichever meeting is titled '{title_a}' to {when}; you will need its id first."])
        checks, ref = [moved], [_call("find_meetings", title=title_a), move]
    elif kind == 3:
        text = rng.choice([f"Look up the '{title_a}' meeting and cancel it.", f"Find '{title_a}' and call it off.", f"'{title_a}' will not happen. Search for that meeting and cancel it.", f"Search the meetings for the title '{title_a}', then cancel the one you find."])
        checks, ref = [off_a], [_call("find_meetings", title=title_a), cancel_a]
    elif kind == 4:
        text = rng.choice([f"Cancel meetings {a} and {b}.", f"Both {a} and {b} are off. Cancel them.", f"Neither meeting {a} nor meeting {b} will take place; cancel each of them.", f"Call off two meetings: {a} and {b}."])
        checks, ref = [off_a, off_b], [cancel_a, cancel_b]
    elif kind == 5:
        text = rng.choice([f"Cancel '{title_b}' and move '{title_a}' to {when}. Look both up first.",
                           f"Find the '{title_b}' meeting and cancel it, then find '{title_a}' and move it to {when}.", f"Two changes by title: '{title_b}' is cancelled, and '{title_a}' moves to {when}. Search for both first.", f"Search for '{title_a}' and '{title_b}'. The first goes to {when}; the second is cancelled."])
        checks = [off_b, moved]
        ref = [_call("find_meetings", title=title_b), cancel_b, _call("find_meetings", title=title_a), move]
    elif kind == 7:
        text = rng.choice([f"Add {guest} to meeting {a}.", f"Invite {guest} to {a}.",
                           f"{guest} should join meeting {a}; add them.", f"Put {guest} on the attendee list of meeting {a}."])
        checks, ref = [invited], [invite]
    elif kind == 8:
        text = rng.choice([f"Find the '{title_a}' meeting and add {guest} to it.",
                           f"{guest} wants to attend '{title_a}'. Look the meeting up and add them.", f"Search for the meeting called '{title_a}' and put {guest} on its attendee list.", f"Add {guest} as an attendee of '{title_a}'. You only know the title, so look it up."])
        checks, ref = [invited], [_call("find_meetings", title=title_a), invite]
    else:
        text = rng.choice([f"Move meeting {a} to {when} and cancel meeting {b}.",
                           f"Cancel {b}, then reschedule {a} to {when}.", f"Two calendar changes: meeting {b} is cancelled and meeting {a} moves to {when}.", f"Cancel meeting {b}. Meeting {a} needs a new time: {when}."])
        checks, ref = [moved, off_b], [cancel_b, move] if text.startswith("Cancel") else [move, cancel_b]
    return {"init_config": {"meetings": meetings}, "task": text, "checklist_with_func": checks,
            "reference_actions": ref}


# ----------------------------------------------------------------------------- rooms

ROOMS_CODE = '''
class RoomBooking:
    def __init__(self, init_config: dict):
        self.rooms = {}
        self.bookings = {}

    def list_rooms(self) -> dict:
        return {"success": True, "data": [dict(r, room_id=k) for k, r in sorted(self.rooms.items())]}

    def book_room(self, room_id: str, day: str, hour: int) -> dict:
        if room_id not in self.rooms:
            return {"success": False, "error": f"no room {room_id}"}
        if day not in ("Mon", "Tue", "Wed", "Thu", "Fri") or type(hour) is not int or not 8 <= hour <= 17:
            return {"success": False, "error": "day must be Mon-Fri and hour an integer from 8 to 17"}
        if any((b["room_id"], b["day"], b["hour"]) == (room_id, day, hour) for b in self.bookings.values()):
            return {"success": False, "error": "room already booked then"}
        booking_id = "B-" + str(1 + max([int(k[2:]) for k in self.bookings] + [100]))
        self.bookings[booking_id] = {"room_id": room_id, "day": day, "hour": hour}
        return {"success": True, "data": {"booking_id": booking_id}}

    def cancel_booking(self, booking_id: str) -> dict:
        if booking_id not in self.bookings:
            return {"success": False, "error": f"no booking {booking_id}"}
        del self.bookings[booking_id]
        return {"success": True, "data": booking_id}

    def change_room(self, booking_id: str, room_id: str) -> dict:
        b = self.bookings.get(booking_id)
        if b is None or room_id not in self.rooms:
            return {"success": False, "error": "unknown booking or room"}
        if any(dict(b, room_id=room_id) == o for o in self.bookings.values()):
            return {"success": False, "error": "room already booked then"}
        b["room_id"] = room_id
        return {"success": True, "data": dict(b, booking_id=booking_id)}
'''

ROOM_NAMES = ["Oak", "Pine", "Elm", "Maple", "Cedar", "Birch", "Willow", "Aspen", "Lotus", "Atlas", "Orion", "Nova"]


def _rooms_task(rng: random.Random) -> dict:
    n_rooms = rng.randint(3, 5)
    room_ids, names = _ids(rng, "R", n_rooms), rng.sample(ROOM_NAMES, n_rooms)
    sizes = rng.sample([4, 6, 8, 10, 12, 16, 20], n_rooms)
    rooms = {r: {"name": nm, "seats": s} for r, nm, s in zip(room_ids, names, sizes)}
    bookings: dict = {}
    for b in _ids(rng, "B", rng.randint(2, 4)):
        slot = {"room_id": rng.choice(room_ids), "day": rng.choice(DAYS), "hour": rng.choice(HOURS)}
        while slot in bookings.values():
            slot["hour"] = rng.choice(HOURS)
        bookings[b] = slot
    day, hour = rng.choice(DAYS), rng.choice(HOURS)
    while any((b["day"], b["hour"]) == (day, hour) for b in bookings.values()):
        hour = rng.choice(HOURS)
    room = rng.choice(room_ids)
    big = max(room_ids, key=lambda r: rooms[r]["seats"])
    need = rng.randint(sorted(sizes)[-2] + 1, rooms[big]["seats"])
    bid = rng.choice(sorted(bookings))
    free = [r for r in room_ids if dict(bookings[bid], room_id=r) not in bookings.values()]
    new_room = rng.choice(free) if free else None
    when = _when(rng, day, hour)

    def booked(r: str) -> dict:
        return _check(f"Is {r} booked on {day} at {_hh(hour)}?",
                      f"{{'room_id': {r!r}, 'day': {day!r}, 'hour': {hour!r}}} in final_state['bookings'].values()")

    gone = _check(f"Is booking {bid} cancelled?", f"{bid!r} not in final_state['bookings']")
    book, cancel = _call("book_room", room_id=room, day=day, hour=hour), _call("cancel_booking", booking_id=bid)
    kind = rng.choice([0, 0, 1, 1, 6, 6, 2, 3, 4, 5, 7] if new_room else [0, 0, 1, 1, 2, 3, 4, 5])  # ~half single-call
    if new_room:
        changed = _check(f"Is booking {bid} in {new_room}?",
                         f"final_state['bookings'].get({bid!r}) == dict({bookings[bid]!r}, room_id={new_room!r})")
        change = _call("change_room", booking_id=bid, room_id=new_room)
    if kind == 0:
        text = rng.choice([f"Book room {room} for {when}.", f"Reserve {room} on {when}.",
                           f"I need room {room} {when}; book it.", f"Make a booking of room {room} for {when}."])
        checks, ref = [booked(room)], [book]
    elif kind == 1:
        text = rng.choice([f"Cancel booking {bid}.", f"Booking {bid} is no longer needed; cancel it.", f"Drop booking {bid}.", f"Release the room held by booking {bid}."])
        checks, ref = [gone], [cancel]
    elif kind == 2:
        text = rng.choice([f"Book the {rooms[room]['name']} room for {when}.",
                           f"Find the room called {rooms[room]['name']} and reserve it for {when}.", f"Reserve {rooms[room]['name']} for {when}. List the rooms to get its id.", f"Someone wants the {rooms[room]['name']} room at {when}; look up its id and book it."])
        checks, ref = [booked(room)], [_call("list_rooms"), book]
    elif kind == 3:
        text = rng.choice([f"Book a room with at least {need} seats for {when}.",
                           f"{need} people meet {when}. Find a room that seats them and book it.", f"Check the rooms and book the one with {need} or more seats for {when}.", f"A group of {need} needs a room {when}. Pick one that is big enough and reserve it."])
        checks, ref = [booked(big)], [_call("list_rooms"), _call("book_room", room_id=big, day=day, hour=hour)]
    elif kind == 4:
        text = rng.choice([f"Cancel booking {bid} and book room {room} for {when}.",
                           f"Book {room} for {when}, then cancel booking {bid}.", f"Two room changes: booking {bid} goes away and room {room} is reserved for {when}.", f"Booking {bid} is obsolete; cancel it. Room {room} must be booked for {when}."])
        checks, ref = [gone, booked(room)], [book, cancel] if text.startswith("Book") else [cancel, book]
    elif kind == 6:
        text = rng.choice([f"Move booking {bid} to room {new_room}.", f"Change the room of booking {bid} to {new_room}.", f"Booking {bid} should use room {new_room} from now on.", f"Put booking {bid} in room {new_room} instead."])
        checks, ref = [changed], [change]
    elif kind == 7:
        text = rng.choice([f"Booking {bid} should be in the {rooms[new_room]['name']} room instead. Switch it.",
                           f"Switch booking {bid} to the room named {rooms[new_room]['name']}.", f"Move booking {bid} into {rooms[new_room]['name']}; list the rooms to find its id.", f"The {rooms[new_room]['name']} room should host booking {bid}. Look up that room and change it."])
        checks, ref = [changed], [_call("list_rooms"), change]
    else:
        other = _other(rng, sorted(bookings), bid)
        gone_other = _check(f"Is booking {other} cancelled?", f"{other!r} not in final_state['bookings']")
        text = rng.choice([f"Cancel bookings {bid} and {other}.", f"Bookings {bid} and {other} are not needed; cancel both.", f"Release two bookings: {bid} and {other}.", f"Neither booking {bid} nor booking {other} is needed any more. Drop them."])
        checks, ref = [gone, gone_other], [cancel, _call("cancel_booking", booking_id=other)]
    return {"init_config": {"rooms": rooms, "bookings": bookings}, "task": text, "checklist_with_func": checks,
            "reference_actions": ref}


# ----------------------------------------------------------------------------- clinic

CLINIC_CODE = """
class ClinicAppointments:
    def __init__(self, init_config: dict):
        self.patients = {}
        self.slots = {}

    def find_patient(self, name: str) -> dict:
        q = str(name).lower()
        return {"success": True, "data": [dict(p, patient_id=k) for k, p in sorted(self.patients.items())
                                          if q in p["name"].lower()]}

    def list_slots(self, doctor: str) -> dict:
        q = str(doctor).lower()
        return {"success": True, "data": [dict(v, slot_id=k) for k, v in sorted(self.slots.items())
                                          if q in v["doctor"].lower()]}

    def book_slot(self, slot_id: str, patient_id: str) -> dict:
        slot = self.slots.get(slot_id)
        if slot is None or patient_id not in self.patients:
            return {"success": False, "error": "unknown slot or patient"}
        if slot["patient"] is not None:
            return {"success": False, "error": f"slot {slot_id} is taken"}
        slot["patient"] = patient_id
        return {"success": True, "data": dict(slot, slot_id=slot_id)}

    def cancel_slot(self, slot_id: str) -> dict:
        slot = self.slots.get(slot_id)
        if slot is None or slot["patient"] is None:
            return {"success": False, "error": f"slot {slot_id} has no appointment"}
        slot["patient"] = None
        return {"success": True, "data": dict(slot, slot_id=slot_id)}
"""
CLINIC_REPORT = _report_tool("slots", "slot_id", "slot")  # an extra tool no task needs

DOCTORS = ["Dr Lee", "Dr Osei", "Dr Patel", "Dr Kim", "Dr Rossi", "Dr Nowak", "Dr Diaz", "Dr Chen"]


def _clinic_task(rng: random.Random) -> dict:
    pids, names = _ids(rng, "P", rng.randint(3, 5)), _names(rng, 5)
    patients = {p: {"name": n} for p, n in zip(pids, names)}
    doctors, sids = rng.sample(DOCTORS, 3), _ids(rng, "S", rng.randint(5, 8), 10, 100)
    slots, seen = {}, set()
    for sid in sids:
        slot = (rng.choice(doctors), rng.choice(DAYS), rng.choice(HOURS))
        while slot in seen:
            slot = (slot[0], rng.choice(DAYS), rng.choice(HOURS))
        seen.add(slot)
        slots[sid] = {"doctor": slot[0], "day": slot[1], "hour": slot[2], "patient": None}
    free, taken = sids[:-2], sids[-2:]
    for sid in taken:
        slots[sid]["patient"] = rng.choice(pids)
    p, s, t = rng.choice(pids), rng.choice(free), taken[0]
    slot = slots[s]
    when = f"{slot['doctor']}'s {slot['day']} {_hh(slot['hour'])} slot"
    booked = _check(f"Is {s} booked for {p}?", f"final_state['slots'][{s!r}] == dict({slot!r}, patient={p!r})")
    freed = _check(f"Is {t} free?", f"final_state['slots'][{t!r}] == dict({slots[t]!r}, patient=None)")
    book = _call("book_slot", slot_id=s, patient_id=p)
    find, listing = _call("find_patient", name=patients[p]["name"]), _call("list_slots", doctor=slot["doctor"])
    name = patients[p]["name"]
    kind = rng.choice([0, 0, 1, 1, 2, 3, 4, 5])
    if kind == 0:
        text = rng.choice([f"Book slot {s} for patient {p}.", f"Give patient {p} the appointment in slot {s}.", f"Reserve slot {s} for patient {p}.", f"Patient {p} takes slot {s}; book it."])
        checks, ref = [booked], [book]
    elif kind == 1:
        text = rng.choice([f"Cancel the appointment in slot {t}.", f"Slot {t}: the patient cannot come. Free it.", f"Release slot {t} by cancelling its appointment.", f"Clear the booking in slot {t}."])
        checks, ref = [freed], [_call("cancel_slot", slot_id=t)]
    elif kind == 2:
        text = rng.choice([f"Find patient {name} and book slot {s} for them.", f"Book slot {s} for {name}.", f"Look up the patient id of {name}, then put them in slot {s}.", f"{name} gets slot {s}. Search for the patient first."])
        checks, ref = [booked], [find, book]
    elif kind == 3:
        text = rng.choice([f"Book {when} for patient {p}.", f"Patient {p} wants {when}. Book it.", f"List the slots of {slot['doctor']} and book {when} for patient {p}.", f"Reserve {when} for patient {p}; you need the slot id first."])
        checks, ref = [booked], [listing, book]
    elif kind == 4:
        text = rng.choice([f"Cancel the appointment in slot {t} and book slot {s} for patient {p}.",
                           f"Book slot {s} for patient {p}, then free slot {t}.", f"Two bookings change: patient {p} gets slot {s}, and slot {t} is cancelled.", f"Slot {t} must be freed. Slot {s} goes to patient {p}."])
        free_t = _call("cancel_slot", slot_id=t)
        checks, ref = [freed, booked], [book, free_t] if text.startswith("Book") else [free_t, book]
    else:
        text = rng.choice([f"{name} wants {when}. Book it.", f"Book {when} for the patient {name}.", f"Find patient {name} and the slot {when}, then book it for them.", f"{name} would like {when}. Look up both and make the booking."])
        checks, ref = [booked], [find, listing, book]
    return {"init_config": {"patients": patients, "slots": slots}, "task": text, "checklist_with_func": checks,
            "reference_actions": ref}


# ----------------------------------------------------------------------------- gym classes (transfer)

CLASSES_CODE = """
class GymClasses:
    def __init__(self, init_config: dict):
        self.classes = {}

    def find_classes(self, name: str) -> dict:
        q = str(name).lower()
        return {"success": True, "data": [dict(c, class_id=k) for k, c in sorted(self.classes.items())
                                          if q in c["name"].lower()]}

    def enroll(self, class_id: str, member_id: str) -> dict:
        c = self.classes.get(class_id)
        if c is None or not isinstance(member_id, str) or not member_id.startswith("M-"):
            return {"success": False, "error": "unknown class or member id"}
        if member_id in c["members"]:
            return {"success": False, "error": f"{member_id} is already enrolled"}
        if len(c["members"]) >= c["capacity"]:
            return {"success": False, "error": f"class {class_id} is full"}
        c["members"].append(member_id)
        return {"success": True, "data": dict(c, class_id=class_id)}

    def unenroll(self, class_id: str, member_id: str) -> dict:
        c = self.classes.get(class_id)
        if c is None or member_id not in c["members"]:
            return {"success": False, "error": f"{member_id} is not in class {class_id}"}
        c["members"].remove(member_id)
        return {"success": True, "data": dict(c, class_id=class_id)}

    def set_capacity(self, class_id: str, capacity: int) -> dict:
        c = self.classes.get(class_id)
        if c is None or not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < len(c["members"]):
            return {"success": False, "error": "unknown class, or capacity below the enrolment"}
        c["capacity"] = capacity
        return {"success": True, "data": dict(c, class_id=class_id)}
"""

CLASS_NAMES = ["Yoga", "Spin", "Pilates", "Boxing", "Zumba", "HIIT", "Rowing", "Stretch"]


def _classes_task(rng: random.Random) -> dict:
    member_ids = _ids(rng, "M", 6)
    cids, names = _ids(rng, "C", rng.randint(4, 6), 10, 100), rng.sample(CLASS_NAMES, 3)
    classes = {}
    for cid in cids:
        cap = rng.choice([4, 5, 6, 8])
        classes[cid] = {"name": rng.choice(names), "day": rng.choice(DAYS), "hour": rng.choice(HOURS),
                        "capacity": cap, "members": rng.sample(member_ids[1:], rng.randint(1, min(cap, 4)))}
    a, b = cids[0], cids[1]
    classes[a]["members"] = classes[a]["members"][:classes[a]["capacity"] - 1]  # room for one more
    m = _other(rng, member_ids, *classes[a]["members"])
    inside = rng.choice(classes[b]["members"])
    ca, cb = classes[a], classes[b]
    cap = ca["capacity"] + rng.randint(2, 6)
    enrolled = _check(f"Is {m} in {a}?", f"final_state['classes'][{a!r}]['members'] == {ca['members'] + [m]!r}")
    dropped = _check(f"Is {inside} out of {b}?", f"final_state['classes'][{b!r}]['members'] == "
                                                 f"{[x for x in cb['members'] if x != inside]!r}")
    raised = _check(f"Is {a}'s capacity {cap}?", f"final_state['classes'][{a!r}]['capacity'] == {cap!r}")
    enroll = _call("enroll", class_id=a, member_id=m)
    same_name = [c for c in cids if classes[c]["name"] == ca["name"]]
    kind = rng.randrange(6)
    if kind == 0:
        text = rng.choice([f"Enroll member {m} in class {a}.", f"Sign {m} up for class {a}."])
        checks, ref = [enrolled], [enroll]
    elif kind == 1:
        text = rng.choice([f"Remove member {inside} from class {b}.", f"{inside} quits class {b}; unenroll them."])
        checks, ref = [dropped], [_call("unenroll", class_id=b, member_id=inside)]
    elif kind == 2:
        text = rng.choice([f"Set the capacity of class {a} to {cap}.", f"Class {a} moves to a bigger hall: capacity {cap}."])
        checks, ref = [raised], [_call("set_capacity", class_id=a, capacity=cap)]
    elif kind == 3 and all((classes[c]["day"], classes[c]["hour"]) != (ca["day"], ca["hour"]) for c in same_name[1:]):
        text = rng.choice([f"Enroll {m} in the {ca['name']} class on {ca['day']} at {_hh(ca['hour'])}.",
                           f"Member {m} wants the {ca['day']} {_hh(ca['hour'])} {ca['name']} class. Sign them up."])
        checks, ref = [enrolled], [_call("find_classes", name=ca["name"]), enroll]
    elif kind == 4 and inside not in ca["members"]:
        text = rng.choice([f"Move member {inside} from class {b} to class {a}.",
                           f"{inside} switches from class {b} to {a}."])
        moved_in = _check(f"Is {inside} in {a}?", f"final_state['classes'][{a!r}]['members'] == {ca['members'] + [inside]!r}")
        checks, ref = [dropped, moved_in], [_call("unenroll", class_id=b, member_id=inside),
                                            _call("enroll", class_id=a, member_id=inside)]
    else:
        text = f"Raise the capacity of class {a} to {cap} and enroll member {m} in it."
        checks, ref = [raised, enrolled], [_call("set_capacity", class_id=a, capacity=cap), enroll]
    return {"init_config": {"classes": classes}, "task": text, "checklist_with_func": checks, "reference_actions": ref}


ENVS = [
    {
        "env_id": "bed_calendar_meetings",
        "env_class_name": "MeetingCalendar",
        "role": "main",
        "environment_introduction": "A team calendar: meetings with an id, title, day (Mon-Fri), start hour (8-17) and attendees.",
        "constraints_rules": ["Cancelled meetings cannot be changed."],
        "tools": [_tool("find_meetings", "Meetings whose title contains the text.", title="string"),
                  _tool("move_meeting", "Move a meeting to a new day and hour.", meeting_id="string",
                        day="string", hour="integer"),
                  _tool("cancel_meeting", "Cancel a meeting.", meeting_id="string"),
                  _tool("add_attendee", "Add a person to a meeting.", meeting_id="string", name="string")],
        "env_class_code": MEETINGS_CODE,
        "make_task": _meetings_task,
    },
    {
        "env_id": "bed_calendar_rooms",
        "env_class_name": "RoomBooking",
        "role": "main",
        "environment_introduction": "Meeting-room bookings: rooms with a name and seats; one-hour bookings by day (Mon-Fri) and hour (8-17).",
        "constraints_rules": ["A room has one booking per day and hour."],
        "tools": [_tool("list_rooms", "All rooms with id, name and seats."),
                  _tool("book_room", "Book a room; returns the booking id.", room_id="string", day="string",
                        hour="integer"),
                  _tool("cancel_booking", "Cancel a booking.", booking_id="string"),
                  _tool("change_room", "Move a booking to another room.", booking_id="string", room_id="string")],
        "env_class_code": ROOMS_CODE,
        "make_task": _rooms_task,
    },
    {
        "env_id": "bed_calendar_clinic",
        "env_class_name": "ClinicAppointments",
        "role": "main",
        "environment_introduction": "A clinic's appointment book: patients, and doctors' one-hour slots by day (Mon-Fri) and hour.",
        "constraints_rules": ["A slot holds at most one patient."],
        "tools": [_tool("find_patient", "Patients whose name contains the text.", name="string"),
                  _tool("list_slots", "Slots of a doctor, free or booked.", doctor="string"),
                  _tool("book_slot", "Book a free slot for a patient.", slot_id="string", patient_id="string"),
                  _tool("cancel_slot", "Cancel the appointment in a slot.", slot_id="string"), CLINIC_REPORT[1]],
        "env_class_code": CLINIC_CODE + CLINIC_REPORT[0],
        "make_task": _clinic_task,
    },
    {
        "env_id": "bed_calendar_classes",
        "env_class_name": "GymClasses",
        "role": "transfer",
        "environment_introduction": "A gym's class timetable: classes with a name, day, hour, capacity and enrolled member ids.",
        "constraints_rules": ["A class cannot hold more members than its capacity."],
        "tools": [_tool("find_classes", "Classes whose name contains the text.", name="string"),
                  _tool("enroll", "Enroll a member in a class.", class_id="string", member_id="string"),
                  _tool("unenroll", "Remove a member from a class.", class_id="string", member_id="string"),
                  _tool("set_capacity", "Change a class's capacity.", class_id="string", capacity="integer")],
        "env_class_code": CLASSES_CODE,
        "make_task": _classes_task,
    },
]
