"""Parent side of a JSON-lines worker process (the EnvScaler and BFCL workers).

A worker is a script that reads one JSON request per line on stdin and writes one JSON reply per
line on stdout. This handle starts it (in its own session, stderr kept in a temporary file),
sends requests with a wall-clock limit per reply, and kills it (the whole sandbox when it runs
inside one of :mod:`stages.core.exec.isolation`) on a timeout, a dead channel or a fatal reply.

Child side, this file is also the program a worker runs (``python -I -B this_file WORKER_SCRIPT
ARGS...``, stdlib only; :data:`IN_SANDBOX` in the sandbox): :func:`serve` loads the worker script,
which defines ``prepare(args)``, ``Session`` (whose ``handle(request) -> reply`` answers one
request), ``MEMORY_ERROR`` (the fatal reply's text when memory runs out) and ``fatal_text(err)``
(the fatal reply's text for any other exception).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

IN_SANDBOX = "/lopd/worker_process.py"  # where this file is bound inside a worker's sandbox


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
        from stages.core.exec import isolation

        isolation.stop(self._proc, self.isolated)  # isolated: the whole sandbox, setsid'd children included
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._stderr.close()


# ----------------------------------------------------------------------------- child side


def serve(script: str, args: list[str]) -> None:
    """Run the worker ``script``: answer each JSON request line on fd 0 with one JSON reply line on fd 1.

    Calls the script's ``prepare(args)``, then points fds 0/1 at /dev/null (so the code the worker
    runs cannot corrupt the channel, which keeps duplicates of them), then serves until stdin closes.
    An exception out of ``Session.handle`` becomes a ``{"status": "fatal"}`` reply, after which the
    parent kills the worker.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("lopd_worker", script)
    worker = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = worker
    spec.loader.exec_module(worker)
    worker.prepare(args)
    channel_in = os.fdopen(os.dup(0), "rb")
    channel_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    session = worker.Session()
    for line in channel_in:
        try:
            reply = session.handle(json.loads(line))
        except MemoryError:
            reply = {"status": "fatal", "error": worker.MEMORY_ERROR}
        except Exception as err:  # noqa: BLE001 -- reported to the parent, which kills this worker
            reply = {"status": "fatal", "error": worker.fatal_text(err)}
        channel_out.write(json.dumps(reply).encode() + b"\n")
        channel_out.flush()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
