"""Environments. Importing this package registers every environment module in it.

Environment modules keep heavy imports (benchmark packages) inside functions so this stays cheap.
"""
import importlib
import pkgutil

from stages.envs.base import (EnvError, Environment, StepResult, check_episode_rules, env_names, lookup_tools, make_env,
                              register)

for _mod in pkgutil.iter_modules(__path__):
    if _mod.name != "base" and not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["EnvError", "Environment", "StepResult", "check_episode_rules", "env_names", "lookup_tools", "make_env",
           "register"]
