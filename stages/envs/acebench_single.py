"""ACEBench's 15 single-turn categories (12 "normal", 3 "special") as one-reply lopd tasks, and
ACEBench's overall score.

Data (``--data-dir``, laid out like ACEBench's ``data_all/data_en``): ``data_<category>.json``
(JSON lines: id, question, function, and time, or profile for ``normal_preference``) and
``possible_answer/data_<category>.json`` (id, ground_truth). A category whose data file is absent
is not served. A malformed row is left out with one line naming the file, the row and the field
(:func:`load_single_turn` returns these lines; they are logged and put in the report's notes).

Episode (``generate_singal`` and ``single_turn_inference`` in ACEBench's generate.py and
model_inference/common_inference.py): the system prompt is ACEBench's for the category (special,
preference, or normal; :mod:`.acebench_prompts`) with the row's time or profile and its function
list written as Python text, the user message ``"Conversation history 1..t:\\n" + question``; with
``language="zh"`` (ACEBench's ``data_zh``) its Chinese prompts (:mod:`.acebench_prompts_zh`), the checker
unchanged (ACEBench's eval_main.py has no language branch in its checks). The
first reply ends the episode and is checked by :mod:`.acebench_ast`: reward 1 when valid, else 0.
The two ``normal_multi_turn_*`` categories are single replies too (the dialogue so far is in the
question); ACEBench scores them per dialogue (below).

Aggregate (model_eval/evaluation_helper.py at e6db74b): a normal category's accuracy is its share
of valid replies rounded to 3 decimals, for ``normal_multi_turn_*`` the share of dialogues (ids
``<category>_<dialogue>_<turn>``) whose every turn is valid (``multiplt_turn_accuracy``); a special
category's share is not rounded; ``normal_summary`` / ``special_summary`` / ``agent_summary`` are the
plain means of their categories rounded to 3 (``calculate_unweighted_accuracy``), and the overall
``summary = round(0.2676 special + 0.578 normal + 0.1545 agent, 3)`` (``generate_result_csv``).
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from schemas import Message, Task, ToolCall
from stages.envs.acebench_ast import NORMAL, SPECIAL, check_normal, check_special, decode_reply, find_description
from stages.envs.acebench_prompts import NORMAL_PROMPT, PREFERENCE_PROMPT, SPECIAL_PROMPT, USER_PROMPT
from stages.envs.acebench_prompts_zh import (NORMAL_PROMPT_ZH, PREFERENCE_PROMPT_ZH, SPECIAL_PROMPT_ZH,
                                                  USER_PROMPT_ZH)
from stages.envs.base import StepResult

log = logging.getLogger(__name__)

PARTS = ("normal", "special")
"""``Task.meta["part"]`` of the single-turn tasks."""
WEIGHTS = {"special": 0.2676, "normal": 0.578, "agent": 0.1545}
"""ACEBench's weights of its three groups in the overall ``summary`` (generate_result_csv)."""
LANGUAGES = ("en", "zh")
"""ACEBench's two data languages (``data_all/data_en``, ``data_all/data_zh``)."""
PROMPTS = {"en": {"normal": NORMAL_PROMPT, "preference": PREFERENCE_PROMPT, "special": SPECIAL_PROMPT,
                  "user": USER_PROMPT},
           "zh": {"normal": NORMAL_PROMPT_ZH, "preference": PREFERENCE_PROMPT_ZH, "special": SPECIAL_PROMPT_ZH,
                  "user": USER_PROMPT_ZH}}
"""ACEBench's single-turn prompts per language (``single_turn_inference`` picks them by ``language``)."""
_ID = re.compile(r"(?P<category>[a-z_]+?)_(?P<turn>\d+_)?\d+")


class _BadRow(ValueError):
    """A data row that cannot be served; the message names the field, ``in_answer`` whether it is in
    the possible-answer row."""

    def __init__(self, message: str, in_answer: bool = False) -> None:
        super().__init__(message)
        self.in_answer = in_answer


