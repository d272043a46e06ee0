"""Builders the bed's domain modules share: tool schemas, check functions, reference actions, tasks.

Pure functions (no randomness except :func:`task`'s one draw from the ``rng`` it is given), so the
bed rebuilds byte-identical. Domain modules import them as ``domains._common``: ``build.py`` puts
the bed folder on ``sys.path``. Stdlib only.
"""
from __future__ import annotations

import random


def tool(tool_name: str, description: str, /, **params: str) -> dict:
    """An OpenAI-style function schema; ``params`` maps argument name -> JSON type, all required."""
    return {"type": "function", "function": {
        "name": tool_name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in params.items()},
                       "required": list(params)}}}


def check(item: str, expr: str) -> dict:
    """A checklist entry whose check function returns the Python expression ``expr`` over ``final_state``."""
    return {"check_item": item, "check_func": f"def check_func(final_state):\n    return {expr}\n"}


def call(tool_name: str, /, **arguments: object) -> dict:
    """One reference action: ``tool_name`` called with ``arguments``."""
    return {"name": tool_name, "arguments": arguments}


def task(rng: random.Random, phrasings: list, checks: list, actions: list, init: dict, **slots) -> dict:
    """One task: initial state ``init``, a text drawn from ``phrasings`` filled with ``slots``, its
    checks and reference actions."""
    return {"init_config": init, "task": rng.choice(phrasings).format(**slots),
            "checklist_with_func": checks, "reference_actions": actions}


def report_tool(collection: str, id_param: str, noun: str) -> tuple[str, dict]:
    """A ``report_problem(<id_param>, problem)`` tool: (method source to append to an environment
    class whose ``self.<collection>`` is keyed by ids, its schema). It records the report in
    ``problem_reports``; no task asks for it, so an agent that calls every tool changes state the
    task did not ask for."""
    code = f'''
    def report_problem(self, {id_param}: str, problem: str) -> dict:
        if {id_param} not in self.{collection} or not isinstance(problem, str) or not problem.strip():
            return {{"success": False, "error": "unknown {noun} or empty problem"}}
        self.__dict__.setdefault("problem_reports", []).append({{"{id_param}": {id_param}, "problem": problem}})
        return {{"success": True, "data": len(self.problem_reports)}}
'''
    return code, tool("report_problem", f"Report a problem with a {noun} to the staff.",
                      **{id_param: "string", "problem": "string"})
