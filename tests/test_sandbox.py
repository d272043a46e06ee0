"""The sandbox contains untrusted code: limits, blocked operations, and status classification."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from stages.core.exec.sandbox import SandboxResult, network_isolated, run_python

FAST = {"timeout_s": 5.0, "cpu_s": 5}


def test_normal_code_runs_and_returns_stdout():
    res = run_python("import sys\nprint(sum(range(10)))\nprint('err', file=sys.stderr)", **FAST)
    assert isinstance(res, SandboxResult)
    assert res.status == "ok" and res.returncode == 0 and res.reason == ""
    assert res.stdout == "45\n"
    assert res.stderr == "err"


def test_stdin_is_fed_and_cwd_is_writable_temp_dir():
    code = "import os\nopen('note.txt', 'w').write(input())\nprint(open('note.txt').read(), os.getcwd())"
    res = run_python(code, stdin="hello\n", **FAST)
    assert res.status == "ok", res.reason
    text, cwd = res.stdout.split()
    assert text == "hello"
    assert not Path(cwd).exists()  # the temp dir is deleted afterwards


def test_syntax_error_is_an_error_with_reason():
    res = run_python("def f(:\n    pass\n", **FAST)
    assert res.status == "error"
    assert res.reason.startswith("SyntaxError")
    assert "line 1" in res.reason


def test_output_before_an_uncaught_exception_is_kept():
    res = run_python("print('partial')\nraise ValueError('late')", **FAST)
    assert res.status == "error" and res.stdout == "partial\n"


def test_uncaught_exception_reports_its_last_line():
    res = run_python("raise ValueError('bad value')", **FAST)
    assert res.status == "error" and res.returncode == 1
    assert res.reason == "ValueError: bad value"
    assert "Traceback" in res.stderr and "__lopd_sandbox" not in res.stderr


def test_infinite_loop_times_out_on_wall_clock():
    res = run_python("while True:\n    pass\n", timeout_s=1.5, cpu_s=30)
    assert res.status == "timeout"
    assert "wall-clock" in res.reason


def test_cpu_limit_is_a_timeout():
    res = run_python("while True:\n    pass\n", timeout_s=30.0, cpu_s=1)
    assert res.status == "timeout"
    assert "CPU-time" in res.reason


def test_huge_allocation_hits_memory_limit():
    res = run_python("x = bytearray(10 * 2**30)\nprint('allocated')", memory_mb=512, **FAST)
    assert res.status == "memory", res.reason
    assert "allocated" not in res.stdout


def test_socket_connect_is_blocked():
    code = "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', 9))\nprint('connected')"
    res = run_python(code, **FAST)
    assert res.status == "blocked"
    assert res.reason == "network access blocked (socket.connect)"
    assert "connected" not in res.stdout


def test_url_fetch_is_blocked():
    code = "import urllib.request\nurllib.request.urlopen('http://10.255.255.1/', timeout=1)"
    res = run_python(code, **FAST)
    assert res.status == "blocked"
    assert res.reason.startswith("network access blocked")


def test_network_namespace_has_no_usable_interface():
    if not network_isolated():
        pytest.skip("unshare --net is not available on this machine")
    # The second layer under the audit hook: the child sees only its own loopback interface.
    res = run_python("print(open('/proc/net/dev').read())", **FAST)
    assert res.status == "ok", res.reason
    interfaces = [ln.split(":")[0].strip() for ln in res.stdout.splitlines()[2:] if ":" in ln]
    assert interfaces == ["lo"]


def test_write_outside_sandbox_is_blocked_and_file_absent(tmp_path):
    target = Path("/tmp") / f"{uuid.uuid4().hex}_outside.txt"
    res = run_python(f"open({str(target)!r}, 'w').write('pwned')", **FAST)
    assert res.status == "blocked"
    assert "file write outside the sandbox" in res.reason
    assert not target.exists()


def test_delete_outside_sandbox_is_blocked(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("data")
    res = run_python(f"import os\nos.remove({str(victim)!r})", **FAST)
    assert res.status == "blocked"
    assert victim.read_text() == "data"


def test_subprocess_is_blocked():
    res = run_python("import subprocess\nsubprocess.run(['sleep', '100'])\nprint('ran')", **FAST)
    assert res.status == "blocked"
    assert res.reason == "process spawning blocked (subprocess.Popen)"
    assert "ran" not in res.stdout


def test_fork_and_system_are_blocked():
    for code in ("import os\nos.fork()", "import os\nos.system('true')"):
        res = run_python(code, **FAST)
        assert res.status == "blocked", code
        assert res.reason.startswith("process spawning blocked")


def test_blocked_attempt_caught_by_program_still_reports_blocked():
    code = "import socket\ntry:\n    socket.getaddrinfo('example.com', 80)\nexcept PermissionError:\n    print('caught')"
    res = run_python(code, **FAST)
    assert res.status == "blocked"
    assert res.stdout.strip() == "caught"


def test_runaway_output_is_capped():
    res = run_python("while True:\n    print('x' * 1000)\n", **FAST)
    assert res.status == "error"
    assert "size limit" in res.reason
    assert len(res.stdout) <= 64 * 1024


def test_rejects_non_positive_limits():
    with pytest.raises(ValueError):
        run_python("pass", timeout_s=0)
