"""One memory cap for a sandboxed program's whole process tree, by the best mechanism available here.

A per-process address-space limit (RLIMIT_AS) leaves a program that forks free to hold ``nproc``
times the cap. :class:`TreeMemoryCap` caps the tree as a whole, by the first of these that works
(:func:`mechanism` says which, probed once per process):

* ``cgroup-v2``: a writable cgroup v2 memory controller (the process's own cgroup, or a delegated
  one named by ``LOPD_SANDBOX_CGROUP``). A fresh child group with ``memory.max`` = the cap,
  ``memory.swap.max`` 0 and ``memory.oom.group`` 1: the kernel kills the whole group on overflow.
* ``cgroup-v1``: a writable cgroup v1 memory controller (a child of the process's own memory
  cgroup). A fresh child group with ``memory.limit_in_bytes`` = the cap (and
  ``memory.memsw.limit_in_bytes`` the same: no swap). The kernel keeps the group under the cap and
  kills one process at a time on overflow; a watcher thread then kills every process of the group
  (it polls the group's ``oom_kill`` count every :data:`POLL_S` seconds).
* ``rss-watchdog``: no writable memory cgroup. A watcher thread sums the proportional set size
  (PSS; resident pages shared by k processes count 1/k each) of the started process and all its
  descendants every :data:`POLL_S` seconds and kills them all once the sum passes the cap. It
  samples, so a program can pass the cap by what it allocates between two samples (a fast
  writer: about 100 MB per 10 ms) before it is killed; a process that leaves the tree (reparented
  to init by a double fork) leaves the count, which bubblewrap's PID namespace prevents.

``LOPD_SANDBOX_TREE_MEMORY=rss-watchdog`` forces the watchdog (tests, or a cgroup that misbehaves).
"""
from __future__ import annotations

import errno
import functools
import itertools
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

CGROUP_VAR = "LOPD_SANDBOX_CGROUP"  # a delegated cgroup v2 directory to make the per-sandbox groups in
CGROUP_ROOT = "/sys/fs/cgroup"
FORCE_VAR = "LOPD_SANDBOX_TREE_MEMORY"  # "rss-watchdog": skip the cgroups
POLL_S = 0.01  # the watchers' sampling period (seconds)
MECHANISMS = ("cgroup-v2", "cgroup-v1", "rss-watchdog")

_group_ids = itertools.count()


def _cgroup_lines() -> list[tuple[str, str]]:
    """(controllers, path) per line of /proc/self/cgroup (empty when unreadable)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    return [(parts[1], parts[2]) for parts in (line.split(":", 2) for line in lines) if len(parts) == 3]


def _v2_base() -> tuple[Path | None, str | None]:
    if not (Path(CGROUP_ROOT) / "cgroup.controllers").is_file():
        return None, f"no cgroup v2 at {CGROUP_ROOT}"
    given = os.environ.get(CGROUP_VAR, "").strip()
    own = next((path for controllers, path in _cgroup_lines() if controllers == ""), None)
    base = Path(given) if given else (None if own is None else Path(CGROUP_ROOT) / own.lstrip("/"))
    if base is None or not base.is_dir():
        return None, f"cgroup {base or '(own)'} not found"
    control = base / "cgroup.subtree_control"
    try:
        if "memory" not in control.read_text().split():
            control.write_text("+memory")
        _probe_group(base, "memory.max")
    except OSError as err:
        return None, f"no writable memory controller in {base} ({err.strerror or err})"
    return base, None


def _v1_mount() -> Path | None:
    """Where the cgroup v1 memory hierarchy is mounted (with its root), from /proc/self/mountinfo."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - " not in line:
            continue
        fs_type, _, options = line.split(" - ", 1)[1].split()[:3]
        if fs_type == "cgroup" and "memory" in options.split(","):
            return Path(fields[4]) if fields[3] == "/" else None  # a bind of a sub-group: no own path
    return None


def _v1_base() -> tuple[Path | None, str | None]:
    mount = _v1_mount()
    own = next((path for controllers, path in _cgroup_lines() if "memory" in controllers.split(",")), None)
    if mount is None or own is None:
        return None, "no cgroup v1 memory controller"
    base = mount / own.lstrip("/")
    try:
        _probe_group(base, "memory.limit_in_bytes")
    except OSError as err:
        return None, f"no writable memory controller in {base} ({err.strerror or err})"
    return base, None


def _probe_group(base: Path, limit_file: str) -> None:
    """Make, cap and remove a group under ``base``; OSError when that is not allowed."""
    probe = base / f"lopd-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        (probe / limit_file).write_text(str(64 * 2**20))
    finally:
        _remove_group(probe)


@functools.lru_cache(maxsize=1)
def mechanism() -> tuple[str, Path | None, str]:
    """(one of :data:`MECHANISMS`, the cgroup directory groups are made in or None, why not a
    cgroup: "" for a cgroup). Probed once per process (a group is made, capped and removed)."""
    if os.environ.get(FORCE_VAR, "").strip() == "rss-watchdog":
        return "rss-watchdog", None, f"{FORCE_VAR}=rss-watchdog"
    base, why_v2 = _v2_base()
    if base is not None:
        return "cgroup-v2", base, ""
    base, why_v1 = _v1_base()
    if base is not None:
        return "cgroup-v1", base, ""
    return "rss-watchdog", None, f"{why_v2}; {why_v1}"


