"""ACEBench under its official rules: lopd's verdicts replayed against a transcription of ACEBench's checker.

The transcription below follows ACEBench/ACEBench at e6db74b: ``agent_eval`` and
``agent_eval_process`` in eval_main.py, ``agent_checker`` in model_eval/checker.py,
``calculate_unweighted_accuracy`` in model_eval/evaluation_helper.py, the result list of
``multi_step_inference`` / ``multi_turn_inference`` (``SAVED_CLASS``) in
model_inference/common_inference.py, and which agent messages count as process steps (every
multi-step message, model_inference/multi_step; multi-turn messages that decode as calls,
``CommonAgent.respond`` in model_inference/multi_turn/common_agent.py).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from schemas import Trajectory
from stages.core.text.toolcalls import parse_tool_calls
from stages.envs import EnvError, acebench_multi, make_env
from stages.envs.acebench import NUDGE, PhonePlatform, load_tasks
from stages.envs.acebench_score import official_end_to_end, official_result, step_text

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "acebench"
needs_data = pytest.mark.skipif(not (DATA / "data_agent_multi_turn.json").is_file(),
                                reason=f"no ACEBench data at {DATA}")
SAVED_CLASS = {"BaseApi": ["wifi", "logged_in"], "MessageApi": ["inbox"], "ReminderApi": ["reminder_list"],
               "FoodPlatform": ["users", "logged_in_users", "orders"], "Travel": ["users", "reservations"]}


# ---- the transcription -------------------------------------------------------------------------

def agent_checker(model_output: dict, possible_answer: dict) -> dict:
    result = {"valid": True, "error": []}
    scenario_name = list(possible_answer.keys())[0]
    possible_answer = list(possible_answer.values())[0]
    model_params = list(model_output.values())[0]
    for model_param, model_value in model_params.items():
        if model_param in possible_answer:
            possible_answer_value = possible_answer[model_param]
        else:
            result["valid"] = False
            result["error"].append(f"class({scenario_name}) attributes({model_param}) missing")
            continue
        if isinstance(possible_answer_value, dict):
            for param, value in possible_answer_value.items():
                if param not in model_value or value != model_value[param]:
                    result["valid"] = False
        elif possible_answer_value != model_value:
            result["valid"] = False
    return result


def agent_eval_item(model_result_item: list, possible_answer_item_) -> bool:
    if type(possible_answer_item_) != list:
        possible_answer_item_ = [possible_answer_item_]
    is_valid, checker_result = True, {"valid": True}
    if len(possible_answer_item_) != len(model_result_item):
        is_valid = False
    else:
        for index in range(len(possible_answer_item_)):
            possible_keys = set(possible_answer_item_[index].keys())
            matched_dict = None
            for model_dict in model_result_item:
                if possible_keys == set(model_dict.keys()):
                    matched_dict = model_dict
                    break
            if matched_dict:
                checker_result = agent_checker(matched_dict, possible_answer_item_[index])
            if checker_result["valid"] == False:  # noqa: E712 -- as upstream
                is_valid = False
    return is_valid


def agent_eval_process_item(model_result: list, call_process: list, correct: bool) -> float:
    if correct:
        return 1.00

    def one(path):
        result_indices, current_index = [], 0
        for stone in path:
            while current_index < len(model_result):
                if model_result[current_index].strip() == stone.strip():
                    result_indices.append(current_index)
                    current_index += 1
                    break
                current_index += 1
        return 1.00 if len(path) == 0 else len(result_indices) / len(path)

    if isinstance(call_process[0], list):
        return max(round(one(p), 3) for p in call_process)
    return one(call_process)


def saved_result(state: dict, involved_classes: list, called: bool) -> list:
    """The result list upstream saves (instances exist once a message decoded), through JSON as on disk."""
    if not called:
        return []
    out = [{name: {k: v for k, v in state[name].items() if k in SAVED_CLASS[name]}} for name in involved_classes]
    return json.loads(json.dumps(out))


def decodes(message: str) -> bool:
    """Whether ACEBench's execution role decodes the message (``decode_function_list``: ast.parse)."""
    func = message[1:] if message[:1] == " " else message
    func = ("" if func.startswith("[") else "[") + func + ("" if func.endswith("]") else "]")
    try:
        parsed = ast.parse(func.strip("[]'"), mode="eval")
    except SyntaxError:
        return False
    return isinstance(parsed.body, (ast.Call, ast.Tuple, ast.List))


