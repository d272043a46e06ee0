"""BFCL-v3 multi-turn episodes: BFCL's stateful API classes executed per step, BFCL's checker at the end.

Follows the inference loop of ``bfcl.model_handler.base_handler.inference_multi_turn_FC``: in each
user turn the model may act several times; an action with tool calls is executed
(``execute_multi_turn_func_call``) and answered with one ``tool`` message per call; an action with
no decodable call ends the turn and the next user message follows (for miss_func the held-out
functions are added at their turn, announced with BFCL's user prompt, and the new tool list is
returned in ``StepResult.info["tools"]``). More than ``MAXIMUM_STEP_LIMIT`` tool steps in one turn is
a force-quit (failure). After the last turn the answer is scored by ``multi_turn_checker``, which
replays the model's calls and the ground truth on fresh instances.

The package keeps API instances in module globals of ``multi_turn_utils`` keyed by model name and
test id, so every episode and every scoring uses a unique model name and deletes its instances.

Untrusted model output: BFCL's executor and checker ``eval`` call strings. The strings handed to
them are built only from checked parts (:func:`stages.core.text.toolcalls.format_python_call` with the
method's declared parameters: a public method of the task's API classes, identifier argument names
that the method declares, JSON literal values written with ``repr`` and read back); a call that
fails a check is answered with an error tool message, is not executed and is not recorded in the
answer. Every string is checked once more (:func:`check_call_string`) right before the package
sees it. Executing through ``eval`` is kept (rather than calling the methods directly) because
BFCL's checker replays the recorded strings with ``eval`` anyway: one checked path serves both.

Model-chosen values: the checked strings still carry model-chosen literals (``power(base=10,
exponent=1000000000)`` computes for minutes), so neither the executor nor the checker runs in the
lopd process: both run in a pooled worker process (:mod:`stages.envs._bfcl_worker`) with a
memory cap, one request per call, each with a wall-clock limit (:data:`CALL_TIMEOUT_S`). A call
that exceeds it is answered with ``Error during execution: timed out after N s``, is not recorded
(like a rejected call), and the worker is killed and replaced; the replacement rebuilds the
episode's state by replaying the recorded calls (BFCL's APIs are deterministic: seeded random
generators), exactly the state BFCL's checker will rebuild. If that replay fails the episode ends
as failed (``error_type`` ``multi_turn:execution_failed``); a checker that fails or runs out of time
scores the answer invalid (``multi_turn:checker_failed``).
"""
from __future__ import annotations

import inspect
import json
import logging
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

from schemas import Message, Task
from stages.envs import _bfcl_worker
from stages.envs._bfcl_files import load_jsonl, to_openai_tools, warn_unknown_types
from stages.envs._worker_process import WorkerFailure, WorkerProcess
from stages.envs.base import EnvError, StepResult
from stages.core.text.toolcalls import (
    ToolCallParseError,
    UnsafeCallError,
    check_python_call,
    format_python_call,
    parse_tool_calls,
)

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0  # wall-clock limit per executed API call (and per replayed call)
START_TIMEOUT_S = 60.0  # a fresh worker imports the package before answering its first request
CHECKER_MARGIN_S = 10.0  # checker limit: CALL_TIMEOUT_S per model and ground-truth call, plus this


