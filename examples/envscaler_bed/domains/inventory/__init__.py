"""Inventory and stock environments of the lopd study bed (lopd's own, in the EnvScaler format).

Four environments, one module each: a warehouse's stock, a web shop's orders, a restaurant
pantry with supplier orders (role "main"), and an equipment rental desk (role "transfer", used by
no train task); their task generators share ``domains._draws``.
Each entry of :data:`ENVS` follows the bed's domain-module contract: the class source as a string,
terse tool schemas, and ``make_task(rng)`` returning a fresh initial state, the task text, check
functions and the reference tool calls. Stdlib only.
"""

from .warehouse import WAREHOUSE
from .shop import SHOP
from .pantry import PANTRY
from .rental import RENTAL

ENVS = [WAREHOUSE, SHOP, PANTRY, RENTAL]
