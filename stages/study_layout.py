"""The settings of a `lopd study` and its folder layout (see :mod:`stages.study`): where each run,
evaluation and summary lives, and the results a ``results`` folder keeps. Read by the study and
by its report (:mod:`stages.study_report`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stages.core.data.inputs import read_utf8

VANILLA = "vanilla"


class StudyRun(BaseModel):
    """One entry of the study: ``name`` (a folder-safe label), ``method`` (``vanilla`` or a distill
    method), ``seeds`` (default: the study's) and ``settings`` (distill settings and method
    options of this entry, over the study's ``[distill]`` table; e.g. ``{margin = 0}``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    method: str = "lopd"
    seeds: list[int] | None = None
    settings: dict[str, Any] = Field(default_factory=dict)


class StudyConfig(BaseModel):
    """Settings of one `lopd study` (the study file, validated).

    ``store`` is the prepared experience store every trained run starts from (copied);
    ``composer`` the cold-start composer given to runs whose method takes one (lopd);
    ``bench`` / ``eval_limit`` / ``eval_max_new_tokens`` / ``eval_batch`` the held-out evaluation
    (``lopd evaluate`` settings); ``eval_every`` the generations between evaluations (0: at the
    start and the end only; else a multiple of the rollouts per step); ``score`` the report
    score the table and plots use (default: ``accuracy``, ``mean`` or ``pass@1``, the first the
    bench has); ``results`` a folder the results are copied into after every finished run, whose
    finished runs a later study reuses (see the module docstring).
    """

    model_config = ConfigDict(extra="forbid")

    out: str = "runs/study"
    env: str = "bfcl"
    store: str
    composer: str | None = None
    results: str | None = None
    bench: str = "bfcl-single"
    eval_limit: int | None = Field(100, ge=1)
    eval_every: int = Field(0, ge=0)
    eval_max_new_tokens: int | None = Field(None, ge=1)
    eval_batch: int = Field(8, ge=1)
    score: str | None = None
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    distill: dict[str, Any] = Field(default_factory=dict)
    runs: list[StudyRun] = Field(min_length=1)

    @field_validator("runs")
    @classmethod
    def _unique_names(cls, runs: list[StudyRun]) -> list[StudyRun]:
        names = [r.name for r in runs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"run name {dup!r} is used twice")
        return runs

    def seeds_of(self, run: StudyRun) -> list[int]:
        """The seeds ``run`` is trained with (a vanilla entry has one evaluation, seedless)."""
        return [0] if run.method == VANILLA else (run.seeds or self.seeds)


def run_dir(config: StudyConfig, run: StudyRun, seed: int) -> Path:
    """The folder of one trained (run, seed)."""
    return Path(config.out) / "runs" / f"{run.name}-seed{seed}"


def done_file(config: StudyConfig, run: StudyRun, seed: int) -> Path:
    """The distill summary a finished (run, seed) leaves; its presence marks the run finished."""
    return run_dir(config, run, seed) / "done.json"


def base_report(config: StudyConfig) -> Path:
    """The base model's evaluate report: generation 0 of every curve."""
    return Path(config.out) / VANILLA / "gen-0.json"


def changed_settings(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The settings that differ, but for the folders (``out``, ``results``): a study may move."""
    return sorted(k for k in set(saved) | set(current)
                  if k not in ("out", "results") and saved.get(k) != current.get(k))


def committed(config: StudyConfig) -> dict[str, Any] | None:
    """The ``results.json`` of the ``results`` folder (None: no such folder or file yet).

    Raises:
        ValueError: unreadable, or written by a study with other settings (names the fields).
    """
    path = Path(config.results) / "results.json" if config.results else None
    if path is None or not path.is_file():
        return None
    try:
        saved = json.loads(read_utf8(path))
        settings, finished = saved["settings"], saved.get("finished", {})
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a study's results.json ({err})") from None
    changed = changed_settings(settings, json.loads(config.model_dump_json()))
    if changed:
        raise ValueError(f"{path}: written by a study with other settings ({', '.join(changed)} differ); "
                         "use another results folder, or restore the study file")
    return saved if finished or "base_report" in saved else None


def reused_runs(config: StudyConfig, saved: dict[str, Any] | None) -> set[tuple[str, int]]:
    """The (run name, seed) pairs finished in the ``results`` folder but not in ``out``."""
    if not saved:
        return set()
    names = {r.name: r for r in config.runs}
    return {(f["run"], f["seed"]) for f in saved.get("finished", {}).values()
            if f["run"] in names and not done_file(config, names[f["run"]], f["seed"]).is_file()}
