"""The results of a `lopd study` (:mod:`stages.study.recipe`): numbers, the paper-style table and plots.

Everything is read back from the study folder (evaluate reports and the runs' ``metrics.jsonl``),
so the results can be rewritten at any time from what is on disk:

- ``results.json``: settings, held-out split, every evaluation (run, method, seed, generations,
  scores, behaviour), every training row (reward, LOPD's Delta and beta), the table rows, the
  base model's evaluate report and final evaluations, the final table (``final_table``:
  :mod:`stages.study.final`) and the finished runs (``finished``: run, seed, seconds, the last
  evaluation's per-task rows, the final evaluations); a study with ``results`` reuses the
  evaluations, training rows, base model and finished runs from its copy there;
- ``results.csv``: the evaluations, one per line;
- ``table.md``: methods x final held-out scores, mean +- sample standard deviation over seeds
  (min..max), with the behaviour statistics and the binomial noise of one evaluation; then the
  final evaluations per bench (mean ± SE over tasks, paired difference to the base model);
- ``heldout.png`` (held-out score vs generations), ``heldout_nll.png`` (held-out reference NLL
  vs generations; benches with references), ``train_reward.png`` (training reward vs
  generations), ``lopd_dual.png`` (LOPD's Delta and beta vs step, the margin m dashed; only with
  LOPD runs): finished runs only, one colour per method as in `lopd report`
  (:func:`stages.report.series_styles`), the base model as a horizontal line.

A folder holding only these files (a committed one) is redrawn from its results.json by :func:`rerender`.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from stages.core.data.inputs import read_utf8
from stages.core.run.runs import METRICS_FILE, read_metrics
from stages.envs.bfcl import HELDOUT_RULE
from stages.report import integer_ticks, note_overlaps, series_styles
from stages.study.final import final_markdown, final_rows, final_seconds, read_finals
from stages.study.layout import VANILLA, base_report, committed, done_file, reused_runs, run_dir
from stages.study.sft import SFT_METHODS

_SCORES = ("accuracy", "mean", "pass@1", "success_rate")
_BEHAVIOUR = ("first_step_tokens", "tool_calls_per_step", "mean_steps", "repeated_calls_per_task")


def _read(path: Path) -> dict[str, Any]:
    return json.loads(read_utf8(path))


def score_key(config: Any, report: dict[str, Any]) -> str:
    """The score the table ranks by: ``config.score`` or the first of :data:`_SCORES` the report has.

    Raises:
        ValueError: the report has no such score (names the scores it has).
    """
    scores = report["scores"]
    key = config.score or next((k for k in _SCORES if k in scores), None)
    if key not in scores:
        raise ValueError(f"score {key!r} is not in the {report['bench']} report (it has {', '.join(scores)})")
    return key


def collect_evaluations(config: Any, saved: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One record per evaluation: the base model's (as ``vanilla``) and each trained run's; a run
    finished only in the ``results`` folder (``saved``, its results.json) has its records from there."""
    base = _read(base_report(config))
    records = [_record(VANILLA, VANILLA, 0, 0, base)]
    reused = reused_runs(config, saved)
    for run in config.runs:
        if run.method == VANILLA:
            continue
        for seed in config.seeds_of(run):
            if (run.name, seed) in reused:
                records += [e for e in saved["evaluations"] if e["run"] == run.name and e["seed"] == seed]
                continue
            if not run_dir(config, run, seed).is_dir():  # not started yet
                continue
            records.append(_record(run.name, run.method, seed, 0, base))
            evals = {int(p.stem.removeprefix("gen-")): p for p in (run_dir(config, run, seed) / "evals").glob("gen-*.json")}
            records += [_record(run.name, run.method, seed, gen, _read(evals[gen])) for gen in sorted(evals)]
    return records


def _record(name: str, method: str, seed: int, generations: int, report: dict[str, Any]) -> dict[str, Any]:
    return {"run": name, "method": method, "seed": seed, "generations": generations,
            "tasks": len(report.get("per_task", [])), **report["scores"],
            **{k: report["behaviour"].get(k) for k in _BEHAVIOUR}}