def multi_turn_task(entry: dict[str, Any], category: str, answers: dict[str, Any], path: Path,
                    answer_path: Path, data_dir: Path, docs: dict[str, list[dict]]) -> Task:
    """Build the :class:`Task` of one multi-turn BFCL entry (function docs from ``multi_turn_func_doc/``).

    Held-out functions (miss_func) are removed from the offered tools and kept per turn in the
    metadata, as BFCL's ``process_multi_turn_test_case`` does. ``docs`` caches loaded doc files.

    An entry whose ground truth has a different number of turns than its question (one in the
    shared copy of multi_turn_base) is kept with a warning: like BFCL, it always scores 0.

    Raises:
        EnvError: unknown API class, malformed question/ground truth, missing doc file or answer.
    """
    from bfcl.constant import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    test_id = entry["id"]
    where = f"{path}: entry {test_id!r}"
    question, classes = entry["question"], entry["involved_classes"]
    if not isinstance(question, list) or not question or not all(isinstance(t, list) for t in question):
        raise EnvError(f"{where}: field 'question' must be a non-empty list of turns (message lists)")
    if not isinstance(classes, list) or any(c not in MULTI_TURN_FUNC_DOC_FILE_MAPPING for c in classes):
        raise EnvError(f"{where}: field 'involved_classes' must list known BFCL API classes, got {classes!r}")
    if test_id not in answers:
        raise EnvError(f"{answer_path}: no ground truth for id {test_id!r}")
    ground_truth = answers[test_id]
    if not isinstance(ground_truth, list) or not all(isinstance(t, list) for t in ground_truth):
        raise EnvError(f"{answer_path}: entry {test_id!r}: field 'ground_truth' must be a list of turns (call lists)")
    if len(ground_truth) != len(question):  # kept, as BFCL does: it can only score force_terminated
        log.warning("%s: entry %r has %d ground-truth turns for %d question turns; it cannot be solved",
                    answer_path, test_id, len(ground_truth), len(question))
    functions = []
    for cls in classes:
        doc_file = data_dir / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]
        if cls not in docs:
            docs[cls] = load_jsonl(doc_file, ("name", "description", "parameters"))
            warn_unknown_types(docs[cls], str(doc_file))
        functions.extend(docs[cls])
    missed: dict[str, list[dict]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        if not turn.isdigit() or int(turn) >= len(question) or question[int(turn)]:
            raise EnvError(f"{where}: field 'missed_function' turn {turn!r} must index an empty question turn")
        held = [f for f in functions if f["name"] in names]
        functions = [f for f in functions if f["name"] not in names]
        missed[turn] = to_openai_tools(held)
    meta = {"category": category, "id": test_id, "question": question, "initial_config": entry["initial_config"],
            "involved_classes": classes, "path": entry.get("path", []), "ground_truth": ground_truth,
            "missed_function": missed}
    prompt = "\n".join(m.get("content", "") for m in question[0] if m.get("role") == "user")
    return Task(task_id=test_id, env="bfcl", split="test", prompt=prompt,
                tools=json.dumps(to_openai_tools(functions)), metadata=json.dumps(meta))


def multi_turn_verdict(task: Task, answer: list[list[list[str]]], *, worker: WorkerProcess | None = None,
                       call_timeout_s: float | None = None) -> dict[str, Any]:
    """Score a complete multi-turn answer with BFCL's ``multi_turn_checker`` (run in a worker process).

    Args:
        task: a multi-turn task from :class:`stages.envs.bfcl.BFCLEnv`.
        answer: per user turn, per step, the executed call strings (BFCL's decoded format, e.g.
            ``[["cd(folder='docs')"], ["ls()"]]`` for one turn of two steps). Empty steps are dropped.
        worker: the worker to use (default: one from the pool, given back afterwards).
        call_timeout_s: the checker may take this long per model and ground-truth call, plus
            :data:`CHECKER_MARGIN_S` (default :data:`CALL_TIMEOUT_S`).

    Returns:
        ``{"valid": bool, "error_type": str, "error_message": str}``; a turn count different from
        the ground truth's is ``multi_turn:force_terminated`` (as in BFCL's runner); a checker that
        times out, runs out of memory or dies is ``multi_turn:checker_failed`` (invalid).

    Raises:
        ValueError: a call string that fails :func:`check_call_string` (it would be eval'd).
    """
    meta = task.meta
    ground_truth = meta["ground_truth"]
    if len(answer) != len(ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"answer has {len(answer)} turns, ground truth {len(ground_truth)}"}
    signatures = api_signatures(tuple(meta["involved_classes"]))
    decoded = [[step for step in turn if step] for turn in answer]
    for call in (c for turn in decoded for step in turn for c in step):
        check_call_string(call, signatures)
    calls = sum(len(step) for turn in decoded for step in turn) + sum(len(turn) for turn in ground_truth)
    entry = {"id": meta["id"], "initial_config": meta["initial_config"], "involved_classes": meta["involved_classes"]}
    request = {"op": "verdict", "decoded": decoded, "ground_truth": ground_truth, "entry": entry,
               "category": meta["category"], "model": _unique_model_name()}
    per_call = CALL_TIMEOUT_S if call_timeout_s is None else call_timeout_s
    own = worker is None
    worker = _bfcl_worker.acquire() if own else worker
    try:
        worker.request({"op": "ping"}, START_TIMEOUT_S)  # a fresh worker's start is not the checker's time
        return worker.request(request, per_call * calls + CHECKER_MARGIN_S)["verdict"]
    except WorkerFailure as err:
        return {"valid": False, "error_type": "multi_turn:checker_failed", "error_message": f"checker: {err}"}
    finally:
        if own:
            _bfcl_worker.release_worker(worker)


def score_multi_turn(task: Task, answer: list[list[list[str]]]) -> bool:
    """Whether ``answer`` (see :func:`multi_turn_verdict`) solves the multi-turn ``task``."""
    return multi_turn_verdict(task, answer)["valid"]


class MultiTurnEpisode:
    """The state of one multi-turn BFCL episode (used by :class:`stages.envs.bfcl.BFCLEnv`).

    Args:
        task: a multi-turn task; ``max_turns``: cap on actions over the whole episode;
        tools_in_prompt: announce held-out functions in the user message (BFCL prompting mode);
        call_timeout_s: wall-clock limit per executed API call (default :data:`CALL_TIMEOUT_S`).
    """

    def __init__(self, task: Task, max_turns: int, tools_in_prompt: bool = False,
                 call_timeout_s: float | None = None) -> None:
        self.task, self.meta = task, task.meta
        self.max_turns, self.tools_in_prompt = max_turns, tools_in_prompt
        self.call_timeout_s = CALL_TIMEOUT_S if call_timeout_s is None else call_timeout_s
        self.tools = task.tool_schemas
        self.signatures = api_signatures(tuple(self.meta["involved_classes"]))
        self.model_name = _unique_model_name()
        self.answer: list[list[list[str]]] = [[]]
        self.turn_steps = 0
        self.steps = 0
        self.done = False
        self.worker: WorkerProcess | None = None  # taken from the pool at the first call
        self.failure = ""  # why the worker could not go on (multi_turn:execution_failed)

    def step(self, action: str) -> StepResult:
        """Execute the action's calls (observation: tool messages) or end the user turn.

        An unparsable action ends the turn like a plain answer (BFCL: "Failed to decode the model
        response. Proceed to next turn."); the parse error is in ``info["parse_error"]``.

        Raises:
            EnvError: the episode is already over.
        """
        if self.done:
            raise EnvError(f"bfcl: episode {self.task.task_id} is over; call reset(task)")
        from bfcl.model_handler.constant import MAXIMUM_STEP_LIMIT

        self.steps += 1
        try:
            calls, parse_error = parse_tool_calls(action), None
        except ToolCallParseError as err:
            calls, parse_error = [], str(err)
        turn = len(self.answer) - 1
        if calls:
            observation = self._execute(calls)
            if observation is None:
                return self._fail("multi_turn:execution_failed", f"API worker failed: {self.failure}", calls)
            self.turn_steps += 1
            if self.turn_steps > MAXIMUM_STEP_LIMIT:
                return self._fail("multi_turn:force_terminated", f"more than {MAXIMUM_STEP_LIMIT} steps in turn {turn}", calls)
            if self.steps >= self.max_turns:
                return self._fail("max_steps", f"episode step cap {self.max_turns} reached", calls)
            return StepResult(observation=observation, tool_calls=calls, info={"turn": turn})
        info: dict[str, Any] = {"turn_ended": turn}
        if parse_error:
            info["parse_error"] = parse_error
        if turn + 1 == len(self.meta["question"]):
            return self._finish(info)
        if self.steps >= self.max_turns:
            return self._fail("max_steps", f"episode step cap {self.max_turns} reached", [], info)
        self.answer.append([])
        self.turn_steps = 0
        return StepResult(observation=self._next_user_turn(turn + 1, info), info=info)

    def close(self) -> None:
        """Delete this episode's API instances and give its worker back to the pool. Idempotent."""
        worker, self.worker = self.worker, None
        if worker is None:
            return
        try:
            worker.request({"op": "release", "model": self.model_name}, self.call_timeout_s)
        except WorkerFailure:
            return  # killed: nothing left to release
        _bfcl_worker.release_worker(worker)

    def _start_worker(self) -> WorkerProcess:
        """A worker holding this episode's instances in the state the recorded answer leads to.

        Raises:
            WorkerFailure: the worker failed to start or to replay a recorded call.
        """
        if self.worker is not None and self.worker.running():
            return self.worker
        if self.worker is not None:  # died between requests (e.g. killed for memory): replace it
            self.worker.close()
        self.worker = _bfcl_worker.acquire()
        self.worker.request({"op": "start", "model": self.model_name, "id": self.meta["id"],
                             "classes": self.meta["involved_classes"], "config": self.meta["initial_config"],
                             "long_context": self.meta["category"] == "multi_turn_long_context"}, START_TIMEOUT_S)
        for call in (c for turn in self.answer for step in turn for c in step):  # after a killed call
            self.worker.request({"op": "call", "model": self.model_name, "call": call}, self.call_timeout_s)
        return self.worker

    def _call(self, text: str, done_in_step: list[str]) -> tuple[str, bool]:
        """Execute one checked call string.

        Returns:
            (observation text, whether the call completed). A call that times out or kills the
            worker is ``("Error during execution: <why>", False)``; the worker is replaced and the
            episode's state rebuilt.

        Raises:
            WorkerFailure: the replacement worker could not rebuild the episode's state.
        """
        worker = self._start_worker()
        try:
            reply = worker.request({"op": "call", "model": self.model_name, "call": text}, self.call_timeout_s)
            return reply["result"], True
        except WorkerFailure as err:
            self.worker = None
            self._start_worker()
            for call in done_in_step:  # the current step's calls are not in self.answer yet
                self.worker.request({"op": "call", "model": self.model_name, "call": call}, self.call_timeout_s)
            return f"Error during execution: {err}", False

    def _execute(self, calls) -> list[Message] | None:
        """Run the calls that pass the checks; each rejected call gets an error tool message.

        Returns ``None`` when the episode's state could not be rebuilt after a failed call.
        """
        strings: list[str | None] = []
        errors: list[str] = []
        for call in calls:
            try:
                if call.name not in self.signatures:
                    raise UnsafeCallError(f"function {call.name[:80]!r} is not available")
                text = format_python_call(call, self.signatures[call.name])
                check_call_string(text, self.signatures)
                strings.append(text)
                errors.append("")
            except (UnsafeCallError, ValueError) as err:
                strings.append(None)
                errors.append(f"Error during execution: {err}")
        done: list[str] = []
        contents: list[str] = []
        for text, error in zip(strings, errors):
            if text is None:
                contents.append(error)
                continue
            try:
                result, completed = self._call(text, done)
            except WorkerFailure as err:
                self.failure = str(err)
                return None
            if completed:  # a killed call is not recorded: the checker could not replay it either
                done.append(text)
            contents.append(result)
        if done:
            self.answer[-1].append(done)
        return [Message(role="tool", name=c.name[:200], content=content) for c, content in zip(calls, contents)]

    def _next_user_turn(self, turn: int, info: dict[str, Any]) -> list[Message]:
        from bfcl.model_handler.constant import (
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
        )

        held = self.meta["missed_function"].get(str(turn))
        if held is None:
            return [Message(role=m.get("role", "user"), content=m.get("content", "")) for m in self.meta["question"][turn]]
        self.tools = self.tools + held
        info["tools"] = self.tools
        text = (DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=json.dumps([t["function"] for t in held]))
                if self.tools_in_prompt else DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)
        return [Message(role="user", content=text)]

    def _finish(self, info: dict[str, Any]) -> StepResult:
        self.done = True
        self.close()
        verdict = multi_turn_verdict(self.task, self.answer, call_timeout_s=self.call_timeout_s)
        info.update(verdict, success=verdict["valid"], answer=self.answer)
        return StepResult(observation=[], reward=float(verdict["valid"]), done=True, info=info)

    def _fail(self, error_type: str, message: str, calls, info: dict[str, Any] | None = None) -> StepResult:
        self.done = True
        self.close()
        info = {**(info or {}), "success": False, "valid": False, "error_type": error_type,
                "error_message": message, "answer": self.answer}
        return StepResult(observation=[], reward=0.0, done=True, tool_calls=calls, info=info)


