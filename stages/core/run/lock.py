"""One process per run folder: an exclusive lock on ``OUT/.lock``.

A training stage takes the lock when it checks its run folder
(:func:`stages.core.run.runs.open_run`), before anything is written. A second process on the
same folder is refused at once, naming the first one's pid and command, instead of wasting a
step and dying on a duplicate store row. The lock is an advisory ``flock`` on an open file, so
the kernel drops it when the holding process ends (a ``kill -9`` leaves no stale lock); the
file keeps the holder's pid and command line for the message.

Within one process the lock is taken once and held until the process exits (a resumed run in
the same process, e.g. ``lopd study``, passes). A process whose ancestor holds the lock passes
too: ``--nproc N`` checks the folder in the launcher, then rank 0 of torchrun's workers opens it
again.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

import psutil

LOCK_FILE = ".lock"
_held: dict[str, int] = {}  # resolved run folder -> the open file descriptor holding its lock


def _holder(path: Path) -> tuple[int | None, str]:
    """The pid and description written in lock file ``path`` ((None, "") when unreadable)."""
    try:
        pid_text, _, what = path.read_text().partition("\n")
        return int(pid_text), what.strip()
    except (OSError, ValueError):
        return None, ""


def lock_run_folder(out: Path, stage: str) -> None:
    """Hold the lock of run folder ``out`` (created if missing) for the rest of this process.

    Args:
        out: the run folder.
        stage: the stage taking it (written into the lock file for the message).

    Raises:
        ValueError: another live process holds it: ``"runs/x is in use by process 4242
            (lopd distill ..., since 13:02:11 UTC): wait for it to end or choose another --out"``.
    """
    out = Path(out)
    key = os.path.realpath(out)
    if key in _held:
        return
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid, what = _holder(path)
        if pid is not None and pid in {p.pid for p in psutil.Process().parents()}:
            return  # our launcher holds it (--nproc)
        who = f"process {pid}" if pid is not None else "another process"
        raise ValueError(f"{out} is in use by {who}{f' ({what})' if what else ''}: "
                         "wait for it to end or choose another --out") from None
    command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv)) or stage
    since = time.strftime("%H:%M:%S UTC", time.gmtime())
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n{stage}: {command[:200]}, since {since}\n".encode(), 0)
    _held[key] = fd
