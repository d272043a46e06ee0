"""Library domain of the lopd study bed: loans, holds, membership cards and study rooms.

Three "main" environments and a "transfer" one (study rooms: no train task uses it), in the EnvScaler
table format (see the bed README). Each entry of
``ENVS`` carries the class source, terse tool schemas and ``make_task(rng)``, which draws a fresh
initial state and one task (text, check functions, reference actions) from ``rng``. Stdlib only.
"""
import random

from domains._common import (call as _call, check as _check, task as _task, tool as _tool,
                             report_tool as _report_tool)

FIRST = ["Ada", "Ben", "Cora", "Dev", "Elif", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kira", "Liam",
         "Mona", "Nils", "Omar", "Pia", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Vic", "Wen", "Yara"]
LAST = ["Moreno", "Baker", "Chen", "Dubois", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jensen",
        "Kowal", "Lopez", "Mensah", "Novak", "Okafor", "Park", "Quist", "Rossi", "Silva", "Tanaka"]
TITLES = ["Dune", "Emma", "Ivanhoe", "Beloved", "Kindred", "Solaris", "Rebecca", "Ulysses", "Walden",
          "Dracula", "Middlemarch", "Persuasion", "Frankenstein", "Neuromancer", "Foundation", "Matilda",
          "Hyperion", "Coraline", "Lolita", "Siddhartha"]
AUTHORS = ["Herbert", "Austen", "Scott", "Morrison", "Butler", "Lem", "Du Maurier", "Joyce", "Thoreau",
           "Stoker", "Eliot", "Shelley", "Gibson", "Asimov", "Dahl", "Simmons", "Gaiman", "Hesse"]


def _ids(rng: random.Random, prefix: str, n: int, digits: int = 4) -> list:
    """``n`` distinct ids like "B-2041" (``digits`` digits, no leading zero; many digits make two
    tasks of an environment rarely share an id)."""
    return [f"{prefix}-{k}" for k in rng.sample(range(10 ** (digits - 1), 10 ** digits), n)]


def _names(rng: random.Random, n: int) -> list:
    """``n`` distinct "First Last" names."""
    firsts, lasts = rng.sample(FIRST, n), rng.sample(LAST, n)
    return [f"{a} {b}" for a, b in zip(firsts, lasts)]


# ----------------------------------------------------------------------------- loans

LOANS_CODE = '''from typing import Dict


class LoanDesk:
    """Loan desk: books (title, author, holder member id or None) and members (name)."""

    def __init__(self, init_config: dict):
        self.books: Dict[str, dict] = {}
        self.members: Dict[str, dict] = {}

    def find_book(self, query: str) -> dict:
        q = str(query).lower()
        hits = [dict(b, book_id=k) for k, b in self.books.items()
                if q and (q in b["title"].lower() or q in b["author"].lower())]
        return {"success": True, "data": hits}

    def find_member(self, name: str) -> dict:
        q = str(name).lower()
        hits = [{"member_id": k, "name": m["name"],
                 "loans": [b for b, v in self.books.items() if v["holder"] == k]}
                for k, m in self.members.items() if q and q in m["name"].lower()]
        return {"success": True, "data": hits}

    def checkout(self, book_id: str, member_id: str) -> dict:
        if book_id not in self.books:
            return {"success": False, "error": f"unknown book {book_id}"}
        if member_id not in self.members:
            return {"success": False, "error": f"unknown member {member_id}"}
        if self.books[book_id]["holder"] is not None:
            return {"success": False, "error": f"book {book_id} is on loan"}
        self.books[book_id]["holder"] = member_id
        return {"success": True, "data": {"book_id": book_id, "holder": member_id}}

    def return_book(self, book_id: str) -> dict:
        if book_id not in self.books:
            return {"success": False, "error": f"unknown book {book_id}"}
        if self.books[book_id]["holder"] is None:
            return {"success": False, "error": f"book {book_id} is not on loan"}
        self.books[book_id]["holder"] = None
        return {"success": True, "data": {"book_id": book_id, "holder": None}}
'''
LOANS_REPORT = _report_tool("books", "book_id", "book")  # an extra tool no task needs


def loans_task(rng: random.Random) -> dict:
    """A loan-desk state (5-7 books, 3-4 members) and one checkout/return task."""
    n_books, n_members = rng.randint(5, 7), rng.randint(3, 4)
    bids, mids = _ids(rng, "B", n_books), _ids(rng, "M", n_members)
    titles, authors, names = rng.sample(TITLES, n_books), rng.sample(AUTHORS, n_books), _names(rng, n_members)
    members = {m: {"name": n} for m, n in zip(mids, names)}
    # the first two books are always on loan and the next two always free; the rest at random
    holders = [rng.choice(mids), rng.choice(mids), None, None] + [rng.choice(mids + [None, None]) for _ in bids[4:]]
    books = {b: {"title": t, "author": a, "holder": h} for b, t, a, h in zip(bids, titles, authors, holders)}
    init = {"books": books, "members": members}
    out, free = bids[:2], bids[2:4]
    holder = lambda b, m: _check(f"Is book {b} on loan to {m}?", f"final_state['books'][{b!r}]['holder'] == {m!r}")
    back = lambda b: _check(f"Is book {b} back (no holder)?", f"final_state['books'][{b!r}]['holder'] is None")
    m = rng.choice(mids)
    kind = rng.choice(["lend", "return"]) if rng.random() < 0.5 else rng.choice(["find_lend", "swap", "member_returns"])
    if kind == "lend":
        return _task(rng, ["Check out book {b} to member {m}.", "Lend book {b} to member {m}.",
                           "Member {m} wants to borrow book {b}; record the loan.", "Book {b} goes home with member {m}. Record it as on loan."],
                     [holder(free[0], m)], [_call("checkout", book_id=free[0], member_id=m)], init, b=free[0], m=m)
    if kind == "return":
        name = members[books[out[0]]["holder"]]["name"]
        return _task(rng, ["Book {b} has been returned; record it.", "Record the return of book {b}.",
                           "{name} brought back book {b}. Check it in.", "Mark book {b} as back on the shelf."],
                     [back(out[0])], [_call("return_book", book_id=out[0])], init, b=out[0], name=name)
    if kind == "find_lend":
        title = books[free[0]]["title"]
        return _task(rng, ["Find the book '{t}' and lend it to member {m}.",
                           "Member {m} wants to borrow '{t}'. Look it up and check it out to them.", "Search the catalogue for '{t}' and record a loan of it to member {m}.", "Lend '{t}' to member {m}. The book id is unknown; search for the title first."],
                     [holder(free[0], m)],
                     [_call("find_book", query=title), _call("checkout", book_id=free[0], member_id=m)],
                     init, t=title, m=m)
    if kind == "swap":
        m = books[out[0]]["holder"]
        return _task(rng, ["Member {m} returns book {b1} and borrows book {b2}.",
                           "Check in book {b1} from member {m}, then lend them book {b2}.", "Two desk jobs for member {m}: book {b1} comes back, book {b2} goes out.", "Book {b1} is returned. Afterwards member {m} takes book {b2} home."],
                     [back(out[0]), holder(free[0], m)],
                     [_call("return_book", book_id=out[0]), _call("checkout", book_id=free[0], member_id=m)],
                     init, m=m, b1=out[0], b2=free[0])
    m = books[out[0]]["holder"]
    loans = [b for b in bids if books[b]["holder"] == m][:3]
    return _task(rng, ["{name} has brought back every book they had on loan. Find their loans and record the returns.",
                       "Check in all the books borrowed by {name}.", "Every loan of {name} has ended. Search for the member and return each book.", "{name} returned all their books today; look up what they had and check each one in."],
                 [back(b) for b in loans],
                 [_call("find_member", name=members[m]["name"])] + [_call("return_book", book_id=b) for b in loans],
                 init, name=members[m]["name"])


# ----------------------------------------------------------------------------- holds

HOLDS_CODE = '''from typing import Dict


class HoldQueue:
    """Hold (reservation) queues: books (title, queue of member ids) and members (name)."""

    def __init__(self, init_config: dict):
        self.books: Dict[str, dict] = {}
        self.members: Dict[str, dict] = {}

    def find_member(self, name: str) -> dict:
        q = str(name).lower()
        hits = [{"member_id": k, "name": m["name"]} for k, m in self.members.items() if q and q in m["name"].lower()]
        return {"success": True, "data": hits}

    def get_holds(self, book_id: str) -> dict:
        if book_id not in self.books:
            return {"success": False, "error": f"unknown book {book_id}"}
        return {"success": True, "data": dict(self.books[book_id], book_id=book_id)}

    def place_hold(self, book_id: str, member_id: str) -> dict:
        if book_id not in self.books:
            return {"success": False, "error": f"unknown book {book_id}"}
        if member_id not in self.members:
            return {"success": False, "error": f"unknown member {member_id}"}
        queue = self.books[book_id]["queue"]
        if member_id in queue:
            return {"success": False, "error": f"{member_id} already holds {book_id}"}
        queue.append(member_id)
        return {"success": True, "data": {"book_id": book_id, "queue": queue}}

    def cancel_hold(self, book_id: str, member_id: str) -> dict:
        if book_id not in self.books:
            return {"success": False, "error": f"unknown book {book_id}"}
        queue = self.books[book_id]["queue"]
        if member_id not in queue:
            return {"success": False, "error": f"{member_id} has no hold on {book_id}"}
        queue.remove(member_id)
        return {"success": True, "data": {"book_id": book_id, "queue": queue}}
'''
HOLDS_REPORT = _report_tool("books", "book_id", "book")  # an extra tool no task needs


def holds_task(rng: random.Random) -> dict:
    """A hold-queue state (4-6 books, 4-5 members) and one place/cancel/move task."""
    n_books, n_members = rng.randint(4, 6), rng.randint(4, 5)
    bids, mids = _ids(rng, "B", n_books), _ids(rng, "M", n_members, 3)
    members = {m: {"name": n} for m, n in zip(mids, _names(rng, n_members))}
    books = {b: {"title": t, "queue": rng.sample(mids, rng.randint(0, 3))}
             for b, t in zip(bids, rng.sample(TITLES, n_books))}
    m = rng.choice(mids)
    held = [b for b in bids if m in books[b]["queue"]]
    if not held:  # the member always holds at least one book
        books[bids[0]]["queue"].append(m)
        held = [bids[0]]
    not_held = [b for b in bids if m not in books[b]["queue"]]
    if not not_held:  # and lacks a hold on at least one
        books[bids[-1]]["queue"].remove(m)
        held.remove(bids[-1])
        not_held = [bids[-1]]
    init = {"books": books, "members": members}
    b_in, b_out, name = rng.choice(held), rng.choice(not_held), members[m]["name"]
    added = lambda b: _check(f"Is {m} last in the hold queue of {b}?",
                             f"final_state['books'][{b!r}]['queue'] == {books[b]['queue'] + [m]!r}")
    removed = lambda b: _check(f"Is {m}'s hold on {b} gone, the rest of the queue kept?",
                               f"final_state['books'][{b!r}]['queue'] == {[x for x in books[b]['queue'] if x != m]!r}")
    kind = rng.choice(["place", "cancel"]) if rng.random() < 0.5 else rng.choice(["find_place", "find_cancel", "move"])
    if kind == "place":
        return _task(rng, ["Place a hold on book {b} for member {m}.", "Member {m} wants to reserve book {b}.",
                           "Put member {m} in the hold queue for book {b}.", "Add a reservation of book {b} by member {m}."],
                     [added(b_out)], [_call("place_hold", book_id=b_out, member_id=m)], init, b=b_out, m=m)
    if kind == "cancel":
        return _task(rng, ["Cancel member {m}'s hold on book {b}.", "Member {m} no longer needs book {b}; remove the hold.",
                           "Take member {m} out of the hold queue for book {b}.", "Drop the reservation member {m} has on book {b}."],
                     [removed(b_in)], [_call("cancel_hold", book_id=b_in, member_id=m)], init, b=b_in, m=m)
    if kind == "find_place":
        return _task(rng, ["Find the member named {name} and place a hold for them on book {b}.",
                           "{name} would like to reserve book {b}. Look up their member id and add the hold.", "Search the members for {name}, then reserve book {b} for them.", "Add {name} to the hold queue of book {b}; their member id is unknown."],
                     [added(b_out)], [_call("find_member", name=name), _call("place_hold", book_id=b_out, member_id=m)],
                     init, name=name, b=b_out)
    if kind == "find_cancel":
        return _task(rng, ["{name} wants to cancel their hold on book {b}. Find their member id and cancel it.",
                           "Look up the member {name} and remove their hold on book {b}.", "Search for {name} and drop their reservation of book {b}.", "The reservation of book {b} by {name} is no longer wanted. Find the member id and cancel it."],
                     [removed(b_in)], [_call("find_member", name=name), _call("cancel_hold", book_id=b_in, member_id=m)],
                     init, name=name, b=b_in)
    return _task(rng, ["Move member {m}'s hold from book {b1} to book {b2}.",
                       "Member {m} wants book {b2} instead of book {b1}: cancel the one hold and place the other.", "Two queue changes for member {m}: leave the queue of {b1}, join the queue of {b2}.", "Switch the reservation of member {m}: {b1} is dropped and {b2} is reserved."],
                 [removed(b_in), added(b_out)],
                 [_call("cancel_hold", book_id=b_in, member_id=m), _call("place_hold", book_id=b_out, member_id=m)],
                 init, m=m, b1=b_in, b2=b_out)


# ----------------------------------------------------------------------------- cards

CARDS_CODE = '''from typing import Dict


class CardOffice:
    """Membership cards: holder name, expiry year, unpaid fees (whole dollars), frozen flag."""

    def __init__(self, init_config: dict):
        self.cards: Dict[str, dict] = {}

    def find_card(self, name: str) -> dict:
        q = str(name).lower()
        hits = [dict(c, card_id=k) for k, c in self.cards.items() if q and q in c["name"].lower()]
        return {"success": True, "data": hits}

    def pay_fees(self, card_id: str, amount: int) -> dict:
        card = self.cards.get(card_id)
        if card is None:
            return {"success": False, "error": f"unknown card {card_id}"}
        if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount <= card["fees"]:
            return {"success": False, "error": f"amount must be 1..{card['fees']} dollars"}
        card["fees"] -= amount
        return {"success": True, "data": {"card_id": card_id, "fees": card["fees"]}}

    def renew_card(self, card_id: str, years: int) -> dict:
        card = self.cards.get(card_id)
        if card is None:
            return {"success": False, "error": f"unknown card {card_id}"}
        if years not in (1, 2, 3) or isinstance(years, bool):
            return {"success": False, "error": "years must be 1, 2 or 3"}
        if card["fees"] > 0 or card["frozen"]:
            return {"success": False, "error": "card has unpaid fees or is frozen"}
        card["expires"] += years
        return {"success": True, "data": {"card_id": card_id, "expires": card["expires"]}}

    def freeze_card(self, card_id: str) -> dict:
        card = self.cards.get(card_id)
        if card is None:
            return {"success": False, "error": f"unknown card {card_id}"}
        card["frozen"] = True
        return {"success": True, "data": {"card_id": card_id, "frozen": True}}
'''


def cards_task(rng: random.Random) -> dict:
    """A card-office state (4-6 cards) and one renew/pay/freeze task."""
    n = rng.randint(4, 6)
    cids, names = _ids(rng, "C", n), _names(rng, n)
    cards = {c: {"name": nm, "expires": rng.randint(2025, 2028), "fees": rng.choice([0, 0, 2, 5, 8, 12]), "frozen": False}
             for c, nm in zip(cids, names)}
    c = rng.choice(cids)
    card = cards[c]
    init = {"cards": cards}
    years = rng.randint(1, 3)
    kind = rng.choice(["renew", "pay", "freeze"]) if rng.random() < 0.5 else rng.choice(["find_renew", "pay_renew", "find_freeze"])
    y_txt = f"{years} year" + ("s" if years > 1 else "")
    renewed = _check(f"Does card {c} now expire in {card['expires'] + years}?",
                     f"final_state['cards'][{c!r}]['expires'] == {card['expires'] + years}")
    frozen = _check(f"Is card {c} frozen?", f"final_state['cards'][{c!r}]['frozen'] is True")
    if kind in ("renew", "find_renew"):
        card["fees"] = 0
    if kind in ("pay", "pay_renew"):
        card["fees"] = rng.randint(3, 15)
    if kind == "renew":
        return _task(rng, ["Renew library card {c} for {y}.", "Extend card {c} by {y}.",
                           "The holder of card {c} wants to renew it for {y}.", "Card {c} stays valid for {y} more."],
                     [renewed], [_call("renew_card", card_id=c, years=years)], init, c=c, y=y_txt)
    if kind == "pay":
        amount = rng.choice([card["fees"], rng.randint(1, card["fees"])])
        return _task(rng, ["Card {c} pays {a} dollars toward its fees.", "Record a {a} dollar fee payment on card {c}.",
                           "Take a payment of {a} dollars for the fees on card {c}.", "The fees on card {c} go down by a {a} dollar payment."],
                     [_check(f"Are card {c}'s fees now {card['fees'] - amount}?",
                             f"final_state['cards'][{c!r}]['fees'] == {card['fees'] - amount}")],
                     [_call("pay_fees", card_id=c, amount=amount)], init, c=c, a=amount)
    if kind == "freeze":
        return _task(rng, ["Card {c} was reported lost; freeze it.", "Freeze library card {c}.",
                           "Block card {c} right away: its holder lost it.", "Put library card {c} on hold with a freeze."],
                     [frozen], [_call("freeze_card", card_id=c)], init, c=c)
    if kind == "find_renew":
        return _task(rng, ["Find {name}'s library card and renew it for {y}.",
                           "{name} wants to renew their card for {y}. Look up the card first.", "Search for the card of {name} and extend it by {y}.", "Extend the library card belonging to {name} by {y}; find its id first."],
                     [renewed], [_call("find_card", name=card["name"]), _call("renew_card", card_id=c, years=years)],
                     init, name=card["name"], y=y_txt)
    if kind == "pay_renew":
        return _task(rng, ["Card {c} owes {f} dollars. Pay it all, then renew the card for {y}.",
                           "Settle the {f} dollar fees on card {c} and extend it by {y}.", "Two jobs on card {c}: the {f} dollars of fees are paid, and the card is renewed for {y}.", "Renew card {c} for {y} once its full fees of {f} dollars are paid."],
                     [_check(f"Are card {c}'s fees paid off?", f"final_state['cards'][{c!r}]['fees'] == 0"), renewed],
                     [_call("pay_fees", card_id=c, amount=card["fees"]), _call("renew_card", card_id=c, years=years)],
                     init, c=c, f=card["fees"], y=y_txt)
    return _task(rng, ["{name} lost their library card. Find it and freeze it.",
                       "Look up {name}'s card and block it; it was stolen.", "Search for the library card of {name} and freeze it.", "The card of {name} is missing. Find the card id and put a freeze on it."],
                 [frozen], [_call("find_card", name=card["name"]), _call("freeze_card", card_id=c)],
                 init, name=card["name"])


# ----------------------------------------------------------------------------- study rooms

ROOMS_CODE = '''from typing import Dict


class StudyRooms:
    """Study rooms: seats and one-hour bookings (hour as text, 9-18 -> member id)."""

    def __init__(self, init_config: dict):
        self.rooms: Dict[str, dict] = {}

    def find_rooms(self, hour: int, seats: int) -> dict:
        if not isinstance(hour, int) or not isinstance(seats, int):
            return {"success": False, "error": "hour and seats must be integers"}
        hits = [k for k, r in self.rooms.items() if r["seats"] >= seats and str(hour) not in r["booked"]]
        return {"success": True, "data": hits}

    def book_room(self, room: str, hour: int, member: str) -> dict:
        info = self.rooms.get(room)
        if info is None:
            return {"success": False, "error": f"unknown room {room}"}
        if not isinstance(hour, int) or not 9 <= hour <= 18:
            return {"success": False, "error": "hour must be 9..18"}
        if str(hour) in info["booked"]:
            return {"success": False, "error": f"{room} is booked at {hour}:00"}
        if not str(member).startswith("M-"):
            return {"success": False, "error": f"bad member id {member}"}
        info["booked"][str(hour)] = member
        return {"success": True, "data": {"room": room, "hour": hour, "member": member}}

    def cancel_booking(self, room: str, hour: int) -> dict:
        info = self.rooms.get(room)
        if info is None:
            return {"success": False, "error": f"unknown room {room}"}
        if str(hour) not in info["booked"]:
            return {"success": False, "error": f"no booking in {room} at {hour}:00"}
        del info["booked"][str(hour)]
        return {"success": True, "data": {"room": room, "hour": hour}}
'''
ROOMS_REPORT = _report_tool("rooms", "room", "room")  # an extra tool no task needs


def rooms_task(rng: random.Random) -> dict:
    """A study-room state (4-6 rooms, a few bookings each) and one book/cancel/move task."""
    n = rng.randint(4, 6)
    rids, pool = _ids(rng, "R", n, 3), _ids(rng, "M", 6, 2)
    m = pool[0]  # the task's member: not booked anywhere initially
    rooms = {r: {"seats": rng.choice([2, 4, 6, 8, 10]),
                 "booked": {str(h): rng.choice(pool[1:]) for h in sorted(rng.sample(range(9, 19), rng.randint(1, 4)))}}
             for r in rids}
    init = {"rooms": rooms}
    r = rng.choice(rids)
    booked = rooms[r]["booked"]
    free_hours = [h for h in range(9, 19) if str(h) not in booked]
    h_free, h_used = rng.choice(free_hours), int(rng.choice(sorted(booked)))
    has = lambda room, h, who: _check(f"Is room {room} booked at {h}:00 for {who}?",
                                      f"final_state['rooms'][{room!r}]['booked'].get({str(h)!r}) == {who!r}")
    gone = lambda room, h: _check(f"Is room {room} free at {h}:00?",
                                  f"{str(h)!r} not in final_state['rooms'][{room!r}]['booked']")
    kind = rng.choice(["book", "cancel"]) if rng.random() < 0.5 else rng.choice(["find_book", "move"])
    if kind == "book":
        return _task(rng, ["Book study room {r} at {h}:00 for member {m}.", "Reserve room {r} for member {m} at {h}:00.",
                           "Member {m} needs room {r} at {h}:00; book it."],
                     [has(r, h_free, m)], [_call("book_room", room=r, hour=h_free, member=m)], init, r=r, h=h_free, m=m)
    if kind == "cancel":
        return _task(rng, ["Cancel the {h}:00 booking of room {r}.", "Room {r} is no longer needed at {h}:00; cancel that booking.",
                           "Free up study room {r} at {h}:00."],
                     [gone(r, h_used)], [_call("cancel_booking", room=r, hour=h_used)], init, r=r, h=h_used)
    if kind == "find_book":
        hour = rng.randint(9, 18)
        fits = [x for x in rids if str(hour) not in rooms[x]["booked"]]
        if not fits:  # keep at least one room free at that hour
            fits = [rids[0]]
            del rooms[rids[0]]["booked"][str(hour)]
        seats = rng.choice([s for s in (2, 4, 6, 8) if s <= max(rooms[x]["seats"] for x in fits)])
        fits = [x for x in fits if rooms[x]["seats"] >= seats]
        ok = _check(f"Is a room with {seats}+ seats booked at {hour}:00 for {m}?",
                    f"any(final_state['rooms'][x]['booked'].get({str(hour)!r}) == {m!r} for x in {fits!r})")
        return _task(rng, ["Member {m} needs a room for {s} people at {h}:00. Find a free one and book it.",
                           "Find a study room with at least {s} seats free at {h}:00 and book it for member {m}."],
                     [ok], [_call("find_rooms", hour=hour, seats=seats), _call("book_room", room=fits[0], hour=hour, member=m)],
                     init, m=m, s=seats, h=hour)
    who = booked[str(h_used)]
    return _task(rng, ["Member {m} wants to move their {h1}:00 booking of room {r} to {h2}:00.",
                       "Shift member {m}'s booking of room {r} from {h1}:00 to {h2}:00."],
                 [gone(r, h_used), has(r, h_free, who)],
                 [_call("cancel_booking", room=r, hour=h_used), _call("book_room", room=r, hour=h_free, member=who)],
                 init, m=who, r=r, h1=h_used, h2=h_free)


ENVS = [
    {"env_id": "bed_library_loans", "env_class_name": "LoanDesk", "role": "main",
     "environment_introduction": "A library loan desk: look up books and members, lend books and check returns in.",
     "constraints_rules": ["A book on loan cannot be lent again until it is returned."],
     "tools": [_tool("find_book", "Search books by title or author.", query="string"),
               _tool("find_member", "Search members by name; shows their loans.", name="string"),
               _tool("checkout", "Lend a book to a member.", book_id="string", member_id="string"),
               _tool("return_book", "Check in a returned book.", book_id="string"), LOANS_REPORT[1]],
     "env_class_code": LOANS_CODE + LOANS_REPORT[0], "make_task": loans_task},
    {"env_id": "bed_library_holds", "env_class_name": "HoldQueue", "role": "main",
     "environment_introduction": "A library's hold queues: members reserve books and wait in line for them.",
     "constraints_rules": ["A member holds a book at most once; new holds join the end of the queue."],
     "tools": [_tool("find_member", "Search members by name.", name="string"),
               _tool("get_holds", "Show a book's hold queue.", book_id="string"),
               _tool("place_hold", "Add a member to a book's queue.", book_id="string", member_id="string"),
               _tool("cancel_hold", "Remove a member's hold.", book_id="string", member_id="string"), HOLDS_REPORT[1]],
     "env_class_code": HOLDS_CODE + HOLDS_REPORT[0], "make_task": holds_task},
    {"env_id": "bed_library_cards", "env_class_name": "CardOffice", "role": "main",
     "environment_introduction": "A library membership office: cards have an expiry year and unpaid fees in dollars.",
     "constraints_rules": ["A card with unpaid fees or frozen cannot be renewed.", "Renewals add 1-3 years."],
     "tools": [_tool("find_card", "Search cards by holder name.", name="string"),
               _tool("pay_fees", "Pay dollars toward a card's fees.", card_id="string", amount="integer"),
               _tool("renew_card", "Extend a card by some years.", card_id="string", years="integer"),
               _tool("freeze_card", "Freeze a lost card.", card_id="string")],
     "env_class_code": CARDS_CODE, "make_task": cards_task},
    {"env_id": "bed_library_rooms", "env_class_name": "StudyRooms", "role": "transfer",
     "environment_introduction": "Library study rooms booked by members for one hour at a time.",
     "constraints_rules": ["Hours are whole numbers from 9 to 18 (9 = 9:00)."],
     "tools": [_tool("find_rooms", "List rooms free at an hour with enough seats.", hour="integer", seats="integer"),
               _tool("book_room", "Book a room for one hour.", room="string", hour="integer", member="string"),
               _tool("cancel_booking", "Cancel a room's booking at an hour.", room="string", hour="integer"),
               ROOMS_REPORT[1]],
     "env_class_code": ROOMS_CODE + ROOMS_REPORT[0], "make_task": rooms_task},
]
