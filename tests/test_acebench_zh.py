"""ACEBench's Chinese data (``--language zh``): prompts, verdicts and scores replayed against the official ones.

The official side is tests/acebench_checker_reference.py (a literal transcription of ACEBench at e6db74b;
each function names its file), plus the SHA-256 of ACEBench's Chinese prompt texts
(model_inference/prompt_zh.py). Data: the hand-written fixtures in tests/fixtures/acebench_zh
(ACEBench's data_zh layout, one dialogue or row per category).
"""
from __future__ import annotations

import hashlib
import json
import re

from pathlib import Path

import pytest
from rich.console import Console

from stages.envs import make_env
from stages.envs.acebench_ast import NORMAL, SPECIAL
from stages.envs.acebench_prompts import NORMAL_PROMPT, PREFERENCE_PROMPT, SPECIAL_PROMPT, USER_PROMPT
from stages.envs.acebench_prompts_zh import (NORMAL_PROMPT_ZH, PREFERENCE_PROMPT_ZH, SPECIAL_PROMPT_ZH,
                                                  USER_PROMPT_ZH)
from stages.envs.acebench_single import judge, load_single_turn, opening
from tests import acebench_checker_reference as ref

FIXTURES = Path(__file__).parent / "fixtures" / "acebench_zh"
TASKS = {t.task_id: t for t in load_single_turn(FIXTURES, "zh")[0]}
ROWS = {json.loads(line)["id"]: json.loads(line) for f in FIXTURES.glob("data_*.json")
        if not f.name.startswith("data_agent_") for line in f.read_text(encoding="utf-8").splitlines()}
PROMPTS = {"SYSTEM_PROMPT_FOR_NORMAL_DATA_ZH": NORMAL_PROMPT_ZH,
           "SYSTEM_PROMPT_FOR_PREFERENCE_DATA_ZH": PREFERENCE_PROMPT_ZH,
           "SYSTEM_PROMPT_FOR_SPECIAL_DATA_ZH": SPECIAL_PROMPT_ZH, "USER_PROMPT_ZH": USER_PROMPT_ZH,
           "SYSTEM_PROMPT_FOR_NORMAL_DATA_EN": NORMAL_PROMPT, "SYSTEM_PROMPT_FOR_PREFERENCE_DATA_EN": PREFERENCE_PROMPT,
           "SYSTEM_PROMPT_FOR_SPECIAL_DATA_EN": SPECIAL_PROMPT, "USER_PROMPT_EN": USER_PROMPT}
OFFICIAL_SHA256 = {  # of the strings in ACEBench's model_inference/prompt_zh.py at e6db74b
    "SYSTEM_PROMPT_FOR_NORMAL_DATA_ZH": "a90208488db665217c55929245d6c919149bb7b8dcb866bde1224e58ec73bc88",
    "SYSTEM_PROMPT_FOR_PREFERENCE_DATA_ZH": "3ddd17adc41f39df1ef9fee43ea2666321252a65dbb5fc97fae1bcc8f7359c57",
    "SYSTEM_PROMPT_FOR_SPECIAL_DATA_ZH": "3a34bb6e77bc7afd228fcd9c3c5e7b7e75c9be4c446180d17670b100a08552c6",
    "USER_PROMPT_ZH": "ea7488fbe4728cd82cfdf32d4e7094bab6c78e0a3913a8751a245e3d67097219",
}


def official(task_id: str, reply: str) -> bool:
    meta = TASKS[task_id].meta
    if meta["part"] == "special":
        return ref.special_row_valid(reply, meta["ground_truth"], meta["category"])
    return ref.normal_row_valid(reply, meta["functions"], meta["ground_truth"], TASKS[task_id].prompt,
                                meta["category"])


def lopd(task_id: str, reply: str) -> bool:
    result = judge(TASKS[task_id], reply)
    assert result.done and result.reward == float(result.info["valid"])
    return result.info["valid"]


def test_the_chinese_prompts_are_acebench_word_for_word():
    for name, digest in OFFICIAL_SHA256.items():
        assert hashlib.sha256(PROMPTS[name].encode()).hexdigest() == digest, name


