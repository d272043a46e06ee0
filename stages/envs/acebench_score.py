"""ACEBench's agent scoring, under two rule sets (``official`` is the default of the environment).

``official`` transcribes ACEBench's own checker (ACEBench/ACEBench at e6db74b; the package is not on
PyPI): :func:`official_result` is the model result its inference saves (one ``{class: attributes}``
entry per involved class, the attributes of ``SAVED_CLASS``, nothing when no call was ever decoded),
:func:`official_end_to_end` is ``agent_eval`` + ``agent_checker`` (class count first, exact class
names, an answer class without a match skipped, dict attributes compared on the answer's keys) and
:func:`official_process` is ``agent_eval_process`` (each step an exact string, stripped).

``lenient`` (lopd's earlier scoring):

* end-to-end: every class of the ground truth matches the final state attribute by attribute
  (class names compared case-insensitively, dict keys as strings, as they are after JSON);
* process accuracy: share of milestone steps found in order in the agent's steps (each step's calls
  are parsed and compared as (name, arguments) values, which ignores quoting and argument order),
  best over accepted paths, 1.0 when end-to-end holds.

Milestones are steps such as ``"[login_food_platform(username='Eve', password='password123')]"``,
or a list of such lists when several paths are accepted. Used by
:class:`stages.envs.acebench.AceBenchEnv` for multi-step and multi-turn tasks alike.
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


# The attributes ACEBench's inference saves per class (``SAVED_CLASS`` in model_inference/common_inference.py).
SAVED_ATTRIBUTES = {"BaseApi": ("wifi", "logged_in"), "MessageApi": ("inbox",), "ReminderApi": ("reminder_list",),
                    "FoodPlatform": ("users", "logged_in_users", "orders"), "Travel": ("users", "reservations")}


def official_result(state: dict[str, dict[str, Any]], involved_classes: list[str],
                    called: bool) -> list[dict[str, Any]]:
    """The model result ACEBench saves for an episode (``multi_step_inference`` / ``multi_turn_inference``).

    Args:
        state: the platform's final state by class (JSON values).
        involved_classes: the task's classes, in order.
        called: whether any agent message was decoded as calls (only then does ACEBench build the
            class instances whose attributes it saves).

    Returns:
        ``[{class: {attribute: value}}]`` for each involved class, or ``[]`` when nothing was called.
    """
    if not called:
        return []
    return [{cls: {k: v for k, v in state.get(cls, {}).items() if k in SAVED_ATTRIBUTES.get(cls, ())}}
            for cls in involved_classes]


def official_end_to_end(result: list[dict[str, Any]], ground_truth: Any) -> tuple[bool, list[str]]:
    """ACEBench's end-to-end verdict (``agent_eval`` in eval_main.py, ``agent_checker`` in
    model_eval/checker.py); returns (ok, errors).

    The number of classes must match; each answer class is checked against the first result entry
    with the same class names (exactly), and skipped when there is none; a result attribute missing
    from the answer fails; a dict answer attribute is compared key by key on the answer's keys.
    """
    answers = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    if len(answers) != len(result):
        return False, ["wrong number of class"]
    errors: list[str] = []
    for answer in answers:
        match = next((entry for entry in result if set(entry) == set(answer)), None)
        if match is not None:
            errors += _agent_checker(match, answer)
    return not errors, errors


def _agent_checker(model_output: dict[str, Any], possible_answer: dict[str, Any]) -> list[str]:
    name, expected = next(iter(possible_answer.items()))
    errors = []
    for attr, have in next(iter(model_output.values())).items():
        if attr not in expected:
            errors.append(f"class({name}) attributes({attr}) missing in possible_answer")
            continue
        want = expected[attr]
        if isinstance(want, dict):
            errors += [f"class({name}) attributes({attr}.{k}) wrong" for k, v in want.items()
                       if not isinstance(have, dict) or k not in have or v != have[k]]
        elif want != have:
            errors.append(f"class({name}) attributes({attr}) wrong")
    return errors


def official_process(steps: list[str], mile_stone: list) -> float:
    """One task's process accuracy as ``agent_eval_process`` (eval_main.py) computes it: milestone
    strings found in order among the step strings (both stripped, compared exactly); with several
    accepted paths the best of the per-path values rounded to 3 decimals; 1.0 for an empty path."""
    def found(path: list[str]) -> float:
        hits, pos = 0, 0
        for stone in path:
            while pos < len(steps):
                pos += 1
                if steps[pos - 1].strip() == stone.strip():
                    hits += 1
                    break
        return hits / len(path) if path else 1.0

    if mile_stone and isinstance(mile_stone[0], list):
        return max(round(found(path), 3) for path in mile_stone)
    return found(mile_stone)


def step_text(action: str, calls: list[ToolCall]) -> str:
    """A step as ACEBench's process check sees it: the action text itself (reasoning removed, stripped)
    when it is written in ACEBench's call format ``[name(key='value', ...)]``, else the calls in that
    format (``key=repr(value)``, arguments in the order given, as ACEBench's execution role writes them)."""
    text = re.sub(r"<think>.*?</think>", "", action, flags=re.DOTALL).strip()
    if not calls or re.match(r"\[.*?\]", text, re.DOTALL):
        return text
    return "[" + ", ".join(f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.args.items())})" for c in calls) + "]"
