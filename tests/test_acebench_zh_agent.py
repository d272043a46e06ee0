"""ACEBench's Chinese agent tasks (``--language zh``): platforms, prompts and verdicts replayed against the
official ones.

The official side: tests/acebench_platform_zh_reference.py (a literal transcription of ACEBench's Chinese
platforms, model_inference/multi_turn/scenarioszh/ at e6db74b), the checker transcription of
tests/test_acebench_official.py (eval_main.py, model_eval/checker.py; no language branch there), and the
SHA-256 of ACEBench's Chinese agent and user prompts (each names its file). Data: the hand-written agent
fixtures in tests/fixtures/acebench_zh (ACEBench's data_zh layout).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from stages.envs import acebench_multi, make_env
from stages.envs.acebench import NUDGE, load_tasks
from stages.envs.acebench_phone import PhonePlatform
from stages.envs.acebench_prompts_zh import (BASE_PROMPT_ZH, MULTI_STEP_AGENT_PROMPT_ZH,
                                                  MULTI_TURN_AGENT_PROMPT_ZH, OPENING_ZH, TRAVEL_PROMPT_ZH,
                                                  USER_PROMPT_BASE_ZH, USER_PROMPT_TRAVEL_ZH, agent_prompt_zh)
from stages.envs.acebench_travel import TravelPlatform
from tests import acebench_platform_zh_reference as ref
from tests.test_acebench_official import SAVED_CLASS, agent_eval_item, agent_eval_process_item, saved_result

FIXTURES = Path(__file__).parent / "fixtures" / "acebench_zh"
OFFICIAL_SHA256 = {  # of ACEBench's strings at e6db74b
    # MULTI_TURN_AGENT_PROMPT_SYSTEM_ZH, model_inference/multi_step/common_agent_step.py
    "MULTI_STEP_AGENT_PROMPT_ZH": "639da606b6f7aeaf29891d9bb9f69529208ad490a7553e17cb4127e1f6419445",
    # MULTI_TURN_AGENT_PROMPT_SYSTEM_ZH, model_inference/multi_turn/common_agent.py
    "MULTI_TURN_AGENT_PROMPT_ZH": "6eaa5c8fc22dc3aea7bd81c8eaa8b36a9d0596404aa2b7e9c798c72a9b94a57d",
    # BASE_PROMPT_ZH and TRAVEL_PROMPT_ZH, model_inference/prompt_zh.py
    "BASE_PROMPT_ZH": "153e877f61316cdd51a430c3ce0699fdb41b34808c2c978d534bc169306af5a6",
    "TRAVEL_PROMPT_ZH": "5b7e2e8940eb299a93ca624c41a892051c89dc41ef483f958e9299fa69cea038",
    # SYSTEM_PROMPT_BASE_ZH and SYSTEM_PROMPT_TRAVEL_ZH, model_inference/multi_turn/APIModel_user.py
    "USER_PROMPT_BASE_ZH": "2130de80ec084075295dda7dd258871f50b2fba7004af2f287f47bc0e0f51ff4",
    "USER_PROMPT_TRAVEL_ZH": "711377c2a3bc500941f90fd069b2941788c3ec8ab76c25798bae1a45bbbeb101",
}
PROMPTS = {"MULTI_STEP_AGENT_PROMPT_ZH": MULTI_STEP_AGENT_PROMPT_ZH, "MULTI_TURN_AGENT_PROMPT_ZH": MULTI_TURN_AGENT_PROMPT_ZH,
           "BASE_PROMPT_ZH": BASE_PROMPT_ZH, "TRAVEL_PROMPT_ZH": TRAVEL_PROMPT_ZH,
           "USER_PROMPT_BASE_ZH": USER_PROMPT_BASE_ZH, "USER_PROMPT_TRAVEL_ZH": USER_PROMPT_TRAVEL_ZH}


def test_the_chinese_agent_and_user_prompts_are_acebench_word_for_word():
    for name, digest in OFFICIAL_SHA256.items():
        assert hashlib.sha256(PROMPTS[name].encode()).hexdigest() == digest, name


# ---- prompt assembly: transcriptions of the official choices -----------------------------------------

def official_agent_prompt(part: str, involved_class: list) -> str:
    """``CommonAgent_Step.respond`` (model_inference/multi_step/common_agent_step.py) and ``CommonAgent.respond``
    (model_inference/multi_turn/common_agent.py), language "zh"."""
    if part == "multi_step":
        return MULTI_STEP_AGENT_PROMPT_ZH
    system_prompt = MULTI_TURN_AGENT_PROMPT_ZH
    if "Travel" in involved_class:
        system_prompt += TRAVEL_PROMPT_ZH
    if "BaseApi" in involved_class:
        system_prompt += BASE_PROMPT_ZH
    return system_prompt


def official_user_messages(question: str, involved_class: list) -> list:
    """``APIUSER.get_init_prompt`` (model_inference/multi_turn/APIModel_user.py), language "zh"."""
    if "BaseApi" in involved_class:
        system_prompt = USER_PROMPT_BASE_ZH
    elif "Travel" in involved_class:
        system_prompt = USER_PROMPT_TRAVEL_ZH
    return [{"role": "system", "content": system_prompt.format(instruction=question)},
            {"role": "user", "content": "今天有什么需要帮助的吗？"}]


class RecordingUser:
    """The simulated user: records its settings, opens, then ends the dialogue at once."""

    settings: dict = {}

    def __init__(self, model, instruction, involved_classes=(), **settings):
        RecordingUser.settings = {"instruction": instruction, "classes": list(involved_classes), **settings}

    def opening(self):
        return "我想取消一个预订。"

    def reply(self, agent_message):
        return "好的，谢谢。finish conversation"


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(acebench_multi, "SimulatedUser", RecordingUser)


@pytest.mark.parametrize("part, classes", [
    ("multi_step", ["BaseApi", "FoodPlatform"]), ("multi_turn", ["Travel"]), ("multi_turn", ["BaseApi", "MessageApi"]),
    ("multi_turn", ["BaseApi", "Travel"])])
def test_agent_and_user_prompts_are_picked_as_acebench_does(part, classes):
    assert agent_prompt_zh(part, classes) == official_agent_prompt(part, classes)
    if part == "multi_turn":
        messages = [{"role": "system", "content": acebench_multi.user_prompt("说明", classes, "zh")},
                    {"role": "user", "content": OPENING_ZH}]
        assert messages == official_user_messages("说明", classes)


def test_episodes_get_the_chinese_prompts(scripted):
    tasks = {t.task_id: t for part in ("multi_step", "multi_turn") for t in load_tasks(FIXTURES, part)}
    env = make_env("acebench", data_dir=FIXTURES, user_model="scripted", language="zh")
    step = env.reset(tasks["agent_multi_step_0"])
    assert step[0].content == MULTI_STEP_AGENT_PROMPT_ZH and step[1].content == tasks["agent_multi_step_0"].prompt
    assert isinstance(env.platform, PhonePlatform) and env.platform.zh
    assert env.step("我需要更多信息。").observation[0].content == NUDGE  # the nudge has no language branch
    turn = env.reset(tasks["agent_multi_turn_0"])
    assert turn[0].content == MULTI_TURN_AGENT_PROMPT_ZH + TRAVEL_PROMPT_ZH and turn[1].content == "我想取消一个预订。"
    assert isinstance(env.platform, TravelPlatform) and env.platform.cabins == ("经济舱", "商务舱")
    assert RecordingUser.settings == {"instruction": tasks["agent_multi_turn_0"].prompt, "classes": ["Travel"],
                                      "max_new_tokens": 1000, "whole_reply": True, "language": "zh"}


# ---- the platforms replayed against the transcription --------------------------------------------------

def _norm(value):
    return json.loads(json.dumps(value, default=str))


def _official_phone(config: dict) -> dict:
    """One instance per class, each loaded with the BaseApi config (``execute_agent_func_call``)."""
    instances = {"BaseApi": ref.BaseApi(), "MessageApi": ref.MessageApi(), "ReminderApi": ref.ReminderApi(),
                 "FoodPlatform": ref.FoodPlatform()}
    for instance in instances.values():
        instance._load_scenario(config.get("BaseApi", {}))
    return instances


def _replay(lopd, official_call, calls):
    """Each call on both sides: the same result; where upstream raises, lopd's error result names the error, or
    (a third element in the call) is the documented deviation given."""
    for name, args, *deviation in calls:
        got = lopd.call(name, args)
        try:
            want = _norm(official_call(name, args))
        except Exception as err:  # noqa: BLE001 -- upstream's executor reports any exception
            assert got == (deviation[0] if deviation else {"status": False, "message": f"Error during execution: {err}"}), (
                name, args)
            continue
        assert not deviation, (name, args)
        assert _norm(got) == want, (name, args)


PHONE_CALLS = [
    ("view_logged_in_users", {}), ("get_latest_message_id", {}), ("get_earliest_message_id", {}),
    ("send_message", {"sender_name": "Grace", "receiver_name": "Frank", "message": "你好"}),  # inbox full
    ("delete_message", {"message_id": 99}), ("delete_message", {"message_id": 3}),
    ("send_message", {"sender_name": "Grace", "receiver_name": "Zed", "message": "你好"}),
    ("send_message", {"sender_name": "Grace", "receiver_name": "Frank", "message": "你好"}),
    ("view_messages_between_users", {"sender_name": "Frank", "receiver_name": "Grace"}),
    ("view_messages_between_users", {"sender_name": "Zed", "receiver_name": "Grace"}),
    ("view_messages_between_users", {"sender_name": "Frank", "receiver_name": "Zed"}),
    ("view_messages_between_users", {"sender_name": "Eve", "receiver_name": "Jack"}),
    ("search_messages", {"user_name": "Frank", "keyword": "披萨"}), ("search_messages", {"user_name": "Zed", "keyword": "x"}),
    ("search_messages", {"user_name": "Frank", "keyword": "没有"}),
    ("view_reminder_by_title", {"title": "To-do list"}), ("view_reminder_by_title", {"title": "无"}),
    ("add_reminder", {"title": "今日花费", "description": "今日花费88.0元", "time": "2024-07-15 09:30"}),
    ("delete_reminder", {"reminder_id": 1}), ("delete_reminder", {"reminder_id": 99}), ("view_all_reminders", {}),
    ("mark_as_notified", {"reminder_id": 2}), ("mark_as_notified", {"reminder_id": 99}),
    ("search_reminders", {"keyword": "不存在的"}), ("search_reminders", {"keyword": "Team"}),  # upstream raises
    ("login_food_platform", {"username": "Eve", "password": "wrong"}),
    ("login_food_platform", {"username": "Zed", "password": "x"}),
    ("login_food_platform", {"username": "Eve", "password": "password123"}),
    ("login_food_platform", {"username": "Eve", "password": "password123"}), ("view_logged_in_users", {}),
    ("check_balance", {"user_name": "Eve"}), ("check_balance", {"user_name": "Zed"}),
    ("add_food_delivery_order", {"username": "Frank", "merchant_name": "达美乐", "items": []}),
    ("add_food_delivery_order", {"username": "Eve", "merchant_name": "无此店", "items": []}),
    ("add_food_delivery_order", {"username": "Eve", "merchant_name": "达美乐",
                                 "items": [{"product": "超级至尊披萨", "quantity": 0}]}),
    ("add_food_delivery_order", {"username": "Eve", "merchant_name": "达美乐", "items": [{"product": "榴莲披萨"}]}),
    ("add_food_delivery_order", {"username": "Eve", "merchant_name": "达美乐",
                                 "items": [{"product": "超级至尊披萨", "quantity": 1}]}),
    ("search_orders", {"keyword": "达美乐"}), ("search_orders", {"keyword": "披萨"}),  # the second: upstream raises
    ("login_food_platform", {"username": "Grace", "password": "password789"}),
    ("add_food_delivery_order", {"username": "Grace", "merchant_name": "盒马生鲜",  # 150.0 = her balance: refused
                                 "items": [{"product": "有机蔬菜包", "quantity": 10}]}),
    ("add_food_delivery_order", {"username": "Grace", "merchant_name": "盒马生鲜",
                                 "items": [{"product": "有机蔬菜包", "quantity": 9}]}),
    ("get_products", {"merchant_name": "喜茶"}), ("get_products", {"merchant_name": "无此店"}),
    ("view_orders", {"user_name": "Eve"}), ("view_orders", {"user_name": "Frank"}),
    ("turn_on_wifi", {}), ("login_device", {}),
]
OFFLINE_CALLS = [
    ("send_message", {"sender_name": "Grace", "receiver_name": "Frank", "message": "你好"}),
    ("delete_message", {"message_id": 1}), ("view_messages_between_users", {"sender_name": "Eve", "receiver_name": "Frank"}),
    ("get_latest_message_id", {}), ("get_earliest_message_id", {}), ("view_reminder_by_title", {"title": "x"}),
    ("add_reminder", {"title": "t", "description": "d", "time": "2024-07-15 09:30"}), ("delete_reminder", {"reminder_id": 1}),
    ("login_food_platform", {"username": "Eve", "password": "password123"}),
    ("login_device", {}), ("send_message", {"sender_name": "Grace", "receiver_name": "Frank", "message": "你好"}),
]


@pytest.mark.parametrize("config, calls", [({"BaseApi": {"wifi": True, "logged_in": True}}, PHONE_CALLS),
                                           ({"BaseApi": {"wifi": False, "logged_in": False}}, OFFLINE_CALLS)])
def test_phone_platform_replays_the_chinese_classes(config, calls):
    """Every function, its errors and the zh-only logic (scenarioszh/phone_platform/*.py): same results, same state."""
    lopd, official = PhonePlatform(config, language="zh"), _official_phone(config)

    def official_call(name, args):
        owners = [i for i in official.values() if name in type(i).__dict__ or name in ref.BaseApi.__dict__]
        results = [getattr(i, name)(**args) for i in owners]  # the device calls reach every instance (lopd: one state)
        return results[0] if name in ref.BaseApi.__dict__ else results[-1]

    _replay(lopd, official_call, calls)
    state = lopd.state()
    for name, instance in official.items():
        assert _norm({k: instance.__dict__[k] for k in SAVED_CLASS[name]}) == state[name], name


TRAVEL_CALLS = [
    ("get_user_details", {"user_id": "user1", "password": "password123"}),
    ("get_user_details", {"user_id": "user1", "password": "x"}),
    ("get_flight_details", {"origin": "北京", "destination": "南京"}), ("get_flight_details", {"origin": "上海"}),
    ("get_flight_details", {"origin": "北京", "destination": "福州"}),
    ("get_reservation_details", {"reservation_id": "res_1"}), ("get_reservation_details", {"user_id": "user2"}),
    ("get_reservation_details", {}),
    ("find_transfer_flights", {"origin_city": "北京", "transfer_city": "南京", "destination_city": "深圳"}),
    ("find_transfer_flights", {"origin_city": "北京", "transfer_city": "上海", "destination_city": "深圳"}),
    ("reserve_flight", {"user_id": "user1", "password": "x", "flight_no": "CA1234", "cabin": "经济舱",
                        "payment_method": "cash", "baggage_count": 1},
     "认证失败，请检查用户ID和密码。"),  # upstream raises (its failed login is a truthy dict); lopd: its own message
    ("reserve_flight", {"user_id": "user3", "password": "password789", "flight_no": "CZ4321", "cabin": "商务舱",
                        "payment_method": "cash", "baggage_count": 1}),  # cash short
    ("reserve_flight", {"user_id": "user1", "password": "password123", "flight_no": "MU3561", "cabin": "经济舱",
                        "payment_method": "cash", "baggage_count": 3}),
    ("modify_flight", {"user_id": "user1", "reservation_id": "res_5", "new_cabin": "商务舱", "add_baggage": 1}),
    ("modify_flight", {"user_id": "user1", "reservation_id": "res_5", "new_flight_no": "MU1566"}),
    ("modify_flight", {"user_id": "user1", "reservation_id": "res_5", "new_flight_no": "CA1234"}),
    ("modify_flight", {"user_id": "user2", "reservation_id": "res_5"}),
    ("modify_flight", {"user_id": "user1", "reservation_id": "res_2", "new_cabin": "经济舱", "new_payment_method": "cash"}),
    ("cancel_reservation", {"user_id": "user1", "reservation_id": "res_2", "reason": "航空公司取消航班"}),
    ("cancel_reservation", {"user_id": "user1", "reservation_id": "res_1", "reason": "行程变更"}),
    ("cancel_reservation", {"user_id": "user9", "reservation_id": "res_1", "reason": "行程变更"}),
    ("cancel_reservation", {"user_id": "user2", "reservation_id": "res_1", "reason": "行程变更"}),
    ("cancel_reservation", {"user_id": "user2", "reservation_id": "res_4", "reason": "行程变更"}),
]


def test_travel_platform_replays_the_chinese_class():
    """Every function with its messages, Chinese cities, cabins and cancellation reason (scenarioszh/travel.py)."""
    lopd, official = TravelPlatform({}, language="zh"), ref.Travel()
    _replay(lopd, lambda name, args: getattr(official, name)(**args), TRAVEL_CALLS)
    assert _norm({"users": official.users, "flights": official.flights,
                  "reservations": official.reservations}) == lopd.state()["Travel"]


# ---- the fixture tasks played against the checker transcription ------------------------------------------

def test_every_zh_fixture_agent_task_replayed(scripted):
    """Each fixture task's milestone path played as written: lopd's verdict = the transcription's, and both pass."""
    env = make_env("acebench", data_dir=FIXTURES, user_model="scripted", language="zh")
    for part in ("multi_step", "multi_turn"):
        for task in load_tasks(FIXTURES, part):
            env.reset(task)
            path = task.meta["mile_stone"]
            for action in path + ["finish conversation" if part == "multi_step" else "都办好了。"]:
                result = env.step(action)
                if result.done:
                    break
            ok = agent_eval_item(saved_result(env.platform.state(), task.meta["involved_classes"], True),
                                 task.meta["ground_truth"])
            assert (result.info["end_to_end"], result.info["process_accuracy"]) == (
                ok, agent_eval_process_item(path, path, ok)) == (True, 1.0), task.task_id
