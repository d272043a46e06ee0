"""Worker process that executes BFCL multi-turn API calls and BFCL's checker, away from the lopd process.

The call strings are checked literals (:func:`stages.envs.bfcl_multi.check_call_string`), but
their values are model-chosen: ``power(base=10, exponent=10**9)`` computes for minutes, a long
``mkdir``/``echo`` sequence can grow memory. So BFCL's executor (``execute_multi_turn_func_call``)
and checker (``multi_turn_checker``) run here, in a separate interpreter (``python -I -B _worker_process.py this_file``,
stdlib + the ``bfcl`` package), with an address-space cap; the parent waits at most a wall-clock
limit per request and kills the worker when it is exceeded. Where OS isolation is available the
worker also runs in the sandbox of :mod:`stages.core.exec.isolation` (uid 65534, no network, read-only
filesystem, empty environment); where it is not, it runs as a plain subprocess (no refusal: BFCL's
simulated APIs are package code, not model code).

Workers are pooled (:func:`acquire` / :func:`release_worker`): an episode takes an idle worker and
gives it back when it ends, so the interpreter start (~0.3 s) is paid once per concurrent episode,
not per episode. API instances live in the package's module globals keyed by a unique model name,
as in-process before; ``release`` deletes them.

Protocol: one JSON object per line, requests on the child's stdin, replies on its stdout (fds 0/1
point at /dev/null for the API code). Requests and replies:

- ``{"op": "start", "model", "id", "classes", "config", "long_context"}`` -> ``{"status": "ok"}``
- ``{"op": "call", "model", "call"}`` -> ``{"status": "ok", "result": text}`` (a raising call is
  BFCL's own ``"Error during execution: ..."`` text)
- ``{"op": "verdict", "decoded", "ground_truth", "entry", "category", "model"}`` ->
  ``{"status": "ok", "verdict": {"valid", "error_type", "error_message"}}``
- ``{"op": "release", "model"}`` -> ``{"status": "ok"}``; ``{"op": "ping"}`` -> ``{"status": "ok"}``
- any request: ``{"status": "fatal", "error": text}`` when the worker cannot go on.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stages.envs._worker_process import WorkerProcess

MEMORY_MB = 4096
MAX_RESULT_CHARS = 1_000_000  # an observation longer than this is cut (the checker sees the full text)
POOL_SIZE = 16
_IN_SANDBOX = "/lopd/bfcl_worker.py"


def start_bfcl_worker(memory_mb: int = MEMORY_MB) -> "WorkerProcess":
    """Start one BFCL worker process (a strict :class:`WorkerProcess`: only ``ok`` replies pass).

    In the OS sandbox where it is available, else a plain subprocess with the same memory cap
    (no refusal: BFCL's simulated APIs are package code, not model code).

    Args:
        memory_mb: address-space cap (``RLIMIT_AS``) of the worker, in MiB.

    Raises:
        OSError: the process could not be started.
    """
    from stages.envs import _worker_process
    from stages.envs._worker_process import WorkerProcess
    from stages.core.exec import isolation

    serve = os.path.abspath(_worker_process.__file__)  # the child's program: it loads this file
    if isolation.available():
        limits = isolation.Limits(memory_mb=int(memory_mb), file_bytes=16 * 2**20)
        argv = isolation.wrap([sys.executable, "-I", "-B", _worker_process.IN_SANDBOX, _IN_SANDBOX],
                              ro_binds={serve: _worker_process.IN_SANDBOX, os.path.abspath(__file__): _IN_SANDBOX},
                              limits=limits)
        return WorkerProcess(argv, isolated=True, env=isolation.base_env(), strict=True)
    return WorkerProcess([sys.executable, "-I", "-B", serve, os.path.abspath(__file__)],
                         isolated=False, env=isolation.base_env(),
                         preexec_fn=lambda: _set_memory_limit(int(memory_mb)), strict=True)


def _set_memory_limit(memory_mb: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


_pool: list[WorkerProcess] = []
_pool_lock = threading.Lock()


def acquire() -> WorkerProcess:
    """An idle pooled worker, or a new one. Give it back with :func:`release_worker`."""
    with _pool_lock:
        while _pool:
            worker = _pool.pop()
            if worker.running():
                return worker
            worker.close()
    return start_bfcl_worker()


def release_worker(worker: WorkerProcess) -> None:
    """Return ``worker`` to the pool (its episodes' state already released), or close it if dead or
    the pool is full."""
    with _pool_lock:
        if worker.running() and len(_pool) < POOL_SIZE:
            _pool.append(worker)
            return
    worker.close()


@atexit.register
def close_pool() -> None:
    """Kill every idle pooled worker (also run at interpreter exit)."""
    with _pool_lock:
        workers, _pool[:] = list(_pool), []
    for worker in workers:
        worker.close()


# ----------------------------------------------------------------------------- child side


class Session:
    def __init__(self) -> None:
        self.episodes: dict[str, dict[str, Any]] = {}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "start":
            self.episodes[req["model"]] = req
            return {"status": "ok"}
        if op == "call":
            from bfcl.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

            ep = self.episodes[req["model"]]
            results, _ = execute_multi_turn_func_call([req["call"]], ep["config"], ep["classes"], ep["model"],
                                                      ep["id"], long_context=ep["long_context"], is_evaL_run=False)
            result = results[0]
            if len(result) > MAX_RESULT_CHARS:
                result = result[:MAX_RESULT_CHARS] + f"... [cut: {len(result)} characters]"
            return {"status": "ok", "result": result}
        if op == "verdict":
            from bfcl.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

            try:
                verdict = multi_turn_checker(req["decoded"], req["ground_truth"], req["entry"], req["category"],
                                             req["model"])
            finally:
                _release(req["model"])
            return {"status": "ok", "verdict": {"valid": bool(verdict["valid"]),
                                                "error_type": str(verdict.get("error_type", "")),
                                                "error_message": str(verdict.get("error_message", ""))[:2000]}}
        if op == "ping":
            return {"status": "ok"}
        if op == "release":
            self.episodes.pop(req["model"], None)
            _release(req["model"])
            return {"status": "ok"}
        return {"status": "fatal", "error": f"unknown op {op!r}"}


def _release(model_name: str) -> None:
    """Delete every API instance the package stored in its globals under ``model_name``."""
    from bfcl.eval_checker.multi_turn_eval import multi_turn_utils

    store = vars(multi_turn_utils)
    for key in [k for k in store if k.startswith(model_name + "_")]:
        del store[key]


MEMORY_ERROR = "MemoryError: exceeded the worker's memory limit"


def fatal_text(err: Exception) -> str:
    """The fatal reply's text for an exception out of :meth:`Session.handle`."""
    return f"{type(err).__name__}: {str(err)[:300]}"


def prepare(_args: list[str]) -> None:
    """Import the API modules before the first (timed) request."""
    import importlib

    from bfcl.eval_checker.multi_turn_eval.multi_turn_utils import CLASS_FILE_PATH_MAPPING

    for module in CLASS_FILE_PATH_MAPPING.values():
        importlib.import_module(module)