def collect_training(config: Any, saved: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One record per training step of each trained run: reward, success and LOPD's Delta, beta
    (of a run finished only in the ``results`` folder: its rows in ``saved``)."""
    rows = []
    reused = reused_runs(config, saved)
    for run in config.runs:
        if run.method == VANILLA or run.method in SFT_METHODS:  # no rollouts: no training reward
            continue
        for seed in config.seeds_of(run):
            if (run.name, seed) in reused:
                rows += [t for t in saved["training"] if t["run"] == run.name and t["seed"] == seed]
                continue
            for m in read_metrics(run_dir(config, run, seed) / "train" / METRICS_FILE):
                rows.append({"run": run.name, "method": run.method, "seed": seed, "step": m["step"],
                             "generations": m["generations"], "reward_mean": m["reward_mean"],
                             "success_rate": m["success_rate"],
                             **{k: m[k] for k in ("Delta", "beta", "reverse_kl") if k in m}})
    return rows


def table_rows(config: Any, evals: list[dict[str, Any]], training: list[dict[str, Any]], key: str,
               reused: set[tuple[str, int]] = frozenset()) -> list[dict]:
    """Per run: the final evaluation of each FINISHED seed (``done.json``, or in ``reused``: finished
    in the ``results`` folder), summarised over seeds; the seeds still to train or evaluate are
    listed as ``pending``."""
    rows = []
    for run in config.runs:
        done = [s for s in config.seeds_of(run)
                if run.method == VANILLA or done_file(config, run, s).is_file() or (run.name, s) in reused]
        pending = [s for s in config.seeds_of(run) if s not in done]
        mine = [e for e in evals if e["run"] == run.name and e["seed"] in done]
        if not mine:
            rows.append({"run": run.name, "method": run.method, "seeds": [], "pending": pending})
            continue
        last_gen = max(e["generations"] for e in mine)
        final = [e for e in mine if e["generations"] == last_gen]
        scores = [e[key] for e in final]
        task_se = [e[f"{key}_se"] for e in final if e.get(f"{key}_se") is not None]
        train = [t["reward_mean"] for t in training if t["run"] == run.name and t["seed"] in done]
        nll = [e["reference_nll"] for e in final if e.get("reference_nll") is not None]
        rows.append({"run": run.name, "method": run.method, "seeds": [e["seed"] for e in final], "pending": pending,
                     "generations": last_gen, "score_mean": float(np.mean(scores)),
                     "score_sd": float(np.std(scores, ddof=1)) if len(scores) > 1 else None,
                     "score_min": min(scores), "score_max": max(scores),
                     "score_se": float(np.mean(task_se)) if task_se else None,
                     "train_reward": float(np.mean(train)) if train else None,
                     "reference_nll": float(np.mean(nll)) if nll else None,
                     "reference_nll_sd": float(np.std(nll, ddof=1)) if len(nll) > 1 else None,
                     **{k: float(np.mean([e[k] for e in final if e.get(k) is not None] or [0.0])) for k in _BEHAVIOUR}})
    return rows


def paired_nll(config: Any, rows: list[dict], base: dict[str, Any], finished: dict[str, dict]) -> None:
    """Add to each finished row the paired change of held-out reference NLL against the base model:
    per task, the run's NLL (mean over its seeds) minus the base model's; ``reference_nll_delta``
    = the mean over tasks, ``reference_nll_delta_se`` its standard error over tasks,
    ``reference_nll_lower`` the share of tasks whose NLL went down. Pairing by task removes the
    task-to-task spread (NLL ranges ~0.3-2.1 over BFCL tasks), so a change far smaller than
    the spread of the unpaired means is measurable. ``finished``: :func:`finished_runs`'s map,
    which holds each finished seed's final per-task rows."""
    base_nll = {t["task_id"]: t["reference_nll"] for t in base.get("per_task", []) if "reference_nll" in t}
    runs = {r.name: r for r in config.runs}
    for row in rows:
        if not row["seeds"] or not base_nll:
            continue
        run = runs[row["run"]]
        per_seed = [base["per_task"]] if run.method == VANILLA else [
            finished[f"{run.name}-seed{s}"]["final_per_task"] for s in row["seeds"]]
        by_task: dict[str, list[float]] = {}
        for tasks in per_seed:
            for t in tasks:
                if t["task_id"] in base_nll and "reference_nll" in t:
                    by_task.setdefault(t["task_id"], []).append(t["reference_nll"] - base_nll[t["task_id"]])
        diffs = [float(np.mean(v)) for v in by_task.values()]
        if len(diffs) > 1:
            row["reference_nll_delta"] = float(np.mean(diffs))
            row["reference_nll_delta_se"] = float(np.std(diffs, ddof=1) / math.sqrt(len(diffs)))
            row["reference_nll_lower"] = float(np.mean([d < 0 for d in diffs]))


def finished_runs(config: Any, saved: dict[str, Any] | None) -> dict[str, dict]:
    """``{"NAME-seedS": {run, seed, seconds, generations, final_per_task}}`` of every finished
    trained (run, seed): read from ``out`` (``done.json`` and the last evaluation), or kept from
    the ``results`` folder's ``saved`` results for those finished only there. ``final_per_task``
    holds each task's id, reward, success and reference NLL (where the bench has one); ``finals``
    the run's final evaluations (:func:`stages.study.final.read_finals`)."""
    reused = reused_runs(config, saved)
    finished = {}
    for run in config.runs:
        for seed in config.seeds_of(run):
            name = f"{run.name}-seed{seed}"
            if run.method == VANILLA:
                continue
            if (run.name, seed) in reused:
                finished[name] = saved["finished"][name]
            elif done_file(config, run, seed).is_file():
                evals = sorted((run_dir(config, run, seed) / "evals").glob("gen-*.json"),
                               key=lambda p: int(p.stem.removeprefix("gen-")))
                last = _read(evals[-1])["per_task"] if evals else []
                finished[name] = {
                    "run": run.name, "seed": seed, "seconds": _read(done_file(config, run, seed))["seconds"],
                    "generations": int(evals[-1].stem.removeprefix("gen-")) if evals else 0,
                    "final_per_task": [{k: t[k] for k in ("task_id", "reward", "success", "reference_nll") if k in t}
                                       for t in last],
                    "finals": read_finals(config, run_dir(config, run, seed) / "evals")}
    return finished


def noise_line(base_score: float, tasks: int) -> str:
    """The noise of one evaluation of ``tasks`` tasks at the base model's score: the binomial
    standard error, or at a score of 0 or 1 (standard error 0) the rule-of-three 95% bound 3/n,
    given only where it bounds a rate (n >= 3)."""
    if 0 < base_score < 1:
        return ("One evaluation's binomial standard error at the base model's score: "
                f"±{math.sqrt(base_score * (1 - base_score) / max(tasks, 1)):.3f}.")
    if tasks < 3:
        return f"The base model scores {base_score:.3f} on {tasks} task(s): too few for a noise estimate."
    solved, rate = (0, "rate") if base_score == 0 else (tasks, "failure rate")
    return (f"The base model solves {solved} of {tasks}: a true {rate} up to 3/{tasks} = {3 / tasks:.3f} "
            "is consistent with that (95%, rule of three).")


def wall_time(seconds: float) -> str:
    """``seconds`` as minutes with one decimal, or as seconds under a minute."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def markdown(config: Any, rows: list[dict], key: str, tasks: int, base_score: float, budget: str) -> str:
    """The paper-style table with its caption lines."""
    lines = [f"Held-out {config.bench} ({tasks} tasks), score `{key}` after the run's last step; "
             f"mean ± sample sd over seeds (min..max) [the evaluation's standard error over tasks, mean "
             f"over seeds, where the bench gives one]. Budget per trained run: {budget}.", noise_line(base_score, tasks),
             "Held-out reference NLL: mean nats per token of each task's verified reference call under the "
             "model, after the exact prompt it was given (lower: the right call is more likely; it moves "
             "before the score does).", "",
             f"| run | method | seeds | generations | held-out {key} | vs vanilla | held-out reference NLL | "
             "NLL vs vanilla (paired ± SE; tasks lower) | train reward | first-step tokens | tool calls/step | "
             "repeated calls/task |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["seeds"]:
            lines.append(f"| {r['run']} | {r['method']} | 0 | - | pending (seeds {r['pending']}) | | | | | | | |")
            continue
        spread = f" ± {r['score_sd']:.3f} ({r['score_min']:.3f}..{r['score_max']:.3f})" if r["score_sd"] is not None else ""
        if r.get("score_se") is not None:
            spread += f" [SE over tasks {r['score_se']:.3f}]"
        train = "-" if r["train_reward"] is None else f"{r['train_reward']:.3f}"
        more = f" (+{len(r['pending'])} pending)" if r["pending"] else ""
        paired = "-" if r.get("reference_nll_delta") is None or r["method"] == VANILLA else (
            f"{r['reference_nll_delta']:+.4f} ± {r['reference_nll_delta_se']:.4f}; {r['reference_nll_lower']:.0%}")
        nll = "-" if r["reference_nll"] is None else f"{r['reference_nll']:.4f}" + (
            f" ± {r['reference_nll_sd']:.4f}" if r["reference_nll_sd"] is not None else "")
        lines.append(f"| {r['run']} | {r['method']} | {len(r['seeds'])}{more} | {r['generations']} | "
                     f"{r['score_mean']:.3f}{spread} | {r['score_mean'] - base_score:+.3f} | {nll} | {paired} | {train} | "
                     f"{r['first_step_tokens']:.1f} | {r['tool_calls_per_step']:.3f} | "
                     f"{r['repeated_calls_per_task']:.3f} |")
    return "\n".join(lines) + "\n"


def finished_only(records: list[dict], rows: list[dict]) -> list[dict]:
    """The ``records`` of the finished (run, seed) pairs of the table ``rows`` (a pending run, with
    no finished seed, is left out of the plots and their legends)."""
    done = {(r["run"], s) for r in rows for s in r["seeds"]}
    return [r for r in records if (r["run"], r["seed"]) in done]


def curves(records: list[dict], x: str, y: str) -> dict[str, list[tuple[float, float, float, float]]]:
    """``{run: [(x, mean, min, max) over seeds]}`` in the order the runs come; runs with no
    value of ``y`` are left out."""
    out = {}
    for name in dict.fromkeys(r["run"] for r in records):
        mine = [r for r in records if r["run"] == name and r.get(y) is not None]
        xs = sorted({r[x] for r in mine})
        by_x = [[r[y] for r in mine if r[x] == v] for v in xs]
        if xs:
            out[name] = [(v, float(np.mean(ys)), min(ys), max(ys)) for v, ys in zip(xs, by_x)]
    return out


def _plot_curves(path: Path, records: list[dict], x: str, y: str, ylabel: str, title: str) -> None:
    """Mean over seeds per run (line) with the min..max band; the base model (``vanilla``, one
    value at generation 0) as a horizontal reference line; styles per method as in `lopd report`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = curves(records, x, y)
    methods = {r["run"]: r["method"] for r in records}
    styles = series_styles(list(data), methods)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, points in data.items():
        style = styles[name]
        xs, means, lows, highs = zip(*points)
        if methods[name] == VANILLA:
            ax.axhline(means[0], color=style["color"], linestyle=":", linewidth=1.5, label=f"{name} (base model)")
            continue
        ax.plot(xs, means, label=name, **style)
        ax.fill_between(xs, lows, highs, color=style["color"], alpha=0.12)
    note_overlaps(ax, {n: [(p[0], p[1]) for p in pts] for n, pts in data.items() if methods[n] != VANILLA})
    integer_ticks(ax)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(config: Any, commit: str | None, budget: tuple[int, int]) -> dict[str, Any]:
    """Write results.json, results.csv, table.md and the plots into ``config.out``; returns the results.

    ``budget``: every trained run's (steps, rollouts per step) (:func:`stages.study.recipe.check_budget`).

    ``seconds`` in the results = the base model's evaluation + each finished run's wall time
    (training with its evaluations; of its last invocation when it was resumed).
    """
    out = Path(config.out)
    base = _read(base_report(config))
    key = score_key(config, base)
    saved = committed(config)
    evals, training = collect_evaluations(config, saved), collect_training(config, saved)
    rows = table_rows(config, evals, training, key, reused_runs(config, saved))
    finished = finished_runs(config, saved)
    paired_nll(config, rows, base, finished)
    base_finals = read_finals(config, base_report(config).parent)
    finals = final_rows(config, base_finals, {name: f.get("finals", {}) for name, f in finished.items()})
    seconds = base.get("seconds", 0.0) + final_seconds(base_finals) + sum(
        f["seconds"] + final_seconds(f.get("finals", {})) for f in finished.values())
    steps, per_step = budget
    budget = f"{steps} steps x {per_step} rollouts = {steps * per_step} generations"
    table = markdown(config, rows, key, len(base.get("per_task", [])), base["scores"][key], budget)
    table += final_markdown(finals)
    table += f"\nWall time of the finished parts: {wall_time(seconds)}.\n"
    split = {"bench": config.bench, "tasks": [t["task_id"] for t in base.get("per_task", [])]}
    if config.bench == "bfcl-single":
        split["rule"] = f"held out: {HELDOUT_RULE}; train: the other single-turn tasks"
    plots = write_plots(config, out, finished_only(evals, rows), finished_only(training, rows), key)
    results = {"settings": json.loads(config.model_dump_json()), "score": key, "split": split,
               "budget": budget, "evaluations": evals, "training": training, "table": rows,
               "table_markdown": table, "plots": plots, "git_commit": commit, "seconds": seconds,
               "finished": finished, "base_report": base, "base_finals": base_finals, "final_table": finals}
    write_files(out, results)
    return results


def write_files(out: Path, results: dict[str, Any]) -> None:
    """Write ``results`` as results.json, its evaluations as results.csv and its table as table.md."""
    (out / "results.json").write_text(json.dumps(results, indent=2))
    columns = list(dict.fromkeys(k for e in results["evaluations"] for k in e))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(results["evaluations"])
    (out / "table.md").write_text(results["table_markdown"])


def write_plots(config: Any, out: Path, evals: list[dict], training: list[dict], key: str) -> list[str]:
    """Draw the plots of the finished runs' ``evals`` and ``training`` rows into ``out``; returns their names."""
    plots = ["heldout.png"]
    _plot_curves(out / "heldout.png", evals, "generations", key, f"held-out {key}", f"{config.bench}: held-out score")
    if training:
        plots.append("train_reward.png")
        _plot_curves(out / "train_reward.png", training, "generations", "reward_mean", "training reward",
                     "training reward (mean over the step's rollouts)")
    if any(e.get("reference_nll") is not None for e in evals):
        plots.append("heldout_nll.png")
        _plot_curves(out / "heldout_nll.png", evals, "generations", "reference_nll", "reference NLL (nats/token)",
                     f"{config.bench}: held-out reference NLL")
    lopd = [t for t in training if "Delta" in t]
    if lopd:
        plots.append("lopd_dual.png")
        _plot_dual(out / "lopd_dual.png", lopd, lopd_margins(config))
    return plots


def rerender(config: Any, saved: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write table.md, the plots, results.csv and results.json into ``out`` again from a study's
    ``results.json`` (``saved``) alone: no run folder or evaluate report is read. The table rows,
    evaluations, training rows, budget and wall time are the saved ones; the final table is paired
    anew from the saved per-task rows; the table text and plots are drawn anew. Returns the results written.

    Raises:
        ValueError: ``saved`` lacks a field a results.json has (names it).
    """
    try:
        key, rows, evals, training = saved["score"], saved["table"], saved["evaluations"], saved["training"]
        base = next(e for e in evals if e["run"] == VANILLA and e["generations"] == 0)
    except (KeyError, StopIteration) as err:
        raise ValueError(f"{out}: results.json has no {err or 'base model evaluation'}") from None
    table = markdown(config, rows, key, base["tasks"], base[key], saved["budget"])
    finals = (final_rows(config, saved["base_finals"], {name: f.get("finals", {}) for name, f in
                                                        saved.get("finished", {}).items()})
              if saved.get("base_finals") else saved.get("final_table", []))  # the kept per-task rows, paired anew
    table += final_markdown(finals)
    table += f"\nWall time of the finished parts: {wall_time(saved.get('seconds', 0.0))}.\n"
    plots = write_plots(config, out, finished_only(evals, rows), finished_only(training, rows), key)
    results = {**saved, "final_table": finals, "table_markdown": table, "plots": plots}
    write_files(out, results)
    return results


def lopd_margins(config: Any) -> dict[str, float]:
    """``{run name: margin m}`` of the study's LOPD runs (the run's setting, the study's
    ``[distill]`` one, else the method's default)."""
    from stages.methods import get_method

    default = get_method("lopd").Options.model_fields["margin"].default
    return {r.name: float({**config.distill, **r.settings}.get("margin", default))
            for r in config.runs if r.method == "lopd"}


def _plot_dual(path: Path, rows: list[dict], margins: dict[str, float]) -> None:
    """LOPD's privileged margin Delta and dual variable beta per step, one line per run and seed;
    each run's margin m as a dashed line on the Delta panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    labels = {f"{name}-seed{seed}": (name, seed) for name, seed in dict.fromkeys((r["run"], r["seed"]) for r in rows)}
    styles = series_styles(list(labels), {label: "lopd" for label in labels})
    series: dict[str, dict[str, list]] = {"Delta": {}, "beta": {}}
    for label, (name, seed) in labels.items():
        mine = [r for r in rows if r["run"] == name and r["seed"] == seed]
        for ax, key in ((a, "Delta"), (b, "beta")):
            series[key][label] = [(r["step"], r[key]) for r in mine]
            ax.plot(*zip(*series[key][label]), label=label, **styles[label])
    for m in sorted(set(margins[n] for n, _ in labels.values() if n in margins)):
        a.axhline(m, color="black", linestyle="--", linewidth=1, label=f"margin m = {m:g}")
    for ax, key, name in ((a, "Delta", "Delta (teacher - student log-prob margin)"), (b, "beta", "beta (dual variable)")):
        note_overlaps(ax, series[key])
        integer_ticks(ax)
        ax.set_xlabel("step")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
