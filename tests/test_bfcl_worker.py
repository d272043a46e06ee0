"""BFCL multi-turn calls and the checker run in a worker process: a model-chosen value that would hang
or exhaust the lopd process becomes an error observation, and the episode goes on (or ends) cleanly."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from stages.envs import _bfcl_worker, bfcl_multi, make_env
from stages.envs.bfcl_multi import multi_turn_verdict

pytest.importorskip("bfcl", reason="nvidia-bfcl (import name bfcl) is not installed")

POWER = "[power(base=10, exponent=1000000000)]"  # minutes of CPU (and ~400 MB) in BFCL's MathAPI


@pytest.fixture
def fast_limits(monkeypatch):
    monkeypatch.setattr(bfcl_multi, "CALL_TIMEOUT_S", 1.0)
    monkeypatch.setattr(bfcl_multi, "CHECKER_MARGIN_S", 1.0)


@pytest.fixture(scope="module")
def math_task():
    tasks = make_env("bfcl", categories=["base"]).tasks("test", limit=16)
    task = next(t for t in tasks if "MathAPI" in t.meta["involved_classes"])
    assert "GorillaFileSystem" in task.meta["involved_classes"]
    return task


def _worker_pids() -> list[int]:
    """Host pids of running BFCL worker interpreters."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"python" in argv[0] and any(a.endswith(b"bfcl_worker.py") for a in argv[1:5]):
                pids.append(int(entry.name))
    return pids


def test_hanging_call_is_a_timeout_observation_and_state_survives(math_task, fast_limits):
    env = make_env("bfcl", max_turns=100)
    env.reset(math_task)
    first = env.step("[touch(file_name='lopd_probe.txt')]")
    assert "Error" not in first.observation[0].content
    started = time.monotonic()
    result = env.step(POWER)
    elapsed = time.monotonic() - started
    assert not result.done and elapsed < 10, elapsed
    assert result.observation[0].content == "Error during execution: timed out after 1 s"
    after = env.step("[ls()]")  # the replacement worker replayed the touch: same state as before
    assert "lopd_probe.txt" in after.observation[0].content and "Error" not in after.observation[0].content
    assert [s for turn in env._multi.answer for step in turn for s in step] == \
        ["touch(file_name='lopd_probe.txt')", "ls()"]  # the killed call is not recorded
    env.close()


def test_ground_truth_with_hostile_calls_mixed_in_still_scores_one(math_task, fast_limits):
    env = make_env("bfcl", max_turns=100)
    env.reset(math_task)
    from stages.core.text.toolcalls import format_python_calls
    from tests.test_env_bfcl import _keyword_call

    results = []
    for index, turn in enumerate(math_task.meta["ground_truth"]):
        if turn:
            calls = format_python_calls([_keyword_call(c, math_task.meta["involved_classes"]) for c in turn])
            if index == 0:  # the probe between two good calls of the same step
                calls = calls[:-1] + ", power(base=10, exponent=1000000000)]"
            results.append(env.step(calls))
            if index == 0:
                assert results[-1].observation[-1].content.startswith("Error during execution: timed out")
        results.append(env.step("done"))
    assert results[-1].done and results[-1].reward == 1.0, results[-1].info


def test_checker_replaying_a_hanging_call_fails_cleanly(math_task, fast_limits):
    answer = [[["power(base=10, exponent=1000000000)"]]] + [[] for _ in math_task.meta["ground_truth"][1:]]
    started = time.monotonic()
    verdict = multi_turn_verdict(math_task, answer)
    assert time.monotonic() - started < 30
    assert not verdict["valid"] and verdict["error_type"] == "multi_turn:checker_failed"
    assert "timed out" in verdict["error_message"]


def test_a_dead_worker_is_replaced_and_the_episode_continues(math_task):
    env = make_env("bfcl", max_turns=100)
    env.reset(math_task)
    env.step("[touch(file_name='lopd_probe.txt')]")
    worker = env._multi.worker
    worker._proc.kill()  # as the kernel would on memory exhaustion
    worker._proc.wait()
    after = env.step("[ls()]")
    assert "lopd_probe.txt" in after.observation[0].content and "Error" not in after.observation[0].content
    assert env._multi.worker is not worker
    env.close()


def test_worker_has_memory_limit_and_no_parent_environment(monkeypatch):
    monkeypatch.setenv("LOPD_TEST_SECRET", "s3cret")
    _bfcl_worker.close_pool()
    worker = _bfcl_worker.acquire()
    try:
        worker.request({"op": "ping"}, 60)
        pids = _worker_pids()
        assert pids
        for pid in pids:
            assert b"LOPD_TEST_SECRET" not in Path(f"/proc/{pid}/environ").read_bytes()
            limit = next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines()
                         if ln.startswith("Max address space"))
            assert limit.split()[3:5] == [str(_bfcl_worker.MEMORY_MB << 20)] * 2, limit
    finally:
        worker.close()


def test_workers_are_reused_between_episodes(math_task):
    env = make_env("bfcl", max_turns=100)
    env.reset(math_task)
    env.step("[pwd()]")
    first = env._multi.worker
    env.reset(math_task)
    env.step("[pwd()]")
    assert env._multi.worker is first  # given back to the pool and taken again
    env.close()
