"""ACEBench's agent scoring (its ``agent_eval``, re-implemented: the package is not on PyPI).

* end-to-end: every class of the ground truth matches the final state attribute by attribute
  (class names compared case-insensitively, dict keys as strings, as they are after JSON);
* process accuracy: share of milestone steps found in order in the agent's steps (ACEBench compares
  call strings; here each step's calls are parsed and compared as (name, arguments) values, which
  ignores quoting and argument order), best over accepted paths, 1.0 when end-to-end holds.

Milestones are steps such as ``"[login_food_platform(username='Eve', password='password123')]"``,
or a list of such lists when several paths are accepted. Used by
:class:`stages.core.envs.acebench.AceBenchEnv` for multi-step and multi-turn tasks alike.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

from schemas import ToolCall


_ARG_START = re.compile(r"(?:^|,)\s*([A-Za-z_]\w*)\s*=")


def parse_milestone(step: str) -> list[tuple[str, dict[str, Any]]]:
    """One milestone step ``"[f(a='x'), g()]"`` as (name, args) pairs.

    Tolerates the release's unescaped quotes (``merchant_name='Domino's'``): argument boundaries are
    found at bracket depth 0 and a value that is not a Python literal is taken as the raw text
    between its outer quotes.
    """
    body = step.strip()
    body = body[1:-1] if body.startswith("[") and body.endswith("]") else body
    calls, depth, start = [], 0, 0
    for i, ch in enumerate(body + ","):  # split calls at commas outside brackets
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            part = body[start:i].strip()
            if part:
                calls.append(part)
            start = i + 1
    out = []
    for part in calls:
        name, _, rest = part.partition("(")
        rest = rest[: rest.rindex(")")] if ")" in rest else rest
        marks = [m for m in _ARG_START.finditer(rest) if _depth(rest, m.start()) == 0]
        args = {}
        for m, nxt in zip(marks, marks[1:] + [None]):
            raw = rest[m.end(): nxt.start() if nxt else len(rest)].strip()
            try:
                args[m.group(1)] = ast.literal_eval(raw)
            except (SyntaxError, ValueError):
                args[m.group(1)] = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw
        out.append((name.strip(), args))
    return out


def _depth(text: str, end: int) -> int:
    return sum(1 if c in "([{" else -1 if c in ")]}" else 0 for c in text[:end])


def _norm(value: Any) -> Any:
    return json.loads(json.dumps(value))


def process_accuracy(steps: list[list[ToolCall]], mile_stone: list) -> float:
    """ACEBench's in-order milestone matching, best over accepted paths (1.0 for an empty path)."""
    paths = mile_stone if mile_stone and isinstance(mile_stone[0], list) else [mile_stone]
    got = [[(c.name, _norm(c.args)) for c in step] for step in steps]
    best = 0.0
    for path in paths:
        want = [[(n, _norm(a)) for n, a in parse_milestone(s)] for s in path]
        found, pos = 0, 0
        for stone in want:
            while pos < len(got):
                pos += 1
                if got[pos - 1] == stone:
                    found += 1
                    break
        best = max(best, found / len(want) if want else 1.0)
    return best


def end_to_end(final_state: dict[str, dict[str, Any]], ground_truth: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    """Whether every ground-truth class state matches ``final_state``; returns (ok, mismatches)."""
    states = {k.lower(): v for k, v in final_state.items()}
    errors = []
    for entry in ground_truth:
        for cls, attrs in entry.items():
            have = states.get(cls.lower())
            if have is None:
                errors.append(f"class {cls} not simulated")
                continue
            errors += [f"{cls}.{k} differs" for k, v in attrs.items() if _norm(have.get(k)) != _norm(v)]
    return not errors, errors
