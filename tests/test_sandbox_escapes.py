"""Hostile programs against the OS isolation of the sandbox (every probe of the escape report).

Most probes run with ``audit_hook=False`` (and several with it on as well): the OS layer
(bubblewrap: uid 65534, own PID / network / mount namespaces, read-only filesystem, own /proc,
empty environment, rlimits) must hold on its own.
"""
from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from stages.core.exec import isolation
from stages.core.exec.sandbox import run_python

pytestmark = pytest.mark.skipif(not isolation.available(),
                                reason=f"no OS isolation on this machine: {isolation.unavailable_reason()}")

FAST = {"timeout_s": 10.0, "cpu_s": 10}
REPO = Path(__file__).resolve().parents[1]
BOTH = pytest.mark.parametrize("hook", [False, True], ids=["os-layer-only", "with-audit-hook"])


def _procs_with(token: str) -> list[int]:
    """Host pids whose command line contains ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                found.append(int(entry))
    return found


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    victim.chmod(0o666)  # even a world-writable file must be out of reach
    tmp_path.chmod(0o777)
    return victim


def test_runs_as_nobody_without_privileges():
    code = ("import os\nst = open('/proc/self/status').read()\n"
            "f = lambda k: [l.split()[1] for l in st.splitlines() if l.startswith(k + ':')][0]\n"
            "print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), f('NoNewPrivs'), f('CapEff'),"
            " f('CapBnd'), sep='|')")
    res = run_python(code, audit_hook=False, **FAST)
    assert res.status == "ok", res.reason
    uid, euid, gid, groups, nnp, cap_eff, cap_bnd = res.stdout.strip().split("|")
    assert (uid, euid, gid) == ("65534", "65534", "65534")
    assert groups in ("[]", "[65534]")
    assert nnp == "1" and int(cap_eff, 16) == 0 and int(cap_bnd, 16) == 0


@BOTH
def test_dir_fd_unlink_and_overwrite_cannot_touch_outside_files(tmp_path, hook):
    victim = _victim(tmp_path)
    code = f"""
import os
for how in ("dir", "root"):
    try:
        if how == "dir":
            fd, name = os.open({str(tmp_path)!r}, os.O_RDONLY), "victim.txt"
        else:
            fd, name = os.open("/", os.O_RDONLY), {str(victim)[1:]!r}
        try:
            os.unlink(name, dir_fd=fd)
            print(how, "unlinked")
        except OSError as e:
            print(how, "unlink failed", e.errno)
        try:
            with open(name, "w", opener=lambda p, f: os.open(p, f, dir_fd=fd)) as fh:
                fh.write("pwned")
            print(how, "overwritten")
        except OSError as e:
            print(how, "overwrite failed", e.errno)
    except OSError as e:
        print(how, "no dir fd", e.errno)
"""
    res = run_python(code, audit_hook=hook, **FAST)
    assert "unlinked" not in res.stdout and "overwritten" not in res.stdout
    assert victim.read_text() == "precious"


@BOTH
def test_parent_environment_secret_is_unreadable(monkeypatch, hook):
    secret = "s3cret-" + uuid.uuid4().hex
    monkeypatch.setenv("LOPD_TEST_SECRET", secret)
    code = f"""
import os
print("ENV", dict(os.environ))
for pid in sorted({{os.getppid(), 1, {os.getpid()}, {os.getppid()}}}):
    try:
        print(pid, open("/proc/%d/environ" % pid, "rb").read())
    except OSError as e:
        print(pid, "unreadable", e.errno)
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            print("scan", entry, open("/proc/%s/environ" % entry, "rb").read())
        except OSError:
            pass
