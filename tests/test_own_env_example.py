"""The own-environment example (examples/own_env, docs/own-environment.md): loaded by the real
loader, every task's reference played through the real environment passes its checks, and wrong
play fails them."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from schemas import ToolCall
from stages.core.text.chat import format_tool_calls
from stages.envs import make_env
from stages.envs.envscaler import FINAL_REPLY

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_env"


def play(env, task, actions: list[str]):
    """Reset ``env`` on ``task`` and play ``actions``; returns the last step's result."""
    env.reset(task)
    for action in actions:
        result = env.step(action)
        if result.done:
            return result
    raise AssertionError(f"{task.task_id}: the episode did not end after {len(actions)} actions")


def action(name: str, **arguments) -> str:
    """One tool call as an agent writes it."""
    return format_tool_calls([ToolCall(name=name, arguments=json.dumps(arguments))])


@pytest.fixture(scope="module", params=[("envscaler", "official"), ("envscaler", "lenient"), ("lopd-bed", "exact")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def env(request):
    name, rules = request.param
    e = make_env(name, data_dir=EXAMPLE, episode_rules=rules)
    yield e
    e.close()


def test_the_files_are_what_make_py_writes():
    spec = importlib.util.spec_from_file_location("own_env_make", EXAMPLE / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    envs, tasks = make.rows()
    assert (EXAMPLE / "environments.jsonl").read_text() == make.jsonl(envs)
    assert (EXAMPLE / "tasks.jsonl").read_text() == make.jsonl(tasks)


def test_the_loader_reads_one_environment_and_its_splits(env):
    assert list(env.data.envs) == ["todo"]
    assert env.data.envs["todo"].tool_names == ["list_items", "add_item", "complete_item"]
    assert {s: len(ids) for s, ids in env.data.splits.items()} == {"test": 2, "train": 6}
    assert all(spec.reference for spec in env.data.tasks.values())


def test_every_reference_passes_every_check(env):
    for split in ("train", "test"):
        for task in env.tasks(split):
            result = play(env, task, env.reference_actions(task))
            assert result.reward == 1.0 and result.info["success"], (task.task_id, result.info)
            assert result.info["passed"] == result.info["total"] >= 2


def test_doing_nothing_fails_every_task(env):
    for split in ("train", "test"):
        for task in env.tasks(split):
            result = play(env, task, [FINAL_REPLY])
            assert result.reward < 1.0 and not result.info["success"], (task.task_id, result.info)


def test_a_wrong_item_or_title_fails(env):
    tasks = {t.task_id: t for t in env.tasks("train")}
    wrong_item = play(env, tasks["todo-01"], [action("complete_item", item_id="T-2"), FINAL_REPLY])
    assert wrong_item.reward == 0.0 and wrong_item.info["passed"] == 0, wrong_item.info
    wrong_title = play(env, tasks["todo-02"], [action("add_item", title="Call the plumbers"), FINAL_REPLY])
    assert wrong_title.reward < 1.0 and not wrong_title.info["success"], wrong_title.info
