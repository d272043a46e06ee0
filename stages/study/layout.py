"""The settings of a `lopd study` and its folder layout (see :mod:`stages.study.recipe`): where each run,
evaluation and summary lives, and the results a ``results`` folder keeps. Read by the study and
by its report (:mod:`stages.study.report`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stages.core.data.inputs import read_utf8
from stages.settings import merge

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


class FinalEval(BaseModel):
    """One final evaluation of every finished student and of the base model (see
    :mod:`stages.study.final`): a ``lopd evaluate`` bench, its task ``limit`` (None: all) and
    ``max_new_tokens`` per action (None: the bench's default)."""

    model_config = ConfigDict(extra="forbid")

    bench: str
    limit: int | None = Field(None, ge=1)
    max_new_tokens: int | None = Field(None, ge=1)


class StudyConfig(BaseModel):
    """Settings of one `lopd study` (the study file, validated).

    ``store`` is the prepared experience store every trained run starts from (copied);
    ``composer`` the cold-start composer given to runs whose method takes one (lopd);
    ``bench`` / ``eval_limit`` / ``eval_max_new_tokens`` / ``eval_batch`` the held-out evaluation
    (``lopd evaluate`` settings); ``eval_every`` the generations between evaluations (0: at the
    start and the end only; else a multiple of the rollouts per step); ``score`` the report
    score the table and plots use (default: ``accuracy``, ``mean`` or ``pass@1``, the first the
    bench has); ``results`` a folder the results are copied into after every finished run, whose
    finished runs a later study reuses (see the module docstring); ``final_evals`` the benches every
    finished student and the base model are scored on once more after training.
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
    final_evals: list[FinalEval] = Field(default_factory=list)
    distill: dict[str, Any] = Field(default_factory=dict)
    runs: list[StudyRun] = Field(min_length=1)

    @field_validator("final_evals")
    @classmethod
    def _known_benches(cls, finals: list[FinalEval]) -> list[FinalEval]:
        from stages.benches import BENCHES

        for final in finals:
            if final.bench not in BENCHES:
                raise ValueError(f"unknown bench {final.bench!r} (benches: {', '.join(BENCHES)})")
        if len({f.bench for f in finals}) < len(finals):
            raise ValueError("a bench is named twice")
        return finals

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


def keep_training_logs(config: StudyConfig, dest: Path) -> None:
    """Copy each finished run's training log (``train/metrics.jsonl`` and ``train/config.json``)
    to ``dest/NAME-seedS/train/``, so that `lopd report` can be drawn again where ``out`` is gone
    (a run already kept there is copied again: the same files)."""
    for run in config.runs:
        if run.method == VANILLA:
            continue
        for seed in config.seeds_of(run):
            if not done_file(config, run, seed).is_file():
                continue
            train = run_dir(config, run, seed) / "train"
            target = dest / train.parent.name / "train"
            for name in ("metrics.jsonl", "config.json"):
                if (train / name).is_file():
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(train / name, target / name)


def base_report(config: StudyConfig) -> Path:
    """The base model's evaluate report: generation 0 of every curve."""
    return Path(config.out) / VANILLA / "gen-0.json"


def changed_settings(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The settings that differ, but for the folders (``out``, ``results``): a study may move. A
    setting missing on one side counts as its default (a study written before the setting
    existed). Runs are compared by name (``runs.NAME``: its method or settings differ); an entry
    added or dropped, or other seeds, change no finished run's results, so a study may grow."""
    fields = StudyConfig.model_fields

    def value(settings: dict[str, Any], key: str) -> Any:
        if key in settings or key not in fields or fields[key].is_required():
            return settings.get(key)
        return fields[key].get_default(call_default_factory=True)

    changed = sorted(k for k in set(saved) | set(current)
                     if k not in ("out", "results", "runs", "seeds") and value(saved, k) != value(current, k))
    before = {r["name"]: r for r in saved.get("runs", [])}
    for run in current.get("runs", []):
        old = before.get(run["name"])
        if old is not None and (old.get("method"), old.get("settings")) != (run.get("method"), run.get("settings")):
            changed.append(f"runs.{run['name']}")
    return changed


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


def load_study(path: str | Path, out: str | None = None) -> StudyConfig:
    """Read and validate a study file (TOML); ``out`` (the ``--out`` flag) overrides its ``out``
    (a flag given > the file: :func:`stages.settings.merge`).

    Raises:
        ValueError: unreadable file or invalid settings (one line naming the file and field).
    """
    import tomllib

    path = Path(path)
    try:
        data = tomllib.loads(read_utf8(path))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    try:
        return StudyConfig.model_validate(merge(data, {"out": out} if out is not None else {}))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ValueError(f"{path}: field {where}: {first['msg']}") from None
