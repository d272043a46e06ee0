"""The final evaluations of a `lopd study` (:mod:`stages.study.recipe`): every finished student, and the
base model, scored once more after training on the study's ``final_evals`` benches (e.g. the
whole held-out split, transfer environments, another benchmark), and the table that compares
them per task against the base model.

Layout (inside the study's ``out``)::

    vanilla/final-BENCH.json          the base model's report on BENCH
    runs/NAME-seedS/evals/final-BENCH.json   a finished run's final student on BENCH

A run counts as finished only once its final evaluations are written (they run before its
``done.json``), so the results a ``results`` folder keeps always carry them. Each kept
evaluation is reduced to its scores and per-task rows (:func:`kept`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from stages.benches import standard_error
from stages.core.data.inputs import read_utf8
from stages.compare import paired_difference
from stages.study.layout import VANILLA, StudyConfig

# per task: the outcome, and the behaviour the paper's claims are about (steps, tool calls, repeats)
_TASK_KEYS = ("task_id", "reward", "success", "reference_nll", "steps", "tool_calls", "repeated_calls")


def final_path(folder: Path, bench: str) -> Path:
    """Where the final evaluation on ``bench`` of the model of ``folder`` lives: ``folder`` is
    ``out/vanilla`` for the base model, a run's ``evals`` folder for a trained one."""
    return folder / f"final-{bench}.json"


def kept(report: dict[str, Any]) -> dict[str, Any]:
    """What a results.json keeps of one final evaluation: bench, scores, seconds and each task's
    id, reward, success, reference NLL, steps, tool calls and repeated calls (where the bench has them)."""
    return {"bench": report["bench"], "scores": report["scores"], "seconds": report.get("seconds", 0.0),
            "per_task": [{k: t[k] for k in _TASK_KEYS if k in t} for t in report.get("per_task", [])]}


def read_finals(config: StudyConfig, folder: Path) -> dict[str, dict[str, Any]]:
    """``{bench: kept report}`` of the final evaluations written in ``folder`` (missing ones left out)."""
    finals = {}
    for final in config.final_evals:
        path = final_path(folder, final.bench)
        if path.is_file():
            finals[final.bench] = kept(json.loads(read_utf8(path)))
    return finals


