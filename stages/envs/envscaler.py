"""EnvScaler environments: synthesized stateful Python classes with rule-based check functions.

Data (environments and tasks tables, their sources and splits): :mod:`.envscaler_data`.

Episode: ``reset`` starts a fresh worker process (:mod:`._envscaler_worker`) that builds the
instance from source + ``init_config`` under memory/CPU limits. Tool calls run as
``getattr(instance, name)(**args)`` in the worker; an action without tool calls is the final
answer. At the end every check function runs on the final state (``vars(instance)`` deep-copied,
as EnvScaler does; ``initial_state`` is a global of the check); reward = fraction passed.
``episode_rules`` (:mod:`.envscaler_rules`) decides the rest: ``official`` (the default, EnvScaler's
evaluation: first tool call of a reply only, a raising tool or the step cap or an empty reply scores
0), ``lenient`` (every call runs, errors are observations, the step cap scores the state) or, on
the lopd study bed, ``exact`` (lenient play; the final state must equal the reference's). The
rules are recorded in every task's metadata and every episode's info. Conversational tasks (rows
with ``user_system_prompt``) are played with a simulated user (``user_model``), by the rules of
:mod:`.envscaler_conv`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas import Message, Task, ToolCall
from stages.envs import envscaler_conv
from stages.envs._envscaler_worker import start_env_worker
from stages.envs._worker_process import WorkerFailure, WorkerProcess
from stages.envs.base import EnvError, StepResult, register
from stages.envs.envscaler_conv import CONV_MAX_STEPS, STOP, User, conv_system_prompt
from stages.envs.envscaler_data import FIXTURES_DIR, HF_ENVS, TOOL_CALL_NOTE, EnvSpec, TaskSpec, load_data
from stages.envs.envscaler_rules import (INVALID_ACTION, EpisodeRules, check_rules, exact_reward, is_lookup,
                                              official_action, official_reward)

OBSERVATION_MAX_CHARS = 8000
FINAL_REPLY = "Task Completed"  # the reply that ends an episode (see AGENTIC_RULES)


# ----------------------------------------------------------------------------- environment


@register("envscaler")
class EnvScalerEnv:
    """EnvScaler episodes (see the module docstring).

    Args:
        data_dir, envs_file, tasks_file, hf_dataset, hf_envs, hf_split, test_size, seed: data
            source and split, see :func:`load_data`.
        max_turns: agent actions per episode; reaching it ends the episode (scored 0 under the
            official rules, on the final state under the lenient ones).
        episode_rules: ``"official"`` (EnvScaler's evaluation) or ``"lenient"``; see
            :mod:`stages.envs.envscaler_rules`.
        call_timeout_s: wall-clock limit per worker request (building the instance, one tool
            call); exceeding it kills the worker and fails the episode.
        check_timeout_s: limit per check function (a timed-out check counts as failed).
        memory_mb: address-space limit of the worker (MiB).
        cpu_s: CPU-seconds limit of the worker over the whole episode.
        user_model: the model that plays the user of conversational tasks (:mod:`.envscaler_conv`);
            None: those tasks are left out of :meth:`tasks` and refused by :meth:`reset`.
        conv_max_turns: agent actions per conversational episode (EnvScaler's 40).
        conversation: play every task conversationally (EnvScaler's ``envscaler_conversation_rl``),
            rows without ``user_system_prompt`` with :data:`.envscaler_conv.USER_PROMPT`.

    Raises:
        EnvError: unusable data (from :func:`load_data`), an unknown ``episode_rules``.
    """

    name = "envscaler"
    default_rules: EpisodeRules = "official"
    rule_sets: tuple[str, ...] = ("official", "lenient")  # ``exact`` needs every task's reference actions

    def __init__(
        self,
        data_dir: Path | str | None = None,
        max_turns: int = 30,
        *,
        envs_file: Path | str | None = None,
        tasks_file: Path | str | None = None,
        hf_dataset: str | None = None,
        hf_envs: str = HF_ENVS,
        hf_split: str = "train",
        test_size: int = 200,
        seed: int = 0,
        call_timeout_s: float = 10.0,
        check_timeout_s: float = 5.0,
        memory_mb: int = 1024,
        cpu_s: int = 300,
        episode_rules: EpisodeRules | None = None,
        user_model: str | None = None,
        conv_max_turns: int = CONV_MAX_STEPS,
        conversation: bool = False,
    ) -> None:
        try:
            self.episode_rules = check_rules(episode_rules or self.default_rules, self.name, self.rule_sets)
        except ValueError as err:
            raise EnvError(str(err)) from None
        self.data = load_data(data_dir, envs_file, tasks_file, hf_dataset, hf_envs, hf_split, test_size, seed)
        self.fixtures = str(FIXTURES_DIR) in self.data.source  # the bundled test fixtures, not EnvScaler's data
        self.data_source = self.data.source + (" (bundled test fixtures, not the EnvScaler benchmark)"
                                               if self.fixtures else "") + f"; episode rules: {self.episode_rules}"
        self.max_turns = max_turns
        self.call_timeout_s = call_timeout_s
        self.check_timeout_s = check_timeout_s
        self.memory_mb = memory_mb
        self.cpu_s = cpu_s
        self.user_model, self.conv_max_turns, self.conversation = user_model, conv_max_turns, conversation
        self._user: User | None = None
        self._worker: WorkerProcess | None = None
        self._task: TaskSpec | None = None
        self._env: EnvSpec | None = None
        self._failure: str | None = None
        self._steps = 0
        self._refused = 0  # calls the environment refused this episode (the ``exact`` rules score them)
        self._done = True

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """Tasks of ``split`` ("train" | "test") in the seeded split order, at most ``limit``;
        conversational tasks only with a ``user_model``.

        Raises:
            EnvError: unknown split.
        """
        if split not in self.data.splits:
            raise EnvError(f"{self.name}: unknown split {split!r}; use one of: {', '.join(sorted(self.data.splits))}")
        ids = [tid for tid in self.data.splits[split] if self.user_model or self._user_prompt(self.data.tasks[tid]) is None]
        ids = ids[: limit if limit is not None else None]
        n_test = len(self.data.splits.get("test", ()))
        out = []
        for tid in ids:
            spec = self.data.tasks[tid]
            env = self.data.envs[spec.env_id]
            meta = {"env_id": spec.env_id, "env_class_name": spec.class_name, "num_checks": len(spec.checks),
                    "split_seed": self.data.seed, "split_test_size": n_test, "source": self.data.source,
                    "episode_rules": self.episode_rules}
            if self._user_prompt(spec) is not None:
                meta.update(conversational=True, user_model=self.user_model)
            out.append(Task(task_id=tid, env=self.name, split=split, prompt=spec.text,
                            tools=json.dumps(list(env.tools)), metadata=json.dumps(meta)))
        return out

    def reference_actions(self, task: Task) -> list[str]:
        """The task's reference actions as action texts: one ``<tool_call>`` per action, then the final reply.

        Raises:
            EnvError: the task is not in the loaded data, or its row has no ``reference_actions``.
        """
        from stages.core.text.chat import format_tool_calls

        spec = self.data.tasks.get(task.task_id)
        if spec is None or spec.reference is None:
            raise EnvError(f"envscaler: task {task.task_id!r} has no reference_actions in {self.data.source}")
        return [format_tool_calls([call]) for call in spec.reference] + [FINAL_REPLY]

    def reset(self, task: Task) -> list[Message]:
        """Start a fresh worker with the task's environment instance; returns system + user messages.

        An environment that fails to build (error, timeout, memory) does not raise: the episode
        is marked failed and the next :meth:`step` ends it with reward 0 and the reason.

        A conversational task starts with the simulated user's first message.

        Raises:
            EnvError: the task is not in the loaded data; a conversational task without a user model.
        """
        spec = self.data.tasks.get(task.task_id)
        if spec is None:
            raise EnvError(f"envscaler: task {task.task_id!r} is not in {self.data.source}")
        user_prompt = self._user_prompt(spec)
        if user_prompt is not None and not self.user_model:
            raise EnvError(f"envscaler: {task.task_id} is a conversational task and needs a user model (user_model)")
        self.close()
        self._user = None
        self._task, self._env = spec, self.data.envs[spec.env_id]
        self._steps, self._done, self._failure, self._refused = 0, False, None, 0
        try:
            self._worker = start_env_worker(self.memory_mb, self.cpu_s)
            self._worker.request({"op": "init", "code": self._env.code, "class_name": spec.class_name,
                                  "init_config": spec.init_config}, self.call_timeout_s)
        except WorkerFailure as err:
            self._failure = f"environment failed to start: {err}"
        if user_prompt is not None:
            self._user = envscaler_conv.start_user(self.user_model, user_prompt)
            system = conv_system_prompt(self._env.system_prompt(), TOOL_CALL_NOTE)
            return [Message(role="system", content=system), Message(role="user", content=self._user.opening())]
        return [Message(role="system", content=self._env.system_prompt()), Message(role="user", content=spec.text)]

    def _user_prompt(self, spec: TaskSpec) -> str | None:
        """The simulated user's system prompt of a conversational task; None for the others."""
        if spec.user_prompt is None and self.conversation:
            return envscaler_conv.USER_PROMPT.replace("{task}", spec.text)
        return spec.user_prompt

    def step(self, action: str) -> StepResult:
        """Apply one agent action (see the module docstring); scores the episode when it ends.

        Raises:
            EnvError: no episode in progress (call :meth:`reset` first).
        """
        from stages.core.text.toolcalls import ToolCallParseError, parse_tool_calls

        if self._done or self._task is None:
            raise EnvError("envscaler: no episode in progress; call reset() first")
        self._steps += 1
        if self._failure:
            return self._fail()
        if self.episode_rules == "official" or self._user is not None:
            return self._official_step(action)
        try:
            calls = parse_tool_calls(action)
        except ToolCallParseError as err:
            hint = f"Error: your tool call could not be parsed ({err}). {TOOL_CALL_NOTE.splitlines()[2]}"
            return self._after([Message(role="user", content=hint)], [])
        if not calls:
            return self._finish("final_answer", [])
        observation = []
        for call in calls:
            try:
                text = self._call(call)
            except WorkerFailure as err:
                self._failure = f"environment failed in tool {call.name!r}: {err}"
                return self._fail(calls)
            observation.append(Message(role="tool", name=call.name, content=text))
        return self._after(observation, calls)

    def _official_step(self, action: str) -> StepResult:
        """One step by EnvScaler's rules (:func:`.envscaler_rules.official_action`; a raising tool
        ends the episode with reward 0, as ``step`` in ``envscaler_env/base_env.py`` does).
        Conversational episodes (any rules): a chat action goes to the user (:mod:`.envscaler_conv`);
        under the lenient rules a raising tool is an observation and the step cap scores the state."""
        official = self.episode_rules == "official"
        act = official_action(action)
        if act.kind == "empty":
            return self._zero("empty_reply", [])
        if act.kind == "error":
            return self._after([Message(role="user", content=act.error)], [], official=official)
        if act.kind == "chat" and self._user is not None:
            said = self._user.reply(act.arguments["content"])
            if STOP in said:  # rl_conv_env.py, is_observation_terminated
                return self._finish("user_stop", [])
            return self._after([Message(role="user", content=said)], [], official=official)
        if act.kind == "chat":
            return self._finish("final_answer", [])
        call = ToolCall(name=act.name, arguments=json.dumps(act.arguments, ensure_ascii=False))
        try:
            reply = self._worker.request({"op": "call", "name": act.name, "args": act.arguments, "official": True},
                                         self.call_timeout_s)
        except WorkerFailure as err:
            self._failure = f"environment failed in tool {act.name!r}: {err}"
            return self._fail([call])
        if reply["status"] == "invalid":
            return self._after([Message(role="user", content=INVALID_ACTION)], [], official=official)
        if reply["status"] != "ok" and official:
            return self._zero("tool_error", [call], f"{act.name}: {reply['error']}")
        text = reply["result"] if reply["status"] == "ok" else f"Error: {reply['error']}"
        if len(text) > OBSERVATION_MAX_CHARS:
            text = text[:OBSERVATION_MAX_CHARS] + " ...[truncated]"
        return self._after([Message(role="tool", name=act.name, content=text)], [call], official=official)

    def _call(self, call: ToolCall) -> str:
        """Run one call (lenient and exact rules); counts it in ``_refused`` when the environment
        refuses it (unknown tool, arguments not an object, the tool raised or returned ``success: False``)
        or, under the exact rules, when a tool that is not a lookup changed nothing."""
        if call.name not in self._env.tool_names:
            self._refused += 1
            return f"Error: unknown tool {call.name!r}; available tools: {', '.join(self._env.tool_names)}"
        args = call.args
        if not isinstance(args, dict):
            self._refused += 1
            return f"Error: the arguments of {call.name!r} must be a JSON object"
        watch = self.episode_rules == "exact" and not is_lookup(call.name)
        reply = self._worker.request({"op": "call", "name": call.name, "args": args, "watch": watch}, self.call_timeout_s)
        self._refused += reply["status"] != "ok" or bool(reply.get("refused")) or reply.get("changed") is False
        text = reply["result"] if reply["status"] == "ok" else f"Error: {reply['error']}"
        if len(text) > OBSERVATION_MAX_CHARS:
            text = text[:OBSERVATION_MAX_CHARS] + " ...[truncated]"
        return text

    def _after(self, observation: list[Message], calls: list[ToolCall], official: bool = False) -> StepResult:
        if self._steps >= (self.max_turns if self._user is None else self.conv_max_turns):
            return self._zero("step_cap", calls) if official else self._finish("step_cap", calls)
        return StepResult(observation=observation, tool_calls=calls)

    def _finish(self, end: str, calls: list[ToolCall]) -> StepResult:
        checks = self._task.checks
        budget = self.check_timeout_s * len(checks) + self.call_timeout_s * (2 if self.episode_rules == "exact" else 1)
        request = {"op": "score", "checks": [c[1] for c in checks], "timeout_s": self.check_timeout_s}
        if self.episode_rules == "exact":
            request["reference"] = [{"name": c.name, "args": c.args} for c in self._task.reference or ()]
        try:
            reply = self._worker.request(request, budget)
        except WorkerFailure as err:
            self._failure = f"scoring failed: {err}"
            return self._fail(calls)
        results = [{"check_item": item, **r} for (item, _), r in zip(checks, reply["results"])]
        passed = sum(r["passed"] for r in results)
        info = {"end": end, "steps": self._steps, "checks": results, "passed": passed,
                "total": len(results), "success": passed == len(results), "episode_rules": self.episode_rules}
        self._end()
        reward = official_reward(passed, len(results)) if self.episode_rules == "official" else passed / len(results)
        if self.episode_rules == "exact":
            exact = reply["exact"]
            reward = exact_reward(passed, len(results), exact["equal"], len(exact["outside"]), self._refused)
            info.update(success=reward == 1.0, state_equal=exact["equal"], outside_changes=exact["outside"][:5],
                        refused_calls=self._refused, reference_error=exact["reference_error"])
        return StepResult(observation=[], reward=reward, done=True, tool_calls=calls, info=info)

    def _zero(self, end: str, calls: list[ToolCall], error: str | None = None) -> StepResult:
        """End the episode unscored with reward 0 (official rules: empty reply, raising tool, step cap)."""
        info = {"end": end, "steps": self._steps, "passed": 0, "total": len(self._task.checks), "success": False,
                "episode_rules": self.episode_rules, **({"error": error} if error else {})}
        self._end()
        return StepResult(observation=[], reward=0.0, done=True, tool_calls=calls, info=info)

    def _fail(self, calls: list[ToolCall] | None = None) -> StepResult:
        info = {"end": "env_failure", "steps": self._steps, "error": self._failure, "passed": 0,
                "total": len(self._task.checks), "success": False, "episode_rules": self.episode_rules}
        self._end()
        return StepResult(observation=[], reward=0.0, done=True, tool_calls=calls or [], info=info)

    def _end(self) -> None:
        self._done = True
        self.close()

    def close(self) -> None:
        """Kill the episode's worker process, if any. Safe to call repeatedly."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None


BED_DIR = Path(__file__).resolve().parents[2] / "examples" / "envscaler_bed"


BED_NOTE = ("Call one tool per reply, exactly as\n"
            '<tool_call>{"name": "<tool>", "arguments": {<arguments as JSON>}}</tool_call>\n'
            f'Read its result before the next step. When the task is done, reply "{FINAL_REPLY}".')


def tool_signature(tool: dict[str, Any]) -> str:
    """One line for a tool schema: ``name(arg: type, opt?: type): description``.

    Optional parameters carry a ``?``; a parameter without a JSON-schema ``type`` shows ``any``.
    """
    fn = tool["function"]
    params = fn.get("parameters") or {}
    required = set(params.get("required") or [])
    args = ", ".join(f"{name}{'' if name in required else '?'}: {(spec or {}).get('type', 'any')}"
                     for name, spec in (params.get("properties") or {}).items())
    description = str(fn.get("description") or "").strip()
    return f"{fn['name']}({args})" + (f": {description}" if description else "")


@register("lopd-bed")
class LopdBedEnv(EnvScalerEnv):
    """lopd's own study bed (``examples/envscaler_bed``): EnvScaler-format environments written for
    lopd, not the EnvScaler release. Splits ``warmup``, ``train``, ``test`` (held out: same
    environments, other tasks) and ``transfer`` (environments no train task uses); ``data_dir``
    defaults to the bundled bed.

    Its own prompt, so that a whole prompt fits a small model's budget (at most 450 SmolLM2 tokens
    on the bundled bed): the system message holds the introduction, the rules, one signature line
    per tool (:func:`tool_signature`) and a three-line call note; tasks carry no tool schemas, so
    the chat template adds no JSON tool block. Episode rules default to ``exact`` (the final state
    must equal the reference actions' state; see :mod:`.envscaler_rules`); ``"lenient"`` and
    ``"official"`` (EnvScaler's) score the checks alone.
    """

    name = "lopd-bed"
    default_rules: EpisodeRules = "exact"
    rule_sets = ("official", "lenient", "exact")

    def __init__(self, data_dir: Path | str | None = None, max_turns: int = 6, **kwargs: Any) -> None:
        """As :class:`EnvScalerEnv`.

        Raises:
            EnvError: also when the ``exact`` rules meet a task without ``reference_actions``.
        """
        super().__init__(data_dir if data_dir is not None else BED_DIR, max_turns, **kwargs)
        bare = next((tid for tid, spec in sorted(self.data.tasks.items()) if spec.reference is None), None)
        if self.episode_rules == "exact" and bare is not None:
            raise EnvError(f"lopd-bed: episode rules 'exact' compare with the state of a task's reference_actions; "
                           f"task {bare} in {self.data.source} has none (--episode-rules lenient scores its checks)")

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """As :meth:`EnvScalerEnv.tasks`, with the tool schemas left out of the task (they are in
        the system message as signatures)."""
        return [t.model_copy(update={"tools": "[]"}) for t in super().tasks(split, limit)]

    def reset(self, task: Task) -> list[Message]:
        """As :meth:`EnvScalerEnv.reset`, with the bed's compact system message."""
        messages = super().reset(task)
        return [Message(role="system", content=self.system_prompt(self._env)), *messages[1:]]

    @staticmethod
    def system_prompt(env: EnvSpec) -> str:
        """Introduction, rules, tool signatures and the call note of one environment."""
        rules = "".join(f"\n- {r}" for r in env.rules)
        tools = "".join(f"\n- {tool_signature(t)}" for t in env.tools)
        return (f"{env.introduction}" + (f"\nRules:{rules}" if rules else "") + f"\nTools:{tools}\n{BED_NOTE}")