# ---- playing --------------------------------------------------------------------------------------

class ScriptedUser:
    """The simulated user: an opening line, then "finish conversation" to every agent message."""

    settings: dict = {}

    def __init__(self, model, instruction, involved_classes=(), **settings):
        ScriptedUser.settings = settings

    def opening(self):
        return "Hello, I need help."

    def reply(self, agent_message):
        return "Thanks, that is all. finish conversation"

    finished = staticmethod(acebench_multi.SimulatedUser.finished)


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(acebench_multi, "SimulatedUser", ScriptedUser)


def play(task, actions: list[str], rules: str = "official"):
    env = make_env("acebench", data_dir=DATA, user_model="scripted", episode_rules=rules)
    env.reset(task)
    for action in actions:
        result = env.step(action)
        if result.done:
            return env, result
    raise AssertionError(f"{task.task_id}: the episode did not end")


def milestone_path(task) -> list[str]:
    ms = task.meta["mile_stone"]
    return ms[0] if isinstance(ms[0], list) else ms


def json_action(step: str) -> str:
    return "\n".join(f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.args})}</tool_call>"
                     for c in parse_tool_calls(step))


def all_tasks() -> dict:
    return {t.task_id: t for part in ("multi_step", "multi_turn") for t in load_tasks(DATA, part)}


# ---- replays ------------------------------------------------------------------------------------

@needs_data
def test_every_task_played_as_written_gets_the_official_verdict(scripted):
    """Each task's milestone strings played as written (stripped, as a model's reply ends): lopd's
    official verdict = the transcription's."""
    passed = {}
    for task_id, task in all_tasks().items():
        path = [step.strip() for step in milestone_path(task)]
        multi_turn = task.meta["part"] == "multi_turn"
        env, result = play(task, path + ["All done, anything else?" if multi_turn else "finish conversation"])
        messages = [m for m in path if decodes(m)] if multi_turn else path
        called = any(decodes(m) for m in path)
        result_list = saved_result(env.platform.state(), task.meta["involved_classes"], called)
        ok = agent_eval_item(result_list, task.meta["ground_truth"])
        process = agent_eval_process_item(messages, task.meta["mile_stone"], ok)
        assert (result.info["end_to_end"], result.info["process_accuracy"]) == (ok, process), task_id
        assert result.info["episode_rules"] == "official"
        passed[task_id] = ok
    assert len(passed) == 50 and sum(passed.values()) > 30  # the released paths mostly reach their answers


@needs_data
@pytest.mark.parametrize("task_id, fix", [
    # the milestone names a product the menu lacks; the answer's order has the full name
    ("agent_multi_step_0", {"'Super Supreme'": "'Super Supreme Pizza'"}),
    ("agent_multi_step_1", {"'Super Supreme'": "'Super Supreme Pizza'"}),
    ("agent_multi_turn_7", {}),
])
def test_answer_classes_without_a_match_are_skipped(scripted, task_id, fix):
    """ReminderAPI / Reminderpi in the answer match no class: officially skipped, in lopd before a failure."""
    task = all_tasks()[task_id]
    actions = []
    for step in milestone_path(task):
        for old, new in fix.items():
            step = step.replace(old, new)
        actions.append(re.sub(r"='([^'=]*'[^'=]*)'(?=[,)])", lambda m: "=" + json.dumps(m.group(1)), step))
    end = "Anything else?" if task.meta["part"] == "multi_turn" else "finish conversation"
    env, official = play(task, [json_action(a) for a in actions] + [end])
    result_list = saved_result(env.platform.state(), task.meta["involved_classes"], True)
    assert official.info["end_to_end"] is agent_eval_item(result_list, task.meta["ground_truth"]) is True
    _, lenient = play(task, [json_action(a) for a in actions] + ["Anything else?"], rules="lenient")
    assert lenient.info["end_to_end"] is False  # lopd before: the misspelt class failed


