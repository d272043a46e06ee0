"""Progress of a long stage (evaluate, collect, sft, coldstart) on a terminal and in a log file.

On a terminal :class:`StageProgress` is rich's live :class:`rich.progress.Progress`. When the
console is no terminal (output redirected to a file, a pipe, `nohup`), a live bar prints nothing
until it stops, so a long run is silent for its whole length; there it prints one plain line when
a task starts, then every ``every`` seconds while it runs (also when no item finished meanwhile: a
batch of long episodes still shows it is alive) and when it finishes::

    bfcl-v3: 120/800 (15%), success 0.120 (mean reward 0.150), 3412 actions; elapsed 0:04:10, ETA 0:23:36

The ETA is the mean time per item done since the start (a resumed run's earlier items excluded)
times the items left.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task, TaskID, TextColumn

EVERY_SECONDS = 30.0  # plain lines at most this often (and at a task's start and end)


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


class StageProgress(Progress):
    """rich's Progress, or plain timed lines with an ETA on a console that is no terminal (module
    docstring). Takes Progress's arguments; ``every``: seconds between plain lines."""

    def __init__(self, *columns: str | ProgressColumn, console: Console | None = None,
                 every: float = EVERY_SECONDS, **kwargs) -> None:
        console = console or Console()
        self.plain = not console.is_terminal and not kwargs.get("disable", False)
        if self.plain:
            kwargs["disable"] = True  # no live display: the lines below instead
        super().__init__(*columns, console=console, **kwargs)
        self.every = every
        self._last: dict[TaskID, float] = {}  # task -> monotonic time of its last line
        self._ended: set[TaskID] = set()  # tasks whose last line is printed
        self._start: dict[TaskID, tuple[float, float]] = {}  # task -> (monotonic time, completed) at its start
        self._stop_beat = threading.Event()
        self._beat: threading.Thread | None = None

    def start(self) -> None:
        super().start()
        if self.plain and self.every > 0 and self._beat is None:  # every 0: a line per update only
            self._stop_beat.clear()
            self._beat = threading.Thread(target=self._heartbeat, name="progress-lines", daemon=True)
            self._beat.start()

    def stop(self) -> None:
        if self._beat is not None:
            self._stop_beat.set()
            self._beat.join()
            self._beat = None
        super().stop()

    def _heartbeat(self) -> None:
        """Print the line of every running task whose last line is ``every`` seconds old."""
        while not self._stop_beat.wait(min(self.every, 1.0)):
            for task_id in list(self._last):
                task = self._tasks.get(task_id)
                if task is None or task_id in self._ended or (task.total is not None and task.completed >= task.total):
                    continue
                if time.monotonic() - self._last[task_id] >= self.every:
                    self._log(task_id)

    def add_task(self, description: str, start: bool = True, total: float | None = 100.0, completed: int = 0,
                 visible: bool = True, **fields) -> TaskID:
        task_id = super().add_task(description, start=start, total=total, completed=completed, visible=visible,
                                   **fields)
        if self.plain:
            self._start[task_id] = (time.monotonic(), float(completed))
            self._log(task_id)
        return task_id

    def update(self, task_id: TaskID, **kwargs) -> None:
        super().update(task_id, **kwargs)
        if self.plain:
            task = self._tasks[task_id]
            finished = task.total is not None and task.completed >= task.total
            if (finished and task_id not in self._ended) or time.monotonic() - self._last[task_id] >= self.every:
                self._log(task_id)
                if finished:
                    self._ended.add(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def line(self, task: Task) -> str:
        """The plain line of ``task``: description, done/total (percent), the text columns but the
        description, elapsed time and ETA."""
        done = int(task.completed)
        head = f"{task.description}: {done}/{int(task.total)} ({100 * task.completed / task.total:.0f}%)" \
            if task.total else f"{task.description}: {done}"
        texts = []
        for column in self.columns:
            if isinstance(column, TextColumn) and "task.description" not in column.text_format:
                texts.append(column.text_format.format(task=task))
            elif isinstance(column, str) and "task.description" not in column:
                texts.append(column.format(task=task))
        started, done_before = self._start.get(task.id, (time.monotonic(), 0.0))
        elapsed = time.monotonic() - started
        clock = f"elapsed {_clock(elapsed)}"
        made = task.completed - done_before
        if task.total and made > 0 and task.completed < task.total:
            clock += f", ETA {_clock(elapsed / made * (task.total - task.completed))}"
        return ", ".join([head, *(t for t in texts if t.strip())]) + f"; {clock}"

    def _log(self, task_id: TaskID) -> None:
        self._last[task_id] = time.monotonic()
        self.console.print(self.line(self._tasks[task_id]), markup=False, highlight=False, soft_wrap=True)
