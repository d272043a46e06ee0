"""Seeded draws the smart-home task generators share: a weighted task kind, numbered ids.

Each draws only from the ``rng`` it is given. Stdlib only.
"""


def pick(rng, weighted):
    """One key of ``weighted`` (key -> weight), drawn with ``rng``."""
    keys = list(weighted)
    return rng.choices(keys, weights=[weighted[k] for k in keys])[0]


def ids(rng, prefix, lo, hi, n):
    """``n`` distinct ids like ``L-12`` with numbers in [lo, hi]."""
    return [f"{prefix}-{k}" for k in rng.sample(range(lo, hi + 1), n)]