@needs_data
def test_dict_attributes_are_compared_on_the_answers_keys(scripted):
    """multi_turn_6: the right reminder plus a duplicate passes officially (extra keys), failed before."""
    task = all_tasks()["agent_multi_turn_6"]
    path = [json_action(s) for s in ["[login_device()]"] + milestone_path(task)]  # the release's path lacks the login
    actions = path + [path[-1], "Anything else?"]
    env, official = play(task, actions)
    result_list = saved_result(env.platform.state(), task.meta["involved_classes"], True)
    assert official.info["end_to_end"] is agent_eval_item(result_list, task.meta["ground_truth"]) is True
    assert play(task, actions, rules="lenient")[1].info["end_to_end"] is False


@needs_data
def test_strict_process_steps_are_exact_strings():
    """A JSON call of the Domino's step: the exact-string rule credits no step the release writes
    ``'Domino's'``; the lenient value comparison credited it."""
    task = all_tasks()["agent_multi_step_0"]
    login, order = milestone_path(task)[:2]
    calls = [json_action(login), json_action(order.replace("'Domino's'", "\"Domino's\""))]
    _, official = play(task, calls + ["finish conversation"])
    texts = [step_text(c, parse_tool_calls(c)) for c in calls]
    assert texts[0] == login and texts[1] != order
    assert official.info["process_accuracy"] == agent_eval_process_item(texts, task.meta["mile_stone"], False) == 1 / 3
    _, lenient = play(task, calls + ["Done."], rules="lenient")
    assert lenient.info["process_accuracy"] == pytest.approx(2 / 3)


def test_step_text_is_the_action_in_acebench_format():
    call = '<tool_call>{"name": "add_reminder", "arguments": {"title": "A", "time": 3}}</tool_call>'
    assert step_text(call, parse_tool_calls(call)) == "[add_reminder(title='A', time=3)]"
    assert step_text("<think>x</think> [turn_on_wifi()] ", parse_tool_calls("[turn_on_wifi()]")) == "[turn_on_wifi()]"
    assert step_text("Which user?", []) == "Which user?"


@needs_data
def test_a_reply_without_a_call_gets_the_nudge_in_multi_step():
    task = all_tasks()["agent_multi_step_2"]
    env = make_env("acebench", data_dir=DATA)
    assert "finish conversation" in env.reset(task)[0].content
    first = env.step("finish conversation")  # the first message does not end the dialogue upstream
    assert not first.done and first.observation[0].content == NUDGE
    asked = env.step("Which user should I log in as?")
    assert not asked.done and asked.observation[0].content == NUDGE
    end = env.step("finish conversation")
    assert end.done and end.info["end_to_end"] is False  # no call ever decoded: an empty result list
    lenient = make_env("acebench", data_dir=DATA, episode_rules="lenient")
    lenient.reset(task)
    assert lenient.step("Which user should I log in as?").done


def test_nothing_called_is_an_empty_result_that_fails():
    state = PhonePlatform({"BaseApi": {"wifi": True, "logged_in": True}}).state()
    answer = [{"BaseApi": {"wifi": True, "logged_in": True}}]
    assert official_result(state, ["BaseApi"], called=False) == []
    assert official_end_to_end([], answer)[0] is agent_eval_item([], answer) is False
    assert official_end_to_end(official_result(state, ["BaseApi"], True), answer) == (True, [])


