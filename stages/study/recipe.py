"""`lopd study`: methods side by side at the same rollout budget, scored on held-out tasks.

A study file (TOML) lists runs: a name, a method (``vanilla`` = the untrained model, any
`lopd distill` method, or ``sft`` / ``rft``: supervised fine-tuning on the train references or on
the student's own successes, :mod:`stages.study.sft`), seeds and the run's own settings; the
``[distill]`` table holds the settings all runs share. Every trained run gets its own copy of the experience store (a
method's rollouts never feed another's retrieval or reference pool) and the same rollout
budget (``steps x tasks_per_step x group_size``, checked). The student is evaluated on the held-out
bench (default ``bfcl-single``: BFCL single-turn tasks never used for training) at generation 0
(the base model, greedy, once for the study), every ``eval_every`` generations and at the end,
inside the training process on the run's student (an ``hf`` engine with a prefix cache, as the
base model's evaluation has).

Layout of ``out``::

    study.json               the study's settings (a rerun must match them)
    vanilla/gen-0.json       the base model's evaluate report (generation 0 of every curve)
    runs/NAME-seedS/store/   the run's copy of the store; train/ its distill run; evals/gen-G.json
    runs/NAME-seedS/done.json  the finished run's distill summary
    vanilla/final-BENCH.json, runs/NAME-seedS/evals/final-BENCH.json
                             the ``final_evals`` (:mod:`stages.study.final`) of the base model and
                             of each finished student, written before its done.json
    results.json, results.csv, table.md, heldout.png, heldout_nll.png, train_reward.png, lopd_dual.png
    report/                  `lopd report` of the trained runs: loss, gradient-norm, time and memory curves

With ``results`` set (a folder kept in the repository, e.g. ``docs/results/bed-cpu``), the results
are copied there after every finished run; a later study (another machine, ``out`` gone) reuses
the finished runs its ``results.json`` lists (``finished``, with their evaluations, training rows
and the base model's report) instead of training them again. Its ``training/NAME-seedS/train/`` keeps
each finished run's ``metrics.jsonl`` and ``config.json``, and its ``report/`` is `lopd report` of
all of them (without sample rollouts: the stores stay in ``out``).

A killed study resumes: finished runs and written evaluations are reused, an unfinished run
resumes from its newest checkpoint (an evaluation runs before its step's checkpoint, so a kill
inside it redoes the step and the evaluation).
"""
from __future__ import annotations

import contextlib
import gc
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError
from rich.console import Console

from stages import evaluate
from stages.distill import recipe as distill
from stages.study import sft as study_sft
from stages.core.data.inputs import read_utf8
from stages.core.run.provenance import git_commit
from stages.methods import get_method
from stages.settings import merge
from stages.study.final import final_path
from stages.study.layout import (VANILLA, StudyConfig, StudyRun, base_report, changed_settings, committed, done_file,
                                  keep_training_logs, reused_runs, run_dir)
from stages.study.sft import SFT_METHODS

def distill_config(config: StudyConfig, run: StudyRun, seed: int) -> distill.DistillConfig:
    """The distill settings of one (run, seed): study ``[distill]`` < the run's ``settings``
    (:func:`stages.settings.merge`), with the run's own store copy, output folder, seed and a
    run id fixed by name and seed.

    Raises:
        ValueError: an unknown setting or option for the run's method (names the run).
    """
    folder = run_dir(config, run, seed)
    values: dict[str, Any] = merge(config.distill, run.settings)
    method = get_method(run.method)
    if config.composer and "composer" in method.Options.model_fields:
        values.setdefault("composer", config.composer)
    steps_per_eval = config.eval_every // _rollouts_per_step(values) if config.eval_every else None
    values.setdefault("checkpoint_every", steps_per_eval or 1)  # a killed study loses at most one step
    values.update(env=config.env, method=run.method, seed=seed, store=str(folder / "store"),
                  out=str(folder / "train"), run_id=f"study-{run.name}-seed{seed}",
                  resume=(folder / "train" / "config.json").is_file())
    try:
        return distill.DistillConfig(**values)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"study run {run.name!r}: {where + ': ' if where else ''}"
                         f"{first['msg'].removeprefix('Value error, ')}") from None


def _rollouts_per_step(values: dict[str, Any]) -> int:
    fields = distill.DistillConfig.model_fields
    return int(values.get("tasks_per_step", fields["tasks_per_step"].default)) * int(
        values.get("group_size", fields["group_size"].default))


