"""Isolated worker process that runs one EnvScaler environment instance.

EnvScaler environments are Python classes shipped as source text (``env_class_code``) and their
check functions are source text too. Both run here, in a separate interpreter started per episode
(``python -I _worker_process.py this_file.py``, stdlib only), never in the caller's process,
inside the OS sandbox of :mod:`stages.core.exec.isolation` (uid 65534, own PID / network / mount
namespaces, read-only filesystem, empty environment, rlimits; without isolation only with
``--unsafe-exec``). The child
also caps its own address space (``RLIMIT_AS``) and CPU time (``RLIMIT_CPU``); the parent enforces
a wall-clock timeout per request and kills the whole sandbox when it is exceeded.

Protocol: one JSON object per line. The parent writes requests on the child's stdin and reads
replies from its stdout; the child points fds 0/1 at /dev/null for the environment code, so a
stray ``print`` or ``input`` in that code cannot corrupt the channel. Requests and replies:

- ``{"op": "init", "code", "class_name", "init_config"}`` -> ``{"status": "ok"}``
- ``{"op": "call", "name", "args", "official"?, "watch"?}`` -> ``{"status": "ok", "result": text,
  "refused": bool, "changed"?: bool}`` or ``{"status": "error", "error": text}`` (the tool raised).
  With ``"official": true`` (EnvScaler's own rules) a name the instance lacks gets ``{"status": "invalid"}`` and the result text is
  ``str(result)``; otherwise the result is JSON text (strings as they are). ``refused``: the tool
  returned a dict whose ``success`` is False (the environment turned the request down); with
  ``"watch": true``, ``changed``: whether the call changed the instance's state (the paths it
  changed are kept for the ``exact`` verdict)
- ``{"op": "score", "checks": [source, ...], "timeout_s", "reference"?: [{"name", "args"}, ...]}`` ->
  ``{"status": "ok", "results": [{"passed": bool, "error": text | null}, ...]}``; with ``reference``
  (the ``exact`` rules) also ``"exact": {"equal": bool, "outside": [path, ...], "reference_error":
  text | null}`` from :func:`exact_verdict` against a fresh instance that ran the reference calls

Any request may instead get ``{"status": "fatal", "error": text}`` (the class failed to load or
construct, or memory ran out): the episode cannot continue.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stages.envs._worker_process import WorkerProcess


_WORKER_IN_SANDBOX = "/lopd/envscaler_worker.py"  # where this file is bound inside the sandbox


def start_env_worker(memory_mb: int, cpu_s: int) -> "WorkerProcess":
    """Start one worker process for an EnvScaler episode (a :class:`WorkerProcess`).

    Args:
        memory_mb: address-space cap of the child (``RLIMIT_AS``), in MiB.
        cpu_s: CPU-seconds cap of the child (``RLIMIT_CPU``), a backstop if the parent dies.

    Raises:
        IsolationUnavailable: no OS isolation here and ``--unsafe-exec`` was not given.
    """
    from stages.envs import _worker_process
    from stages.envs._worker_process import WorkerProcess
    from stages.core.exec import isolation  # parent side only: the child runs this file stdlib-only

    args = [str(int(memory_mb)), str(int(cpu_s))]
    serve = os.path.abspath(_worker_process.__file__)  # the child's program: it loads this file
    isolated = isolation.require()  # raises IsolationUnavailable unless isolated or --unsafe-exec
    if isolated:
        limits = isolation.Limits(cpu_s=int(cpu_s), memory_mb=int(memory_mb), file_bytes=16 * 2**20)
        binds = {serve: _worker_process.IN_SANDBOX, os.path.abspath(__file__): _WORKER_IN_SANDBOX}
        argv = isolation.wrap([sys.executable, "-I", "-B", _worker_process.IN_SANDBOX, _WORKER_IN_SANDBOX, *args],
                              ro_binds=binds, limits=limits)
        return WorkerProcess(argv, isolated=True, env=isolation.base_env())
    return WorkerProcess([sys.executable, "-I", serve, os.path.abspath(__file__), *args], isolated=False)


# ----------------------------------------------------------------------------- child side


class _CheckTimeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _CheckTimeout()


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _snapshot(instance: Any) -> dict[str, Any]:
    """The instance's state as EnvScaler defines it: ``vars(instance)`` minus dunders, deep-copied."""
    import copy

    return copy.deepcopy({k: v for k, v in vars(instance).items() if not (k.startswith("__") and k.endswith("__"))})


def _construct(cls: type, init_config: dict[str, Any]) -> Any:
    """Build the instance the way EnvScaler does: ``cls(config)`` (or ``cls()`` when the
    constructor takes no argument), then set every config key as an attribute."""
    import copy
    import inspect

    try:
        takes_config = len(inspect.signature(cls).parameters) > 0
    except (TypeError, ValueError):
        takes_config = True
    instance = cls(copy.deepcopy(init_config)) if takes_config else cls()
    for key, value in copy.deepcopy(init_config).items():
        setattr(instance, key, value)
    return instance


