"""ACEBench's normal and special categories: lopd's verdicts and aggregate replayed against the official ones.

The official side is tests/acebench_checker_reference.py, a literal transcription of ACEBench's
checker, decoder and aggregate (at e6db74b; each function names its file). Data: the hand-written
fixtures in tests/fixtures/acebench (ACEBench's data_en layout, a few rows per category).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from stages.envs import acebench_multi, make_env
from stages.envs.acebench_ast import NORMAL, SPECIAL
from stages.envs.acebench_single import category_accuracy, judge, load_single_turn, opening, single_turn_scores
from tests import acebench_checker_reference as ref

FIXTURES = Path(__file__).parent / "fixtures" / "acebench"
TASKS = {t.task_id: t for t in load_single_turn(FIXTURES)[0]}


def official(task_id: str, reply: str, truth=None) -> bool:
    """The transcription's verdict on ``reply`` for a fixture task (optionally with another answer)."""
    meta = TASKS[task_id].meta
    truth = meta["ground_truth"] if truth is None else truth
    if meta["part"] == "special":
        return ref.special_row_valid(reply, truth, meta["category"])
    return ref.normal_row_valid(reply, meta["functions"], truth, TASKS[task_id].prompt, meta["category"])


def lopd(task_id: str, reply: str, truth=None) -> bool:
    task = TASKS[task_id]
    if truth is not None:
        task = task.model_copy(update={"metadata": json.dumps({**task.meta, "ground_truth": truth})})
    result = judge(task, reply)
    assert result.done and result.reward == float(result.info["valid"])
    return result.info["valid"]


SINGLE, PARALLEL = "normal_single_turn_single_function_0", "normal_single_turn_parallel_function_0"
ALERTS, DEEP, SHORT = "normal_single_turn_single_function_1", "normal_atom_object_deep_0", "normal_atom_object_short_0"
ATHENS = {"weather_forecast": {"city": "Athens", "days": 3}}
BOOL = {"alerts_configure": {"channels": ["sms"], "verbose": True}}
FLOAT = {"alerts_configure": {"channels": ["email"], "threshold": 0.25}}
ENUM = {"weather_forecast": {"city": "Cairo", "units": "metric"}}