def check_budget(config: StudyConfig) -> tuple[int, int]:
    """Every trained run's (steps, rollouts per step) must be the same; returns them.

    Raises:
        ValueError: runs with different budgets, or ``eval_every`` not a multiple of the
            rollouts per step (names the runs and numbers).
    """
    budgets = {}
    for run in config.runs:
        if run.method != VANILLA and run.method not in SFT_METHODS:  # sft/rft take the distill runs' budget
            c = distill_config(config, run, config.seeds_of(run)[0])
            budgets[run.name] = (c.steps, c.tasks_per_step * c.group_size)
    if len(set(budgets.values())) > 1:
        shown = ", ".join(f"{n}: {s} steps x {r} rollouts" for n, (s, r) in budgets.items())
        raise ValueError(f"runs must share the rollout budget (steps x tasks_per_step x group_size): {shown}")
    steps, per_step = next(iter(budgets.values()), (int(config.distill.get(
        "steps", distill.DistillConfig.model_fields["steps"].default)), _rollouts_per_step(config.distill)))
    if config.eval_every % per_step:
        raise ValueError(f"eval_every={config.eval_every} must be a multiple of the {per_step} rollouts per step")
    return steps, per_step


def _eval_config(config: StudyConfig, label: str, out: Path, bench: str | None = None, limit: int | None = None,
                 max_new_tokens: int | None = None) -> evaluate.EvaluateConfig:
    """The held-out evaluation's settings (``bench`` given: a final evaluation's, with its own
    ``limit`` and ``max_new_tokens``; the training data folder only for the study's own bench)."""
    final = bench is not None
    data_dir = config.distill.get("data_dir") if not final or bench == config.bench else None
    return evaluate.EvaluateConfig(bench=bench or config.bench, model=label, out=str(out), data_dir=data_dir,
                                   limit=limit if final else config.eval_limit,
                                   max_new_tokens=max_new_tokens if final else config.eval_max_new_tokens,
                                   batch_size=config.eval_batch, device=config.distill.get("device"),
                                   dtype=config.distill.get("dtype"))


def _final_evals(config: StudyConfig, model: str, folder: Path, console: Console,
                 distiller: distill.Distiller | None = None) -> None:
    """Score ``model`` (the base model's name, or the label of ``distiller``'s final student) on
    every ``final_evals`` bench not yet written in ``folder``."""
    for final in config.final_evals:
        out = final_path(folder, final.bench)
        if out.is_file():
            continue
        console.rule(f"study: {model} on {final.bench} (final evaluation)")
        settings = _eval_config(config, model, out, final.bench, final.limit, final.max_new_tokens)
        if distiller is None:
            evaluate.run(settings, console)
        else:
            evaluate.run(settings, console, engine=_eval_engine(config, distiller), tokenizer=distiller.student.tokenizer)


def _eval_engine(config: StudyConfig, distiller: distill.Distiller):
    """The student's engine for one evaluation: for ``hf`` a fresh one on the same weights with a
    prefix cache (the base model's evaluation has one too; ``reference_nll`` then reuses each
    prompt's keys and values: ~5 min less per 100 BFCL tasks on 2 cores), dropped afterwards;
    any other engine as the run has it."""
    if distiller.config.engine != "hf":
        return distiller.engine
    return _hf_engine(config, distiller.student.model, distiller.student.tokenizer, distiller.student.adapter)


def _hf_engine(config: StudyConfig, model: Any, tokenizer: Any, adapter: str | None):
    from stages.engines import make_engine
    from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS

    return make_engine("hf", model, tokenizer, adapter=adapter, batch_size=config.eval_batch,
                       prefix_cache_tokens=PREFIX_CACHE_TOKENS)


def _evaluate_at(config: StudyConfig, folder: Path, label: str, console: Console):
    """``evaluate_at(generations, student, adapter, tokenizer)`` of an sft/rft entry
    (:func:`stages.study.sft.train`): the student in training scored into ``evals/gen-G.json``."""
    def evaluate_at(generations: int, student: Any, adapter: str | None, tokenizer: Any) -> None:
        out = folder / "evals" / f"gen-{generations}.json"
        if out.is_file():
            return
        student.eval()
        with _rng_kept():
            evaluate.run(_eval_config(config, f"{label}@{generations}", out), console,
                         engine=_hf_engine(config, student, tokenizer, adapter), tokenizer=tokenizer)
    return evaluate_at


@contextlib.contextmanager
def _rng_kept():
    """Leave torch's, numpy's and Python's random states as they were (an evaluation inside a
    training run must not change what the run samples next)."""
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        yield
    finally:
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])


def _evaluate_inside(config: StudyConfig, folder: Path, label: str, console: Console):
    """The ``on_step`` hook of a trained run: evaluate at every ``eval_every`` and the last step."""
    def hook(distiller: distill.Distiller, row: dict) -> None:
        generations, last = row["generations"], row["step"] == distiller.config.steps
        if not last and not (config.eval_every and generations % config.eval_every == 0):
            return
        out = folder / "evals" / f"gen-{generations}.json"
        if out.is_file():  # written before a kill; the redone step is the same (bit-exact resume)
            return
        with _rng_kept():
            evaluate.run(_eval_config(config, f"{label}@{generations}", out), console,
                         engine=_eval_engine(config, distiller), tokenizer=distiller.student.tokenizer)
    return hook


