"""`lopd report`: training curves and a summary of one or more run folders.

Reads every ``metrics.jsonl`` under the given folders (a coldstart or distill run, or a whole
`lopd study` folder, whose runs are overlaid) and every evaluate report (``*.json`` with
``bench`` and ``scores``) there, and writes into ``out``:

- one PNG per metric group present (rewards, losses, coldstart's held-out NLL, LOPD's dual,
  anchor and latents, gradient norms, seconds per step, peak memory): one panel per metric, one line per run, against
  generations when every row has them (distill), else against steps;
- ``summary.md``: per run the steps, first / last / min / max of each metric, and the scores of
  the evaluation reports found.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from stages.core.data.inputs import read_utf8
from stages.core.run.runs import METRICS_FILE

# (file stem, title, metric names): a metric is drawn in the first group that names it
GROUPS = (
    ("reward", "rollout reward", ("reward_mean", "success_rate")),
    ("loss", "losses", ("loss", "nll", "reverse_kl", "forward_kl", "kd_loss", "distill_loss", "pg_loss", "kl_ref", "sdl")),
    ("heldout", "held-out NLL of the teacher (coldstart)", ("heldout_nll", "heldout_nll_no_latents", "heldout_nll_untrained")),
    ("dual", "privileged margin and dual variable (LOPD)", ("Delta", "beta", "margin_term")),
    ("anchor", "latent anchor", ("anchor", "latent_norm")),
    ("grad_norms", "gradient norms", ("grad_norm", "grad_norm_student", "grad_norm_composer")),
    ("seconds", "time per step (s)", ("seconds", "rollout_s", "train_s", "prepare_s", "forward_s", "backward_s",
                                      "optimizer_s", "sync_s", "memory_s", "tokens_per_s")),
    ("memory", "memory (MB): resident now and peak", ("rss_mb", "peak_rss_mb", "peak_gpu_mb")),
)


class ReportConfig(BaseModel):
    """Settings of `lopd report`: ``runs`` the folders to read, ``out`` where the plots and the
    summary go (default: ``<first run>/report``)."""

    model_config = ConfigDict(extra="forbid")

    runs: list[str] = Field(min_length=1)
    out: str | None = None


def find_runs(folders: list[Path]) -> dict[str, Path]:
    """``{label: metrics file}`` for every ``metrics.jsonl`` under ``folders`` (labels are the
    path below the given folder, ``train`` and ``runs`` parts dropped; prefixed by the folder's
    name when several folders are given).

    Raises:
        FileNotFoundError: a folder does not exist.
        ValueError: no metrics file under any folder.
    """
    found: dict[str, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such run folder")
        for path in sorted(folder.rglob(METRICS_FILE)):
            parts = [p for p in path.parent.relative_to(folder).parts if p not in ("train", "runs")]
            label = "/".join(([folder.name] if len(folders) > 1 or not parts else []) + parts)
            found[label] = path
    if not found:
        raise ValueError(f"no {METRICS_FILE} under {', '.join(map(str, folders))} (give a coldstart, distill or study folder)")
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


def find_reports(folders: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """``(path, report)`` for every evaluate report (JSON object with ``bench`` and ``scores``)."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.json")):
            if path.stat().st_size > 50_000_000:
                continue
            try:
                report = json.loads(read_utf8(path))
            except (json.JSONDecodeError, ValueError):
                continue
            if isinstance(report, dict) and isinstance(report.get("scores"), dict) and "bench" in report:
                found.append((str(path), report))
    return found


def _numeric(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], float(r[key])) for r in rows
            if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])]


def plot_group(path: Path, title: str, metrics: list[str], runs: dict[str, list[dict]], x: str) -> None:
    """One PNG: a panel per metric, a line per run (``x``: ``generations`` or ``step``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    colors = {label: f"C{i % 10}" for i, label in enumerate(runs)}  # one colour per run in every panel
    for ax, key in zip(axes.flat, metrics):
        for label, rows in runs.items():
            by_step = {r["step"]: r for r in rows}
            points = [(by_step[s].get(x, s), v) for s, v in _numeric(rows, key)]
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, color=colors[label])
        ax.set_title(key, fontsize=10)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    drawn = [label for label, rows in runs.items() if any(_numeric(rows, k) for k in metrics)]
    handles = [plt.Line2D([], [], color=colors[label], marker="o", markersize=3) for label in drawn]
    fig.legend(handles, drawn, loc="lower center", ncol=min(len(drawn), 4), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(drawn) / 4), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(runs: dict[str, list[dict]], reports: list[tuple[str, dict]]) -> str:
    """The markdown summary: metrics per run (first, last, min, max), then evaluation scores."""
    lines = ["# Run report", ""]
    for label, rows in runs.items():
        keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "step" and _numeric(rows, k)]
        lines += [f"## {label}", "", f"{len(rows)} steps (last: {rows[-1]['step'] if rows else '-'}).", "",
                  "| metric | first | last | min | max |", "|---|---|---|---|---|"]
        for key in keys:
            values = [v for _, v in _numeric(rows, key)]
            lines.append(f"| {key} | {values[0]:.4g} | {values[-1]:.4g} | {min(values):.4g} | {max(values):.4g} |")
        lines.append("")
    if reports:
        lines += ["## Evaluation reports", "", "| report | bench | scores |", "|---|---|---|"]
        for path, report in reports:
            scores = ", ".join(f"{k} {v:.3f}" for k, v in report["scores"].items() if isinstance(v, (int, float)))
            lines.append(f"| {path} | {report['bench']} | {scores} |")
        lines.append("")
    return "\n".join(lines)


def run(config: ReportConfig, console: Console | None = None) -> dict[str, Any]:
    """Write the plots and ``summary.md`` of ``config.runs`` into ``config.out``; returns what was written.

    Raises:
        FileNotFoundError: a run folder does not exist.
        ValueError: no metrics file in any of them.
    """
    console = console or Console()
    folders = [Path(r) for r in config.runs]
    runs = {label: read_rows(path) for label, path in find_runs(folders).items()}
    runs = {label: rows for label, rows in runs.items() if rows}
    if not runs:
        raise ValueError(f"the {METRICS_FILE} files under {', '.join(config.runs)} hold no step yet")
    out = Path(config.out) if config.out else folders[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    x = "generations" if all("generations" in r for rows in runs.values() for r in rows) else "step"
    plots = []
    for stem, title, names in GROUPS:
        present = [k for k in names if any(_numeric(rows, k) for rows in runs.values())]
        if present:
            plot_group(out / f"{stem}.png", title, present, runs, x)
            plots.append(f"{stem}.png")
    reports = find_reports(folders)
    (out / "summary.md").write_text(summary(runs, reports))
    console.print(f"[bold]report[/] of {len(runs)} run(s) ({', '.join(runs)}): "
                  f"{', '.join(plots)} and summary.md written to {out}", soft_wrap=True)
    return {"out": str(out), "plots": plots, "runs": list(runs), "reports": [p for p, _ in reports]}