# (rule, fixture task, answer or None for the fixture's own, reply, the official verdict)
CASES = [
    ("name match", SINGLE, None, "[weather_forecast(city='Athens', days=3)]", True),
    ("wrong function name", SINGLE, None, "[weather_history(city='Athens', date='2024-01-01')]", False),
    ("missing required param", SINGLE, None, "[weather_forecast(days=3)]", False),
    ("optional param of the answer may be left out", SINGLE, None, "[weather_forecast(city='Athens')]", True),
    ("a param the answer lacks must not be given", SINGLE, None,
     "[weather_forecast(city='Athens', days=3, units='metric')]", False),
    ("an unknown param fails", SINGLE, None, "[weather_forecast(city='Athens', days=3, country='GR')]", False),
    ("wrong type: a string for an integer", SINGLE, None, "[weather_forecast(city='Athens', days='3')]", False),
    ("numbers are type-checked only", SINGLE, None, "[weather_forecast(city='Athens', days=5)]", True),
    ("strings by containment", SINGLE, None, "[weather_forecast(city='Athens, Greece', days=3)]", True),
    ("strings standardised", SINGLE, None, "[weather_forecast(city='ATHENS', days=3)]", True),
    ("wrong string", SINGLE, None, "[weather_forecast(city='Sparta', days=3)]", False),
    ("whitespace dropped", SINGLE, None, "[ weather_forecast( city = 'Athens' ,\n days = 3 ) ]", True),
    ("prose around the list", SINGLE, None, "Here you go: [weather_forecast(city='Athens', days=3)]", False),
    ("no brackets", SINGLE, None, "weather_forecast(city='Athens', days=3)", False),
    ("positional argument", SINGLE, None, "[weather_forecast('Athens')]", False),
    ("empty list", SINGLE, None, "[]", False),
    ("value in the allowed list", SINGLE, ENUM, "[weather_forecast(city='Cairo', units='Metric')]", True),
    ("value not in the allowed list", SINGLE, ENUM, "[weather_forecast(city='Cairo', units='kelvin')]", False),
    ("boolean", ALERTS, BOOL, "[alerts_configure(channels=['sms'], verbose=True)]", True),
    ("'true' is a boolean", ALERTS, BOOL, "[alerts_configure(channels=['sms'], verbose='true')]", True),
    ("boolean values are type-checked only", ALERTS, BOOL, "[alerts_configure(channels=['sms'], verbose=False)]", True),
    ("a string for a boolean", ALERTS, BOOL, "[alerts_configure(channels=['sms'], verbose='yes')]", False),
    ("float", ALERTS, FLOAT, "[alerts_configure(channels=['email'], threshold=0.25)]", True),
    ("an integer is a float", ALERTS, FLOAT, "[alerts_configure(channels=['email'], threshold=1)]", True),
    ("a string for a float", ALERTS, FLOAT, "[alerts_configure(channels=['email'], threshold='0.25')]", False),
    ("list in order", "normal_atom_list_0", None, "[alerts_configure(channels=['email', 'sms', 'push'])]", True),
    ("list standardised", "normal_atom_list_0", None, "[alerts_configure(channels=['E-mail', 'SMS', 'push'])]", True),
    ("list out of order", "normal_atom_list_0", None, "[alerts_configure(channels=['sms', 'email', 'push'])]", False),
    ("list short", "normal_atom_list_0", None, "[alerts_configure(channels=['email', 'sms'])]", False),
    ("object", ALERTS, None, "[alerts_configure(channels=['email', 'sms'], window={'start': '06:00', 'end': '18:00'})]",
     True),
    ("object values by containment", ALERTS, None,
     "[alerts_configure(channels=['email', 'sms'], window={'start': '06:00:00', 'end': '18:00'})]", True),
    ("object with an extra key", ALERTS, None,
     "[alerts_configure(channels=['email', 'sms'], window={'start': '06:00', 'end': '18:00', 'tz': 'UTC'})]", False),
    ("object with a key missing", ALERTS, None,
     "[alerts_configure(channels=['email', 'sms'], window={'start': '06:00'})]", False),
    ("nested object", DEEP, None,
     "[tickets_book(trip={'from': 'Paris', 'to': {'city': 'Rome', 'station': 'Termini'}})]", True),
    ("nested object, wrong value", DEEP, None,
     "[tickets_book(trip={'from': 'Paris', 'to': {'city': 'Milan', 'station': 'Termini'}})]", False),
    ("list of objects, second answer candidate", SHORT, None, "[tickets_book(trip={'from': 'Lyon', 'to': "
     "{'city': 'Nice'}}, passengers=[{'name': 'Ben', 'age': 36}, {'name': 'Ana', 'age': 34}])]", True),
    ("list of objects, one missing", SHORT, None,
     "[tickets_book(trip={'from': 'Lyon', 'to': {'city': 'Nice'}}, passengers=[{'name': 'Ana', 'age': 34}])]", False),
    ("multiple calls in any order", PARALLEL, None, "[alerts_configure(channels=['email']), "
     "weather_forecast(city='Oslo'), weather_forecast(city='Athens')]", True),
    ("multiple calls, one missing", PARALLEL, None,
     "[weather_forecast(city='Oslo'), weather_forecast(city='Athens')]", False),
    ("multiple calls, one answer unmet", PARALLEL, None,
     "[weather_forecast(city='Oslo'), weather_forecast(city='Oslo'), alerts_configure(channels=['email'])]", False),
    ("multiple calls, wrong counts", PARALLEL, None,
     "[weather_forecast(city='Oslo'), weather_forecast(city='Athens'), weather_forecast(city='Rome')]", False),
    ("incomplete: phrase, function, parameter", "special_incomplete_0", None,
     '["Missing necessary parameters (city) for the api (weather_forecast)"]', True),
    ("incomplete: function not named", "special_incomplete_0", None, '["Missing necessary parameters (city)"]', False),
    ("incomplete: no phrase", "special_incomplete_0", None, "Which city do you mean?", False),
    ("incomplete: a parameter not named", "special_incomplete_1", None,
     '["Missing necessary parameters (city) for the api (weather_history)"]', False),
    ("incomplete: values as written, spaces included", "special_incomplete_1", {"weather_history": ["city ", " date"]},
     '["Missing necessary parameters (city, date) for the api (weather_history)"]', False),
    ("incomplete: an empty answer passes", "special_incomplete_1", {}, "I need more details.", True),
    ("error_param: phrase and value", "special_error_param_0", None,
     '["There is incorrect value (-3) for the parameters (days) in the conversation history."]', True),
    ("error_param: value not named", "special_error_param_0", None,
     '["There is incorrect value (3) for the parameters (days)."]', False),
    ("error_param: a call instead", "special_error_param_0", None, "[weather_forecast(city='Athens', days=-3)]", False),
    ("irrelevant: phrase", "special_irrelevant_0", None,
     '["Due to the limitations of the function, I cannot solve this problem."]', True),
    ("irrelevant: no phrase", "special_irrelevant_0", None, "I cannot book tables.", False),
]


