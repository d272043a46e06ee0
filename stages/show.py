"""`lopd show`: what the model said, task by task, without Python.

Reads an evaluation report (``lopd evaluate --out``): each ``per_task`` row holds the task's
transcript (``messages``: role, content, tool calls), its reward and the checker's verdict
(``info``); reports written before transcripts were kept show the scores only. Or reads an
experience store folder (``collect``/``distill`` rollouts): each trajectory with its run id.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

_ROLE_STYLE = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}
# characters of model output that would drive the terminal (escape sequences, carriage returns,
# bidirectional overrides): shown as \xNN / \uNNNN instead of being sent to it
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every terminal control character (but newline and tab) written as an escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        text)


def _safe(value: Any) -> str:
    """``value`` as text for a rich line: terminal control characters escaped, markup escaped."""
    return escape(printable(str(value)))


def select(rows: list[dict[str, Any]], task: str | None = None, failed: bool = False,
           limit: int | None = None) -> list[dict[str, Any]]:
    """The ``per_task`` rows whose task id contains ``task``, only unsuccessful ones with
    ``failed``, at most ``limit`` (in report order)."""
    chosen = [r for r in rows if (task is None or task in str(r.get("task_id", "")))
              and not (failed and r.get("success"))]
    return chosen[:limit] if limit is not None else chosen


def _arguments(value: Any) -> str:
    """A tool call's arguments as JSON text: an object stored as a JSON string is shown as the
    object (not as an escaped string); text that is no JSON is shown as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return value
    return json.dumps(value, ensure_ascii=False, default=str)


def render_task(row: dict[str, Any]) -> Panel:
    """One task of a report as a rich panel: every message (tool calls as ``-> name(args)``),
    then the reward and the checker's verdict."""
    parts: list[Any] = []
    for m in row.get("messages") or []:
        role = str(m.get("role", "?"))
        name = f"/{m['name']}" if m.get("name") else ""
        body = Text(printable(f"[{role}{name}] "), style=_ROLE_STYLE.get(role, "bold"))
        body.append(printable(str(m.get("content", ""))))
        for call in m.get("tool_calls") or []:
            body.append(printable(f"\n  -> {call.get('name')}({_arguments(call.get('arguments'))})"), style="magenta")
        parts.append(body)
    if not row.get("messages"):
        parts.append(Text("(no transcript in this report: rerun lopd evaluate to keep one)", style="dim"))
    info = {k: v for k, v in (row.get("info") or {}).items() if v not in (None, "", [], {})}
    verdict = Text(f"reward {row.get('reward', 0.0):.3f}  success {bool(row.get('success'))}", style="bold")
    if info:
        verdict.append(printable("  checker: " + json.dumps(info, ensure_ascii=False, default=str)[:600]), style="")
    parts.append(verdict)
    mark = "[green]ok[/]" if row.get("success") else "[red]failed[/]"
    return Panel(Group(*parts), title=f"{_safe(row.get('task_id'))} {mark}", title_align="left")


def store_rows(opened: Any, run_id: str | None = None, env: str | None = None,
               split: str | None = None, failed: bool = False) -> list[dict[str, Any]]:
    """The trajectories of the opened experience store ``opened`` matching the filters, in
    insertion order, as report-like rows (``task_id``, ``messages``, ``reward``, ``success``,
    ``info``, ``run_id``, ``policy``)."""
    rows = []
    for t in opened.query(run_id=run_id, env=env, split=split, success=False if failed else None):
        info = json.loads(t.info) if t.info else {}
        rows.append({"task_id": t.task_id, "messages": [m.model_dump() for m in t.messages], "reward": t.reward,
                     "success": t.success, "info": info if isinstance(info, dict) else {"info": info},
                     "run_id": t.run_id, "policy": t.policy})
    return rows


def _filters(run_id: str | None, env: str | None, split: str | None, failed: bool, task: str | None) -> str:
    """The filters given, as flags (e.g. ``--failed --split test``)."""
    given = [f"--run-id {run_id}" if run_id else "", f"--env {env}" if env else "", f"--split {split}" if split else "",
             "--failed" if failed else "", f"--task {task}" if task else ""]
    return _safe(" ".join(g for g in given if g) or "the filters")


def run(report: str | Path, task: str | None = None, failed: bool = False, limit: int | None = 5,
        console: Console | None = None, run_id: str | None = None, env: str | None = None,
        split: str | None = None) -> int:
    """Print the chosen tasks of evaluation report ``report`` (a JSON file), or the chosen
    trajectories of the experience store ``report`` (a folder; ``run_id``, ``env``, ``split``
    filter it); returns how many were shown.

    Raises:
        FileNotFoundError: no such file or folder.
        ValueError: not a JSON evaluation report (no ``per_task`` list), a store filter given
            with a report, or a ``run_id`` the store does not hold: one line naming the file;
            ``limit`` below 1.
        StoreError: a folder that is not an experience store.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"--limit {limit}: show at least 1 task (leave it out for 5)")
    console = console or Console()
    path = Path(report)
    if path.is_dir():
        from stages.core.data.store import ExperienceStore

        opened = ExperienceStore.open(path, create=False)
        counts = opened.run_counts()
        listed = ", ".join(f"{name} ({n})" for name, n in counts.items())
        if run_id and run_id not in counts:
            raise ValueError(f"store {path}: no run {run_id!r}; its runs (trajectories): {listed or 'none'}")
        rows = store_rows(opened, run_id, env, split, failed)
        chosen = select(rows, task, failed, limit)
        console.print(f"[bold]store {_safe(path)}[/]: {len(chosen)} of {len(rows)} trajectories shown; "
                      f"runs in the store (trajectories): {_safe(listed or 'none')}", soft_wrap=True)
        if not chosen and counts:
            console.print(f"note: none of the store's {sum(counts.values())} trajectories matches "
                          f"{_filters(run_id, env, split, failed, task)}", soft_wrap=True)
        for row in chosen:
            console.print(render_task({**row, "task_id": f"{row['task_id']} [{row['run_id']}]"}))
        return len(chosen)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such report or store (lopd evaluate --out writes a report; "
                                "lopd collect --store a store)")
    if run_id or env or split:
        raise ValueError(f"{path}: --run-id, --env and --split filter a store folder, not an evaluation report")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a JSON report ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("per_task"), list):
        raise ValueError(f"{path}: field 'per_task' is missing: not an evaluation report")
    matching = select(data["per_task"], task, failed)
    rows = matching[:limit] if limit is not None else matching
    filters = _filters(None, None, None, failed, task)
    matched = f" ({len(matching)} match {filters})" if (task or failed) and matching else ""
    console.print(f"[bold]{_safe(data.get('bench'))}[/] - {_safe(data.get('model'))}: "
                  f"{len(rows)} of {len(data['per_task'])} tasks shown{matched}", soft_wrap=True)
    if not matching and data["per_task"]:
        console.print(f"note: none of the report's {len(data['per_task'])} tasks matches {filters}", soft_wrap=True)
    for row in rows:
        console.print(render_task(row))
    return len(rows)
