"""BFCL-v3 (Berkeley Function-Calling Leaderboard) as an environment, scored by the `nvidia-bfcl` package.

Splits:
    train    single-turn categories simple, multiple, parallel, parallel_multiple: one action, scored
             by BFCL's AST checker (``bfcl.eval_checker.ast_eval.ast_checker``, language Python),
             less the held-out tasks below and less every task whose question (normalised) is a
             held-out task's: BFCL asks 37 of its train-side questions again under another id and
             category (e.g. simple_4 = multiple_96, with other tools), 764 train tasks remain.
    heldout  the held-out single-turn tasks (199 of the 1,000 shipped): those whose id falls in
             bucket 0 of 5 under :func:`is_heldout` (a sha256 of the id, so the split is fixed and
             disjoint from ``train``); their Task rows say split ``test``. `lopd evaluate --bench
             bfcl-single` scores them.
    test   multi-turn categories multi_turn_base, multi_turn_miss_func, multi_turn_miss_param,
           multi_turn_long_context: executed against BFCL's stateful API classes and scored by its
           multi-turn checker (see :mod:`stages.envs.bfcl_multi`).

Data comes from the package (``bfcl/data``) or from ``data_dir`` holding the same files
(``BFCL_v3_<category>.json``, ``possible_answer/``, ``multi_turn_func_doc/``). Task ids are BFCL's ids.
Actions may use any format :func:`stages.core.text.toolcalls.parse_tool_calls` reads.
"""
from __future__ import annotations

import hashlib
import json
from itertools import chain, zip_longest
from pathlib import Path
from typing import Any

from schemas import Message, Task, ToolCall
from stages.envs._bfcl_files import (
    load_jsonl,
    log_unknown_types,
    package_data_dir,
    to_openai_tools,
    warn_unknown_types,
)
from stages.core.text.normalise import normalise
from stages.core.text.toolcalls import ToolCallParseError, format_python_calls, parse_tool_calls
from stages.envs.base import EnvError, StepResult, register
from stages.envs.bfcl_multi import MultiTurnEpisode, multi_turn_task

__all__ = ["BFCLEnv", "HELDOUT_RULE", "MULTI_TURN", "SINGLE_TURN", "SPLITS", "load_jsonl", "opening_messages", "package_data_dir",
           "is_heldout", "single_turn_verdict", "system_prompt", "to_openai_tools"]

SINGLE_TURN = ("simple", "multiple", "parallel", "parallel_multiple")
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
SPLITS = {"train": SINGLE_TURN, "heldout": SINGLE_TURN, "test": MULTI_TURN}
HELDOUT_RULE = "sha256('lopd-heldout:' + task_id) mod 5 == 0"


def is_heldout(task_id: str) -> bool:
    """Whether a single-turn task is held out from training (:data:`HELDOUT_RULE`; ~1 in 5)."""
    return int(hashlib.sha256(f"lopd-heldout:{task_id}".encode()).hexdigest(), 16) % 5 == 0


def system_prompt(tools: list[dict[str, Any]] | None = None) -> str:
    """BFCL's prompting system prompt; with ``tools`` the function list is written into it."""
    from bfcl.model_handler.constant import DEFAULT_SYSTEM_PROMPT, DEFAULT_SYSTEM_PROMPT_WITHOUT_FUNC_DOC

    if tools is None:
        return DEFAULT_SYSTEM_PROMPT_WITHOUT_FUNC_DOC
    return DEFAULT_SYSTEM_PROMPT.format(functions=json.dumps([t["function"] for t in tools]))