def test_platform_edge_cases_error_like_upstream():
    p = PhonePlatform({"BaseApi": {"wifi": True, "logged_in": True}})
    before = p.state()
    assert p.call("search_reminders", {"keyword": "Meeting"})["status"] is False  # not an upstream function
    p.call("login_food_platform", {"username": "Eve", "password": "password123"})
    logged = p.state()
    for items in ("Cheese Milk Tea", {"product": "Cheese Milk Tea"}, 3, None):
        order = {"username": "Eve", "merchant_name": "Heytea", "items": items}
        assert p.call("add_food_delivery_order", order)["status"] is False
    assert p.state() == logged and before != logged
    assert p.call("add_food_delivery_order", {"username": "Eve", "merchant_name": "Heytea", "items": {}})["status"]
    assert p.orders[-1]["items"] == [] and p.orders[-1]["total_price"] == 0.0  # upstream iterates an empty dict


@needs_data
def test_multi_turn_prompt_policy_and_user_settings(scripted):
    tasks = all_tasks()
    phone, travel = tasks["agent_multi_turn_0"], tasks["agent_multi_turn_20"]
    env = make_env("acebench", data_dir=DATA, user_model="scripted")
    system = env.reset(phone)[0].content
    assert "June 11, 2024, 16:00" in system and "login_device()" in system and "Memory is full" in system
    assert ScriptedUser.settings == {"max_new_tokens": 1000, "whole_reply": True, "language": "en"}
    system = env.reset(travel)[0].content
    assert "July 15, 2024, 08:00" in system and "50 yuan" in system and "login_device()" not in system
    lenient = make_env("acebench", data_dir=DATA, user_model="scripted", episode_rules="lenient")
    assert "login_device()" not in lenient.reset(phone)[0].content
    assert ScriptedUser.settings == {"max_new_tokens": 64, "whole_reply": False, "language": "en"}
    with pytest.raises(EnvError, match="episode_rules must be one of official, lenient"):
        make_env("acebench", data_dir=DATA, episode_rules="strict")


def test_the_agent_score_is_the_plain_mean_of_the_parts():
    """Multi-step 0.5 (10 of 20), multi-turn 0.2 (6 of 30): ACEBench's agent score 0.35; pooled 0.32."""
    from stages.benches import _acebench_score

    def traj(task_id: str, ok: bool) -> Trajectory:
        return Trajectory(trajectory_id=task_id, task_id=task_id, env="acebench", split="test", prompt="p", policy="m",
                          messages=[], turns=[], reward=float(ok), success=ok, num_steps=0, num_tool_calls=0,
                          run_id="r", info=json.dumps({"end_to_end": ok, "process_accuracy": 1.0 if ok else 0.25}))

    trajs = [traj(f"agent_multi_step_{i}", i < 10) for i in range(20)]
    trajs += [traj(f"agent_multi_turn_{i}", i < 6) for i in range(30)]
    scores, _ = _acebench_score(None, None, trajs)
    part_step, part_turn = 10 / 20, 6 / 30
    assert scores["multi_step_end_to_end"] == part_step and scores["multi_turn_end_to_end"] == part_turn
    assert scores["end_to_end"] == round((round(part_step, 3) + round(part_turn, 3)) / 2, 3) == 0.35
    assert scores["pooled_end_to_end"] == pytest.approx(16 / 50) == 0.32
    process = [round((n + (20 - n) * 0.25) / 20, 3) for n in (10,)] + [round((6 + 24 * 0.25) / 30, 3)]
    assert scores["process_accuracy"] == round(sum(process) / 2, 3)


def test_decoding_agrees_with_lopd_parsing_on_every_milestone():
    """The transcription's `decodes` and lopd's parser agree on which released steps are calls."""
    if not (DATA / "data_agent_multi_turn.json").is_file():
        pytest.skip(f"no ACEBench data at {DATA}")
    from stages.core.text.toolcalls import ToolCallParseError

    for task in all_tasks().values():
        for step in (s.strip() for s in milestone_path(task)):
            try:
                calls = parse_tool_calls(step)
            except ToolCallParseError:
                calls = []
            assert bool(calls) == decodes(step), step
