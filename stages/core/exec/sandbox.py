"""Run untrusted, model-generated Python in a locked-down subprocess.

The security boundary is the operating system (:mod:`stages.core.exec.isolation`): each program runs in
its own bubblewrap sandbox -- uid 65534 without capabilities and with ``no_new_privs``, fresh PID,
network, IPC and mount namespaces, a read-only filesystem holding only the system and Python files,
its own ``/proc``, an empty environment, a size-capped writable tmpfs as cwd and resource limits
(CPU seconds, address space, file size, processes, no core dumps). On the wall-clock timeout the
whole sandbox is killed (PID namespace: ``setsid``/double-forked children die with it).

Where isolation is unavailable, :func:`run_python` refuses with
:class:`~stages.core.exec.isolation.IsolationUnavailable` unless ``--unsafe-exec`` was given
(:func:`stages.core.exec.isolation.set_unsafe_exec`); then it falls back to the old in-process guards:
rlimits, its own session / process group, a network namespace when ``unshare`` works.

On top of either, an audit-hook prelude (:pep:`578`) raises ``PermissionError`` on network calls,
writes or deletions outside the temp dir, process spawning, signals to other processes and raw
``ctypes`` use, and records the attempt on stderr so the result says ``status="blocked"``. It is
a convenience that names what a program tried, not a boundary (it misses ``dir_fd`` paths,
``_posixsubprocess``, /proc reads, ...).

Usage::

    res = run_python("print(1 + 1)", timeout_s=5)
    res.status, res.stdout        # ("ok", "2\\n")
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stages.core.exec import isolation
from stages.core.exec.isolation import IsolationUnavailable, set_unsafe_exec  # noqa: F401  (re-exported)
from stages.core.exec.tree_memory import TreeMemoryCap

Status = Literal["ok", "error", "timeout", "memory", "blocked"]

_BLOCKED = BLOCKED_MARK = "__lopd_sandbox_blocked__:"  # stderr line: the audit hook blocked an operation
_FAILED = FAILED_MARK = "__lopd_sandbox_failed__:"  # stderr line: the program raised (exception type follows)
_FILE_CAP = 16 * 2**20  # RLIMIT_FSIZE: largest file (incl. captured stdout/stderr) in bytes

_PROGRAM = "/lopd/program.py"  # where the program file is bound (read-only) inside the sandbox

# Runs in the child as `python -I -B [-X int_max_str_digits=0] -c _BOOT <workdir> <program file> hook|nohook`
# (by default no int/str digit limit, as in a judge's interpreter). It reads (and
# deletes, when it can) the program file, installs the audit hook, then executes the program as
# __main__.
_BOOT = r'''
import os, sys
sys.dont_write_bytecode = True
_WORK = os.path.realpath(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as _f:
    _SRC = _f.read()
try:
    os.remove(sys.argv[2])
except OSError:
    pass
_HOOK = sys.argv[3] == "hook"
del _f
_PID = os.getpid()
_MB, _MF = "@BLOCKED@", "@FAILED@"
_NET = {"socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyaddr", "socket.getnameinfo", "socket.sendto", "socket.sendmsg"}
_SPAWN = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
          "os.forkpty", "pty.spawn"}
_PATH1 = {"os.remove", "os.rmdir", "shutil.rmtree", "os.mkdir", "os.truncate", "os.chmod",
          "os.chown", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr"}
_PATH2 = {"os.rename", "os.link", "os.symlink"}
_CTYPES = {"ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer",
           "ctypes.string_at", "ctypes.wstring_at", "ctypes.call_function"}
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_busy = [False]

def _inside(path):
    if isinstance(path, int):
        return True
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    real = os.path.realpath(os.path.join(os.getcwd(), os.fspath(path)))
    return real == _WORK or real.startswith(_WORK + os.sep) or real == "/dev/null"

def _block(what):
    sys.stderr.write("\n%s%s\n" % (_MB, what))
    sys.stderr.flush()
    raise PermissionError("sandbox: " + what)

def _hook(event, args):
    if _busy[0]:
        return
    _busy[0] = True
    try:
        if event in _NET:
            _block("network access blocked (%s)" % event)
        elif event in _SPAWN:
            _block("process spawning blocked (%s)" % event)
        elif event in ("os.kill", "os.killpg") and args[0] not in (_PID, 0):
            _block("signal to another process blocked (%s)" % event)
        elif event in _CTYPES or (event == "ctypes.dlopen" and args[0] is not None):
            _block("raw ctypes access blocked (%s)" % event)
        elif event == "open":
            path, mode, flags = args
            writing = (isinstance(flags, int) and flags & _WRITE) or (
                isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writing and path is not None and not _inside(path):
                _block("file write outside the sandbox blocked (open %s)" % (path,))
        elif event in _PATH1 and args and not _inside(args[0]):
            _block("file change outside the sandbox blocked (%s %s)" % (event, args[0]))
        elif event in _PATH2 and not (_inside(args[1]) and (event == "os.symlink" or _inside(args[0]))):
            _block("file change outside the sandbox blocked (%s)" % event)
    finally:
        _busy[0] = False

if _HOOK:
    sys.addaudithook(_hook)
del _hook
_g = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(_SRC, "<sandbox>", "exec"), _g)
except SystemExit:
    raise
except BaseException as _e:
    try:
        import traceback
        traceback.print_exc()
    except BaseException:
        pass
    _msg = str(_e).splitlines()
    try:
        sys.stdout.flush()  # keep what the program printed before it failed
    except BaseException:
        pass
    sys.stderr.write("\n%s%s: %s\n" % (_MF, type(_e).__name__, _msg[0] if _msg else ""))
    sys.stderr.flush()
    os._exit(1)
'''.replace("@BLOCKED@", _BLOCKED).replace("@FAILED@", _FAILED)
PRELUDE = _BOOT  # its source, for programs that start further programs in a process they forked


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
        status: ``ok`` (exit 0), ``error`` (non-zero exit / uncaught exception), ``timeout``
            (wall-clock or CPU-time limit), ``memory`` (MemoryError or killed for memory),
            ``blocked`` (the program attempted a forbidden operation).
        returncode: the child's exit status (negative: killed by that signal).
        stdout, stderr: captured output, each cut to ``max_output_chars`` (sandbox markers removed).
        reason: one human-readable line explaining the status ("" when ``ok``).
        duration_s: wall-clock seconds from start to exit.
    """

    status: Status
    returncode: int
    stdout: str
    stderr: str
    reason: str
    duration_s: float