"""
    res = run_python(code, audit_hook=hook, **FAST)
    assert res.status == "ok", res.reason
    assert "ENV" in res.stdout
    assert secret not in res.stdout and secret not in res.stderr
    assert "LOPD_TEST_SECRET" not in res.stdout


def test_host_processes_are_not_visible():
    code = ("import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "cmds = [open('/proc/%s/cmdline' % p, 'rb').read() for p in pids]\n"
            "print(os.getpid(), len(pids), any(b'pytest' in c for c in cmds))")
    res = run_python(code, audit_hook=False, **FAST)
    assert res.status == "ok", res.reason
    pid, count, sees_pytest = res.stdout.split()
    assert int(pid) < 10 and int(count) < 10 and sees_pytest == "False"


def test_posixsubprocess_fork_exec_is_contained(tmp_path):
    _victim(tmp_path)
    marker, token = tmp_path / "fork_exec_marker", "lopd-escape-" + uuid.uuid4().hex
    script = f"id -u; touch {marker}; echo touched-$?; exec sleep 30"
    code = f"""
import os, _posixsubprocess
r, w = os.pipe()
pid = _posixsubprocess.fork_exec(
    [b"/bin/sh", b"-c", {script.encode()!r}, {token.encode()!r}], [b"/bin/sh"], True, (w,), None, None,
    -1, -1, -1, -1, -1, -1, r, w, False, True, -1, None, None, None, -1, None, False)
os.close(w)
os.read(r, 100)
import time
time.sleep(1)
print("spawned", pid)
"""
    res = run_python(code, audit_hook=True, **FAST)
    assert "spawned" in res.stdout, res.stderr  # the probe did run
    lines = res.stdout.split()
    assert lines[0] == "65534" and lines[1] != "touched-0"
    assert not marker.exists()
    assert _procs_with(token) == []  # the setsid'd child died with the sandbox


@pytest.mark.parametrize("parent", ["exits", "times-out"])
def test_setsid_double_fork_child_dies_with_the_sandbox(tmp_path, parent):
    _victim(tmp_path)
    marker, token = tmp_path / "late_marker", "lopd-escape-" + uuid.uuid4().hex
    tail = "while True:\n    pass\n" if parent == "times-out" else "print('parent done')\n"
    code = f"""
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 2; echo pwned > {marker}", {token!r}])
    os._exit(0)
os.wait()
import time
time.sleep(0.3)
{tail}"""
    res = run_python(code, audit_hook=False, timeout_s=2.0, cpu_s=10)
    assert res.status == ("timeout" if parent == "times-out" else "ok"), res.reason
    assert _procs_with(token) == []
    time.sleep(2.5)
    assert not marker.exists()
    assert _procs_with(token) == []


@BOTH
def test_no_network_even_to_host_loopback(hook):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        code = f"""
import socket
for family, addr in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET6, ("::1", {port}))):
    try:
        s = socket.socket(family)
        s.settimeout(2)
        s.connect(addr)
        s.sendall(b"hello")
        print("connected")
    except OSError as e:
        print("refused", type(e).__name__)
"""
        res = run_python(code, audit_hook=hook, **FAST)
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            server.accept()
    assert "connected" not in res.stdout
    assert res.stdout.count("refused") == 2 or res.status == "blocked"


@BOTH
def test_writes_outside_own_dir_fail(tmp_path, hook):
    victim = _victim(tmp_path)
    name = "lopd-escape-" + uuid.uuid4().hex
    targets = [REPO / name, Path.home() / name, Path("/tmp") / name, tmp_path / name, victim, Path("/") / name,
               Path(sys.prefix) / name]
    code = f"""
import os
for t in {[str(t) for t in targets]!r}:
    try:
        with open(t, "w") as fh:
            fh.write("pwned")
        print("wrote", t)
    except OSError as e:
        print("failed", t, e.errno)
open("mine.txt", "w").write("ok")
print("own dir", open("mine.txt").read(), os.getcwd())
"""
    res = run_python(code, audit_hook=hook, **FAST)
    assert "wrote" not in res.stdout
    if not hook:
        assert res.stdout.count("failed") == len(targets)
        assert f"own dir ok {isolation.WORKDIR}" in res.stdout
    assert victim.read_text() == "precious"
    assert not any(t.exists() for t in targets if t != victim)


def test_host_files_are_not_readable(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top-secret")
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    code = f"""
import os
for p in ({str(secret)!r}, {str(REPO / 'pyproject.toml')!r}, "/root", "/home", "/etc/hostname"):
    try:
        print(p, open(p).read()[:50] if os.path.isfile(p) else os.listdir(p))
    except OSError as e:
        print(p, "unreadable", e.errno)