@pytest.mark.parametrize("task_id", sorted(ROWS))
def test_each_task_gets_the_prompts_acebench_picks_for_zh(task_id):
    """common_inference.py's language branch, replayed on every fixture row: same system and user prompt."""
    row = ROWS[task_id]
    system, user = ref.single_turn_inference_prompts("zh", PROMPTS, row["question"], row["function"], row.get("time"),
                                                     row.get("profile"), task_id)
    messages = opening(TASKS[task_id])
    assert (messages[0].content, messages[1].content) == (system, user)
    assert user.startswith("对话历史1..t:\n")


def _render(truth) -> str:
    return "[" + ", ".join(f"{re.sub(r'_[0-9]+$', '', name)}({', '.join(f'{k}={v!r}' for k, v in params.items())})"
                           for name, params in truth.items()) + "]"


REPLIES = [  # Chinese replies: the official checker has no language branch
    '["Missing necessary parameters (city) for the api (weather_forecast)"]',
    '["缺少必要参数 (city) for the api (weather_forecast)"]',  # the phrase translated: fails officially
    '["There is incorrect value (负三天) for the parameters (days) in the conversation history."]',
    '["There is incorrect value (-3) for the parameters (days)."]',  # the value not as the answer writes it
    '["Due to the limitations of the function, I cannot solve this problem."]',
    '["由于函数的限制，我无法解决这个问题。"]',
    "[weather_forecast(city='北，京', days=3)]",  # a Chinese comma is not standardised away upstream
    "[weather_forecast(city='北,京', days=3)]",  # an ASCII one is
    "[weather_forecast(city='北 京', days=3)]",  # whitespace is removed before decoding
    "[weather_forecast(city='西安', units='英制')]",
    "[alerts_configure(channels=['短信'], verbose=True)]",
]


def test_every_zh_task_replayed():
    """Every fixture task's own answer and the Chinese replies above: lopd = official, task by task."""
    own = 0
    for task_id, task in TASKS.items():
        candidates = REPLIES + ([_render(task.meta["ground_truth"])] if task.meta["part"] == "normal" else [])
        for reply in candidates:
            assert lopd(task_id, reply) is official(task_id, reply), (task_id, reply)
        if task.meta["part"] == "normal":
            own += lopd(task_id, _render(task.meta["ground_truth"]))
    assert len(TASKS) == 17 and own == 14  # every normal task's own answer passes
    assert [lopd("special_incomplete_0", r) for r in REPLIES[:2]] == [True, False]
    assert [lopd("special_error_param_0", r) for r in REPLIES[2:4]] == [True, False]
    assert [lopd("special_irrelevant_0", r) for r in REPLIES[4:6]] == [True, False]
    assert [lopd("normal_single_turn_single_function_0", r) for r in REPLIES[6:9]] == [False, True, True]


def test_language_is_checked():
    with pytest.raises(ValueError, match="language must be one of en, zh"):
        load_single_turn(FIXTURES, "fr")
    from stages.envs.base import EnvError
    with pytest.raises(EnvError, match="language must be one of en, zh"):
        make_env("acebench", data_dir=FIXTURES, language="fr")


AGENT_SCRIPT = {  # the scripted model's replies per agent task (tests/test_acebench_zh_agent.py: a user that ends at once)
    "agent_multi_step_0": ["[login_food_platform(username='Eve', password='password123')]",
                           "[add_food_delivery_order(username='Eve', merchant_name='达美乐', "
                           "items=[{'product': '超级至尊披萨', 'quantity': 1}])]", "finish conversation"],  # passes
    "agent_multi_turn_0": ["请问您的用户ID和预订ID是什么？"],  # no call: fails
}
SCRIPT = {  # the scripted model's reply per task
    "normal_single_turn_single_function_0": "[weather_forecast(city='北京', days=3)]",
    "normal_single_turn_parallel_function_0": "[weather_forecast(city='上海'), weather_forecast(city='广州')]",
    "normal_similar_api_0": "[weather_forecast(city='成都')]",  # the similar api: wrong
    "normal_preference_0": "[weather_forecast(city='杭州', units='英制')]",
    "normal_atom_bool_0": "[alerts_configure(channels=['短信'], verbose=True)]",
    "normal_atom_enum_0": "[weather_forecast(city='南京', units='英制')]",  # wrong enum value
    "normal_atom_number_0": "[alerts_configure(channels=['邮件'], threshold=0.25)]",
    "normal_atom_list_0": "[alerts_configure(channels=['邮件', '短信', '推送'])]",
    "normal_atom_object_deep_0": "[tickets_book(trip={'from': '北京', 'to': {'city': '上海', 'station': '虹桥站'}})]",
    "normal_atom_object_short_0": "[tickets_book(trip={'from': '天津', 'to': {'city': '济南'}}, "
                                  "passengers=[{'name': '张三', 'age': 36}])]",
    "normal_multi_turn_user_adjust_0_0": "[weather_forecast(city='西安')]",
    "normal_multi_turn_user_adjust_0_1": "[weather_forecast(city='西安', units='公制')]",  # the dialogue fails
    "normal_multi_turn_user_switch_0_0": "[weather_forecast(city='厦门')]",
    "normal_multi_turn_user_switch_0_1": "[alerts_configure(channels=['推送'])]",
    "special_incomplete_0": '["Missing necessary parameters (city) for the api (weather_forecast)"]',
    "special_error_param_0": '["参数days的值有误"]',  # no English phrase: fails
    "special_irrelevant_0": '["Due to the limitations of the function, I cannot solve this problem."]',
}


