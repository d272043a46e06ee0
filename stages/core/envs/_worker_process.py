"""Parent side of a JSON-lines worker process (the EnvScaler and BFCL workers).

A worker is a script that reads one JSON request per line on stdin and writes one JSON reply per
line on stdout. This handle starts it (in its own session, stderr kept in a temporary file),
sends requests with a wall-clock limit per reply, and kills it (the whole sandbox when it runs
inside one of :mod:`stages.core.exec.isolation`) on a timeout, a dead channel or a fatal reply. The
worker scripts themselves stay stdlib-only on their child side; only the parent imports this.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any


class WorkerFailure(Exception):
    """The worker could not answer: it timed out, died, sent a fatal or unreadable reply, or
    failed to start. It has been killed."""


class WorkerProcess:
    """Handle on one worker process (started at construction).

    Args:
        argv: the command (already wrapped by :func:`stages.core.exec.isolation.wrap` when isolated).
        isolated: whether ``argv`` runs inside the OS sandbox (then the sandbox is killed as a
            whole on close).
        env: the worker's environment (None = inherit).
        preexec_fn: run in the child before exec (e.g. to set rlimits when not isolated).
        strict: every reply whose ``status`` is not ``"ok"`` is fatal (default: only
            ``"fatal"`` is; other statuses are returned to the caller).

    Raises:
        OSError: the process could not be started.
    """

    def __init__(self, argv: list[str], *, isolated: bool, env: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None, strict: bool = False) -> None:
        self.isolated, self.strict = isolated, strict
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      env=env, start_new_session=True, preexec_fn=preexec_fn)
        self._buf = b""
        self.alive = True

    def running(self) -> bool:
        """Whether the worker process is alive and usable."""
        return self.alive and self._proc.poll() is None

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request; wait at most ``timeout_s`` seconds for its reply and return it.

        Raises:
            WorkerFailure: timeout (``"timed out after N s"``), dead worker, unreadable or fatal
                reply (see ``strict``); the worker is killed first.
        """
        if not self.alive:
            raise WorkerFailure("worker is closed")
        try:
            self._proc.stdin.write(json.dumps(payload).encode() + b"\n")
            self._proc.stdin.flush()
            reply = json.loads(self._read_line(timeout_s))
        except (OSError, ValueError) as err:
            raise self._fail(f"worker channel broken: {err}") from None
        status = reply.get("status")
        if status == "fatal" or (self.strict and status != "ok"):
            raise self._fail(str(reply.get("error", "fatal worker error"))[:300])
        return reply

    def _read_line(self, timeout_s: float) -> bytes:
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"timed out after {timeout_s:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise self._fail(self._death_reason())
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _death_reason(self) -> str:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip().splitlines()[-1:]
        return f"worker died (exit code {code})" + (f": {tail[0][:300]}" if tail else "")

    def _fail(self, reason: str) -> WorkerFailure:
        self.close()
        return WorkerFailure(reason)

    def close(self) -> None:
        """Kill the worker (its whole sandbox when isolated) and release its pipes. Idempotent."""
        if not self.alive:
            return
        self.alive = False
        if self.isolated:
            from stages.core.exec import isolation

            isolation.kill(self._proc)  # the whole sandbox, setsid'd children included
        else:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._stderr.close()
