"""`lopd report`: training curves and a summary of one or more run folders.

Reads every ``metrics.jsonl`` under the given folders (a coldstart or distill run, or a whole
`lopd study` folder, whose runs are overlaid) and the evaluate reports (``*.json`` with ``bench``
and ``scores``) found there, given as files, or in the ``eval`` folder beside a run folder
(`lopd evaluate`'s default ``runs/eval``) whose ``model`` lies inside that run folder; a folder of
evaluation reports alone is summarised without plots. Writes into ``out``:

- one PNG per metric group present (rewards, losses, coldstart's held-out NLL, LOPD's dual,
  anchor and latents, gradient norms, seconds per step, peak memory): one panel per metric, one line per run, against
  generations when every row has them (distill), else against steps;
- ``summary.md``: first a line per path given: the runs and evaluation reports read from it, or
  why nothing was (no such path, not an evaluation report, no step yet); then per run the steps,
  first / last / min / max of each metric (for a distill run also sample rollouts of its last
  steps: :mod:`stages.samples`; for a cold start its ladder of controls, ``ladder.json``:
  :mod:`stages.coldstart.ladder.rungs`), and the scores of the evaluation reports found.

A path that cannot be read is a warning and its line in the summary; only when no path gives a
run or a report is it an error.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape

from stages.core.data.inputs import read_utf8
from stages.core.run.runs import METRICS_FILE
from stages.samples import run_samples

if TYPE_CHECKING:  # the ladder's module loads torch: imported where a ladder is read (export reads no ladder)
    from stages.coldstart.ladder.rungs import Ladder

# (file stem, title, metric names): a metric is drawn in the first group that names it
GROUPS = (
    ("reward", "rollout reward", ("reward_mean", "success_rate")),
    ("loss", "losses", ("loss", "nll", "reverse_kl", "forward_kl", "kd_loss", "distill_loss", "pg_loss", "kl_ref", "sdl")),
    ("heldout", "held-out NLL of the teacher (coldstart)", ("heldout_nll", "heldout_nll_no_latents", "heldout_nll_untrained",
                                                              "heldout_nll_other_experiences")),
    ("dual", "privileged margin and dual variable (LOPD)", ("Delta", "beta", "margin_term")),
    ("anchor", "latent anchor", ("anchor", "latent_norm")),
    ("grad_norms", "gradient norms", ("grad_norm", "grad_norm_student", "grad_norm_composer")),
    ("seconds", "time per step (s)", ("seconds", "rollout_s", "train_s", "prepare_s", "forward_s", "backward_s",
                                      "optimizer_s", "sync_s", "memory_s", "tokens_per_s")),
    ("memory", "memory (MB): resident now and peak", ("rss_mb", "peak_rss_mb", "peak_gpu_mb")),
)
# groups drawn in one panel: their metrics measure the same thing on one scale (the cold start's
# held-out NLL without latents, untrained, trained and with another task's experiences)
SHARED_PANEL = frozenset({"heldout"})
# one colour per method in every study and report plot; a label takes the colour of the method it names
METHOD_COLORS = {"vanilla": "#555555", "lopd": "C0", "lopd-text": "C9", "grpo": "C1", "opsd": "C2", "sdft": "C4",
                 "sdpo": "C3", "skill-sd": "C5"}
_OTHER_COLORS = ("C6", "C8", "C7")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_LINESTYLES = ("-", "--", "-.", ":")


class ReportConfig(BaseModel):
    """Settings of `lopd report`: ``runs`` the folders (and evaluation report files) to read,
    ``out`` where the plots and the summary go (default: ``<first folder>/report``; for report
    files alone ``<their folder>/report``), ``samples_steps`` how many last steps of each distill
    run get sample rollouts in the summary (0: none)."""

    model_config = ConfigDict(extra="forbid")

    runs: list[str] = Field(min_length=1)
    out: str | None = None
    samples_steps: int = Field(3, ge=0)


def find_runs(folders: list[Path]) -> dict[str, Path]:
    """``{label: metrics file}`` for every ``metrics.jsonl`` under ``folders`` (labels are the
    path below the given folder, ``train`` and ``runs`` parts dropped; prefixed by the folder's
    name when several folders are given; the run folder's whole path where that label is taken,
    e.g. two folders named ``lopd``).

    Raises:
        FileNotFoundError: a folder does not exist.
    """
    found: dict[str, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such run folder")
        for path in sorted(folder.rglob(METRICS_FILE)):
            parts = [p for p in path.parent.relative_to(folder).parts if p not in ("train", "runs")]
            label = "/".join(([folder.name] if len(folders) > 1 or not parts else []) + parts)
            found[label if label not in found else str(path.parent)] = path
    return found


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The metric rows of ``path``; a line that is not a JSON object is skipped with a note.

    A killed run can leave a half-written last line: it loses that row only, never the report.
    """
    rows = []
    for n, line in enumerate(read_utf8(path).splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        elif line.strip():
            Console(stderr=True).print(f"note: {path} line {n}: not a metrics row (skipped)", soft_wrap=True)
    return rows


def report_or_reason(path: Path) -> dict[str, Any] | str:
    """The evaluate report in ``path`` (a JSON object with ``bench`` and ``scores``), else why
    not, in words (e.g. ``"not JSON (Expecting value at line 1 column 1)"``)."""
    if path.stat().st_size > 50_000_000:
        return "larger than 50 MB, not read"
    try:
        report = json.loads(read_utf8(path))
    except json.JSONDecodeError as err:
        return f"not JSON ({err.msg} at line {err.lineno} column {err.colno})"
    except ValueError as err:  # unreadable, or not UTF-8: the message names the file first
        return str(err).removeprefix(f"{path}: ")
    if isinstance(report, dict) and isinstance(report.get("scores"), dict) and "bench" in report:
        return report
    return "not an evaluation report (a lopd evaluate --out JSON with bench and scores)"


def _inside(model: Any, folder: Path) -> bool:
    """Whether a report's ``model`` (a path, or a hub id) names a folder inside ``folder``."""
    if not isinstance(model, str) or not Path(model).exists():
        return False
    return Path(model).resolve().is_relative_to(folder.resolve())


def find_reports(folders: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """``(path, report)`` for every evaluate report under ``folders``, and in the ``eval``
    folder beside each of them when its ``model`` lies inside that folder."""
    found: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.json")):
            if isinstance(report := report_or_reason(path), dict):
                found.setdefault(str(path), report)
        beside = folder.parent / "eval"
        for path in sorted(beside.glob("*.json")) if beside.resolve() != folder.resolve() else []:
            if isinstance(report := report_or_reason(path), dict) and _inside(report.get("model"), folder):
                found.setdefault(str(path), report)
    return list(found.items())


class Inputs(BaseModel):
    """What the paths given to `lopd report` hold: ``metric_files`` (:func:`find_runs`), ``runs``
    their rows by label (runs with a step), ``reports`` ``(path, report)``, ``lines`` one markdown
    line per path given (what was read from it, or why nothing was) and ``problems`` one line
    ``"PATH: why"`` per path or run that gave nothing."""

    metric_files: dict[str, Path]
    runs: dict[str, list[dict]]
    reports: list[tuple[str, dict[str, Any]]]
    lines: list[str]
    problems: list[str]


def read_inputs(given: list[Path]) -> Inputs:
    """Read every path given (:class:`Inputs`): a folder's runs (:func:`find_runs`) and evaluation
    reports (:func:`find_reports`), a file as an evaluation report; nothing raises for one path."""
    metric_files = find_runs([p for p in given if p.is_dir()])
    runs, unread = {}, {}
    for label, path in metric_files.items():
        try:
            rows = read_rows(path)
        except ValueError as err:  # unreadable, or not UTF-8
            rows, unread[label] = [], str(err).removeprefix(f"{path}: ")
        if rows:
            runs[label] = rows
        else:
            unread.setdefault(label, f"its {METRICS_FILE} holds no step yet")
    found: dict[str, dict[str, Any]] = {}
    lines, problems = [], []
    for path in given:
        parts, why = [], None
        if path.is_dir():
            for label, file in metric_files.items():
                if file.is_relative_to(path) and label in runs:
                    parts.append(f"run `{label}` ({len(runs[label])} steps, last {runs[label][-1]['step']})")
                elif file.is_relative_to(path):
                    parts.append(f"run `{label}`: {unread[label]}")
                    problems.append(f"{file.parent}: {unread[label]}")
            reports = find_reports([path])
            found.update({name: report for name, report in reports if name not in found})
            if reports:
                parts.append(f"{len(reports)} evaluation report(s): " + ", ".join(f"`{name}`" for name, _ in reports))
            why = None if parts else f"no {METRICS_FILE} under it, nor an evaluation report"
        elif path.is_file():
            report = report_or_reason(path)
            if isinstance(report, dict):
                found.setdefault(str(path), report)
                parts.append(f"evaluation report ({report['bench']}, {report.get('model', '-')})")
            else:
                why = report
        else:
            why = "no such run folder or report file"
        lines.append(f"- `{path}`: " + ("; ".join(parts) if why is None else f"not read: {why}"))
        problems += [] if why is None else [f"{path}: {why}"]
    return Inputs(metric_files=metric_files, runs=runs, reports=list(found.items()), lines=lines, problems=problems)


def _numeric(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], float(r[key])) for r in rows
            if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])]