def _restore_base(config: StudyConfig, saved: dict[str, Any] | None, console: Console) -> None:
    """Write the base model's report and final evaluations from the ``results`` folder when ``out``
    has none."""
    base = base_report(config)
    if not base.is_file() and saved and "base_report" in saved:
        base.parent.mkdir(parents=True, exist_ok=True)
        base.write_text(json.dumps(saved["base_report"], indent=2))
        console.print(f"study: the base model's evaluation reused from {config.results}")
    for bench, report in (saved or {}).get("base_finals", {}).items():
        path = final_path(base.parent, bench)
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=2))


def _freeze(config: StudyConfig) -> None:
    """Write ``study.json``, or check a rerun against it (any change but the folders is an error)."""
    path = Path(config.out) / "study.json"
    current = json.loads(config.model_dump_json())
    if path.is_file():
        changed = changed_settings(json.loads(read_utf8(path)), current)
        if changed:
            raise ValueError(f"{path}: this study was started with other settings ({', '.join(changed)} "
                             "differ); use another --out, or restore the study file")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2))


def _copy_store(source: Path, dest: Path) -> None:
    """The run's own copy of the experience store (copied once, then reused on resume)."""
    if dest.exists():
        return
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    partial.rename(dest)


def run_study(config: StudyConfig, console: Console | None = None, report_only: bool = False,
              only: list[str] | None = None) -> dict[str, Any]:
    """Run (or resume) every entry of the study, then write the results; returns ``results.json``.

    With ``report_only`` nothing is trained or evaluated and only ``out`` is written (the
    ``results`` folder, kept in the repository, is read, never rewritten): the results of what
    the study folder holds (unfinished runs show as pending); with no base model's evaluation
    and no run folders, the table and plots are redrawn from the ``results`` folder's or
    ``out``'s results.json alone (:func:`stages.study.report.rerender`). ``only`` names the entries to train
    now, ``NAME`` (all its seeds) or ``NAME:SEED`` (the base model is evaluated in any case); the
    others are left as they are, so a study can be run in parts, in any order, across sessions or
    machines sharing the folder.

    Raises:
        ValueError: invalid settings (unequal budgets, unknown options, a changed study), an
            ``only`` name that is no entry, or ``report_only`` with neither the base model's
            evaluation nor a results.json of this study.
        StoreError, EnvError: unusable store or environment.
    """
    console = console or Console()
    out = Path(config.out)
    chosen = _chosen(config, only)
    if report_only:
        _restore_base(config, committed(config), console)
        if not base_report(config).is_file() and not (out / "runs").is_dir():
            return _rerender(config, console)
        if not base_report(config).is_file():
            raise ValueError(f"{out}: no study results yet (the base model's evaluation is missing)")
        _freeze(config)
        return _report(config, console, publish=False)
    if not Path(config.store).exists():
        raise ValueError(f"store {config.store}: not found (prepare it with lopd collect/index)")
    steps, per_step = check_budget(config)
    for run in config.runs:  # every method and option is checked before anything trains
        for seed in config.seeds_of(run):
            if run.method in SFT_METHODS:
                study_sft.sft_config(config, run, seed, steps, per_step)
                if run.method == "rft":
                    study_sft.collect_config(config, run, seed, steps)
            elif run.method != VANILLA:
                distill_config(config, run, seed)
    saved = committed(config)
    _freeze(config)
    _restore_base(config, saved, console)
    base = base_report(config)
    model = config.distill.get("model", distill.DistillConfig.model_fields["model"].default)
    if not base.is_file():
        console.rule("study: the base model (generation 0)")
        evaluate.run(_eval_config(config, model, base), console)
    _final_evals(config, model, base.parent, console)
    for run in config.runs:
        if run.method == VANILLA or (chosen is not None and run.name not in chosen):
            continue
        for seed in config.seeds_of(run):
            if chosen is not None and chosen[run.name] is not None and seed not in chosen[run.name]:
                continue
            folder = run_dir(config, run, seed)
            if done_file(config, run, seed).is_file():
                console.print(f"study: {run.name} seed {seed} finished earlier, reused")
                continue
            if (run.name, seed) in reused_runs(config, saved):
                console.print(f"study: {run.name} seed {seed} finished earlier, reused from {config.results}")
                continue
            console.rule(f"study: {run.name} ({run.method}) seed {seed}: {steps} steps x {per_step} rollouts")
            _copy_store(Path(config.store), folder / "store")
            label, t0 = f"{run.name}-seed{seed}", time.perf_counter()
            if run.method in SFT_METHODS:
                final = study_sft.train(config, run, seed, (steps, per_step), console,
                                        _evaluate_at(config, folder, label, console))
                gc.collect()
                _final_evals(config, str(final), folder / "evals", console)
                done = json.dumps({"run": label, "method": run.method, "final_dir": str(final),
                                   "seconds": time.perf_counter() - t0}, indent=2)
            else:
                distiller = distill.Distiller(distill_config(config, run, seed).resolved(), console)
                report = distiller.fit(on_step=_evaluate_inside(config, folder, label, console))
                _final_evals(config, f"{label}@final", folder / "evals", console, distiller)
                done = report.model_dump_json(indent=2)
                del distiller
                gc.collect()
            done_file(config, run, seed).write_text(done)
            if config.results:  # the finished run's rows reach the repository's folder at once
                _publish(config, console)
    return _report(config, console)


