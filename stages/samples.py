"""Sample rollouts of a distill run for `lopd report`'s ``summary.md`` and the run's logger.

A distill run's folder holds ``config.json`` with its ``store`` and ``run_id``; each step's
rollouts are in that experience store, tagged with ``info[STEP_KEY]``
(:func:`stages.core.data.experience_rows.tag_step_rows`). For each of the last steps the
first, the best and the worst rollout (by reward; the first in store order on ties) are shown:
reward, success, task id, and the assistant actions, each truncated, as Markdown code blocks.
A missing or unreadable store is one note line, never a failure of the report.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from schemas import Trajectory
from stages.core.data.experience_rows import STEP_KEY
from stages.core.run.runs import CONFIG_FILE

ACTION_CHARS = 300  # characters kept of each assistant action
ACTIONS_SHOWN = 4  # assistant actions shown per rollout (the first ones)


def code_block(text: str) -> list[str]:
    """``text`` as a fenced Markdown code block whose fence is longer than any run of backticks in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def _actions(trajectory: Trajectory) -> str:
    """The first assistant actions of a rollout (the text the model wrote, tool calls included), each truncated."""
    parts = []
    assistant = [m for m in trajectory.messages if m.role == "assistant"]
    for n, m in enumerate(assistant[:ACTIONS_SHOWN], start=1):
        body = m.content
        cut = body if len(body) <= ACTION_CHARS else body[:ACTION_CHARS] + f" ... ({len(body)} chars)"
        parts.append(f"[action {n}] {cut}")
    if len(assistant) > ACTIONS_SHOWN:
        parts.append(f"... ({len(assistant) - ACTIONS_SHOWN} more actions)")
    return "\n".join(parts) or "(no assistant action)"


def _by_step(rows: list[Trajectory]) -> dict[int, list[Trajectory]]:
    """The rows grouped by ``info[STEP_KEY]`` (rows without one are left out), in store order."""
    steps: dict[int, list[Trajectory]] = {}
    for t in rows:
        try:
            step = json.loads(t.info).get(STEP_KEY)
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(step, int):
            steps.setdefault(step, []).append(t)
    return steps


def chosen_samples(group: list[Trajectory]) -> list[dict]:
    """The first, best and worst rollout (by reward; the first in order on ties) of one step's
    rollouts ``group``, each once: ``{roles, task_id, reward, success, trajectory_id, actions}``
    with ``roles`` e.g. ``"first / best"`` and ``actions`` the first assistant actions, truncated.
    Empty for an empty group."""
    if not group:
        return []
    chosen = {"first": group[0], "best": max(group, key=lambda t: t.reward),
              "worst": min(group, key=lambda t: t.reward)}
    shown: dict[str, list[str]] = {}
    for role, t in chosen.items():
        shown.setdefault(t.trajectory_id, []).append(role)
    samples = []
    for trajectory_id, roles in shown.items():
        t = next(r for r in group if r.trajectory_id == trajectory_id)
        samples.append({"roles": " / ".join(roles), "task_id": t.task_id, "reward": float(t.reward),
                        "success": bool(t.success), "trajectory_id": trajectory_id, "actions": _actions(t)})
    return samples


def samples_markdown(samples: list[dict]) -> list[str]:
    """Markdown lines of :func:`chosen_samples`' rollouts: a bullet and a code block each."""
    lines: list[str] = []
    for sample in samples:
        lines += [f"- {sample['roles']}: task `{sample['task_id']}`, reward {sample['reward']:.3f}, "
                  f"success {sample['success']}", ""]
        lines += [*code_block(sample["actions"]), ""]
    return lines


def step_samples(rows: list[Trajectory], steps: int) -> list[str]:
    """Markdown lines: for each of the last ``steps`` steps of ``rows`` (a run's stored rollouts),
    its first, best and worst rollout (a rollout is shown once, labelled with every role it has)."""
    by_step = _by_step(rows)
    lines: list[str] = []
    for step in sorted(by_step)[-steps:]:
        group = by_step[step]
        lines += [f"#### step {step} ({len(group)} rollouts)", ""]
        lines += samples_markdown(chosen_samples(group))
    return lines


def run_samples(folder: Path, steps: int) -> list[str]:
    """The sample-rollout section of run folder ``folder`` for ``summary.md``: empty for a run that
    is not a distill run (no ``config.json`` naming a ``method``, ``store`` and ``run_id``) or when
    ``steps`` is 0; one note line when its store is missing or unreadable or holds no step of it."""
    if steps <= 0:
        return []
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    if not isinstance(config, dict) or not all(isinstance(config.get(k), str) for k in ("method", "store", "run_id")):
        return []
    from stages.core.data.store import ExperienceStore, StoreError

    head = ["### Sample rollouts (first, best, worst per step)", ""]
    try:
        rows = ExperienceStore.open(config["store"], create=False).query(run_id=config["run_id"])
    except (StoreError, OSError, ValueError, RuntimeError) as err:  # lance raises OSError/ValueError/RuntimeError
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return [*head, f"note: no sample rollouts: store {config['store']} unreadable ({reason})", ""]
    lines = step_samples(rows, steps)
    if not lines:
        return [*head, f"note: no sample rollouts: store {config['store']} holds no step of run {config['run_id']}", ""]
    return [*head, *lines]
