"""Where OS isolation is unavailable, model code runs only with an explicit --unsafe-exec."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.core.exec import isolation
from stages.core.exec.sandbox import IsolationUnavailable, run_python
from stages.envs._envscaler_worker import start_env_worker
from tests.tiny import save_tiny

runner = CliRunner()


@pytest.fixture
def no_isolation(monkeypatch):
    """Simulate a machine without isolation (the probe says so), restoring everything afterwards."""
    monkeypatch.setenv(isolation.OFF_VAR, "off")
    monkeypatch.delenv(isolation.UNSAFE_VAR, raising=False)
    isolation.reset()
    isolation.set_unsafe_exec(False)
    yield
    isolation.set_unsafe_exec(False)
    monkeypatch.undo()
    isolation.reset()


def test_probe_is_cached_once_per_process():
    isolation.reset()
    isolation.available()
    isolation.unavailable_reason()
    isolation.available()
    info = isolation._probe.cache_info()
    assert info.misses == 1 and info.hits == 2


def test_refuses_untrusted_code_without_isolation(no_isolation):
    assert not isolation.available()
    with pytest.raises(IsolationUnavailable) as err:
        run_python("print('ran')")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == (f"cannot isolate model code here (disabled by {isolation.OFF_VAR}=off); install bubblewrap, "
                   "or run it unisolated with --unsafe-exec (collect, evaluate) or LOPD_UNSAFE_EXEC=1 (distill and "
                   "the other stages)")


def test_isolation_error_is_not_swallowed_as_an_episode_failure():
    # The rollout loop turns `Exception`s from environments into failed episodes; this must stop the run.
    assert issubclass(IsolationUnavailable, BaseException) and not issubclass(IsolationUnavailable, Exception)


def test_envscaler_worker_refuses_without_isolation(no_isolation):
    with pytest.raises(IsolationUnavailable):
        start_env_worker(256, 10)


def test_unsafe_exec_falls_back_to_the_in_process_guards(no_isolation):
    isolation.set_unsafe_exec(True)
    with pytest.warns(RuntimeWarning, match="model code runs WITHOUT OS isolation") as said:
        res = run_python("import os\nprint(os.getuid())", timeout_s=10)
        run_python("print(1)", timeout_s=10)
    assert len(said) == 1  # once per process, not per program
    assert res.status == "ok", res.reason
    assert res.stdout.strip() == str(__import__("os").getuid())  # not isolated: the caller's uid
    blocked = run_python("import socket\nsocket.socket().connect(('127.0.0.1', 9))", timeout_s=10)
    assert blocked.status == "blocked"  # the audit hook still names the attempt


def test_unsafe_exec_env_var_is_honoured(no_isolation, monkeypatch):
    monkeypatch.setenv(isolation.UNSAFE_VAR, "1")
    assert run_python("print(2)", timeout_s=10).stdout == "2\n"


def test_isolated_run_ignores_the_unsafe_flag():
    if not isolation.available():
        pytest.skip(f"no OS isolation on this machine: {isolation.unavailable_reason()}")
    isolation.set_unsafe_exec(True)
    try:
        assert run_python("import os\nprint(os.getuid())", timeout_s=10).stdout == "65534\n"
    finally:
        isolation.set_unsafe_exec(False)


@pytest.mark.parametrize("args", [
    ["collect", "--env", "code", "--store", "STORE"],
    ["collect", "--env", "envscaler", "--store", "STORE"],
    ["collect", "--env", "taco", "--reference", "--store", "STORE"],
    ["distill", "--method", "grpo", "--env", "taco", "--store", "STORE", "--out", "OUT"],
    ["evaluate", "--bench", "livecodebench"],
    ["evaluate", "--bench", "humaneval-plus"],
])
def test_cli_refuses_in_one_line_before_loading_a_model(no_isolation, tmp_path, args):
    res = runner.invoke(app, [a.replace("STORE", str(tmp_path / "store")).replace("OUT", str(tmp_path / "out"))
                              for a in args])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # rich wraps long lines to the terminal width
    assert text.startswith("error: cannot isolate model code here (disabled by")
    assert text.endswith("LOPD_UNSAFE_EXEC=1 (distill and the other stages)")
    assert not (tmp_path / "store").exists() and not (tmp_path / "out").exists()  # nothing written


def test_cli_unsafe_exec_runs_collect_unisolated(no_isolation, tmp_path):
    tiny = str(save_tiny(tmp_path / "tiny"))
    args = ["collect", "--env", "envscaler", "--model", tiny, "--store", str(tmp_path / "store"), "--limit", "1",
            "--max-new-tokens", "8", "--max-steps", "2", "--temperature", "0"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    res = runner.invoke(app, [*args, "--unsafe-exec"])
    assert res.exit_code == 0, res.output
    assert "mean reward" in res.output