"""
    res = run_python(code, audit_hook=False, **FAST)
    assert res.status == "ok", res.reason
    assert "top-secret" not in res.stdout and "[project]" not in res.stdout
    assert res.stdout.count("unreadable") >= 3


def test_fork_bomb_is_contained():
    token = "lopd-escape-" + uuid.uuid4().hex
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-S', '-c', {bomb!r}, {token!r}])"
    t0 = time.monotonic()
    res = run_python(code, audit_hook=False, timeout_s=3.0, cpu_s=30)
    assert res.status == "timeout", res.reason
    assert time.monotonic() - t0 < 15
    assert _procs_with(token) == []
    assert run_python("print('alive')", **FAST).stdout == "alive\n"


def test_huge_allocation_hits_memory_limit_without_hook():
    res = run_python("x = bytearray(10 * 2**30)\nprint('allocated')", memory_mb=512, audit_hook=False, **FAST)
    assert res.status == "memory", res.reason
    assert "allocated" not in res.stdout


def test_100mb_of_output_is_capped_without_hook():
    res = run_python("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)\n", audit_hook=False, **FAST)
    assert res.status == "error" and "size limit" in res.reason
    assert len(res.stdout) <= 64 * 1024


def test_filling_the_work_dir_stops_at_its_size_cap():
    code = ("import errno\nn = 0\ntry:\n    for i in range(20):\n"
            "        with open('f%d' % i, 'wb') as fh:\n            fh.write(b'x' * (8 * 2**20))\n"
            "        n += 1\nexcept OSError as e:\n    print('stopped', e.errno == errno.ENOSPC, n)\n")
    res = run_python(code, audit_hook=False, **FAST)
    assert res.status == "ok", res.reason
    stopped, enospc, n = res.stdout.split()
    assert stopped == "stopped" and enospc == "True" and int(n) * 8 <= isolation.WORK_MB


def test_infinite_loop_times_out_without_hook():
    res = run_python("while True:\n    pass\n", timeout_s=1.5, cpu_s=30, audit_hook=False)
    assert res.status == "timeout" and "wall-clock" in res.reason
    assert res.duration_s < 5


def test_envscaler_worker_environment_code_is_contained(tmp_path, monkeypatch):
    from stages.envs._envscaler_worker import start_env_worker

    victim = _victim(tmp_path)
    secret, token = "s3cret-" + uuid.uuid4().hex, "lopd-escape-" + uuid.uuid4().hex
    monkeypatch.setenv("LOPD_TEST_SECRET", secret)
    env_code = f"""
import os, socket
class Evil:
    def __init__(self, config):
        self.log = [os.getuid(), dict(os.environ)]
        for act in ("unlink", "write", "environ", "net"):
            try:
                if act == "unlink":
                    os.unlink({str(victim)!r})
                elif act == "write":
                    open({str(victim)!r}, "w").write("pwned")
                elif act == "environ":
                    self.log.append(open("/proc/%d/environ" % os.getppid(), "rb").read())
                else:
                    socket.create_connection(("127.0.0.1", 22), timeout=1)
                self.log.append(act + " done")
            except OSError as e:
                self.log.append(act + " failed")
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 30", {token!r}])
    def report(self):
        return repr(self.log)
"""
    worker = start_env_worker(512, 30)
    try:
        assert worker.request({"op": "init", "code": env_code, "class_name": "Evil", "init_config": {}}, 20) == \
            {"status": "ok"}
        log = worker.request({"op": "call", "name": "report", "args": {}}, 20)["result"]
        deadline = time.monotonic() + 5
        while not _procs_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _procs_with(token), "the setsid child should be running inside the sandbox"
    finally:
        worker.close()
    assert log.startswith("[65534, ")
    assert "done" not in log and log.count("failed") == 4
    assert secret not in log
    assert victim.read_text() == "precious"
    assert _procs_with(token) == []
