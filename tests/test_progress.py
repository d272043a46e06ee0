"""StageProgress: plain lines with done/total, the stage's fields, elapsed time and an ETA when
the console is no terminal (a log file); rich's live bar and no such lines on a terminal."""
from __future__ import annotations

import io
import re

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

from stages.core.run.progress import StageProgress

LINE = re.compile(r"^bench: (\d+)/8 \((\d+)%\), success (\d\.\d{3}); elapsed \d+:\d\d:\d\d(, ETA \d+:\d\d:\d\d)?$")


def _play(console: Console, every: float, completed: int = 0) -> list[str]:
    with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("success {task.fields[success]:.3f}"), console=console, every=every) as bar:
        job = bar.add_task("bench", total=8, completed=completed, success=0.0)
        for i in range(completed, 8):
            bar.update(job, advance=1, success=(i + 1) / 8)
    return console.file.getvalue().splitlines()


def test_a_log_file_gets_a_line_per_update_due_and_the_last_one():
    lines = _play(Console(file=io.StringIO()), every=0.0)
    assert len(lines) == 9 and all(LINE.match(line) for line in lines), lines
    assert [int(LINE.match(line).group(1)) for line in lines] == list(range(9))
    assert all(LINE.match(line).group(4) for line in lines[1:-1])  # an ETA while items are left
    assert lines[-1].startswith("bench: 8/8 (100%), success 1.000; elapsed") and "ETA" not in lines[-1]


def test_lines_are_spaced_by_every_and_a_resumed_task_starts_where_it_was():
    lines = _play(Console(file=io.StringIO()), every=3600.0, completed=5)
    assert [int(LINE.match(line).group(1)) for line in lines] == [5, 8]  # its start and its end only


def test_a_terminal_gets_the_live_bar_and_no_plain_lines():
    text = "\n".join(_play(Console(file=io.StringIO(), force_terminal=True, width=120), every=0.0))
    assert not any(LINE.match(line) for line in text.splitlines()) and "━" in text


def test_a_log_file_gets_lines_while_no_item_finishes():
    """A batch of long episodes finishes nothing for minutes: the line still comes every ``every``."""
    import time

    console = Console(file=io.StringIO())
    with StageProgress(TextColumn("{task.description}"), MofNCompleteColumn(),
                       TextColumn("success {task.fields[success]:.3f}"), console=console, every=0.05) as bar:
        job = bar.add_task("bench", total=8, success=0.0)
        time.sleep(0.5)
        bar.update(job, advance=8, success=1.0)
        time.sleep(0.2)  # nothing after the task's last line
    lines = console.file.getvalue().splitlines()
    assert all(LINE.match(line) for line in lines), lines
    waiting = [line for line in lines if line.startswith("bench: 0/8")]
    assert len(waiting) >= 4 and lines[-1].startswith("bench: 8/8 (100%)")
    assert sum(line.startswith("bench: 8/8") for line in lines) == 1


def test_the_cold_start_bar_says_no_step_yet_before_its_first_step():
    from stages.coldstart.recipe import _bar_loss

    assert _bar_loss([]) == {"loss": "no step yet"}
    assert _bar_loss([1.0, 2.0]) == {"loss": "loss (mean of last 2) 1.500"}