def state_diff(a: Any, b: Any, path: tuple = ()) -> list[tuple]:
    """Paths (tuples of keys) where states ``a`` and ``b`` differ: dicts are compared key by key
    (a key on one side only is a difference at its path), anything else (lists included) as a
    whole value. Pure; ``[]`` when ``a == b``."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[tuple] = []
        for key in sorted(set(a) | set(b), key=repr):
            if key not in a or key not in b:
                out.append(path + (key,))
            else:
                out.extend(state_diff(a[key], b[key], path + (key,)))
        return out
    return [] if a == b else [path]


def exact_verdict(initial: dict[str, Any], reference: dict[str, Any], final: dict[str, Any],
                  touched: set[tuple] = frozenset(), reference_touched: set[tuple] = frozenset()) -> dict[str, Any]:
    """The ``exact`` rules' comparison of an episode's final state with the reference's.

    Args:
        initial, reference, final: states (``vars`` snapshots) before the episode, after the
            reference actions, after the episode.
        touched: paths the episode's calls changed on the way (a change later undone included).
        reference_touched: the same for the reference actions.

    Returns:
        ``{"equal": final == reference, "outside": paths (as lists of key reprs) where ``final``
        differs from ``reference``, or that the episode touched, and that lie outside every path
        the reference changed or touched}``: a difference inside such a path (at it or below it) is a
        wrong value of a wanted change; any other is a change the task did not ask for, even if undone.
    """
    changed = set(state_diff(initial, reference)) | set(reference_touched)
    candidates = sorted(set(state_diff(final, reference)) | set(touched), key=repr)
    outside = [p for p in candidates if not any(p[:len(q)] == q for q in changed)]
    return {"equal": final == reference, "outside": [[repr(k) for k in p] for p in outside]}


class Session:
    def __init__(self) -> None:
        self.instance: Any = None
        self.initial_state: dict[str, Any] = {}
        self.build: tuple[type, dict[str, Any]] | None = None  # (class, init_config): a second instance for ``exact``
        self.touched: set[tuple] = set()  # paths the watched calls changed (``exact``)

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "init":
            namespace: dict[str, Any] = {"__name__": "envscaler_env"}
            exec(compile(req["code"], "<env_class_code>", "exec"), namespace)
            cls = namespace.get(req["class_name"])
            if not isinstance(cls, type):
                return {"status": "fatal", "error": f"class {req['class_name']!r} not defined by env_class_code"}
            self.instance = _construct(cls, req["init_config"])
            self.initial_state = _snapshot(self.instance)
            self.build = (cls, req["init_config"])
            return {"status": "ok"}
        if op == "call":
            if req.get("official") and not hasattr(self.instance, req["name"]):
                return {"status": "invalid"}
            before = _snapshot(self.instance) if req.get("watch") else None
            try:
                result = getattr(self.instance, req["name"])(**req["args"])
            except MemoryError:
                raise
            except Exception as err:  # a tool that raises is an observation, not a crash
                return {"status": "error", "error": f"{type(err).__name__}: {err}"}
            refused = isinstance(result, dict) and result.get("success") is False
            reply = {"status": "ok", "result": str(result) if req.get("official") else _render(result), "refused": refused}
            if before is not None:
                changes = state_diff(before, _snapshot(self.instance))
                self.touched.update(changes)
                reply["changed"] = bool(changes)
            return reply
        if op == "score":
            final_state = _snapshot(self.instance)
            reply = {"status": "ok", "results": [self._check(src, final_state, req["timeout_s"]) for src in req["checks"]]}
            if req.get("reference") is not None:
                reply["exact"] = self._exact(req["reference"], final_state)
            return reply
        return {"status": "fatal", "error": f"unknown op {op!r}"}

    def _exact(self, calls: list[dict[str, Any]], final_state: dict[str, Any]) -> dict[str, Any]:
        """:func:`exact_verdict` of ``final_state`` against a fresh instance that ran ``calls``
        (``reference_error``: the first reference call that raised or was refused, else None)."""
        reference = _construct(*self.build)
        error, touched = None, set()
        for call in calls:
            before = _snapshot(reference)
            try:
                result = getattr(reference, call["name"])(**call["args"])
            except MemoryError:
                raise
            except Exception as err:  # a broken reference is reported, the task then cannot succeed
                result = {"success": False, "error": f"{type(err).__name__}: {err}"}
            touched.update(state_diff(before, _snapshot(reference)))
            if error is None and isinstance(result, dict) and result.get("success") is False:
                error = f"{call['name']}: {result.get('error')}"
        verdict = exact_verdict(self.initial_state, _snapshot(reference), final_state, self.touched, touched)
        return dict(verdict, reference_error=error)

    def _check(self, source: str, final_state: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        import builtins
        import copy

        namespace: dict[str, Any] = {"__builtins__": builtins, "initial_state": copy.deepcopy(self.initial_state)}
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            exec(compile(source, "<check_func>", "exec"), namespace)
            func = namespace.get("check_func")
            if not callable(func):
                return {"passed": False, "error": "source defines no check_func"}
            result = func(copy.deepcopy(final_state))
        except _CheckTimeout:
            return {"passed": False, "error": f"check timed out after {timeout_s:g} s"}
        except MemoryError:
            raise
        except Exception as err:  # a check that raises counts as failed
            return {"passed": False, "error": f"{type(err).__name__}: {err}"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if not isinstance(result, bool):
            return {"passed": False, "error": f"check_func returned {type(result).__name__}, not bool"}
        return {"passed": result, "error": None}


MEMORY_ERROR = "MemoryError: environment exceeded the memory limit"


def fatal_text(err: Exception) -> str:
    """The fatal reply's text for an exception out of :meth:`Session.handle` (environment source
    that fails to load or construct)."""
    return f"{type(err).__name__}: {err}"


def prepare(args: list[str]) -> None:
    """Cap this process's address space and CPU time (``args``: MiB, seconds); arm the check timer."""
    import resource

    memory_mb, cpu_s = int(args[0]), int(args[1])
    for limit, value in ((resource.RLIMIT_AS, memory_mb << 20), (resource.RLIMIT_CPU, cpu_s)):
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value if hard == resource.RLIM_INFINITY else hard))
    signal.signal(signal.SIGALRM, _alarm)
