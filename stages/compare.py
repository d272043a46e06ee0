"""`lopd evaluate --compare`: evaluate reports side by side, the ways they differ besides the
model (task set, decoding, composer: :func:`differences`), and the paired difference of two
reports' per-task values (also read by `lopd study`'s final table).

A report file is checked field by field before use: a bad one is one ``ValueError`` line naming
the file and the field.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from stages.benches import standard_error
from stages.core.run.printing import titled_table

PAIRED_KEYS = ("reward", "success", "reference_nll")  # per-task values compared in pairs over tasks


def _load_report(path: Path) -> dict[str, Any]:
    """A report file checked field by field: one-line ``ValueError`` naming file and field."""
    from stages.core.data.inputs import read_utf8

    text = read_utf8(path)
    try:
        report = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a JSON evaluate report ({err.msg} at line {err.lineno} "
                         f"column {err.colno})") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path}: not an evaluate report (the top level is {_json_kind(report)}, not an object)")
    for field in ("bench", "model", "scores", "behaviour"):
        if field not in report:
            raise ValueError(f"{path}: missing field {field!r} (not an evaluate report)")
    for field in ("bench", "model"):
        if not isinstance(report[field], str):
            raise ValueError(f"{path}: field {field!r} must be a string, got {_json_kind(report[field])}")
    for section in ("scores", "behaviour"):
        metrics = report[section]
        if not isinstance(metrics, dict):
            raise ValueError(f"{path}: field {section!r} must be an object of metric: number, "
                             f"got {_json_kind(metrics)}")
        for key, value in metrics.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{path}: field '{section}.{key}' must be a number, got "
                                 f"{_json_kind(value)} {json.dumps(value)[:40]}")
    return report


def _data_of(report: dict[str, Any]) -> Any:
    """The data a report was scored on: its ``config.data_dir`` (None: the package's copy)."""
    config = report.get("config")
    return config.get("data_dir") if isinstance(config, dict) else None


def _json_kind(value: Any) -> str:
    """The JSON name of a value's type (null, boolean, number, string, array, object)."""
    for kind, types in (("null", type(None)), ("boolean", bool), ("number", (int, float)),
                        ("string", str), ("array", list), ("object", dict)):
        if isinstance(value, types):
            return kind
    return type(value).__name__


# settings of a report's ``config`` that change what a model generates (with its filled protocol)
DECODING = ("protocol", "temperature", "top_p", "top_k", "max_new_tokens", "max_turns", "episode_rules", "seed",
            "engine", "user_model")


def _reports(paths: list[Path]) -> list[dict[str, Any]]:
    """The reports of ``paths``, checked (:func:`_load_report`) and of one bench and data.

    Raises:
        ValueError: see :func:`compare`.
    """
    if not paths:
        raise ValueError("compare: give at least one report path")
    reports = [_load_report(Path(p)) for p in paths]
    for path, r in zip(paths[1:], reports[1:]):
        if r["bench"] != reports[0]["bench"]:
            raise ValueError(f"{path}: a {r['bench']} report cannot be compared with {paths[0]} ({reports[0]['bench']})")
        if _data_of(r) != _data_of(reports[0]):
            raise ValueError(f"{path}: scored on other data ({_data_of(r) or 'package data'}) than {paths[0]} "
                             f"({_data_of(reports[0]) or 'package data'})")
    return reports


def _setting(report: dict[str, Any], key: str) -> Any:
    """``config[key]`` of a report, None without it."""
    config = report.get("config")
    return config.get(key) if isinstance(config, dict) else None


def _composer(report: dict[str, Any]) -> str:
    """``"DIR (store STORE)"`` of a report's composer and store, ``"none"`` without one."""
    composer = _setting(report, "composer")
    return f"{composer} (store {_setting(report, 'store')})" if composer else "none"


def _labels(paths: list[Path], reports: list[dict[str, Any]]) -> list[str]:
    """Column headers: each report's model, with its composer (``+ composer DIR``; ``(no composer)``
    when another report has one), and its file when two headers would be the same."""
    composers = [_setting(r, "composer") for r in reports]
    labels = [r["model"] + (f" + composer {c}" if c else " (no composer)" if any(composers) else "")
              for r, c in zip(reports, composers)]
    return [label if labels.count(label) == 1 else f"{label} ({Path(path).parent.name}/{Path(path).name})"
            for path, label in zip(paths, labels)]


def compare(paths: list[Path]) -> Table:
    """Side-by-side table of evaluate reports; later columns show deltas vs the first report.
    What makes the deltas more than the models' difference: :func:`differences`.

    Raises:
        ValueError: fewer than one path, a file that is not an evaluate report (names file and
            field), or reports of different benches or data.
    """
    reports = _reports(paths)
    on_fixtures = " (on bundled test fixtures, not the benchmark)" if reports[0].get("fixtures") else ""
    table = titled_table(f"compare {reports[0]['bench']}{on_fixtures}")
    table.add_column("metric", overflow="fold")
    for label in _labels(paths, reports):
        table.add_column(label, justify="right", overflow="fold")  # a long model path wraps, never cut to "…"
    for section in ("scores", "behaviour"):
        keys = list(dict.fromkeys(k for r in reports for k in r[section]))
        for key in keys:
            base = reports[0][section].get(key)
            cells = []
            for i, r in enumerate(reports):
                value = r[section].get(key)
                if value is None:
                    cells.append("-")
                elif i == 0 or base is None:
                    cells.append(f"{value:.3f}")
                else:
                    cells.append(f"{value:.3f} ({value - base:+.3f})")
            table.add_row(key if section == "scores" else f"[dim]{key}[/]", *cells)
    for key in PAIRED_KEYS:
        stats = [paired_difference(task_rows(reports[0]), task_rows(r), key) for r in reports[1:]]
        if any(stats):
            table.add_row(f"paired Δ {key}", "-", *(
                f"{plus_minus(d, se)} ({up} higher / {down} lower, n {n})" if n else "-"
                for d, se, n, up, down in (st or (0.0, 0.0, 0, 0, 0) for st in stats)))
    return table


def differences(paths: list[Path]) -> list[str]:
    """One line per later report and per way it differs from the first besides the model: its
    task set (its deltas are unpaired), its decoding (:data:`DECODING`: protocol, budget, step
    cap, sampling; settings a report does not record are not compared), its composer.

    Raises:
        ValueError: see :func:`compare`.
    """
    reports = _reports(paths)
    first, lines = reports[0], []
    tasks0 = {r.get("task_id") for r in task_rows(first)}
    for path, report in zip(paths[1:], reports[1:]):
        tasks = {r.get("task_id") for r in task_rows(report)}
        if tasks != tasks0:
            lines.append(f"{path} scored other tasks than {paths[0]} ({len(tasks - tasks0)} only in it, "
                         f"{len(tasks0 - tasks)} only in the first, {len(tasks & tasks0)} in both): its score deltas "
                         f"are unpaired; the paired rows use the {len(tasks & tasks0)} shared tasks")
        both = [k for k in DECODING if isinstance(report.get("config"), dict) and isinstance(first.get("config"), dict)
                and k in report["config"] and k in first["config"]]
        greedy = _setting(report, "temperature") == 0 and _setting(first, "temperature") == 0  # the seed is unused
        decoding = [f"{k} {_setting(report, k)} ({paths[0]}: {_setting(first, k)})" for k in both
                    if _setting(report, k) != _setting(first, k) and not (k == "seed" and greedy)]
        if decoding:
            lines.append(f"{path} was decoded otherwise than {paths[0]}: {', '.join(decoding)}: its deltas are "
                         "not the models' alone")
        composer, composer0 = _composer(report), _composer(first)
        if composer != composer0:
            lines.append(f"{path} generated with composer {composer}, {paths[0]} with {composer0}: its deltas "
                         "include the composer's effect")
    return lines


def task_rows(report: dict[str, Any]) -> list[dict]:
    """A report's per-task rows (objects only; none when the report has no ``per_task`` list)."""
    rows = report.get("per_task")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def plus_minus(diff: float, se: float) -> str:
    """``diff ± se`` with 3 decimals, more where the standard error would print as 0.000 (two
    significant digits of it, at most 6 decimals): ``-0.0034 ± 0.00041``."""
    decimals = 3 if se >= 0.001 or se <= 0 else min(6, 1 - math.floor(math.log10(se)))
    return f"{diff:+.{decimals}f} ± {se:.{decimals}f}"


def paired_difference(base: list[dict], other: list[dict], key: str) -> tuple[float, float, int, int, int] | None:
    """The paired difference of per-task value ``key`` (``other`` minus ``base``) over the tasks
    both reports scored: ``(mean, standard error of the mean, n, tasks higher, tasks lower)``;
    booleans count as 0/1. None when fewer than two tasks have the value in both reports.
    """
    values = {r.get("task_id"): r.get(key) for r in base}
    diffs = [float(r[key]) - float(values[r.get("task_id")]) for r in other
             if isinstance(r.get(key), (int, float)) and isinstance(values.get(r.get("task_id")), (int, float))]
    if len(diffs) < 2:
        return None
    return (sum(diffs) / len(diffs), standard_error(diffs), len(diffs), sum(d > 0 for d in diffs),
            sum(d < 0 for d in diffs))


def comparison_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """The numbers of :func:`compare` as rows, for ``--compare ... --out FILE``: per report and
    metric ``{"report", "model", "composer", "section", "metric", "value", "delta"}`` (``delta``: minus the
    first report's value, None for the first), then per later report and per-task key
    ``{"report", "model", "composer", "section": "paired", "metric", "value": mean, "se", "n",
    "higher", "lower"}``. Model names and paths are whole.

    Raises:
        ValueError: see :func:`compare`.
    """
    reports = _reports(paths)
    rows: list[dict[str, Any]] = []
    for path, r in zip(paths, reports):
        for section in ("scores", "behaviour"):
            for key, value in r[section].items():
                base = reports[0][section].get(key)
                delta = None if r is reports[0] or value is None or base is None else value - base
                rows.append({"report": str(path), "model": r["model"], "composer": _setting(r, "composer"),
                             "section": section, "metric": key, "value": value, "delta": delta})
    for path, r in zip(paths[1:], reports[1:]):
        for key in PAIRED_KEYS:
            stat = paired_difference(task_rows(reports[0]), task_rows(r), key)
            if stat:
                mean, se, n, up, down = stat
                rows.append({"report": str(path), "model": r["model"], "composer": _setting(r, "composer"),
                             "section": "paired", "metric": key,
                             "value": mean, "se": se, "n": n, "higher": up, "lower": down})
    return rows


def write_comparison(paths: list[Path], out: Path) -> Path:
    """Write :func:`comparison_rows` to ``out``: JSON (a list of objects) for ``.json``, else CSV
    (one header of every field)."""
    import csv

    rows = comparison_rows(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".json":
        out.write_text(json.dumps(rows, indent=2))
        return out
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return out
