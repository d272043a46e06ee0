"""The environment protocol every `--env` implements, and the registry that names them.

An environment is created once per rollout (fresh state per episode) by its registered factory::

    env = make_env("bfcl", data_dir=None)
    tasks = env.tasks(split="train", limit=8)
    messages = env.reset(tasks[0])          # system + user messages to start the conversation
    result = env.step(action_text)          # StepResult(observation, reward, done, info)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from schemas import Message, Task, ToolCall, Trajectory
from stages.core.registry import Registry


# How an agent acts in the multi-step tool environments (EnvScaler, ACEBench): A.5 of the LOPD
# paper, in our words
AGENTIC_RULES = (
    "Work step by step: call one tool per reply (no parallel calls) and read its result before the "
    "next step. Query the state with read-only tools before you call tools that change it. When the "
    'task is done, reply with exactly "Task Completed" and no tool call; that ends the episode.'
)


class EnvError(Exception):
    """Raised for unusable environment input (missing/malformed data files), with a one-line message."""


@dataclass
class StepResult:
    """What an environment returns for one agent action.

    Attributes:
        observation: new messages to append after the assistant message (tool results, the next
            user turn, or a parse-error hint); empty when the episode is over.
        reward: reward in [0, 1]; only meaningful when ``done`` (0.0 before).
        done: whether the episode ended (task finished, step cap, or failure).
        tool_calls: calls parsed from the action.
        info: scoring details (checker verdicts, errors), JSON-serialisable.
    """

    observation: list[Message]
    reward: float = 0.0
    done: bool = False
    tool_calls: list[ToolCall] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    """One episode's environment. ``max_turns`` caps agent actions per episode (default 30)."""

    name: str
    max_turns: int

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """Tasks of ``split`` ("train" | "test") in a deterministic order, at most ``limit``."""

    def reset(self, task: Task) -> list[Message]:
        """Start an episode on ``task`` with fresh state; returns the opening messages."""

    def step(self, action: str) -> StepResult:
        """Apply the policy's raw action text; see :class:`StepResult`."""

    def close(self) -> None:
        """Release resources (worker processes, temp dirs)."""

    # Optional: environments with reference solutions also provide
    # ``reference_actions(task) -> list[str]`` (the actions of a reference episode), used by
    # ``lopd collect --reference``; they raise EnvError for tasks without one.


EnvFactory = Callable[..., Environment]


def _import_environments() -> None:
    from stages import envs  # noqa: F401  (imports every environment module, filling the registry)


ENVS: Registry[EnvFactory] = Registry("--env", error=EnvError, load=_import_environments,
                                      unknown="unknown --env {name}; {hint}choose one of: {known}")


def register(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Class/function decorator adding an environment factory under ``name``."""
    return ENVS.register(name)


def make_env(name: str, data_dir: Path | None = None, max_turns: int = 30, episode_rules: str | None = None,
             **kwargs: Any) -> Environment:
    """Build the environment registered as ``name``.

    ``episode_rules`` (``"official"`` or ``"lenient"``) picks the episode rules of an environment
    that has two sets (its class has ``default_rules``); None keeps the environment's default.

    Raises:
        EnvError: unknown name (the message lists the known ones); ``episode_rules`` for an
            environment with one set of rules (the message lists those with two).
    """
    factory = ENVS[name]
    check_episode_rules(name, episode_rules)
    if episode_rules is not None:
        kwargs["episode_rules"] = episode_rules
    return factory(data_dir=data_dir, max_turns=max_turns, **kwargs)


def check_episode_rules(name: str, episode_rules: str | None, bench: str | None = None) -> None:
    """Refuse ``episode_rules`` (set, not None) for environment ``name`` (played by benchmark
    ``bench``, when given) unless its class has two sets of rules (a ``default_rules`` attribute).

    Raises:
        EnvError: one line naming the environments that have official and lenient rules.
    """
    if episode_rules is not None and not (name in ENVS and hasattr(ENVS[name], "default_rules")):
        ruled = [n for n, factory in ENVS.items() if hasattr(factory, "default_rules")]
        what = f"--bench {bench} (environment {name})" if bench and bench != name else f"env {name!r}"
        raise EnvError(f"--episode-rules: {what} has one set of episode rules; "
                       f"only {', '.join(ruled)} have official and lenient ones")


def env_names() -> list[str]:
    """Registered environment names."""
    return ENVS.names()


def lookup_tools(trajectories: list[Trajectory], data_dir: str | None = None) -> list[list[dict[str, Any]]]:
    """Tool schemas per trajectory: ``info["tools"]`` when rollout recorded them, else the
    ``Task.tools`` of the same task id listed by the trajectory's environment, else ``[]``.

    The environment lookup is a stop-gap for stores written before rollout recorded the tools;
    it loads each (env, split) task list once. It cannot recover tools that an environment
    changed mid-episode (BFCL multi-turn ``miss_func``): the initial task tools are used.
    An environment that cannot list its tasks yields ``[]`` for its trajectories.
    """
    out: list[list[dict[str, Any]]] = []
    for traj in trajectories:
        info = json.loads(traj.info) if traj.info else {}
        if isinstance(info.get("tools"), list):
            out.append(info["tools"])
            continue
        key = (traj.env, traj.split, data_dir)
        if key not in _TASK_TOOLS:
            try:
                env = make_env(traj.env, data_dir=Path(data_dir) if data_dir else None)
                try:
                    _TASK_TOOLS[key] = {t.task_id: t.tool_schemas for t in env.tasks(traj.split)}
                finally:
                    env.close()
            except Exception:  # noqa: BLE001 - unknown env / missing data: render without tools
                _TASK_TOOLS[key] = {}
        out.append(_TASK_TOOLS[key].get(traj.task_id, []))
    return out


_TASK_TOOLS: dict[tuple, dict[str, list[dict[str, Any]]]] = {}
