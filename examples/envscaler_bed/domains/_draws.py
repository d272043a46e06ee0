"""Seeded draws the banking and inventory task generators share: ids, people, texts, task kinds.

Each draws only from the ``rng`` it is given, so the bed rebuilds byte-identical. Imported as
``domains._draws`` (``build.py`` puts the bed folder on ``sys.path``). Stdlib only.
"""
from __future__ import annotations

import random

FIRST_NAMES = ["Ada", "Ben", "Chloe", "Dario", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
               "Kira", "Lena", "Marco", "Nadia", "Omar", "Priya", "Rosa", "Sven", "Tara", "Yusuf"]
LAST_NAMES = ["Moreno", "Novak", "Okafor", "Petrov", "Quinn", "Rossi", "Sato", "Tanaka", "Ulrich",
              "Vidal", "Weber", "Young", "Zhou", "Berg", "Costa", "Duarte", "Ekstrom", "Fischer"]


def ids(rng: random.Random, letters: str, k: int, digits: int = 3) -> list[str]:
    """``k`` distinct ids like "K-417" (a letter from ``letters``, ``digits`` digits)."""
    out: list[str] = []
    while len(out) < k:
        new = f"{rng.choice(letters)}-{rng.randint(10 ** (digits - 1), 10 ** digits - 1)}"
        if new not in out:
            out.append(new)
    return out


def people(rng: random.Random, k: int) -> list[str]:
    """``k`` distinct full names with distinct first names."""
    return [f"{f} {rng.choice(LAST_NAMES)}" for f in rng.sample(FIRST_NAMES, k)]


def say(rng: random.Random, templates: list[str], **fields: object) -> str:
    """One of ``templates`` (chosen by ``rng``), filled with ``fields``."""
    return rng.choice(templates).format(**fields)


def pick(rng: random.Random, kinds: list) -> object:
    """Half the tasks single-call (the first three kinds), half multi-call (the rest)."""
    return rng.choice(kinds[:3]) if rng.random() < 0.5 else rng.choice(kinds[3:])