@pytest.mark.parametrize("rule, task_id, truth, reply, verdict", CASES, ids=[c[0] for c in CASES])
def test_each_rule_gives_the_official_verdict(rule, task_id, truth, reply, verdict):
    assert official(task_id, reply, truth) is verdict
    assert lopd(task_id, reply, truth) is verdict


def _render(truth) -> str:
    candidate = truth[0] if isinstance(truth, list) else truth
    return "[" + ", ".join(f"{re.sub(r'_[0-9]+$', '', name)}({', '.join(f'{k}={v!r}' for k, v in params.items())})"
                           for name, params in candidate.items()) + "]"


def test_every_fixture_task_replayed():
    """Each fixture task's answer written as a reply, and the same reply for every other task: lopd = official."""
    replies = [_render(t.meta["ground_truth"]) for t in TASKS.values() if t.meta["part"] == "normal"]
    replies += ['["Missing necessary parameters (city) for the api (weather_forecast)"]',
                '["There is incorrect value (-3) for the parameters (days)."]',
                '["Due to the limitations of the function, I cannot solve this problem."]']
    own = 0
    for task_id, task in TASKS.items():
        for reply in replies:
            assert lopd(task_id, reply) is official(task_id, reply), (task_id, reply)
        if task.meta["part"] == "normal":
            own += lopd(task_id, _render(task.meta["ground_truth"]))
    assert len(TASKS) == 20 and own == 16  # every normal task's own answer passes


def test_opening_is_acebench_prompt_for_the_category():
    single = opening(TASKS[SINGLE])
    functions = TASKS[SINGLE].meta["functions"]
    assert single[0].content.startswith('You are an AI assistant with the role name "assistant." Based on')
    assert single[0].content.endswith("API Specifications:\n" + str(functions))
    assert "\nThe current time is 2024-06-11 16:00.\n" in single[0].content
    assert single[1].content == "Conversation history 1..t:\n" + TASKS[SINGLE].prompt
    preference = opening(TASKS["normal_preference_0"])[0].content
    assert "Character Profile:\nName: Kari. Home city: Oslo. Prefers imperial units.\n" in preference
    special = opening(TASKS["special_irrelevant_0"])[0].content
    assert '["Missing necessary parameters (key1, key2, ...) for the api (ApiName)"]' in special
    assert TASKS[SINGLE].tools == "[]"  # the functions are in the prompt, as upstream


def test_documented_differences_from_acebench():
    """Where lopd departs from the official code (module docstring of acebench_ast): a think block is
    dropped; a bare name is unreadable (ACEBench reads it as a string)."""
    think = "<think>Athens, 3 days.</think>[weather_forecast(city='Athens', days=3)]"
    assert lopd(SINGLE, think) is True and official(SINGLE, think) is False
    bare = "[weather_forecast(city=Athens, days=3)]"
    assert lopd(SINGLE, bare) is False and official(SINGLE, bare) is True


def test_dialogue_accuracy_and_special_share_as_upstream():
    valid = {"normal_multi_turn_user_adjust_0_0": True, "normal_multi_turn_user_adjust_0_1": False,
             "normal_multi_turn_user_adjust_1_0": True, "normal_multi_turn_user_adjust_2_0": True,
             "normal_multi_turn_user_adjust_2_1": True, "normal_multi_turn_user_adjust_10_0": False}
    score_list = ref.multi_turn_score_list(sorted(valid.items(), key=lambda kv: tuple(map(int, kv[0].split("_")[-2:]))))
    end, _ = ref.multiplt_turn_accuracy(score_list)
    assert category_accuracy("normal_multi_turn_user_adjust", valid) == end == 0.5  # dialogues 1 and 2 of 4
    special = {f"special_irrelevant_{i}": i == 0 for i in range(3)}
    assert category_accuracy("special_irrelevant", special) == 1 / 3  # not rounded upstream
    assert category_accuracy("normal_atom_bool", {f"normal_atom_bool_{i}": i == 0 for i in range(3)}) == 0.333