@functools.lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """The command prefix that runs a program in a fresh network namespace, or () if none works."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    for prefix in ((exe, "--net"), (exe, "--net", "--map-root-user")):
        try:
            probe = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return ()


def network_isolated() -> bool:
    """Whether sandboxed programs get their own (empty) network namespace on this machine."""
    return isolation.available() or bool(_netns_prefix())


def _limits(cpu_s: int, memory_mb: int, nproc: int) -> None:
    # Runs in the child between fork and exec; keep it to plain syscalls.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_CAP, _FILE_CAP))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _read(path: Path, max_chars: int) -> str:
    with open(path, "rb") as fh:
        data = fh.read(max_chars * 4)
    return data.decode("utf-8", errors="replace")[:max_chars]


def _split_markers(stderr: str) -> tuple[str, str | None, str | None]:
    """Remove marker lines from stderr; return (clean stderr, first blocked reason, failure line)."""
    blocked = failure = None
    kept = []
    for line in stderr.splitlines():
        if line.startswith(_BLOCKED):
            blocked = blocked or line[len(_BLOCKED):].strip()
        elif line.startswith(_FAILED):
            failure = line[len(_FAILED):].strip()
        else:
            kept.append(line)
    return "\n".join(kept).strip("\n"), blocked, failure


def python_argv(workdir: str, program: str, audit_hook: bool = True, digit_limit: bool = False) -> list[str]:
    """The argv that runs the Python file ``program`` as ``__main__`` the way :func:`run_python` does
    (isolated interpreter, the audit-hook prelude when ``audit_hook``; no int/str digit limit unless
    ``digit_limit``), with ``workdir`` as the only place it may write; used to start further programs
    inside a sandbox."""
    limit = [] if digit_limit else ["-X", "int_max_str_digits=0"]
    return [sys.executable, "-I", "-B", *limit, "-c", _BOOT, workdir, program, "hook" if audit_hook else "nohook"]


def classify(rc: int, wall_killed: bool, stderr: str, timeout_s: float, cpu_s: int) -> tuple[Status, str, str]:
    """Status of a program started with :func:`python_argv` from its exit.

    Args:
        rc: exit status as ``Popen.wait`` gives it (negative: killed by that signal).
        wall_killed: it was killed for running past its wall-clock limit.
        stderr: what it wrote to stderr (holds the prelude's marker lines).
        timeout_s, cpu_s: its wall-clock and CPU-time limits (named in the reason).

    Returns:
        (status, one-line reason, stderr without the marker lines).
    """
    clean, blocked, failure = _split_markers(stderr)
    if blocked:
        return "blocked", blocked, clean
    if wall_killed:
        return "timeout", f"exceeded {timeout_s:g} s wall-clock limit", clean
    if rc == -signal.SIGXCPU:
        return "timeout", f"exceeded CPU-time limit ({cpu_s} s)", clean
    if (failure or "").startswith("MemoryError"):
        return "memory", "exceeded memory limit (MemoryError)", clean
    if rc == -signal.SIGKILL:
        return "memory", "killed by SIGKILL (memory or CPU hard limit)", clean
    if rc == -signal.SIGXFSZ or (failure or "").startswith(f"OSError: [Errno {errno.EFBIG}]"):
        return "error", f"exceeded output/file size limit ({_FILE_CAP // 2**20} MiB)", clean
    if rc < 0:
        return "error", f"killed by signal {signal.Signals(-rc).name}", clean
    if rc != 0:
        last = failure or next((ln for ln in reversed(clean.splitlines()) if ln.strip()), "")
        return "error", (last or f"exit status {rc}")[:300], clean
    return "ok", "", clean


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: int = 10,
    memory_mb: int = 1024,
    stdin: str = "",
    max_output_chars: int = 64 * 1024,
    audit_hook: bool = True,
    nproc: int = isolation.NPROC,
    digit_limit: bool = False,
) -> SandboxResult:
    """Execute ``code`` as ``__main__`` in a sandboxed child interpreter and wait for it.

    Isolation (see the module docstring and :mod:`stages.core.exec.isolation`): uid 65534, fresh PID /
    network / IPC / mount namespaces, read-only filesystem except a private tmpfs cwd, own
    ``/proc``, empty environment, rlimits; the whole sandbox is killed on the wall-clock timeout.

    Memory: ``memory_mb`` caps the whole process tree together
    (:class:`stages.core.exec.tree_memory.TreeMemoryCap`: a cgroup v2 or v1 memory group, else a
    watchdog over the tree's summed memory; an overflow kills the tree: status ``memory``) and
    each process's address space.

    Args:
        code: Python source text (untrusted).
        timeout_s: wall-clock limit in seconds; the child's whole sandbox is killed after it.
        cpu_s: CPU-time limit in seconds per process (RLIMIT_CPU soft limit; SIGXCPU -> ``timeout``).
        memory_mb: memory cap in MiB: the whole tree's and each process's (RLIMIT_AS).
        stdin: text fed to the child's standard input ("" -> /dev/null).
        max_output_chars: stdout and stderr are each cut to this many characters.
        audit_hook: install the audit-hook layer (default). ``False`` leaves the OS layer alone
            (tests use it to show that layer holds on its own; programs that start programs).
        nproc: RLIMIT_NPROC of the program (processes and threads of its uid).
        digit_limit: keep Python's int/str conversion limit (4,300 digits); off by default, as in
            a judge's interpreter.

    Returns:
        A :class:`SandboxResult`. Never raises for anything the program does.

    Raises:
        ValueError: non-positive limits.
        IsolationUnavailable: OS isolation does not work here and ``--unsafe-exec`` was not given.
        OSError: the child could not be started at all (e.g. no temp dir space).
    """
    if timeout_s <= 0 or cpu_s <= 0 or memory_mb <= 0 or nproc <= 0:
        raise ValueError(f"sandbox limits must be positive (timeout_s={timeout_s}, cpu_s={cpu_s}, "
                         f"memory_mb={memory_mb}, nproc={nproc})")
    isolated = isolation.require()
    root = Path(tempfile.mkdtemp(prefix="lopd-sandbox-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        group = stack.enter_context(TreeMemoryCap(memory_mb))
        program = root / "program.py"
        program.write_text(code, encoding="utf-8")
        if isolated:
            limits = isolation.Limits(cpu_s=int(cpu_s), memory_mb=int(memory_mb), file_bytes=_FILE_CAP, nproc=int(nproc))
            argv = isolation.wrap(python_argv(isolation.WORKDIR, _PROGRAM, audit_hook, digit_limit),
                                  ro_binds={str(program): _PROGRAM}, limits=limits)
            env, cwd, preexec = isolation.base_env(), root, None
        else:  # --unsafe-exec on a machine without isolation: the old in-process guards only
            work = root / "work"
            work.mkdir()
            argv = [*_netns_prefix(), *python_argv(str(work), str(program), audit_hook, digit_limit)]
            env = {**isolation.base_env(), "HOME": str(work), "TMPDIR": str(work)}
            cwd, preexec = work, functools.partial(_limits, int(cpu_s), int(memory_mb), int(nproc))
        argv = [*group.prefix, *argv]
        stdin_path = root / "stdin.txt"
        stdin_path.write_text(stdin, encoding="utf-8")
        out_path, err_path = root / "stdout.txt", root / "stderr.txt"
        wall_killed = False
        start = time.monotonic()
        with open(stdin_path, "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen(
                argv,
                stdin=fin if stdin else subprocess.DEVNULL,
                stdout=fout,
                stderr=ferr,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=preexec,
            )
            group.watch(proc)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                wall_killed = True
            rc = isolation.stop(proc, isolated)  # isolated: returns once no process of the sandbox is left
        duration = time.monotonic() - start
        if isolated and rc > 128:  # bwrap reports a child killed by signal N as exit status 128 + N
            rc = -(rc - 128)
        stdout, stderr = _read(out_path, max_output_chars), _read(err_path, _FILE_CAP)
        status, reason, clean = classify(rc, wall_killed, stderr, timeout_s, cpu_s)
        if group.exceeded() and not wall_killed:
            status, reason = "memory", f"exceeded the memory cap of the whole process tree ({memory_mb} MiB)"
        return SandboxResult(status, rc, stdout, clean[:max_output_chars], reason, duration)