class TreeMemoryCap:
    """Caps the memory of a process tree together (module docstring); a context manager.

    Start the command as ``[*cap.prefix, *argv]`` with ``start_new_session=True``, then call
    :meth:`watch` with its ``Popen``; after it ended, :meth:`exceeded` says whether the cap ended
    it. Leaving the context kills what is left of the group and removes it.

    Args:
        memory_mb: the cap in MiB.

    Raises:
        OSError: a cgroup was probed writable but the group could not be made.
    """

    def __init__(self, memory_mb: int):
        self.memory_mb = int(memory_mb)
        self.kind, base, _ = mechanism()
        self.path: Path | None = None
        self.prefix: list[str] = []
        self._fired = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_bytes = 0  # the watchdog's largest sum seen
        if base is None:
            return
        self.path = base / f"lopd-sandbox-{os.getpid()}-{next(_group_ids)}"
        self.path.mkdir()
        cap = str(self.memory_mb * 2**20)
        if self.kind == "cgroup-v2":
            writes = (("memory.max", cap), ("memory.swap.max", "0"), ("memory.oom.group", "1"))
        else:  # the swap limit (memsw) must stay >= the memory limit: set after it
            writes = (("memory.limit_in_bytes", cap), ("memory.memsw.limit_in_bytes", cap))
        for name, value in writes:
            if name in ("memory.max", "memory.limit_in_bytes") or (self.path / name).exists():
                (self.path / name).write_text(value)
        # the shell moves itself into the group (writing 0 moves the writer), then becomes the command
        self.prefix = ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def watch(self, proc: subprocess.Popen) -> None:
        """Start watching the tree of ``proc`` (started with :attr:`prefix`); no-op for cgroup v2,
        whose kernel kills the whole group itself."""
        if self.kind == "cgroup-v2":
            return
        target = self._watch_v1 if self.kind == "cgroup-v1" else self._watch_rss
        self._thread = threading.Thread(target=target, args=(proc,), daemon=True, name="lopd-tree-memory")
        self._thread.start()

    def exceeded(self) -> bool:
        """Whether the cap ended the program: the kernel killed a process of the group for memory
        (cgroups), or the watchdog killed the tree."""
        if self._fired.is_set():
            return True
        if self.kind == "cgroup-v2":
            events = _key_values(self.path / "memory.events")
            return events.get("oom_kill", 0) > 0 or events.get("oom_group_kill", 0) > 0
        if self.kind == "cgroup-v1":
            return _key_values(self.path / "memory.oom_control").get("oom_kill", 0) > 0
        return False

    def _watch_v1(self, proc: subprocess.Popen) -> None:
        while not self._done.is_set() and proc.poll() is None:
            if _key_values(self.path / "memory.oom_control").get("oom_kill", 0) > 0:
                self._fired.set()
                self._kill_group()
                return
            time.sleep(POLL_S)

    def _watch_rss(self, proc: subprocess.Popen) -> None:
        cap = self.memory_mb * 2**20
        while not self._done.is_set() and proc.poll() is None:
            tree = _descendants(proc.pid)
            held = sum(_pss_bytes(pid) for pid in tree)
            self.peak_bytes = max(self.peak_bytes, held)
            if held > cap:
                self._fired.set()
                for _ in range(100):  # new forks may appear while killing: until none is left
                    for pid in tree:
                        _sigkill(pid)
                    tree = [pid for pid in _descendants(proc.pid) if _alive(pid)]
                    if not tree:
                        return
                    time.sleep(POLL_S)
                return
            time.sleep(POLL_S)

    def _kill_group(self) -> None:
        for _ in range(100):  # processes forked while killing join the group: until it is empty
            pids = _pids(self.path / "cgroup.procs")
            if not pids:
                return
            for pid in pids:
                _sigkill(pid)
            time.sleep(POLL_S)

    def __enter__(self) -> "TreeMemoryCap":
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self.path is None:
            return
        if (self.path / "cgroup.kill").exists():
            try:
                (self.path / "cgroup.kill").write_text("1")
            except OSError:
                pass
        else:
            self._kill_group()
        _remove_group(self.path)


def _key_values(path: Path) -> dict[str, int]:
    """``key value`` lines of a cgroup file as ints ({} when unreadable)."""
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}
    except (OSError, ValueError):
        return {}


def _pids(path: Path) -> list[int]:
    """The process ids listed in a cgroup's ``cgroup.procs`` ([] when unreadable)."""
    try:
        return [pid for pid in map(int, path.read_text().split()) if pid > 0]
    except (OSError, ValueError):
        return []


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it (from /proc/<pid>/task/<tid>/children)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                pass
    return found


def _pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (its resident size where smaps_rollup is not
    readable; 0 for a process that is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _sigkill(pid: int) -> None:
    """SIGKILL process ``pid`` (> 0: never a process group) if it is still there."""
    if pid <= 0:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_group(path: Path) -> None:
    """rmdir a cgroup, retrying for up to 5 s while its killed processes are reaped (EBUSY)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            path.rmdir()
            return
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() > deadline:
                return
            time.sleep(0.02)
