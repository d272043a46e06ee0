"""OS-level isolation for untrusted (model-generated) programs, built on bubblewrap.

Every untrusted program (code-benchmark answers, LiveCodeBench solutions, EnvScaler environment
classes and check functions) runs as ``bwrap <namespaces and mounts> -- <setpriv> -- argv`` where:

* **namespaces**: fresh PID, network, IPC, UTS and (if possible) cgroup namespaces. The network
  namespace holds only a downed loopback (no route anywhere, not even to the host's 127.0.0.1);
  in the PID namespace bwrap's reaper is PID 1, so killing bwrap kills every process of the
  program, ``setsid``/double-forked children included (``--die-with-parent`` as well).
* **filesystem**: a new root (read-only tmpfs) holding read-only binds of ``/usr`` (and the
  ``/bin``, ``/lib*``, ``/sbin`` links or dirs), a few loader files from ``/etc``, the Python
  installation and virtualenv that run the program, and the files the caller names; a fresh
  ``/proc`` of the new PID namespace (the host's processes, e.g. the parent's
  ``/proc/<pid>/environ``, are not visible); a minimal ``/dev``; and the only writable place,
  :data:`WORKDIR`, a size-capped tmpfs that vanishes with the sandbox. The project directory, home
  directories and the host's ``/tmp`` are simply not there. ``/proc/self/mountinfo`` still names
  each bind's host source path (a kernel record of the mount, not closed here): the same paths
  for the system and Python directories, and the host names of the caller's binds (the program's
  temporary file, a bench grader's driver and folders): names only, nothing more is reachable
  through them. A caller may add a private writable
  ``/dev/shm`` tmpfs (``shm_mb``, for ``multiprocessing``) and writable binds of output folders it
  made for this one run (``rw_binds``; what the program leaves there is untrusted).
* **credentials**: as root, ``setpriv`` switches to uid/gid 65534 (nobody) with no supplementary
  groups, an empty capability bounding set and ``no_new_privs``; as an ordinary user, bwrap's user
  namespace maps the caller to uid 65534 with no capabilities and no further user namespaces.
* **environment**: cleared; only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and thread-count caps.
* **resource limits** (set by ``prlimit`` inside the sandbox, just before the program):
  CPU seconds, address space, file size, processes of uid 65534, no core dumps.
* **whole-tree memory cap** (:class:`stages.core.exec.tree_memory.TreeMemoryCap`, applied by the
  callers around the command): a cgroup v2 or v1 memory group holding every process of the
  program, else a watchdog over the tree's summed memory; the whole tree is killed on overflow.

The probe runs once per process (cached); set ``LOPD_SANDBOX_ISOLATION=off`` before the first
use (or call :func:`reset` after setting it) to simulate a machine without isolation.
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # nobody
WORKDIR = "/sandbox"
WORK_MB = 64  # size of the writable tmpfs at WORKDIR
NPROC = 256  # RLIMIT_NPROC for uid 65534 (shared by all concurrent sandboxes)
OFF_VAR = "LOPD_SANDBOX_ISOLATION"
UNSAFE_VAR = "LOPD_UNSAFE_EXEC"  # "1": same as --unsafe-exec (for stages without the flag)
# Environments / benches whose episodes execute model-written code (checked before a run starts).
RUNS_MODEL_CODE = frozenset({"code", "livecodebench", "taco", "envscaler", "humaneval-plus", "mbpp-plus"})

_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_unsafe_exec = False


class IsolationUnavailable(BaseException):
    """Untrusted code was about to run, OS isolation is unavailable and ``--unsafe-exec`` was not given.

    A ``BaseException`` on purpose: the rollout loop turns an ``Exception`` from an environment into
    one failed episode; this must instead stop the run (the CLI prints it as one error line).
    """


@dataclass(frozen=True)
class Limits:
    """Resource limits applied inside the sandbox (``None``: leave unlimited).

    Attributes:
        cpu_s: RLIMIT_CPU soft limit in seconds (hard limit one second above).
        memory_mb: RLIMIT_AS in MiB.
        file_bytes: RLIMIT_FSIZE in bytes (also caps what the program can write to stdout files).
        nproc: RLIMIT_NPROC (processes of the sandbox uid).
    """

    cpu_s: int | None = None
    memory_mb: int | None = None
    file_bytes: int | None = None
    nproc: int | None = NPROC


def set_unsafe_exec(allowed: bool) -> None:
    """Allow (``True``) or forbid (``False``, default) running untrusted code *without* isolation.

    Called by the ``collect`` and ``evaluate`` stages with their ``--unsafe-exec`` flag (distill's
    preflight with ``False``: it has no flag, only ``LOPD_UNSAFE_EXEC``). It only
    matters where isolation is unavailable; where it is available it is always used.
    """
    global _unsafe_exec
    _unsafe_exec = bool(allowed)


def unsafe_exec_allowed() -> bool:
    """Whether ``--unsafe-exec`` (or ``LOPD_UNSAFE_EXEC=1``) is in effect for this process."""
    return _unsafe_exec or os.environ.get(UNSAFE_VAR, "").strip() == "1"


def prepare(name: str, unsafe_exec: bool) -> None:
    """Stage entry check: record ``--unsafe-exec`` and, if ``name`` (an environment or bench) runs
    model code, fail now rather than after the model has loaded.

    Raises:
        IsolationUnavailable: as :func:`require`.
    """
    set_unsafe_exec(unsafe_exec)
    if name in RUNS_MODEL_CODE:
        require()


def reset() -> None:
    """Forget the cached probe result and the warning given (tests; after changing ``LOPD_SANDBOX_ISOLATION``)."""
    _probe.cache_clear()
    _warn_unisolated.cache_clear()


def unavailable_reason() -> str | None:
    """Why OS isolation cannot be used here (one line), or ``None`` when it works. Probed once."""
    return _probe()[1]


def available() -> bool:
    """Whether untrusted programs run under OS isolation on this machine (probed once, cached)."""
    return _probe()[1] is None


def require() -> bool:
    """Check, before running untrusted code, that it may run; returns whether it will be isolated.

    Returns:
        ``True`` when isolation is available, ``False`` when it is not but ``--unsafe-exec`` was
        given (the caller then falls back to its in-process guards).

    Raises:
        IsolationUnavailable: isolation is unavailable and ``--unsafe-exec`` was not given. The
            message is one line naming the cause and the two ways out.
    """
    reason = unavailable_reason()
    if reason is None:
        return True
    if unsafe_exec_allowed():
        _warn_unisolated(reason)
        return False
    raise IsolationUnavailable(
        f"cannot isolate model code here ({reason}); install bubblewrap, or run it unisolated with "
        f"--unsafe-exec (collect, evaluate) or {UNSAFE_VAR}=1 (distill and the other stages)")


@functools.cache
def _warn_unisolated(reason: str) -> None:
    """Say once per process that model code runs without OS isolation (``--unsafe-exec``)."""
    warnings.warn(f"model code runs WITHOUT OS isolation ({reason}): --unsafe-exec / {UNSAFE_VAR}=1 is in effect",
                  RuntimeWarning, stacklevel=3)


def _python_dirs() -> list[str]:
    """Directories the sandboxed interpreter needs: its installation and virtualenv (resolved)."""
    dirs: list[str] = []
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    for d in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(exe_dir)):
        real = os.path.realpath(d)
        if real != "/" and os.path.isdir(real):
            dirs.append(real)
    dirs.sort(key=len)
    kept: list[str] = []
    for d in dirs:
        if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in kept + ["/usr"]):
            kept.append(d)
    return kept


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a", "/a/b"]`` (directories the bind at ``path`` needs above it)."""
    parts = os.path.normpath(path).strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