def opening_messages(turn: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[Message]:
    """System prompt + the first turn's messages (a task's own system message is appended to ours)."""
    system = system_prompt(tools)
    messages = []
    for m in turn:
        if m.get("role") == "system":
            system += "\n\n" + m.get("content", "")
        else:
            messages.append(Message(role=m.get("role", "user"), content=m.get("content", "")))
    return [Message(role="system", content=system), *messages]


def single_turn_verdict(task: Task, calls: list[ToolCall]) -> dict[str, Any]:
    """Score single-turn ``calls`` on ``task`` with BFCL's AST checker (Python).

    Names written with ``_`` in place of ``.`` (as OpenAI-style tool names) are mapped back.

    Returns:
        The checker's verdict: ``{"valid": bool, "error": [...], "error_type": str}``.
    """
    from bfcl.eval_checker.ast_eval.ast_checker import ast_checker

    meta = task.meta
    undotted = {f["name"].replace(".", "_"): f["name"] for f in meta["function"]}
    decoded = [{undotted.get(c.name, c.name): c.args} for c in calls]
    return ast_checker(meta["function"], decoded, meta["ground_truth"], "Python", meta["category"], "lopd")


def _resolve_categories(categories: list[str] | str | None) -> set[str]:
    if categories is None:
        return set(SINGLE_TURN + MULTI_TURN)
    names = [categories] if isinstance(categories, str) else list(categories)
    known = SINGLE_TURN + MULTI_TURN
    chosen = set()
    for name in names:
        full = name if name in known else f"multi_turn_{name}"
        if full not in known:
            raise EnvError(f"bfcl: unknown category {name!r}; choose from {', '.join(known)}")
        chosen.add(full)
    return chosen


def _load_category(data_dir: Path, category: str) -> list[Task]:
    path = data_dir / f"BFCL_v3_{category}.json"
    multi = category in MULTI_TURN
    required = ("id", "question", "initial_config", "involved_classes") if multi else ("id", "question", "function")
    entries = load_jsonl(path, required)
    answer_path = data_dir / "possible_answer" / path.name
    answers = {a["id"]: a["ground_truth"] for a in load_jsonl(answer_path, ("id", "ground_truth"))}
    if multi:
        docs: dict[str, list[dict]] = {}
        return [multi_turn_task(e, category, answers, path, answer_path, data_dir, docs) for e in entries]
    tasks, unknown_types = [], []
    for lineno, entry in enumerate(entries, start=1):
        if entry["id"] not in answers:
            raise EnvError(f"{answer_path}: no ground truth for id {entry['id']!r}")
        if not isinstance(entry["question"], list) or not entry["question"] or not isinstance(entry["question"][0], list):
            raise EnvError(f"{path}:{lineno}: field 'question' must be a non-empty list of message lists")
        warn_unknown_types(entry["function"], str(path), entry["id"], found=unknown_types)
        meta = {"category": category, "question": entry["question"][0], "function": entry["function"],
                "ground_truth": answers[entry["id"]]}
        prompt = "\n".join(m.get("content", "") for m in entry["question"][0] if m.get("role") == "user")
        tasks.append(Task(task_id=entry["id"], env="bfcl", split="train", prompt=prompt,
                          tools=json.dumps(to_openai_tools(entry["function"])), metadata=json.dumps(meta)))
    log_unknown_types(unknown_types, str(path))
    return tasks


@register("bfcl")
class BFCLEnv:
    """BFCL-v3 environment (one instance per episode).

    Args:
        data_dir: folder with BFCL-v3 files; default: the data shipped in the ``bfcl`` package.
        max_turns: cap on agent actions per episode (multi-turn; exceeding it fails the episode).
        categories: subset of categories (``"simple"``, ``"base"``, ``"multi_turn_miss_func"`` ...).
        tools_in_prompt: write the function docs into the system prompt (BFCL prompting mode) in
            addition to ``Task.tools``; for chat templates without tool support.

    Raises:
        EnvError: unknown category; missing/malformed data files (when tasks are listed).
    """

    name = "bfcl"

    def __init__(self, data_dir: Path | str | None = None, max_turns: int = 30,
                 categories: list[str] | str | None = None, tools_in_prompt: bool = False) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.max_turns = max_turns
        self.categories = _resolve_categories(categories)
        self.tools_in_prompt = tools_in_prompt
        self._task: Task | None = None
        self._multi = None  # bfcl_multi.MultiTurnEpisode of the current multi-turn episode

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """Tasks of ``split``, categories interleaved round-robin (file order within each), at most ``limit``.

        ``train`` and ``heldout`` divide the single-turn tasks by :func:`is_heldout`; ``train``
        also drops every task that asks a held-out question (module docstring).

        Raises:
            EnvError: unknown split; missing/malformed data files.
        """
        if split not in SPLITS:
            raise EnvError(f"bfcl: unknown split {split!r}; choose {', '.join(map(repr, SPLITS))}")
        data_dir = self.data_dir or package_data_dir()
        # train also reads the single-turn categories it does not serve: their held-out questions
        wanted = [c for c in SPLITS[split] if c in self.categories or
                  (split == "train" and (data_dir / f"BFCL_v3_{c}.json").is_file())]
        loaded = {c: _load_category(data_dir, c) for c in wanted}
        per_category = [loaded[c] for c in SPLITS[split] if c in self.categories]
        if split == "heldout":
            per_category = [[t.model_copy(update={"split": "test"}) for t in tasks if is_heldout(t.task_id)]
                            for tasks in per_category]
        elif split == "train":
            held = {normalise(t.prompt) for tasks in loaded.values() for t in tasks if is_heldout(t.task_id)}
            per_category = [[t for t in tasks if not is_heldout(t.task_id) and normalise(t.prompt) not in held]
                            for tasks in per_category]
        tasks = [t for t in chain.from_iterable(zip_longest(*per_category)) if t is not None]
        return tasks[:limit] if limit is not None else tasks

    def reset(self, task: Task) -> list[Message]:
        """Start an episode on ``task`` (fresh API instances for multi-turn tasks)."""
        self.close()
        self._task = task
        meta = task.meta
        tools = task.tool_schemas if self.tools_in_prompt else None
        if meta.get("category") in MULTI_TURN:
            self._multi = MultiTurnEpisode(task, self.max_turns, self.tools_in_prompt)
            return opening_messages(meta["question"][0], tools)
        return opening_messages(meta["question"], tools)

    def step(self, action: str) -> StepResult:
        """Single-turn: score the one action (done). Multi-turn: see ``MultiTurnEpisode.step``.

        Raises:
            EnvError: called before :meth:`reset` or after a single-turn episode ended.
        """
        if self._multi is not None:
            return self._multi.step(action)
        if self._task is None:
            raise EnvError("bfcl: step() called without an active episode; call reset(task) first")
        task, self._task = self._task, None
        try:
            calls = parse_tool_calls(action)
        except ToolCallParseError as err:
            info = {"success": False, "valid": False, "error_type": "ast_decoder:decoder_failed", "error": str(err)}
            return StepResult(observation=[], reward=0.0, done=True, info=info)
        verdict = single_turn_verdict(task, calls)
        valid = bool(verdict["valid"])
        info = {"success": valid, "valid": valid, "error_type": verdict.get("error_type", ""),
                "error": [str(e) for e in verdict.get("error", [])]}
        return StepResult(observation=[], reward=float(valid), done=True, tool_calls=calls, info=info)

    def reference_actions(self, task: Task) -> list[str]:
        """The task's reference answer as actions (single-turn: one BFCL python-list call string).

        For each parameter the first non-empty accepted value of BFCL's possible answer is used.

        Raises:
            EnvError: ``task`` is multi-turn (no reference demonstrations are produced for those).
            UnsafeCallError: the ground truth holds a name or value that cannot be written as a
                Python literal call (none of the shipped tasks does).
        """
        meta = task.meta
        if meta.get("category") in MULTI_TURN:
            raise EnvError(f"bfcl: no reference actions for multi-turn task {task.task_id}")

        def pick(options: Any) -> Any:
            value = next((v for v in options if v != ""), "") if isinstance(options, list) else options
            return {k: pick(v) for k, v in value.items()} if isinstance(value, dict) else value

        calls = [ToolCall(name=name, arguments=json.dumps({k: pick(v) for k, v in args.items() if pick(v) != ""}))
                 for item in meta["ground_truth"] for name, args in item.items()]
        return [format_python_calls(calls)]

    def close(self) -> None:
        """Drop the episode and its BFCL API instances."""
        if self._multi is not None:
            self._multi.close()
        self._multi = None
        self._task = None
