"""One memory cap for a sandboxed program's whole process tree, by whichever mechanism works here
(cgroup v2, cgroup v1, else the summed-memory watchdog): the program forks children that each
hold a block; the tree as a whole passes the cap, each process stays under it."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from stages.core.exec import isolation, tree_memory
from stages.core.exec.sandbox import run_python
from stages.core.exec.tree_memory import TreeMemoryCap

TREE = """
import os, sys, time
children, mb = {children}, {mb}
held, failed = 0, None
for _ in range(children):
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as err:
        failed = err.errno
        break
    if pid == 0:
        os.close(r)
        block = b"\\x01" * (mb * 2**20)  # written, so resident
        os.write(w, b"1")
        time.sleep(20)
        os._exit(0)
    os.close(w)
    held += len(os.read(r, 1))
print("held", held, "fork_failed", failed, flush=True)
"""


def _started_since(before: set[int]) -> list[int]:
    """This test process's descendants that were not there at ``before`` (other tests of the session
    may leave long-lived workers, e.g. a benchmark grader's, that are not the probe's)."""
    return [pid for pid in tree_memory._descendants(os.getpid())[1:] if pid not in before]


def _tree_rss_mb(before: set[int]) -> float:
    """Resident MiB of every process this test process started since ``before``, and theirs."""
    total = 0
    for pid in _started_since(before):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


class _Sampler:
    """Samples the memory of this process's descendants every 5 ms while a test runs (peak in MiB)."""

    def __init__(self):
        self.peak_mb, self._stop = 0.0, threading.Event()
        self.before = set(tree_memory._descendants(os.getpid())[1:])
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, _tree_rss_mb(self.before))
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture(params=["best", "rss-watchdog"])
def cap_mechanism(request, monkeypatch):
    """Each test once with the best mechanism here, once with the watchdog forced."""
    if request.param == "rss-watchdog":
        monkeypatch.setenv(tree_memory.FORCE_VAR, "rss-watchdog")
    tree_memory.mechanism.cache_clear()
    yield tree_memory.mechanism()[0]
    tree_memory.mechanism.cache_clear()


@pytest.mark.skipif(not isolation.available(), reason="needs bubblewrap isolation")
def test_six_children_of_700_mb_under_a_1_gb_cap_end_with_the_tree_killed(cap_mechanism):
    """The issue's probe: 4.2 GB held on main under cgroup v1 (each process capped, not the tree)."""
    with _Sampler() as sampler:
        res = run_python(TREE.format(children=6, mb=700), memory_mb=1024, audit_hook=False, timeout_s=60)
    assert res.status == "memory", res
    assert res.reason == "exceeded the memory cap of the whole process tree (1024 MiB)", res
    assert "held 6" not in res.stdout
    # a cgroup never lets the tree pass the cap; the watchdog samples every 10 ms, so a fast writer
    # passes it by what it writes in between (about 1.1 GiB at the peak on a 2-core machine)
    bound_mb = 1.2 * 1024 if cap_mechanism.startswith("cgroup") else 1.5 * 1024
    assert sampler.peak_mb < bound_mb, (cap_mechanism, sampler.peak_mb)
    assert _started_since(sampler.before) == []  # nothing of the tree survived


def test_a_tree_under_the_cap_runs_to_the_end(cap_mechanism):
    res = run_python(TREE.format(children=3, mb=40), memory_mb=512, audit_hook=False, timeout_s=60)
    assert res.status == "ok" and "held 3 fork_failed None" in res.stdout, (cap_mechanism, res)


def test_the_watchdog_kills_the_whole_tree_of_a_plain_command(monkeypatch):
    """Without a sandbox too: every descendant of the started process is killed."""
    monkeypatch.setenv(tree_memory.FORCE_VAR, "rss-watchdog")
    tree_memory.mechanism.cache_clear()
    try:
        with TreeMemoryCap(200) as cap:
            assert cap.kind == "rss-watchdog" and cap.prefix == []
            proc = subprocess.Popen([isolation.sys.executable, "-c", TREE.format(children=4, mb=80)],
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
            cap.watch(proc)
            out, _ = proc.communicate(timeout=60)
            assert cap.exceeded() and "held 4" not in out
            assert 200 * 2**20 < cap.peak_bytes < 400 * 2**20
    finally:
        tree_memory.mechanism.cache_clear()


def test_cgroup_v2_group_files_and_prefix(tmp_path, monkeypatch):
    """The v2 group is made under the base, capped, entered by the command's shell and removed."""
    base = tmp_path / "base"
    base.mkdir()
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    (base / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(tree_memory, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setenv(tree_memory.CGROUP_VAR, str(base))
    tree_memory.mechanism.cache_clear()
    try:
        assert tree_memory.mechanism() == ("cgroup-v2", base, "")
        assert (base / "cgroup.subtree_control").read_text() == "+memory"
        with TreeMemoryCap(300) as group:
            assert (group.path / "memory.max").read_text() == str(300 * 2**20)
            out = subprocess.run([*group.prefix, "echo", "inside"], capture_output=True, text=True)
            assert out.stdout == "inside\n" and (group.path / "cgroup.procs").read_text() == "0\n"
            (group.path / "memory.events").write_text("oom 1\noom_kill 1\n")
            assert group.exceeded()
    finally:
        tree_memory.mechanism.cache_clear()
