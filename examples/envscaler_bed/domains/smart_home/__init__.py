"""Smart-home domain of the lopd study bed: lights, thermostats, door security (main) and garden
irrigation (transfer), one module each. Each entry of ENVS follows the bed's domain-module contract
(stdlib only)."""

from .lights import LIGHTS
from .thermostats import THERMOSTATS
from .security import SECURITY
from .irrigation import IRRIGATION

ENVS = [LIGHTS, THERMOSTATS, SECURITY, IRRIGATION]