def test_the_overall_is_acebench_weighted_summary():
    valid, accuracy = {}, {}
    for k, category in enumerate(NORMAL + SPECIAL):
        n = 3 + k % 4
        turn = "_0" if category.startswith("normal_multi_turn") else ""  # one-turn dialogues
        valid.update({f"{category}_{i}{turn}": i < k % n for i in range(n)})
        accuracy[category] = {"accuracy": round((k % n) / n, 3) if category in NORMAL else (k % n) / n}
    agent = round((0.5 + 0.2) / 2, 3)
    scores, notes = single_turn_scores(valid, agent)
    normal = ref.calculate_unweighted_accuracy([accuracy[c] for c in NORMAL])
    special = ref.calculate_unweighted_accuracy([accuracy[c] for c in SPECIAL])
    expected = ref.summary_of(special, normal, {"accuracy": agent})
    assert list(scores)[:4] == ["summary", "normal_summary", "special_summary", "agent_summary"] and notes == []
    assert scores["summary"] == expected and scores["normal_summary"] == normal["accuracy"]
    assert scores["special_summary"] == special["accuracy"] and scores["agent_summary"] == 0.35
    assert {c: scores[c] for c in NORMAL + SPECIAL} == {c: a["accuracy"] for c, a in accuracy.items()}
    played = {k: v for k, v in valid.items() if not k.startswith("special_irrelevant")}
    partial, notes = single_turn_scores(played, None)
    assert "summary" not in partial and "special_summary" not in partial and "normal_summary" in partial
    assert notes == ["summary (ACEBench's overall) not reported: no tasks played of special_irrelevant, agent"]


def test_malformed_rows_are_left_out_with_one_line_each(tmp_path):
    data = tmp_path / "data_en"
    shutil.copytree(FIXTURES, data)
    path = data / "data_normal_atom_enum.json"
    row = json.loads(path.read_text())
    path.write_text(json.dumps({**row, "function": "weather_forecast"}) + "\nnot json\n")
    answers = data / "possible_answer" / "data_special_incomplete.json"
    lines = answers.read_text().splitlines()
    answers.write_text("\n".join([json.dumps({"id": "special_incomplete_0", "ground_truth": {"weather_forecast": 3}}),
                                  *lines[1:]]) + "\n")
    tasks, problems = load_single_turn(data)
    assert len(tasks) == len(TASKS) - 2 and len(problems) == 3
    assert problems[0] == f"{path} row 2: not JSON (Expecting value); row left out"
    assert problems[1] == (f"{path} row 1 (id 'normal_atom_enum_0'): field 'function' must be a list of objects with "
                           "a string 'name'; row left out")
    assert problems[2] == (f"{answers} row 1 (id 'special_incomplete_0'): field 'ground_truth' must map names to "
                           "lists of strings; row left out")
    env = make_env("acebench", data_dir=data)
    assert len(env.tasks("test")) == 1 + len(TASKS) - 2 and env.data_notes == problems


class _User:
    """The simulated user of the fixture's multi-turn task: it ends the dialogue at once."""

    def __init__(self, *args, **kwargs):
        pass

    def opening(self):
        return "Please turn on my WiFi."

    def reply(self, agent_message):
        return "finish conversation"


REPLIES = {  # the scripted model's reply per task, and whether ACEBench counts it valid
    "agent_multi_step_0": ["[turn_on_wifi()]", "finish conversation"],  # end state reached
    "agent_multi_turn_0": ["Hello, what do you need?"],  # no call: fails
    SINGLE: ["[weather_forecast(city='Athens', days=3)]"],
    ALERTS: ["[alerts_configure(channels=['email'], window={'start': '06:00', 'end': '18:00'})]"],
    PARALLEL: ["[alerts_configure(channels=['email']), weather_forecast(city='Oslo'), "
               "weather_forecast(city='Athens')]"],
    "normal_multi_turn_user_adjust_0_0": ["[weather_forecast(city='Oslo')]"],
    "normal_multi_turn_user_adjust_0_1": ["[weather_forecast(city='Oslo', units='metric')]"],
    "normal_multi_turn_user_adjust_1_0": ["[weather_history(city='Rome', date='2024-05-01')]"],
    "normal_multi_turn_user_switch_0_0": ["[weather_forecast(city='Lima')]"],
    "normal_multi_turn_user_switch_0_1": ["[alerts_configure(channels=['push'])]"],
    "normal_similar_api_0": ["[weather_forecast(city='Paris')]"],
    "normal_preference_0": ["[weather_forecast(city='Oslo', units='imperial')]"],
    "normal_atom_bool_0": ["[alerts_configure(channels=['sms'], verbose=true)]"],
    "normal_atom_enum_0": ["[weather_forecast(city='Cairo', units='kelvin')]"],
    "normal_atom_number_0": ["[alerts_configure(channels=['email'], threshold=0.25)]"],
    "normal_atom_list_0": ["[alerts_configure(channels=['email', 'sms', 'push'])]"],
    DEEP: ["[tickets_book(trip={'from': 'Paris', 'to': {'city': 'Rome', 'station': 'Termini'}})]"],
    SHORT: ["[tickets_book(trip={'from': 'Lyon', 'to': {'city': 'Nice'}}, passengers=[{'name': 'Ben', 'age': 36}, "
            "{'name': 'Ana', 'age': 34}])]"],
    "special_incomplete_0": ['["Missing necessary parameters (city) for the api (weather_forecast)"]'],
    "special_incomplete_1": ['["Missing necessary parameters (city) for the api (weather_history)"]'],
    "special_error_param_0": ["[weather_forecast(city='Athens', days=-3)]"],
    "special_irrelevant_0": ['["Due to the limitations of the function, I cannot solve this problem."]'],
}


