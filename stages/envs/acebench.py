"""ACEBench agent tasks (multi-step and multi-turn) against minimal executable copies of its platforms.

Data (``--data-dir``, e.g. ``ACEBench/data_all/data_en``; from github.com/ACEBench/ACEBench
``data_all/data_en``): ``data_agent_multi_step.json`` and ``data_agent_multi_turn.json`` (JSON lines:
id, question, initial_config, function, involved_classes) and ``possible_answer/<same name>`` (id,
ground_truth = list of ``{ClassName: end-state attributes}``, mile_stone = list of call-path steps
such as ``"[login_food_platform(username='Eve', password='password123')]"``, or a list of such
lists when several paths are accepted).

Two platforms, picked by the task's involved classes:
:class:`stages.envs.acebench_phone.PhonePlatform` re-implements the four ``phone_platform``
classes of ACEBench's repository (BaseApi, MessageApi, ReminderApi, FoodPlatform);
:class:`stages.envs.acebench_travel.TravelPlatform` re-implements its ``Travel``
class (flights, reservations; multi-turn tasks 20-29). Scoring (:mod:`stages.envs.acebench_score`)
re-implements ACEBench's ``agent_eval``: end-to-end state match and process accuracy.

``episode_rules="official"`` (the default) plays and scores as ACEBench does: its checker and exact
process strings, a multi-step reply without a call answered with ACEBench's nudge (the episode goes
on until "finish conversation" or the step cap), the agent's "finish conversation" ending any
episode after its first message, the multi-turn agent told the phone / airline policy
(:mod:`.acebench_prompts`), a simulated user of up to 1,000 tokens whose whole reply is kept.
``"lenient"`` is lopd's earlier play and scoring (see :mod:`.acebench_score`).

The released answers are not fully consistent (some milestones name products that do not exist,
some end states disagree with their milestone); scores inherit that noise, as they do upstream.

Multi-turn tasks are served when the environment has a ``user_model``: a simulated user
(:mod:`stages.envs.acebench_multi`, with ACEBench's phone or travel user rules) opens the
dialogue and answers every agent message without a tool call; "finish conversation" or the step
cap ends it, scored like multi-step. All 30 multi-turn tasks run (20 phone, 10 Travel).

``language="zh"`` (``data_zh``) plays the same tasks on ACEBench's Chinese platforms (scenarioszh: the
same classes with Chinese data and messages, ``language`` of both platforms); the agent gets ACEBench's
Chinese system prompt word for word (:func:`.acebench_prompts_zh.agent_prompt_zh`: its format rules,
plus the airline / phone policy in multi-turn tasks) and the user its Chinese rules; the nudge and the
checker are the English ones, as upstream (neither has a language branch).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from schemas import Message, Task, ToolCall
from stages.envs import acebench_single
from stages.envs.acebench_phone import PhonePlatform
from stages.envs.acebench_prompts import FINISH_RULE, agent_policy
from stages.envs.acebench_prompts_zh import agent_prompt_zh
from stages.envs.acebench_score import (end_to_end, official_end_to_end, official_process, official_result,
                                             process_accuracy, step_text)
from stages.core.data.inputs import read_utf8
from stages.core.text.toolcalls import ToolCallParseError, parse_tool_calls
from stages.envs.acebench_travel import SYSTEM_PROMPT as TRAVEL_SYSTEM_PROMPT
from stages.envs.acebench_travel import TravelPlatform
from stages.envs.base import AGENTIC_RULES, EnvError, StepResult, register

_HINT = "pass --data-dir <ACEBench>/data_all/data_en or data_zh (git clone github.com/ACEBench/ACEBench)"
SYSTEM_PROMPT = "You are an AI agent operating a phone for the user with the tools you are given. " + AGENTIC_RULES
NUDGE = "Please do not ask me any questions, use the known conditions to solve the problem"  # ACEBench's words
FINISH = "finish conversation"


# ---- data -------------------------------------------------------------------------------------------------

_TYPE_NAMES = {"dict": "object", "float": "number", "list": "array", "tuple": "array", "int": "integer",
               "str": "string", "bool": "boolean", "any": "string"}


def _schema(fn: dict[str, Any]) -> dict[str, Any]:
    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (_TYPE_NAMES.get(v, v) if k == "type" and isinstance(v, str) else fix(v))
                    for k, v in node.items()}
        return [fix(x) for x in node] if isinstance(node, list) else node

    return fix(fn)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise EnvError(f"acebench: {path} not found; {_HINT}")
    try:
        return [json.loads(line) for line in read_utf8(path, EnvError).splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise EnvError(f"{path}: not valid JSON lines ({err.msg} at line {err.lineno})") from None


SIMULATED = frozenset({"BaseApi", "MessageApi", "ReminderApi", "FoodPlatform", "Travel"})


def load_tasks(data_dir: Path | None, part: str = "multi_step") -> list[Task]:
    """ACEBench agent tasks of ``part`` ("multi_step" | "multi_turn"; test split) with their
    possible answers and involved classes in the metadata.

    Raises:
        EnvError: missing data folder/files, a row without the needed fields, or a class not simulated.
    """
    if data_dir is None:
        raise EnvError(f"acebench: no data; {_HINT}")
    root = Path(data_dir)
    name = f"data_agent_{part}.json"
    rows = _lines(root / name)
    answers = {a.get("id"): a for a in _lines(root / "possible_answer" / name)}
    tasks = []
    for row in rows:
        where = f"{root / name} id {row.get('id')}"
        classes = row.get("involved_classes")
        if not isinstance(classes, list) or not set(classes) <= SIMULATED:
            raise EnvError(f"{where}: involved_classes must list classes of {sorted(SIMULATED)}, got {classes!r}")
        answer = answers.get(row.get("id"))
        if answer is None or not {"ground_truth", "mile_stone"} <= answer.keys():
            raise EnvError(f"{where}: no possible answer with ground_truth and mile_stone")
        if not {"question", "function", "initial_config"} <= row.keys():
            raise EnvError(f"{where}: needs fields question, function, initial_config")
        tasks.append(Task(
            task_id=row["id"], env="acebench", split="test", prompt=row["question"],
            tools=json.dumps([_schema(f) for f in row["function"]]),
            metadata=json.dumps({"initial_config": row["initial_config"], "ground_truth": answer["ground_truth"],
                                 "mile_stone": answer["mile_stone"], "part": part, "involved_classes": classes}),
        ))
    return tasks


@register("acebench")
class AceBenchEnv:
    """ACEBench agent episodes on :class:`PhonePlatform`, or on the Travel platform for tasks involving "Travel";
    tasks of the normal and special categories, when their files are in the data folder, are one reply each
    (:mod:`.acebench_single`, checked by :mod:`.acebench_ast`).

    An action with tool calls is executed (one tool message per call). An action without calls:
    in a multi-turn episode it goes to the simulated user, whose answer is the next user message;
    in a multi-step one it ends the episode (lenient rules) or gets ACEBench's nudge (official
    rules). "finish conversation" (from the user, or under the official rules from the agent after
    its first message) and the step cap end any episode. Reward = 1 when end-to-end holds, else
    the process accuracy; ``info`` has ``end_to_end``, ``process_accuracy``, the mismatches and the
    rules.

    Args:
        data_dir: ACEBench's ``data_en`` (or ``data_zh``) folder.
        max_turns: agent actions per episode (20 = ACEBench's 40 dialogue messages).
        user_model: the simulated user's model; None: multi-step tasks only.
        episode_rules: ``"official"`` (ACEBench's) or ``"lenient"`` (module docstring).
        language: ``"en"`` (``data_en``) or ``"zh"`` (``data_zh``): every task gets ACEBench's prompts of
            that language and the agent tasks its platforms of that language (module docstring).

    Raises:
        EnvError: an unknown ``episode_rules`` or ``language``.
    """

    name = "acebench"
    default_rules = "official"

    def __init__(self, data_dir: Path | None = None, max_turns: int = 20, user_model: str | None = None,
                 episode_rules: str = "official", language: str = "en"):
        if episode_rules not in ("official", "lenient"):
            raise EnvError(f"acebench: episode_rules must be one of official, lenient, got {episode_rules!r}")
        if language not in acebench_single.LANGUAGES:
            raise EnvError(f"acebench: language must be one of {', '.join(acebench_single.LANGUAGES)}, "
                           f"got {language!r}")
        self.data_dir, self.max_turns, self.user_model = data_dir, max_turns, user_model
        self.language = language
        self.episode_rules = episode_rules
        self._task: Task | None = None
        self._user = None
        self.data_notes: list[str] = []  # rows of the single-turn files left out, one line each

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """The multi-step tasks, then (with a user model) the multi-turn ones, then the normal and special
        ones found in the data folder; only ``split="test"`` exists.

        Raises:
            EnvError: another split, or missing/malformed data.
        """
        if split != "test":
            raise EnvError(f"acebench: only split 'test' exists, got {split!r}")
        if self.data_dir is None:
            raise EnvError(f"acebench: no data; {_HINT}")
        tasks = load_tasks(self.data_dir)
        if self.user_model:
            tasks += load_tasks(self.data_dir, "multi_turn")
        single, self.data_notes = acebench_single.load_single_turn(self.data_dir, self.language)
        tasks += single
        return tasks[:limit] if limit is not None else tasks

    def reset(self, task: Task) -> list[Message]:
        """Fresh platform from the task's initial_config; system prompt + the user's request (multi-turn:
        the simulated user's opening line).

        Raises:
            EnvError: a multi-turn task without a user model.
        """
        self._task, self._steps, self._texts, self._called, self._user = task, [], [], False, None
        if task.meta.get("part") in acebench_single.PARTS:
            return acebench_single.opening(task)
        classes = task.meta.get("involved_classes", [])
        travel = "Travel" in classes
        platform = TravelPlatform if travel else PhonePlatform
        self.platform = platform(copy.deepcopy(task.meta["initial_config"]), language=self.language)
        zh = self.language == "zh"
        prompt = TRAVEL_SYSTEM_PROMPT if travel else SYSTEM_PROMPT
        if self.episode_rules == "official":  # ACEBench's episodes end on "finish conversation"
            prompt = prompt.replace(AGENTIC_RULES, FINISH_RULE)
        if zh:  # ACEBench's own Chinese prompt (with the multi-turn policy), under either rules
            prompt = agent_prompt_zh(task.meta["part"], classes)
        if task.meta.get("part") == "multi_turn":
            if not self.user_model:
                raise EnvError(f"{task.task_id}: a multi-turn task needs a user model (--user-model)")
            from stages.envs.acebench_multi import SimulatedUser

            official = self.episode_rules == "official"
            self._user = SimulatedUser(self.user_model, task.prompt, classes, max_new_tokens=1000 if official else 64,
                                       whole_reply=official, language=self.language)
            policy = agent_policy(classes) if official and not zh else ""
            system = Message(role="system", content=f"{prompt}\n\n{policy}" if policy else prompt)
            return [system, Message(role="user", content=self._user.opening())]
        return [Message(role="system", content=prompt), Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        """Execute the action's calls, or answer / score an action without calls (class docstring)."""
        if self._task is None:
            raise EnvError("acebench: step() before reset()")
        if self._task.meta.get("part") in acebench_single.PARTS:  # one reply, checked by ACEBench's rules
            return acebench_single.judge(self._task, action)
        official = self.episode_rules == "official"
        turn = len(self._steps) + 1
        if official and turn > 1 and FINISH in action:  # ACEBench ends on it before executing anything
            self._steps.append([])
            return self._finish([])
        try:
            calls = parse_tool_calls(action)
        except ToolCallParseError as err:
            if not official:
                self._steps.append([])
                hint = Message(role="user", content=f"Your tool call could not be read ({err}). "
                                                    "Use the <tool_call> format.")
                return self._finish([]) if len(self._steps) >= self.max_turns else StepResult([hint], info={"parse_error": str(err)})
            calls = []  # upstream: a message that does not decode is no call
        if not calls:
            return self._no_call(action, turn)
        self._steps.append(calls)
        self._texts.append(step_text(action, calls))
        self._called = True
        obs = [Message(role="tool", name=c.name, content=json.dumps(self.platform.call(c.name, c.args), default=str))
               for c in calls]
        if len(self._steps) >= self.max_turns:
            return self._finish(calls)
        return StepResult(obs, tool_calls=calls)

    def _no_call(self, action: str, turn: int) -> StepResult:
        """An action without calls: the user answers (multi-turn), ACEBench's nudge (official
        multi-step), or the end (lenient multi-step)."""
        official = self.episode_rules == "official"
        self._steps.append([])
        if self._user is None:
            if not official:
                return self._finish([])
            self._texts.append(step_text(action, []))  # upstream records every multi-step message
            if len(self._steps) >= self.max_turns:
                return self._finish([])
            return StepResult([Message(role="user", content=NUDGE)])
        said = self._user.reply(action)
        ends = (turn > 1 and FINISH in said) if official else self._user.finished(said)
        if ends or len(self._steps) >= self.max_turns:
            return self._finish([])
        return StepResult([Message(role="user", content=said)])

    def score(self) -> dict[str, Any]:
        """Scores of the episode so far: end_to_end, process_accuracy, mismatches, the rules."""
        meta = self._task.meta
        if self.episode_rules == "official":
            result = official_result(self.platform.state(), meta.get("involved_classes", []), self._called)
            ok, errors = official_end_to_end(result, meta["ground_truth"])
            process = 1.0 if ok else official_process(self._texts, meta["mile_stone"])
        else:
            ok, errors = end_to_end(self.platform.state(), meta["ground_truth"])
            process = 1.0 if ok else process_accuracy(self._steps, meta["mile_stone"])
        return {"end_to_end": ok, "process_accuracy": process, "mismatches": errors[:10], "success": ok,
                "episode_rules": self.episode_rules}

    def _finish(self, calls: list[ToolCall]) -> StepResult:
        info = self.score()
        return StepResult([], reward=1.0 if info["end_to_end"] else info["process_accuracy"], done=True,
                          tool_calls=calls, info=info)

    def close(self) -> None:
        """Nothing to release."""