def test_evaluate_language_zh_reports_acebench_scores(tmp_path, monkeypatch):
    """`evaluate --bench acebench --language zh` on the zh fixtures, agent tasks included (scripted model and
    user): category, group and agent scores and ACEBench's weighted ``summary`` as the transcription computes
    them from the same replies."""
    from stages.envs import acebench_multi
    from stages.evaluate import EvaluateConfig, run
    from tests.test_acebench_zh_agent import RecordingUser
    from tests.test_evaluate import SequentialEngine
    from tests.tiny import tiny_tokenizer

    monkeypatch.setattr(acebench_multi, "SimulatedUser", RecordingUser)
    order = [t.task_id for t in make_env("acebench", data_dir=FIXTURES, user_model="scripted", language="zh").tasks("test")]
    assert order[:2] == ["agent_multi_step_0", "agent_multi_turn_0"] and sorted(order[2:]) == sorted(SCRIPT)
    replies = {**AGENT_SCRIPT, **{t: [reply] for t, reply in SCRIPT.items()}}
    report = run(EvaluateConfig(bench="acebench", data_dir=str(FIXTURES), language="zh", batch_size=1,
                                out=str(tmp_path / "r.json")),
                 Console(file=open("/dev/null", "w")), engine=SequentialEngine([replies[t] for t in order]),
                 tokenizer=tiny_tokenizer())
    scores = report["scores"]
    accuracy = {}
    for category in NORMAL + SPECIAL:
        rows = [(t, official(t, SCRIPT[t])) for t in order if t.startswith(category + "_")]
        if category.startswith("normal_multi_turn"):
            accuracy[category] = ref.multiplt_turn_accuracy(ref.multi_turn_score_list(rows))[0]
        else:
            share = sum(ok for _, ok in rows) / len(rows)
            accuracy[category] = round(share, 3) if category in NORMAL else share
    normal = ref.calculate_unweighted_accuracy([{"accuracy": accuracy[c]} for c in NORMAL])["accuracy"]
    special = ref.calculate_unweighted_accuracy([{"accuracy": accuracy[c]} for c in SPECIAL])["accuracy"]
    assert {c: scores[c] for c in NORMAL + SPECIAL} == accuracy
    assert (scores["normal_summary"], scores["special_summary"]) == (normal, special) == (0.75, 0.667)
    agent = ref.calculate_unweighted_accuracy([{"accuracy": 1.0}, {"accuracy": 0.0}])
    assert list(scores)[0] == "summary" and scores["summary"] == ref.summary_of(
        {"accuracy": special}, {"accuracy": normal}, agent)
    assert scores["multi_step_end_to_end"] == 1.0 and scores["multi_turn_end_to_end"] == 0.0
    assert scores["agent_summary"] == scores["end_to_end"] == 0.5
    assert any("1 multi-step, 1 multi-turn tasks, 1 of them on Travel" in n for n in report["notes"])
    assert "ACEBench's zh prompts" in report["rules"]
    assert report["config"]["language"] == "zh"  # recorded in the report
