"""No training on evaluation tasks: the train tasks of a run against every benchmark that scores
tasks of the same environment.

``lopd collect`` (train split) and ``lopd distill`` call :func:`check_train_tasks` before any
rollout. A train task overlaps an evaluation task when

- its id is one a benchmark scores: the benchmarks' own task lists, as ``lopd evaluate`` would
  load them (only those whose data is found without a flag: the package copies; a benchmark
  that needs ``--data-dir`` is checked when the run's ``--data-dir`` serves it), and the id
  families that a benchmark scores in full (``HumanEval/N``: HumanEval+ scores all 164 problems,
  ``Mbpp/N``: MBPP+ all of its problems), or
- its prompt, normalised (lower case, whitespace collapsed), equals an evaluation task's.

An overlap is a :class:`LeakageError` naming the tasks and the benchmark, unless the caller allows
it (``--allow-overlap``: the user means to train on evaluation tasks, e.g. a smoke test).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from schemas import Task
from stages.core.text.normalise import normalise

# id families a benchmark scores in full, whatever data file the user evaluates with
_SCORED_IN_FULL = {"HumanEval/": "humaneval-plus", "Mbpp/": "mbpp-plus"}


class LeakageError(ValueError):
    """Train tasks that an evaluation benchmark scores (one line: the tasks and the benchmark)."""


@dataclass(frozen=True)
class Overlap:
    """One train task that a benchmark also scores, and how it was matched (``id`` or ``prompt``)."""

    task_id: str
    bench: str
    by: str


def evaluation_tasks(env: str, data_dir: Path | None = None) -> dict[str, list[Task]]:
    """``{bench: tasks}`` of every benchmark that plays ``env`` and whose data loads (with
    ``data_dir``, else the package copies); a benchmark whose data is not found is left out."""
    from stages.benches import BENCHES
    from stages.envs import EnvError
    from stages.evaluate import EvaluateConfig

    out: dict[str, list[Task]] = {}
    for name, bench in BENCHES.items():
        if bench.env != env:
            continue
        config = EvaluateConfig(bench=name, data_dir=str(data_dir) if data_dir else None)
        try:
            out[name] = bench.prepare(config).tasks
        except (EnvError, OSError, ValueError):
            continue  # its data is not here: nothing to compare with
    return out


def find_overlap(train: Iterable[Task], evaluated: dict[str, list[Task]]) -> list[Overlap]:
    """Train tasks that a benchmark scores, by id (and id family) or by normalised prompt."""
    by_id: dict[str, str] = {}
    by_prompt: dict[str, str] = {}
    for bench, tasks in evaluated.items():
        for t in tasks:
            by_id.setdefault(t.task_id, bench)
            by_prompt.setdefault(normalise(t.prompt), bench)
    found = []
    for t in train:
        family = next((b for prefix, b in _SCORED_IN_FULL.items() if t.task_id.startswith(prefix)), None)
        if t.task_id in by_id or family:
            found.append(Overlap(t.task_id, by_id.get(t.task_id) or family, "id"))
        elif normalise(t.prompt) in by_prompt:
            found.append(Overlap(t.task_id, by_prompt[normalise(t.prompt)], "prompt"))
    return found


def check_train_tasks(env: str, train: list[Task], data_dir: Path | None = None, *,
                      allow_overlap: bool = False) -> list[Overlap]:
    """Refuse train tasks that an evaluation benchmark scores; returns the overlap (allowed or none).

    Raises:
        LeakageError: some train tasks are evaluation tasks and ``allow_overlap`` is False.
    """
    overlap = find_overlap(train, evaluation_tasks(env, data_dir))
    if overlap and not allow_overlap:
        benches = sorted({o.bench for o in overlap})
        shown = ", ".join(o.task_id for o in overlap[:5]) + (" ..." if len(overlap) > 5 else "")
        raise LeakageError(
            f"env {env}: {len(overlap)} of {len(train)} train task(s) are scored by "
            f"{' and '.join(benches)} ({shown}): training on them contaminates that evaluation; "
            "train on other data, or pass --allow-overlap if you mean it")
    return overlap
