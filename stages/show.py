"""`lopd show`: what the model said in an evaluation, task by task, without Python.

Reads an evaluation report (``lopd evaluate --out``): each ``per_task`` row holds the task's
transcript (``messages``: role, content, tool calls), its reward and the checker's verdict
(``info``). Reports written before transcripts were kept show the scores only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

_ROLE_STYLE = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}


def select(rows: list[dict[str, Any]], task: str | None = None, failed: bool = False,
           limit: int | None = None) -> list[dict[str, Any]]:
    """The ``per_task`` rows whose task id contains ``task``, only unsuccessful ones with
    ``failed``, at most ``limit`` (in report order)."""
    chosen = [r for r in rows if (task is None or task in str(r.get("task_id", "")))
              and not (failed and r.get("success"))]
    return chosen[:limit] if limit is not None else chosen


def render_task(row: dict[str, Any]) -> Panel:
    """One task of a report as a rich panel: every message (tool calls as ``-> name(args)``),
    then the reward and the checker's verdict."""
    parts: list[Any] = []
    for m in row.get("messages") or []:
        role = str(m.get("role", "?"))
        body = Text(f"[{role}{'/' + m['name'] if m.get('name') else ''}] ", style=_ROLE_STYLE.get(role, "bold"))
        body.append(str(m.get("content", "")))
        for call in m.get("tool_calls") or []:
            body.append(f"\n  -> {call.get('name')}({json.dumps(call.get('arguments'), ensure_ascii=False)})",
                        style="magenta")
        parts.append(body)
    if not row.get("messages"):
        parts.append(Text("(no transcript in this report: rerun lopd evaluate to keep one)", style="dim"))
    info = {k: v for k, v in (row.get("info") or {}).items() if v not in (None, "", [], {})}
    verdict = Text(f"reward {row.get('reward', 0.0):.3f}  success {bool(row.get('success'))}", style="bold")
    if info:
        verdict.append("  checker: " + json.dumps(info, ensure_ascii=False, default=str)[:600], style="")
    parts.append(verdict)
    mark = "[green]ok[/]" if row.get("success") else "[red]failed[/]"
    return Panel(Group(*parts), title=f"{escape(str(row.get('task_id')))} {mark}", title_align="left")


def run(report: str | Path, task: str | None = None, failed: bool = False, limit: int | None = 5,
        console: Console | None = None) -> int:
    """Print the chosen tasks of evaluation report ``report``; returns how many were shown.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a JSON evaluation report (no ``per_task`` list): one line naming the file.
    """
    console = console or Console()
    path = Path(report)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such report (lopd evaluate --out writes one)")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a JSON report ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("per_task"), list):
        raise ValueError(f"{path}: field 'per_task' is missing: not an evaluation report")
    rows = select(data["per_task"], task, failed, limit)
    console.print(f"[bold]{escape(str(data.get('bench')))}[/] - {escape(str(data.get('model')))}: "
                  f"{len(rows)} of {len(data['per_task'])} tasks shown", soft_wrap=True)
    for row in rows:
        console.print(render_task(row))
    return len(rows)
