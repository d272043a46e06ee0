"""The ``exact`` episode rules of the lopd study bed: the state comparison (pure functions against
a naive reference) and episodes on the bundled bed that extra, repeated or refused calls fail."""
from __future__ import annotations

import itertools
import json
import random

import pytest

from schemas import ToolCall
from stages.core.text.chat import format_tool_calls
from stages.envs import make_env
from stages.envs._envscaler_worker import exact_verdict, state_diff
from stages.envs.envscaler_rules import exact_reward, is_lookup


def _leaves(state: dict, path: tuple = ()) -> dict[tuple, object]:
    """Naive reference: every non-dict value by its key path (an empty dict is a leaf too)."""
    if isinstance(state, dict) and state:
        return {p: v for k, item in state.items() for p, v in _leaves(item, path + (k,)).items()}
    return {path: state}


def _random_state(rng: random.Random, depth: int = 0) -> dict:
    return {k: (_random_state(rng, depth + 1) if depth < 2 and rng.random() < 0.4 else rng.choice([0, 1, "a", [1, 2]]))
            for k in rng.sample("abcd", rng.randint(1, 3))}


def test_state_diff_names_the_paths_a_naive_leaf_comparison_finds():
    rng = random.Random(3)
    for _ in range(300):
        a, b = _random_state(rng), _random_state(rng)
        la, lb = _leaves(a), _leaves(b)
        naive = {p for p in la.keys() | lb.keys() if la.get(p, object()) != lb.get(p, object())}
        got = set(state_diff(a, b))
        # every naive difference lies at or below a reported path, and every reported path covers one
        assert all(any(p[:len(q)] == q for q in got) for p in naive)
        assert all(any(p[:len(q)] == q for p in naive) for q in got)
        assert (got == set()) == (a == b)


def test_exact_verdict_separates_wrong_values_of_wanted_changes_from_other_changes():
    initial = {"m": {"M-1": {"day": "Mon", "hour": 9, "status": "on"}, "M-2": {"day": "Tue", "hour": 10, "status": "on"}}}
    reference = {"m": {"M-1": {"day": "Fri", "hour": 9, "status": "on"}, "M-2": initial["m"]["M-2"]}}
    assert exact_verdict(initial, reference, reference) == {"equal": True, "outside": []}
    wrong_day = {"m": {"M-1": {"day": "Thu", "hour": 9, "status": "on"}, "M-2": initial["m"]["M-2"]}}
    assert exact_verdict(initial, reference, wrong_day) == {"equal": False, "outside": []}
    extra = {"m": {"M-1": reference["m"]["M-1"], "M-2": {"day": "Tue", "hour": 10, "status": "off"}}}
    assert exact_verdict(initial, reference, extra)["outside"] == [["'m'", "'M-2'", "'status'"]]
    added = dict(reference, log=["x"])
    assert exact_verdict(initial, reference, added)["outside"] == [["'log'"]]
    undone = ("m", "M-2", "status")  # changed on the way and changed back: still a change not asked for
    assert exact_verdict(initial, reference, reference, {undone})["outside"] == [["'m'", "'M-2'", "'status'"]]
    assert exact_verdict(initial, reference, reference, {undone}, {undone})["outside"] == []
    assert exact_verdict(initial, reference, reference, {("m", "M-1", "day")})["outside"] == []


@pytest.mark.parametrize("passed, total, equal, outside, refused, want", [
    (2, 2, True, 0, 0, 1.0), (1, 2, True, 0, 0, 0.5), (2, 2, True, 0, 1, 0.0), (2, 2, False, 1, 0, 0.0), (1, 2, False, 0, 0, 0.5),
    (2, 2, False, 0, 0, 0.5), (1, 1, False, 0, 0, 0.0), (2, 3, False, 0, 0, 2 / 3), (3, 3, False, 0, 0, 2 / 3)])
def test_exact_reward_table(passed, total, equal, outside, refused, want):
    assert exact_reward(passed, total, equal, outside, refused) == pytest.approx(want)


def test_exact_reward_is_one_only_for_an_equal_state_passing_every_check():
    for passed, total in ((p, t) for t in range(1, 5) for p in range(t + 1)):
        for equal, outside, refused in itertools.product((True, False), (0, 2), (0, 1)):
            reward = exact_reward(passed, total, equal, outside, refused)
            assert (reward == 1.0) == (equal and passed == total and not outside and not refused)
            assert reward <= passed / total  # a reference that fails its own checks scores below 1


def _text(name: str, args: dict) -> str:
    return format_tool_calls([ToolCall(name=name, arguments=json.dumps(args))])


def _play(env, task, actions):
    env.reset(task)
    for action in actions:
        result = env.step(action)
        if result.done:
            return result
    raise AssertionError("episode did not end")


@pytest.fixture(scope="module")
def bed():
    env = make_env("lopd-bed")
    tasks = {t.task_id: t for t in env.tasks("train")}
    return env, tasks


def _a_task(env, tasks, min_writes: int):
    """The first train task whose reference makes at least ``min_writes`` state-changing calls."""
    for tid in sorted(tasks):
        writes = [c for c in env.data.tasks[tid].reference if not is_lookup(c.name)]
        if len(writes) >= min_writes and len(env.data.tasks[tid].checks) >= min_writes:
            return tasks[tid], writes
    raise AssertionError("no such task")


def test_exact_episodes_reward_the_reference_state_only(bed):
    env, tasks = bed
    task, writes = _a_task(env, tasks, 2)
    ref = env.reference_actions(task)
    done = _play(env, task, ref)
    assert done.reward == 1.0 and done.info["success"] and done.info["episode_rules"] == "exact"
    first = _text(writes[0].name, writes[0].args)
    partial = _play(env, task, [first, "Task Completed"])
    assert 0 < partial.reward < 1 and not partial.info["success"] and partial.info["outside_changes"] == []
    repeated = _play(env, task, ref[:-1] + [first, "Task Completed"])  # refused, or a wanted change made twice
    assert repeated.reward < 1 and not repeated.info["success"]
    unknown = _play(env, task, ref[:-1] + [_text("no_such_tool", {}), "Task Completed"])
    assert unknown.reward == 0.0 and unknown.info["refused_calls"] == 1 and unknown.info["state_equal"]
    lenient = make_env("lopd-bed", episode_rules="lenient")
    assert _play(lenient, task, ref[:-1] + [_text("no_such_tool", {}), "Task Completed"]).reward == 1.0