def _per_task(finals: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Per task: ``key`` averaged over the seeds' reports that scored it (booleans as 0/1)."""
    values: dict[str, list[float]] = {}
    for report in finals:
        for t in report["per_task"]:
            if isinstance(t.get(key), (bool, int, float)):
                values.setdefault(t["task_id"], []).append(float(t[key]))
    return [{"task_id": task, key: float(np.mean(v))} for task, v in values.items()]


def final_rows(config: StudyConfig, base: dict[str, dict], runs: dict[str, dict[str, dict]]) -> list[dict[str, Any]]:
    """The final table's rows: per bench of ``config.final_evals`` and per study entry with that
    evaluation for all its finished seeds, the mean over tasks ± its standard error of the per-task
    reward and success (averaged over seeds first), the seeds' spread of the mean success, and the
    paired difference to the base model over the same tasks.

    Every other trained run is also paired against the study's first ``lopd`` entry (the
    method under test): ``success_vs_lopd`` and its SE, tasks higher and lower, and the entry's
    name as ``lopd_run``.

    ``base``: the base model's ``{bench: kept report}``; ``runs``: ``{"NAME-seedS": {bench: kept
    report}}`` of the finished trained runs.
    """
    def reports_of(run: Any, bench: str) -> list[dict[str, Any]]:
        if run.method == VANILLA:
            return [base[bench]]
        return [runs[f"{run.name}-seed{s}"][bench] for s in config.seeds_of(run)
                if bench in runs.get(f"{run.name}-seed{s}", {})]

    lopd = next((run for run in config.runs if run.method == "lopd"), None)
    rows = []
    for final in config.final_evals:
        bench = final.bench
        if bench not in base:
            continue
        lopd_tasks = _per_task(reports_of(lopd, bench), "success") if lopd else []
        base_tasks = {key: _per_task([base[bench]], key) for key in ("reward", "success")}
        for run in config.runs:
            reports = reports_of(run, bench)
            if not reports:
                continue
            row: dict[str, Any] = {"bench": bench, "run": run.name, "method": run.method, "seeds": len(reports),
                                   "tasks": len(reports[0]["per_task"])}
            per_key = {key: _per_task(reports, key) for key in ("reward", "success")}
            for key, tasks in per_key.items():
                if not tasks:
                    continue
                values = [t[key] for t in tasks]
                row[key], row[f"{key}_se"] = float(np.mean(values)), standard_error(values)
                seeds = [float(np.mean([float(t[key]) for t in r["per_task"] if key in t])) for r in reports]
                row[f"{key}_seed_min"], row[f"{key}_seed_max"] = min(seeds), max(seeds)
                if run.method != VANILLA:
                    diff = paired_difference(base_tasks[key], tasks, key)
                    if diff:
                        row[f"{key}_delta"], row[f"{key}_delta_se"], _, row[f"{key}_higher"], row[f"{key}_lower"] = diff
            versus = (paired_difference(lopd_tasks, per_key["success"], "success")
                      if lopd_tasks and run.method != VANILLA and run is not lopd else None)
            if versus:
                row["lopd_run"] = lopd.name
                (row["success_vs_lopd"], row["success_vs_lopd_se"], _, row["success_vs_lopd_higher"],
                 row["success_vs_lopd_lower"]) = versus
            rows.append(row)
    return rows


def _cell(row: dict[str, Any], key: str) -> str:
    if key not in row:
        return "-"
    spread = (f" (seeds {row[f'{key}_seed_min']:.3f}..{row[f'{key}_seed_max']:.3f})" if row["seeds"] > 1 else "")
    return f"{row[key]:.3f} ± {row[f'{key}_se']:.3f}{spread}"


def _delta(row: dict[str, Any], key: str) -> str:
    if key not in row:
        return "-"
    d, se = row[key], row[f"{key}_se"]
    sigmas = f", {d / se:+.1f} SE" if se > 0 else ""
    prefix = key.removesuffix("_delta")
    return f"{d:+.3f} ± {se:.3f}{sigmas} ({row[f'{prefix}_higher']} higher / {row[f'{prefix}_lower']} lower)"


def final_markdown(rows: list[dict[str, Any]]) -> str:
    """The final evaluations as markdown: one table per bench (empty string: none yet)."""
    if not rows:
        return ""
    lines = ["", "## Final evaluations (each finished student after its last step, greedy)", "",
             "Mean over tasks ± standard error over tasks (a run with several seeds: each task's value "
             "averaged over the seeds first; the seeds' own means in brackets). Paired Δ: per task, the "
             "run's value minus the base model's, mean ± SE over the tasks both scored, and how many tasks "
             "went up and down; '+2.0 SE': the difference is twice its standard error. Δ vs the study's first "
             "LOPD entry: the same, paired against that run instead of the base model."]
    for bench in dict.fromkeys(r["bench"] for r in rows):
        mine = [r for r in rows if r["bench"] == bench]
        lopd = next((r["lopd_run"] for r in mine if "lopd_run" in r), None)
        versus = f" Δ success vs {lopd} (paired) |" if lopd else ""
        lines += ["", f"### {bench} ({mine[0]['tasks']} tasks)", "",
                  "| run | method | seeds | success | Δ success vs vanilla (paired) | reward | "
                  f"Δ reward vs vanilla (paired) |{versus}", "|---|---|---|---|---|---|---|" + ("---|" if lopd else "")]
        for r in mine:
            lines.append(f"| {r['run']} | {r['method']} | {r['seeds']} | {_cell(r, 'success')} "
                         f"| {_delta(r, 'success_delta')} | {_cell(r, 'reward')} | {_delta(r, 'reward_delta')} |"
                         + (f" {_delta(r, 'success_vs_lopd')} |" if lopd else ""))
    return "\n".join(lines) + "\n"


def final_seconds(finals: dict[str, dict[str, Any]]) -> float:
    """The wall time of a model's final evaluations, in seconds."""
    return float(sum(f.get("seconds", 0.0) for f in finals.values()))