def test_evaluate_reports_acebench_overall(tmp_path, monkeypatch):
    """`evaluate --bench acebench` on a data folder with all 17 categories: the first score is ACEBench's
    weighted overall, computed by the transcription from the same replies."""
    from stages.evaluate import EvaluateConfig, run
    from tests.test_evaluate import SequentialEngine
    from tests.tiny import tiny_tokenizer

    monkeypatch.setattr(acebench_multi, "SimulatedUser", _User)
    order = [t.task_id for t in make_env("acebench", data_dir=FIXTURES, user_model="scripted").tasks("test")]
    assert order[:2] == ["agent_multi_step_0", "agent_multi_turn_0"] and sorted(order) == sorted(REPLIES)
    report = run(EvaluateConfig(bench="acebench", data_dir=str(FIXTURES), batch_size=1, out=str(tmp_path / "r.json")),
                 Console(file=open("/dev/null", "w")), engine=SequentialEngine([REPLIES[t] for t in order]),
                 tokenizer=tiny_tokenizer())
    scores = report["scores"]
    accuracy = {}
    for category in NORMAL + SPECIAL:
        rows = [(t, official(t, REPLIES[t][0])) for t in order if t.startswith(category + "_")]
        if category.startswith("normal_multi_turn"):
            accuracy[category] = ref.multiplt_turn_accuracy(ref.multi_turn_score_list(rows))[0]
        else:
            share = sum(ok for _, ok in rows) / len(rows)
            accuracy[category] = round(share, 3) if category in NORMAL else share
    normal = ref.calculate_unweighted_accuracy([{"accuracy": accuracy[c]} for c in NORMAL])
    special = ref.calculate_unweighted_accuracy([{"accuracy": accuracy[c]} for c in SPECIAL])
    agent = ref.calculate_unweighted_accuracy([{"accuracy": 1.0}, {"accuracy": 0.0}])
    assert list(scores)[0] == "summary" and scores["summary"] == ref.summary_of(special, normal, agent) == 0.645
    assert (scores["normal_summary"], scores["special_summary"], scores["agent_summary"]) == (0.75, 0.5, 0.5)
    assert {c: scores[c] for c in NORMAL + SPECIAL} == accuracy
    assert scores["multi_step_end_to_end"] == 1.0 and scores["multi_turn_end_to_end"] == 0.0
    assert scores["end_to_end"] == 0.5 and scores["pooled_end_to_end"] == 0.5  # over the agent tasks only
    assert any(n.startswith("normal and special categories: 20 tasks in 15 of 15 categories") for n in report["notes"])
    assert report["rules"].endswith("normal and special: ACEBench's en prompts, its AST checker and string rules "
                                    "(stages/envs/acebench_ast.py)")
    rows = {r["task_id"]: r for r in report["per_task"]}
    assert rows["normal_atom_enum_0"]["info"]["error_type"] == "value_error:string"
    assert rows[SINGLE]["tool_calls"] == 1 and rows[SINGLE]["reward"] == 1.0


def test_agent_only_data_keeps_the_agent_scores(tmp_path):
    from stages.benches import BENCHES
    from stages.evaluate import EvaluateConfig

    data = tmp_path / "data_en"
    (data / "possible_answer").mkdir(parents=True)
    for name in ("data_agent_multi_step.json", "data_agent_multi_turn.json"):
        shutil.copy(FIXTURES / name, data / name)
        shutil.copy(FIXTURES / "possible_answer" / name, data / "possible_answer" / name)
    prepared = BENCHES["acebench"].prepare(EvaluateConfig(bench="acebench", data_dir=str(data)))
    assert [t.task_id for t in prepared.tasks] == ["agent_multi_step_0", "agent_multi_turn_0"]
    assert f"scored: the agent categories only (no normal or special tasks: no data_normal_* / data_special_* " \
           f"files in {data}); ACEBench's overall (summary) needs its 12 normal and 3 special categories too" \
           in prepared.notes
    assert "AST checker" not in prepared.rules
