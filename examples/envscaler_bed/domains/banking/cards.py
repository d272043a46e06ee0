"""Payment cards: freeze, unfreeze, limits (role "main").

One environment of the bed's banking domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, people as _people, say as _say, pick as _pick


CARDS_CODE = '''\
class CardService:
    def __init__(self, init_config: dict):
        """Payment cards. State: cards: card_id -> {card_id, holder, status, limit}
        (status active | frozen; limit: daily spending limit in whole euros)."""
        self.cards = {}

    def find_cards(self, holder: str) -> dict:
        """Cards whose holder name contains ``holder`` (case-insensitive)."""
        q = str(holder).lower()
        return {"success": True, "data": [c for c in self.cards.values() if q in c["holder"].lower()]}

    def _set_status(self, card_id, old, new):
        card = self.cards.get(str(card_id))
        if card is None:
            return {"success": False, "error": f"unknown card {card_id}"}
        if card["status"] != old:
            return {"success": False, "error": f"card {card_id} is {card['status']}, not {old}"}
        card["status"] = new
        return {"success": True, "data": card}

    def freeze_card(self, card_id: str) -> dict:
        """Freeze an active card."""
        return self._set_status(card_id, "active", "frozen")

    def unfreeze_card(self, card_id: str) -> dict:
        """Reactivate a frozen card."""
        return self._set_status(card_id, "frozen", "active")

    def set_limit(self, card_id: str, limit: int) -> dict:
        """Set the card's daily limit (whole euros, 50 to 5000)."""
        card = self.cards.get(str(card_id))
        if card is None:
            return {"success": False, "error": f"unknown card {card_id}"}
        if not isinstance(limit, int) or isinstance(limit, bool) or not 50 <= limit <= 5000:
            return {"success": False, "error": "limit must be a whole number from 50 to 5000"}
        card["limit"] = limit
        return {"success": True, "data": card}
'''


def _cards_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    ids = _ids(rng, "C", n)
    cards = {}
    for i, (c, h) in enumerate(zip(ids, _people(rng, n))):  # the first two: one active, one frozen
        status = ["active", "frozen"][i % 2] if i < 2 else rng.choice(["active", "active", "frozen"])
        cards[c] = {"card_id": c, "holder": h, "status": status, "limit": rng.randint(2, 40) * 50}
    active = [c for c in ids if cards[c]["status"] == "active"]
    frozen = [c for c in ids if cards[c]["status"] == "frozen"]
    a, f = rng.choice(active), rng.choice(frozen)

    def status_is(card: str, status: str) -> dict:
        return _check(f"Is card {card} {status}?", f'final_state["cards"]["{card}"]["status"] == "{status}"')

    def limit_is(card: str, limit: int) -> dict:
        return _check(f"Is the daily limit of {card} {limit}?", f'final_state["cards"]["{card}"]["limit"] == {limit}')

    def new_limit(card: str) -> int:
        return rng.choice([x * 50 for x in range(2, 61) if x * 50 != cards[card]["limit"]])

    def freeze() -> tuple:
        text = _say(rng, ["Freeze card {a}.", "Card {a} was stolen; freeze it right away.",
                          "Block card {a} by freezing it.", "Put a freeze on card {a} so it cannot be used."], a=a)
        return text, [status_is(a, "frozen")], [_call("freeze_card", card_id=a)]

    def unfreeze() -> tuple:
        text = _say(rng, ["Unfreeze card {f}.", "Card {f} was found again; unfreeze it.",
                          "Reactivate the frozen card {f}.", "Lift the freeze on card {f}."], f=f)
        return text, [status_is(f, "active")], [_call("unfreeze_card", card_id=f)]

    def limit() -> tuple:
        c = rng.choice(ids)
        v = new_limit(c)
        text = _say(rng, ["Set the daily limit of card {c} to {v} euros.",
                          "Change the spending limit of card {c} to {v}.",
                           "Card {c} needs a daily limit of {v} euros.", "Make {v} euros the new daily spending cap for card {c}."], c=c, v=v)
        return text, [limit_is(c, v)], [_call("set_limit", card_id=c, limit=v)]

    def find_freeze() -> tuple:
        holder = cards[a]["holder"]
        text = _say(rng, ["{holder} lost their card. Find it and freeze it.",
                           "Look up the card of {holder} and freeze it; they think it was stolen.", "Someone may be using the card of {holder}. Search for it and block it with a freeze.", "Freeze whatever card {holder} holds; first find it."], holder=holder)
        return text, [status_is(a, "frozen")], [_call("find_cards", holder=holder), _call("freeze_card", card_id=a)]

    def find_limit() -> tuple:
        c = rng.choice(ids)
        holder, v = cards[c]["holder"], new_limit(c)
        text = _say(rng, ["Find the card of {holder} and set its daily limit to {v} euros.",
                          "{holder} wants a daily limit of {v} euros; look up their card and change it.", "Search the cards for {holder} and give that card a {v} euro daily limit.", "The card holder {holder} asked for a new daily cap of {v} euros. Find the card and update it."],
                    holder=holder, v=v)
        return text, [limit_is(c, v)], [_call("find_cards", holder=holder), _call("set_limit", card_id=c, limit=v)]

    def two() -> tuple:
        if rng.random() < 0.5:
            v = new_limit(f)
            text = _say(rng, ["Unfreeze card {f} and set its daily limit to {v} euros.",
                               "Reactivate card {f} with a new daily limit of {v}.", "Unfreeze card {f}; its daily limit should then be {v} euros.", "Card {f} is frozen. Make it active again and change its daily limit to {v} euros."], f=f, v=v)
            calls = [_call("unfreeze_card", card_id=f), _call("set_limit", card_id=f, limit=v)]
            return text, [status_is(f, "active"), limit_is(f, v)], calls
        text = _say(rng, ["Freeze card {a} and unfreeze card {f}.", "Unfreeze card {f}, then freeze card {a}.", "Freeze card {a}; card {f} on the other hand should be unfrozen.", "Freeze card {a} and reactivate card {f}, which is frozen now."],
                    a=a, f=f)
        calls = [_call("freeze_card", card_id=a), _call("unfreeze_card", card_id=f)]
        checks = [status_is(a, "frozen"), status_is(f, "active")]
        return text, checks, calls if text.startswith("Freeze") else calls[::-1]

    text, checks, calls = _pick(rng, [freeze, unfreeze, limit, find_freeze, find_limit, two])()
    return {"init_config": {"cards": cards}, "task": text, "checklist_with_func": checks, "reference_actions": calls}


CARDS = {
    "env_id": "bed_banking_cards",
    "env_class_name": "CardService",
    "role": "main",
    "environment_introduction": "A bank's card service: payment cards with a status and a daily limit in euros.",
    "constraints_rules": ["Only active cards can be frozen; only frozen cards can be unfrozen."],
    "tools": [
        _tool("find_cards", "Find cards by holder name.", holder="string"),
        _tool("freeze_card", "Freeze a card.", card_id="string"),
        _tool("unfreeze_card", "Unfreeze a card.", card_id="string"),
        _tool("set_limit", "Set a card's daily limit.", card_id="string", limit="integer"),
    ],
    "env_class_code": CARDS_CODE,
    "make_task": _cards_task,
}