def method_of(label: str) -> str | None:
    """The method a run label names (``lopd``, ``study/grpo-seed1``: the longest of
    :data:`METHOD_COLORS` its last path part starts with, then ends or goes on with ``-``), else None."""
    last = label.rsplit("/", 1)[-1]
    names = [m for m in METHOD_COLORS if last == m or last.startswith(m + "-")]
    return max(names, key=len) if names else None


def series_styles(labels: list[str], methods: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``{label: matplotlib line keywords}``: the colour of the label's method (``methods[label]``,
    else :func:`method_of`; :data:`METHOD_COLORS`;
    labels of no known method take the other colours in turn), a marker of its own and, among labels
    of one colour, a linestyle of its own; a label drawn earlier is drawn wider and with larger
    markers, so a later line on the same values leaves it visible around the edges."""
    styles: dict[str, dict[str, Any]] = {}
    others: dict[str, str] = {}
    per_color: dict[str, int] = {}
    for i, label in enumerate(labels):
        method = (methods or {}).get(label) or method_of(label)
        color = METHOD_COLORS[method] if method in METHOD_COLORS else others.setdefault(label, _OTHER_COLORS[len(others) % len(_OTHER_COLORS)])
        k = per_color.get(color, 0)
        per_color[color] = k + 1
        styles[label] = {"color": color, "marker": _MARKERS[i % len(_MARKERS)],
                         "linestyle": _LINESTYLES[k % len(_LINESTYLES)],
                         "linewidth": max(1.0, 3.0 - 0.4 * i), "markersize": max(3.0, 9.0 - 1.2 * i),
                         "alpha": 0.85}
    return styles


def identical_series(series: dict[str, list[tuple[float, float]]], rel_tol: float = 1e-3) -> list[list[str]]:
    """The groups (two or more labels) whose points are the same at every x, within ``rel_tol``
    of the span of all values (at least 1e-12): drawn over each other."""
    values = [y for points in series.values() for _, y in points]
    tol = max((max(values) - min(values)) * rel_tol, 1e-12) if values else 0.0
    groups: list[list[str]] = []
    for label, points in series.items():
        if not points:
            continue
        group = next((g for g in groups if [x for x, _ in series[g[0]]] == [x for x, _ in points]
                      and all(abs(a[1] - b[1]) <= tol for a, b in zip(series[g[0]], points))), None)
        if group is None:
            groups.append([label])
        else:
            group.append(label)
    return [g for g in groups if len(g) > 1]


def note_overlaps(ax: Any, series: dict[str, list[tuple[float, float]]]) -> None:
    """Write on ``ax`` which series lie on the same values (drawn over each other)."""
    groups = identical_series(series)
    if groups:
        text = "; ".join(" = ".join(g) for g in groups)
        ax.text(0.01, 0.01, f"same values: {text}", transform=ax.transAxes, fontsize=6, va="bottom", alpha=0.8)


def integer_ticks(ax: Any) -> None:
    """Whole numbers only on the x axis (steps and generations); a panel spanning less than two
    (one point, e.g. a cold start's single held-out check) is widened to +-1 around its middle, or
    the locator would fall back to fractions."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = ax.get_xlim()
    if hi - lo < 2:
        ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_group(path: Path, title: str, metrics: list[str], runs: dict[str, list[dict]], x: str,
               levels: dict[str, dict[str, float]] | None = None) -> None:
    """One PNG: a panel per metric, a line per run (``x``: ``generations`` or ``step``), or for a
    group of :data:`SHARED_PANEL` (``path``'s stem) one panel with a line per run and metric;
    ``levels`` ``{metric: {name: value}}`` draws each distinct value dashed across its panel
    (e.g. the LOPD runs' margin m on the ``Delta`` panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {key: key for key in metrics}
    if path.stem in SHARED_PANEL:  # one panel on one scale, a series per (run, metric)
        shared = {}
        for label, rows in runs.items():
            for key in metrics:
                name = f"{label}: {key}" if len(runs) > 1 else key
                shared[name] = [{"step": r["step"], x: r.get(x, r["step"]), "value": r[key]} for r in rows if key in r]
        styles = series_styles(list(shared), {name: method_of(name.split(": ")[0]) or "" for name in shared})
        runs, metrics, titles = shared, ["value"], {"value": ""}
    else:
        styles = series_styles(list(runs))  # one style per run in every panel
    cols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, metrics):
        series = {}
        for label, rows in runs.items():
            by_step = {r["step"]: r for r in rows}
            series[label] = [(by_step[s].get(x, s), v) for s, v in _numeric(rows, key)]
            if series[label]:
                ax.plot(*zip(*series[label]), **{**styles[label], "markersize": styles[label]["markersize"] / 2})
        for value in sorted(set((levels or {}).get(key, {}).values())):
            ax.axhline(value, color="black", linestyle="--", linewidth=1)
            ax.annotate(f"margin m = {value:g}", (0.02, value), xycoords=("axes fraction", "data"), fontsize=7,
                        va="bottom")
        note_overlaps(ax, series)
        integer_ticks(ax)
        ax.set_title(titles[key], fontsize=10)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    drawn = [label for label, rows in runs.items() if any(_numeric(rows, k) for k in metrics)]
    handles = [plt.Line2D([], [], **{**styles[label], "markersize": 3}) for label in drawn]
    ncol = max(1, min(len(drawn), 2 * cols))  # two entries per panel's width: long labels fit
    fig.legend(handles, drawn, loc="lower center", ncol=ncol, fontsize=8)
    fig.suptitle(title)
    legend_rows = math.ceil(len(drawn) / ncol)  # one row of 8-point text is ~0.2 inch
    fig.tight_layout(rect=(0, min(0.5, (0.1 + 0.2 * legend_rows) / fig.get_figheight()), 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")  # nothing drawn outside the figure is cut
    plt.close(fig)


def summary_row(path: str, report: dict[str, Any]) -> str:
    """One markdown row ``| path | bench | model | tasks | scores |`` of an evaluate report."""
    scores = ", ".join(f"{k} {v:.3f}" for k, v in report["scores"].items() if isinstance(v, (int, float)))
    tasks = len(report["per_task"]) if isinstance(report.get("per_task"), list) else "-"
    return f"| {path} | {report['bench']} | {report.get('model', '-')} | {tasks} | {scores} |"


def summary(runs: dict[str, list[dict]], reports: list[tuple[str, dict]],
            samples: dict[str, list[str]] | None = None, ladders: dict[str, Ladder] | None = None,
            inputs: list[str] = ()) -> str:
    """The markdown summary: the ``inputs`` lines (:func:`read_inputs`), metrics per run (first,
    last, min, max), its ``samples`` lines (sample rollouts, by run label) and a cold start's
    ladder of controls (``ladders``, by run label), then evaluation scores."""
    from stages.coldstart.ladder.rungs import ladder_markdown

    lines = ["# Run report", ""] + (["## Inputs", "", *inputs, ""] if inputs else [])
    for label, rows in runs.items():
        keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "step" and _numeric(rows, k)]
        lines += [f"## {label}", "", f"{len(rows)} steps (last: {rows[-1]['step'] if rows else '-'}).", "",
                  "| metric | first | last | min | max |", "|---|---|---|---|---|"]
        for key in keys:
            values = [v for _, v in _numeric(rows, key)]
            lines.append(f"| {key} | {values[0]:.4g} | {values[-1]:.4g} | {min(values):.4g} | {max(values):.4g} |")
        lines.append("")
        lines += (samples or {}).get(label, [])
        if label in (ladders or {}):
            lines += ladder_markdown(ladders[label])
    if reports:
        lines += ["## Evaluation reports", "", "| report | bench | model | tasks | scores |", "|---|---|---|---|---|"]
        lines += [summary_row(path, report) for path, report in reports]
        lines += ["", *paired_markdown(reports)]
    return "\n".join(lines)


def paired_markdown(reports: list[tuple[str, dict]]) -> list[str]:
    """Per bench with two or more reports: each later report against the first, paired over the tasks
    both scored (``lopd evaluate --compare``'s paired rows: mean difference ± its standard error,
    tasks higher / lower), as markdown lines; none when no bench has two reports."""
    from stages.compare import PAIRED_KEYS, paired_difference, plus_minus, task_rows

    lines: list[str] = []
    for bench in dict.fromkeys(report["bench"] for _, report in reports):
        same = [(path, report) for path, report in reports if report["bench"] == bench]
        rows = []
        for path, report in same[1:]:
            for key in PAIRED_KEYS:
                stat = paired_difference(task_rows(same[0][1]), task_rows(report), key)
                if stat:
                    diff, se, n, up, down = stat
                    rows.append(f"| {path} | {key} | {plus_minus(diff, se)} | {n} | {up} / {down} |")
        if rows:
            lines += [f"Paired over tasks, {bench}: each report minus {same[0][0]}.", "",
                      "| report | per-task value | difference ± SE | tasks | higher / lower |", "|---|---|---|---|---|",
                      *rows, ""]
    return lines


def lopd_margins(folders: dict[str, Path]) -> dict[str, float]:
    """``{label: margin m}`` of the LOPD distill runs among run ``folders`` (their ``config.json``)."""
    margins = {}
    for label, folder in folders.items():
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):  # not a distill run, or unreadable: no line
            continue
        options = config.get("options") if isinstance(config, dict) else None
        margin = options.get("margin") if isinstance(options, dict) else None
        if config.get("method") == "lopd" and isinstance(margin, (int, float)):
            margins[label] = float(margin)
    return margins


def run(config: ReportConfig, console: Console | None = None) -> dict[str, Any]:
    """Write the plots and ``summary.md`` of ``config.runs`` into ``config.out``; returns what was written.

    A path that gives nothing (missing, not a report, no step yet) is a warning and its line in
    ``summary.md`` (:func:`read_inputs`).

    Raises:
        ValueError: no path gives a metrics row or an evaluation report (one line: each path and why).
    """
    console = console or Console()
    given = [Path(r) for r in config.runs]
    inputs = read_inputs(given)
    metric_files, runs, reports = inputs.metric_files, inputs.runs, inputs.reports
    if not runs and not reports:
        raise ValueError("; ".join(inputs.problems) + (" (give a coldstart, distill or study folder, a folder of "
                                                      "lopd evaluate reports, or report files)"))
    for problem in inputs.problems:
        console.print(f"[yellow]warning:[/] {escape(problem)} (its line in summary.md says so)", soft_wrap=True)
    first = next(p if p.is_dir() else p.parent for p in given if p.exists())
    out = Path(config.out) if config.out else first / "report"
    out.mkdir(parents=True, exist_ok=True)
    x = "generations" if all("generations" in r for rows in runs.values() for r in rows) else "step"
    plots = []
    levels = {"Delta": lopd_margins({label: metric_files[label].parent for label in runs})}
    for stem, title, names in GROUPS:
        present = [k for k in names if any(_numeric(rows, k) for rows in runs.values())]
        if present:
            plot_group(out / f"{stem}.png", title, present, runs, x, levels)
            plots.append(f"{stem}.png")
    from stages.coldstart.ladder.rungs import LADDER, Ladder

    samples = {label: run_samples(metric_files[label].parent, config.samples_steps) for label in runs}
    ladders = {label: Ladder.model_validate_json(read_utf8(path)) for label in runs
               if (path := metric_files[label].parent / LADDER).is_file()}
    (out / "summary.md").write_text(summary(runs, reports, samples, ladders, inputs.lines))
    console.print(f"[bold]report[/] of {len(runs)} run(s) ({', '.join(runs) or 'no metrics'}) and {len(reports)} "
                  f"evaluation report(s): {', '.join([*plots, 'summary.md'])} written to {out}", soft_wrap=True)
    return {"out": str(out), "plots": plots, "runs": list(runs), "reports": [p for p, _ in reports]}
