"""ACEBench agent environment: phone platform, milestone scoring, end-to-end state check, multi-turn."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas import ToolCall
from stages.envs import EnvError, make_env
from stages.envs.base import AGENTIC_RULES
from stages.envs.acebench import PhonePlatform
from stages.envs.acebench_score import end_to_end, parse_milestone, process_accuracy

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "acebench"
needs_data = pytest.mark.skipif(not (DATA / "data_agent_multi_step.json").is_file(), reason=f"no ACEBench data at {DATA}")
# Tasks whose released end state disagrees with their own milestone path (upstream data noise:
# a product name missing from the menu, a missing login step, a different deleted message).
INCONSISTENT = {0, 1, 12, 13, 14, 15, 16, 17}


def _path(task) -> list[str]:
    ms = task.meta["mile_stone"]
    return ms[0] if isinstance(ms[0], list) else ms


def _action(step: str) -> str:
    return "\n".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in parse_milestone(step))


def test_parse_milestone_tolerates_unescaped_quotes():
    step = "[add_food_delivery_order(username='Eve', merchant_name='Domino's', items=[{'product': 'X', 'quantity': 1}])]"
    assert parse_milestone(step) == [("add_food_delivery_order",
                                      {"username": "Eve", "merchant_name": "Domino's", "items": [{"product": "X", "quantity": 1}]})]
    assert parse_milestone("[login_device(), get_products(merchant_name='Heytea')]") == [
        ("login_device", {}), ("get_products", {"merchant_name": "Heytea"})]


def test_process_accuracy_in_order_best_path():
    ms = ["[turn_on_wifi()]", "[delete_message(message_id=4)]"]
    wifi, delete = [ToolCall(name="turn_on_wifi")], [ToolCall(name="delete_message", arguments='{"message_id": 4}')]
    assert process_accuracy([wifi, delete], ms) == 1.0
    assert process_accuracy([delete, wifi], ms) == 0.5  # order matters
    assert process_accuracy([], ms) == 0.0
    assert process_accuracy([delete], [["[turn_on_wifi()]"], ["[delete_message(message_id=4)]"]]) == 1.0


def test_platform_rules():
    p = PhonePlatform({"BaseApi": {"wifi": False, "logged_in": True}})
    assert p.call("login_food_platform", {"username": "Eve", "password": "password123"})["status"] is False
    p.call("turn_on_wifi", {})
    assert p.call("login_food_platform", {"username": "Eve", "password": "password123"})["status"] is True
    order = p.call("add_food_delivery_order", {"username": "Eve", "merchant_name": "Heytea",
                                               "items": [{"product": "Cheese Milk Tea", "quantity": 2}]})
    assert order["status"] and p.users["Eve"]["balance"] == 450.0
    assert p.call("send_message", {"sender_name": "Eve", "receiver_name": "Frank", "message": "hi"})["message"].startswith("Inbox capacity is full")
    assert p.call("get_latest_message_id", {})["message_id"] == 4
    assert p.call("nope", {})["status"] is False
    assert p.call("add_food_delivery_order", {"username": "Eve", "merchant_name": "Heytea", "items": [3]})["status"] is False


@needs_data
def test_milestones_score_full_process_accuracy_and_consistent_end_states():
    env = make_env("acebench", data_dir=DATA, episode_rules="lenient")
    tasks = env.tasks("test")
    assert len(tasks) == 20
    end_ok = set()
    for i, task in enumerate(tasks):
        system = env.reset(task)[0]
        assert system.role == "system" and system.content.endswith(AGENTIC_RULES)  # A.5 of the LOPD paper
        for step in _path(task):
            assert not env.step(_action(step)).done
        result = env.step("All done.")
        assert result.done and result.info["process_accuracy"] == 1.0 and result.reward == 1.0
        if result.info["end_to_end"]:
            end_ok.add(i)
    assert end_ok == set(range(20)) - INCONSISTENT


@needs_data
def test_ground_truth_state_matches_and_empty_answer_scores_zero():
    env = make_env("acebench", data_dir=DATA, episode_rules="lenient")
    for task in env.tasks("test", limit=5):
        gt = task.meta["ground_truth"]
        state = {cls: attrs for entry in gt for cls, attrs in entry.items()}
        assert end_to_end(state, gt) == (True, [])
        env.reset(task)
        result = env.step("I cannot help with that.")
        assert result.done and result.reward == 0.0 and not result.info["end_to_end"]


def test_missing_data_names_the_flag(tmp_path):
    with pytest.raises(EnvError, match=r"--data-dir <ACEBench>/data_all/data_en or data_zh \(git clone github.com/ACEBench"):
        make_env("acebench").tasks("test")
    with pytest.raises(EnvError, match="data_agent_multi_step.json not found"):
        make_env("acebench", data_dir=tmp_path).tasks("test")


@needs_data
def test_multi_turn_with_the_tiny_model_as_agent_and_user(tmp_path):
    """One multi-turn task end to end: the tiny model plays both sides; the simulated user opens
    the dialogue and answers, the step cap ends it, the report has multi-step, multi-turn and overall."""
    from rich.console import Console

    from stages.evaluate import EvaluateConfig, run
    from tests.tiny import save_tiny

    tiny = str(save_tiny(tmp_path / "tiny"))
    env = make_env("acebench", data_dir=DATA, user_model=tiny, max_turns=2)
    turn = [t for t in env.tasks("test") if t.task_id.startswith("agent_multi_turn")]
    assert len(turn) == 30 and all(t.meta["part"] == "multi_turn" for t in turn)
    travel = next(t for t in turn if "Travel" in t.meta["involved_classes"])
    assert env.reset(travel)[0].content.startswith("You are an AI airline agent")
    assert env._user.messages[0]["content"].startswith("You are a user talking to an airline agent")
    opening = env.reset(turn[0])
    assert opening[1].role == "user" and env._user.messages[0]["content"].count(turn[0].prompt) == 1
    assert env._user.messages[0]["content"].startswith("You are a user talking to an assistant agent that operates your phone")
    first = env.step("Hello, how can I help?")  # no tool call: the user answers
    assert not first.done and first.observation[0].role == "user"
    assert env.step("Anything else?").done  # the step cap
    multi_turn_first = min(i for i, t in enumerate(env.tasks("test")) if t.task_id.startswith("agent_multi_turn"))
    report = run(EvaluateConfig(bench="acebench", data_dir=str(DATA), model=tiny, limit=multi_turn_first + 1,
                                max_new_tokens=4, max_turns=2, out=str(tmp_path / "r.json")),
                 Console(file=open("/dev/null", "w")))
    assert {"end_to_end", "multi_step_end_to_end", "multi_turn_end_to_end", "multi_turn_process_accuracy"} <= set(report["scores"])
    assert f"data: {DATA}, language en (20 multi-step, 1 multi-turn tasks, 0 of them on Travel)" in report["notes"]
    with pytest.raises(EnvError, match="needs a user model"):
        make_env("acebench", data_dir=DATA).reset(turn[0])