def _chosen(config: StudyConfig, only: list[str] | None) -> dict[str, set[int] | None] | None:
    """``--only`` as ``{run name: its chosen seeds, or None for all}`` (None: no ``--only``).

    Raises:
        ValueError: a name that is no entry, or a seed that is not one of the entry's.
    """
    if not only:
        return None
    runs = {r.name: r for r in config.runs}
    chosen: dict[str, set[int] | None] = {}
    for item in only:
        name, _, seed = item.partition(":")
        if name not in runs:
            raise ValueError(f"--only {item}: no such run in the study (runs: {', '.join(runs)})")
        if not seed:
            chosen[name] = None
            continue
        seeds = config.seeds_of(runs[name])
        if not seed.isdigit() or int(seed) not in seeds:
            raise ValueError(f"--only {item}: run {name} has seeds {', '.join(map(str, seeds))}")
        if name not in chosen or chosen[name] is not None:
            chosen[name] = (chosen.get(name) or set()) | {int(seed)}
    return chosen


def _publish(config: StudyConfig, console: Console, publish: bool = True) -> dict[str, Any]:
    """Write the results into ``out`` and, with ``publish``, copy them (json, csv, table, plots)
    into ``results``."""
    from stages.study.report import write_results

    results = write_results(config, commit=git_commit(), budget=check_budget(config))
    if publish and config.results and Path(config.results).resolve() != Path(config.out).resolve():
        dest = Path(config.results)
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("results.json", "results.csv", "table.md", *results["plots"]):
            shutil.copyfile(Path(config.out) / name, dest / name)
        keep_training_logs(config, dest / "training")
        console.print(f"study: results copied into {dest}")
    return results


def _rerender(config: StudyConfig, console: Console) -> dict[str, Any]:
    """``--report-only`` with no run folders: the table and plots drawn again from a results.json
    alone (the ``results`` folder's, else ``out``'s, e.g. a committed ``docs/results/...`` folder),
    written into ``out`` (beside it only when ``out`` is that folder).

    Raises:
        ValueError: no results.json there, or one of a study with other settings.
    """
    from stages.study.report import rerender

    folders = [Path(f) for f in (config.results, config.out) if f]
    folder = next((f for f in folders if (f / "results.json").is_file()), None)
    if folder is None:
        raise ValueError(f"{config.out}: no study results yet (the base model's evaluation is missing, "
                         "and no results.json to draw from)")
    saved = json.loads(read_utf8(folder / "results.json"))
    changed = changed_settings(saved.get("settings", {}), json.loads(config.model_dump_json()))
    if changed:
        raise ValueError(f"{folder / 'results.json'}: written by a study with other settings "
                         f"({', '.join(changed)} differ); use its study file")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    results = rerender(config, saved, out)
    console.print(results["table_markdown"], markup=False, highlight=False, soft_wrap=True)  # as table.md
    console.print(f"study redrawn from {folder / 'results.json'} (no run folders) into {out}: table.md, "
                  "results.csv, " + ", ".join(results["plots"]))
    return results


def _report(config: StudyConfig, console: Console, publish: bool = True) -> dict[str, Any]:
    """Write the results (:func:`_publish`) and `lopd report` of the runs in ``out``; with
    ``publish`` also of the training logs kept in ``results`` (drawn there)."""
    from stages import report

    out = Path(config.out)
    results = _publish(config, console, publish)
    console.print(results["table_markdown"], markup=False, highlight=False, soft_wrap=True)  # as table.md
    console.print(f"study written to {out}: results.json, results.csv, table.md, "
                  + ", ".join(results["plots"]))
    if (out / "runs").is_dir():  # the trained runs' curves (losses, gradient norms, time, memory)
        report.run(report.ReportConfig(runs=[str(out / "runs")], out=str(out / "report")), console)
    kept = Path(config.results) / "training" if config.results else None
    if publish and kept and kept.is_dir():  # the training logs of every run kept there, from any machine
        report.run(report.ReportConfig(runs=[str(kept)], out=str(kept.parent / "report"), samples_steps=0), console)
    return results
