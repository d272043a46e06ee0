"""One memory cap for a sandboxed program's whole process tree: with cgroup v2 (a writable memory
controller) the tree shares ``memory_mb``; elsewhere forks stop at ``nproc``, so the tree stays within
nproc x the per-process cap. The program forks 4 children holding 120 MB each under a 256 MB cap."""
from __future__ import annotations

import pytest

from stages.core.exec import isolation
from stages.core.exec.sandbox import run_python

TREE = """
import os, time
held, failed = 0, None
for _ in range(4):
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as err:
        failed = err.errno
        break
    if pid == 0:
        os.close(r)
        block = b"\\x01" * (120 * 2**20)  # written, so resident
        os.write(w, b"1")
        time.sleep(5)
        os._exit(0)
    os.close(w)
    held += len(os.read(r, 1))
print("held", held, "fork_failed", failed, flush=True)
"""


@pytest.mark.skipif(isolation.cgroup_base()[0] is None, reason="no writable cgroup v2 memory controller here")
def test_cgroup_caps_the_whole_tree():
    res = run_python(TREE, memory_mb=256, audit_hook=False, timeout_s=30)
    assert res.status == "memory" and "whole process tree" in res.reason, res
    assert "held 4" not in res.stdout


@pytest.mark.skipif(isolation.cgroup_base()[0] is not None, reason="cgroup v2 caps the tree here")
def test_without_cgroup_the_tree_is_bounded_by_nproc_times_the_cap():
    res = run_python(TREE, memory_mb=256, audit_hook=False, timeout_s=30, nproc=3)
    held = int(res.stdout.split()[1])
    assert res.status == "ok" and held <= 2 and "fork_failed None" not in res.stdout, res  # <= 3 x 256 MB


def test_memory_group_files_and_prefix(tmp_path, monkeypatch):
    """The group is made under the base, capped, entered by the command's shell and removed."""
    base = tmp_path / "base"
    base.mkdir()
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    (base / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(isolation, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setenv(isolation.CGROUP_VAR, str(base))
    isolation.cgroup_base.cache_clear()
    try:
        assert isolation.cgroup_base() == (base, None)
        assert (base / "cgroup.subtree_control").read_text() == "+memory"
        with isolation.MemoryGroup(300) as group:
            assert (group.path / "memory.max").read_text() == str(300 * 2**20)
            import subprocess
            out = subprocess.run([*group.prefix, "echo", "inside"], capture_output=True, text=True)
            assert out.stdout == "inside\n" and (group.path / "cgroup.procs").read_text() == "0\n"
            (group.path / "memory.events").write_text("oom 1\noom_kill 1\n")
            assert group.oom_killed()
    finally:
        isolation.cgroup_base.cache_clear()