def _limit_args(limits: Limits) -> list[str]:
    out = ["--core=0"]
    if limits.cpu_s is not None:
        out.append(f"--cpu={int(limits.cpu_s)}:{int(limits.cpu_s) + 1}")
    if limits.memory_mb is not None:
        out.append(f"--as={int(limits.memory_mb) * 2**20}")
    if limits.file_bytes is not None:
        out.append(f"--fsize={int(limits.file_bytes)}")
    if limits.nproc is not None:
        out.append(f"--nproc={int(limits.nproc)}")
    return out


def _command(tools: tuple[str, str, str], root: bool, argv: Sequence[str], ro_binds: Mapping[str, str],
             limits: Limits, env: Mapping[str, str], work_mb: int, rw_binds: Mapping[str, str] | None = None,
             shm_mb: int = 0) -> list[str]:
    bwrap, setpriv, prlimit = tools
    cmd = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
    if not root:
        cmd += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns",
                "--cap-drop", "ALL"]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    for path in _ETC_FILES:
        cmd += ["--ro-bind-try", path, path]
    binds = [(path, path) for path in _python_dirs()] + list(ro_binds.items())
    writable = list((rw_binds or {}).items())
    parents = sorted({p for _, dest in binds + writable for p in _ancestors(dest)}, key=len)
    for path in parents:  # created 0755 (bwrap would otherwise make them 0700 as root: no access)
        cmd += ["--perms", "0755", "--dir", path]
    for src, dest in binds:
        cmd += ["--ro-bind", src, dest]
    for src, dest in writable:
        cmd += ["--bind", src, dest]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    if shm_mb:  # POSIX shared memory / semaphores (multiprocessing) need a writable /dev/shm
        cmd += ["--size", str(int(shm_mb) * 2**20), "--perms", "1777", "--tmpfs", "/dev/shm"]
    cmd += ["--size", str(int(work_mb) * 2**20), "--perms", "1777", "--tmpfs", WORKDIR,
            "--remount-ro", "/", "--chdir", WORKDIR]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    cmd.append("--")
    if root:
        cmd += [setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--"]
    return [*cmd, prlimit, *_limit_args(limits), "--", *argv]


def base_env() -> dict[str, str]:
    """The whole environment of a sandboxed program (nothing is inherited from the parent)."""
    return {"PATH": "/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


_PROBE_CODE = (
    "import os\n"
    "try:\n    open('/probe', 'w')\n    print('writable-root')\nexcept OSError:\n    pass\n"
    "print(os.getuid(), os.getgid(), os.getpid() < 10, os.getcwd())\n"
)


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[tuple[tuple[str, str, str], bool] | None, str | None]:
    """((tool paths, running as root), None) when a sandboxed test program behaves; else (None, reason)."""
    if os.environ.get(OFF_VAR, "").strip().lower() in ("off", "0", "no", "false", "none"):
        return None, f"disabled by {OFF_VAR}=off"
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
    found = {name: shutil.which(name, path=search) for name in ("bwrap", "setpriv", "prlimit")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        return None, f"{missing[0]}: not installed"
    tools = (found["bwrap"], found["setpriv"], found["prlimit"])
    root = os.geteuid() == 0
    cmd = _command(tools, root, [sys.executable, "-I", "-S", "-c", _PROBE_CODE], {}, Limits(cpu_s=10),
                   base_env(), 1)
    try:
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                             env=base_env(), start_new_session=True)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"bwrap: {err}"
    want = f"{SANDBOX_UID} {SANDBOX_UID} True {WORKDIR}"
    if res.returncode != 0 or res.stdout.strip() != want:
        detail = (res.stderr.strip().splitlines() or [res.stdout.strip() or f"exit status {res.returncode}"])[-1]
        return None, f"bwrap: {detail[:200]}"
    return (tools, root), None


def wrap(argv: Sequence[str], *, ro_binds: Mapping[str, str] | None = None, limits: Limits = Limits(),
         env: Mapping[str, str] | None = None, work_mb: int = WORK_MB, rw_binds: Mapping[str, str] | None = None,
         shm_mb: int = 0) -> list[str]:
    """The command line that runs ``argv`` inside the sandbox described in the module docstring.

    Start it with ``subprocess.Popen(cmd, start_new_session=True, env=base_env(), ...)`` and stop it
    with :func:`kill` (which returns once every process of the sandbox is gone). The program's cwd
    is :data:`WORKDIR`.

    Args:
        argv: program and arguments; paths in it must exist inside the sandbox (``sys.executable``
            does; other files go through ``ro_binds``). Never a shell string.
        ro_binds: host path -> path inside the sandbox, bound read-only.
        rw_binds: host path -> path inside the sandbox, bound writable (an output folder made
            for this run only: the program, as uid 65534, can write there -- so the caller must
            treat what it finds there as untrusted, and the host folder must be writable by
            uid 65534 when running as root).
        limits: resource limits for the program.
        env: the program's whole environment (default :func:`base_env`).
        work_mb: size of the writable tmpfs at :data:`WORKDIR` in MiB.
        shm_mb: when non-zero, a writable tmpfs of this size (MiB) at ``/dev/shm`` (needed by
            ``multiprocessing`` locks and shared values); private to the sandbox.

    Returns:
        The argv list to execute (bwrap first).

    Raises:
        IsolationUnavailable: isolation does not work here (regardless of ``--unsafe-exec``;
            callers check :func:`require` first to choose their fallback).
    """
    state, reason = _probe()
    if state is None:
        raise IsolationUnavailable(f"cannot isolate model code here ({reason})")
    tools, root = state
    return _command(tools, root, argv, dict(ro_binds or {}), limits, dict(base_env() if env is None else env), work_mb,
                    dict(rw_binds or {}), int(shm_mb))


def kill(proc: subprocess.Popen, wait_s: float = 10.0) -> int:
    """SIGKILL the sandbox that ``proc`` (a :func:`wrap` command) runs and wait until it is gone.

    Kills the PID namespace's init (bwrap's child): the kernel then kills every process in the
    namespace and bwrap, which waits for that init, exits only once all of them are reaped -- so
    when this returns no process of the program survives (``setsid``/double-forked ones included).
    Falls back to killing bwrap's process group if the init cannot be found in time.

    Returns:
        bwrap's exit status (as ``Popen.wait``).
    """
    deadline = time.monotonic() + wait_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            inits = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        except (OSError, ValueError):
            inits = []
        for pid in inits:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            return proc.wait(timeout=max(0.01, deadline - time.monotonic()) if inits else 0.01)
        except subprocess.TimeoutExpired:
            continue
    kill_group(proc.pid)
    return proc.wait()


def kill_group(pgid: int) -> None:
    """SIGKILL every process in the process group ``pgid`` (no error if it is gone or not ours)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, isolated: bool) -> int:
    """End ``proc`` (started with ``start_new_session=True``) with every process it started, and wait.

    Args:
        proc: the running command.
        isolated: ``proc`` runs a :func:`wrap` command: :func:`kill` takes its whole sandbox down;
            otherwise its process group is killed (children that left the group survive).

    Returns:
        Its exit status (as ``Popen.wait``).
    """
    if isolated:
        return kill(proc)
    kill_group(proc.pid)
    return proc.wait()
