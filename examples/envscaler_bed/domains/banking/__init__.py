"""Banking and payments environments of the lopd study bed (lopd's own, in the EnvScaler format).

Four environments, one module each: current accounts and transfers, payment cards (freeze,
limits), bill payments and standing orders (role "main"), and a loan desk (role "transfer", used
by no train task); their task generators share ``domains._draws``.
Each entry of :data:`ENVS` follows the bed's domain-module contract: the class source as a string,
terse tool schemas, and ``make_task(rng)`` returning a fresh initial state, the task text, check
functions and the reference tool calls. Amounts are whole euros (integers). Stdlib only.
"""

from .accounts import ACCOUNTS
from .cards import CARDS
from .bills import BILLS
from .loans import LOANS

ENVS = [ACCOUNTS, CARDS, BILLS, LOANS]