def load_single_turn(data_dir: Path, language: str = "en") -> tuple[list[Task], list[str]]:
    """The normal and special tasks found in ``data_dir``, in ACEBench's category order.

    Args:
        data_dir: a folder laid out like ACEBench's ``data_all/data_en`` (or ``data_zh``).
        language: "en" or "zh" (:data:`LANGUAGES`): which of ACEBench's prompts the tasks get
            (model_inference/prompt_en.py or prompt_zh.py); the checker is the same for both.

    Returns:
        (tasks, problems): ``problems`` holds one line per row or file left out, naming the file,
        the row and the field. Never raises for a malformed file or row.

    Raises:
        ValueError: ``language`` is not one of :data:`LANGUAGES`.
    """
    if language not in LANGUAGES:
        raise ValueError(f"acebench: language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    tasks: list[Task] = []
    problems: list[str] = []
    for category in NORMAL + SPECIAL:
        path = Path(data_dir) / f"data_{category}.json"
        if not path.is_file():
            continue
        answer_path = Path(data_dir) / "possible_answer" / path.name
        rows, answers = _rows(path, problems), _rows(answer_path, problems)
        by_id = {a.get("id"): (number, a) for number, a in answers if isinstance(a.get("id"), str)}
        for number, row in rows:
            answer_number, answer = by_id.get(row.get("id"), (0, None))
            try:
                tasks.append(_task(category, row, answer, language))
            except _BadRow as err:
                where = f"{answer_path} row {answer_number}" if err.in_answer else f"{path} row {number}"
                problems.append(f"{where} (id {row.get('id')!r}): {err}; row left out")
    for line in problems:
        log.warning("acebench: %s", line)
    return tasks, problems


def _rows(path: Path, problems: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for the JSON-object lines of ``path``; an unreadable file or line becomes
    a problem line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        problems.append(f"{path}: cannot be read as UTF-8 ({type(err).__name__}); its rows are left out")
        return []
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            problems.append(f"{path} row {number}: not JSON ({getattr(err, 'msg', type(err).__name__)}); "
                            "row left out")
            continue
        if isinstance(row, dict):
            rows.append((number, row))
        else:
            problems.append(f"{path} row {number}: not a JSON object; row left out")
    return rows


def _task(category: str, row: dict[str, Any], answer: dict[str, Any] | None, language: str) -> Task:
    """One row as a task.

    Raises:
        _BadRow: a missing or ill-typed field (the message names it).
    """
    task_id = row.get("id")
    match = _ID.fullmatch(task_id) if isinstance(task_id, str) else None
    multi_turn = category.startswith("normal_multi_turn")
    if match is None or match["category"] != category or bool(match["turn"]) != multi_turn:
        form = f"{category}_<dialogue>_<turn>" if multi_turn else f"{category}_<number>"
        raise _BadRow(f"field 'id' must read {form}")
    question, functions = row.get("question"), row.get("function")
    if not isinstance(question, str):
        raise _BadRow("field 'question' must be a string")
    if not isinstance(functions, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                                  for f in functions):
        raise _BadRow("field 'function' must be a list of objects with a string 'name'")
    context = "profile" if category == "normal_preference" else "time"
    if not isinstance(row.get(context), str):
        raise _BadRow(f"field {context!r} must be a string")
    if answer is None or "ground_truth" not in answer:
        raise _BadRow(f"no row with this id and a field 'ground_truth' in possible_answer/data_{category}.json")
    truth = answer["ground_truth"]
    prompts = PROMPTS[language]
    if category in SPECIAL:
        _check_special_truth(category, truth)  # raises _BadRow(in_answer=True)
        template = prompts["special"]
    else:
        _check_normal_truth(functions, truth)  # raises _BadRow(in_answer=True)
        template = prompts["preference" if category == "normal_preference" else "normal"]
    system = template.format(**{context: row[context]}, function=str(functions))
    return Task(task_id=task_id, env="acebench", split="test", prompt=question,
                metadata=json.dumps({"part": "special" if category in SPECIAL else "normal", "category": category,
                                     "system": system, "functions": functions, "ground_truth": truth,
                                     "language": language}))


def _check_normal_truth(functions: list[dict[str, Any]], truth: Any) -> None:
    for candidate in truth if isinstance(truth, list) else [truth]:
        if not isinstance(candidate, dict) or not all(isinstance(p, dict) for p in candidate.values()):
            raise _BadRow("field 'ground_truth' must be {function: {parameter: value}} or a list of such", True)
        for key in candidate:
            if find_description(functions, key) is None:
                raise _BadRow(f"field 'ground_truth' calls {key!r}, which no entry of 'function' names", True)


def _check_special_truth(category: str, truth: Any) -> None:
    if category == "special_irrelevant":
        return
    if not isinstance(truth, dict) or not all(
            isinstance(v, str) or isinstance(v, list) and all(isinstance(x, str) for x in v) for v in truth.values()):
        raise _BadRow("field 'ground_truth' must map names to lists of strings", True)


def opening(task: Task) -> list[Message]:
    """The episode's messages: ACEBench's system prompt for the category and the question, in the
    task's language (English for tasks without one)."""
    user = PROMPTS[task.meta.get("language", "en")]["user"]
    return [Message(role="system", content=task.meta["system"]),
            Message(role="user", content=user.format(question=task.prompt))]


def judge(task: Task, reply: str) -> StepResult:
    """Check the one reply of a single-turn task and end the episode.

    Returns:
        A final step: reward 1.0 when ACEBench's checker finds the reply valid, else 0.0; ``info``
        has ``category``, ``valid``, ``error_type``, ``error`` and ``success``; ``tool_calls`` the
        calls the reply decodes to.
    """
    meta = task.meta
    calls = decode_reply(reply)
    if meta["part"] == "special":
        verdict = check_special(meta["category"], reply, meta["ground_truth"])
    elif calls is None:
        verdict = {"valid": False, "error_type": "wrong_output_format",
                   "error": "the reply is not one list of calls [name(key=value, ...), ...]"}
    else:
        truth = meta["ground_truth"]
        verdicts = [check_normal(meta["functions"], calls, c) for c in (truth if isinstance(truth, list) else [truth])]
        verdict = next((v for v in verdicts if v["valid"]), verdicts[0] if verdicts else
                       {"valid": False, "error_type": "no_answer", "error": "the answer lists no candidate"})
    tool_calls = [ToolCall(name=name, arguments=json.dumps(args, default=str))
                  for call in calls or [] for name, args in call.items()]
    info = {"category": meta["category"], **verdict, "success": verdict["valid"]}
    return StepResult([], reward=1.0 if verdict["valid"] else 0.0, done=True, tool_calls=tool_calls, info=info)


def category_of(task_id: str) -> str | None:
    """The normal or special category of a task id (``<category>_<n>``), None for other tasks."""
    match = _ID.fullmatch(task_id)
    return match["category"] if match and match["category"] in NORMAL + SPECIAL else None


def category_accuracy(category: str, valid: dict[str, bool]) -> float:
    """One category's accuracy as ACEBench computes it (module docstring).

    Args:
        category: a normal or special category.
        valid: task id -> whether the reply was valid (at least one task; ``normal_multi_turn_*`` ids
            end in ``_<dialogue>_<turn>``, as :func:`load_single_turn` checks).

    Returns:
        The accuracy in [0, 1]: rounded to 3 decimals for normal categories, not for special ones.
    """
    if category.startswith("normal_multi_turn"):
        dialogues: dict[str, list[bool]] = {}
        for task_id in sorted(valid, key=lambda t: tuple(int(x) for x in t.split("_")[-2:])):
            dialogues.setdefault(task_id.split("_")[-2], []).append(valid[task_id])
        return round(sum(all(turns) for turns in dialogues.values()) / len(dialogues), 3)
    share = sum(valid.values()) / len(valid)
    return share if category in SPECIAL else round(share, 3)


def single_turn_scores(valid: dict[str, bool], agent: float | None) -> tuple[dict[str, float], list[str]]:
    """The single-turn part of ACEBench's scores.

    Args:
        valid: task id -> valid, for the normal and special tasks played (other ids are ignored).
        agent: ACEBench's agent score (mean of its multi-step and multi-turn accuracies), None when
            a part of it was not played.

    Returns:
        (scores, notes): ``summary`` (the overall) first when every category was played, then
        ``normal_summary`` / ``special_summary`` / ``agent_summary`` for the groups played in full,
        then each played category's accuracy; ``notes`` say what was left out and why.
    """
    by_category: dict[str, dict[str, bool]] = {}
    for task_id, ok in valid.items():
        category = category_of(task_id)
        if category:
            by_category.setdefault(category, {})[task_id] = ok
    accuracy = {c: category_accuracy(c, by_category[c]) for c in NORMAL + SPECIAL if c in by_category}
    groups = {"normal": NORMAL, "special": SPECIAL}
    summaries = {g: round(sum(accuracy[c] for c in cats) / len(cats), 3)
                 for g, cats in groups.items() if all(c in accuracy for c in cats)}
    if agent is not None:
        summaries["agent"] = agent
    scores: dict[str, float] = {}
    notes = []
    if len(summaries) == 3:
        scores["summary"] = round(sum(WEIGHTS[g] * summaries[g] for g in WEIGHTS), 3)
    else:
        missing = [c for c in NORMAL + SPECIAL if c not in accuracy] + ([] if agent is not None else ["agent"])
        notes.append(f"summary (ACEBench's overall) not reported: no tasks played of {', '.join(missing)}")
    scores.update({f"{g}_summary": summaries[g] for g in ("normal", "special", "agent") if g in summaries})
    scores.update(accuracy)
    return scores, notes