def _unique_model_name() -> str:
    return f"lopd_{uuid.uuid4().hex}"


@lru_cache(maxsize=None)
def api_signatures(classes: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """Public methods of the BFCL API classes (the only calls the executor may run) and their parameters.

    Like the package's executor, a method name defined by two classes belongs to the later one.

    Args:
        classes: BFCL API class names (``involved_classes`` of a task).

    Returns:
        ``{method name: frozenset of its parameter names (without self)}``.
    """
    import importlib

    from bfcl.eval_checker.multi_turn_eval.multi_turn_utils import CLASS_FILE_PATH_MAPPING

    signatures = {}
    for cls_name in classes:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                params = list(inspect.signature(fn).parameters.values())[1:]
                signatures[name] = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return signatures


def check_call_string(call: str, signatures: dict[str, frozenset[str]]) -> None:
    """Raise unless ``call`` is ``method(literal, ..., param=literal, ...)`` of a known API method.

    The last check before a string reaches BFCL's ``eval``: a plain method name from
    ``signatures`` (see :func:`api_signatures`), literal values only, keyword names among the
    method's parameters (positional literals are allowed: BFCL's ground truth uses them).

    Raises:
        ValueError: the call is rejected (the message says why).
    """
    try:
        name = check_python_call(call, positional=True)[0]
        if name not in signatures:
            raise UnsafeCallError(f"{name[:80]!r} is not a method of the task's API classes")
        check_python_call(call, signatures[name], positional=True)
    except UnsafeCallError as err:
        raise ValueError(f"call {call[:120]!r} rejected: {err}") from None
