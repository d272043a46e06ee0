"""BFCL-v3 environment: ground truth scores 1 through the package's checkers and through reset/step,
empty answers score 0, episodes do not share state, bad input fails cleanly."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path

import pytest

from schemas import ToolCall
from stages.core.text.toolcalls import format_python_calls, parse_tool_calls
from stages.envs import EnvError, make_env
from stages.envs.bfcl import MULTI_TURN, SINGLE_TURN, to_openai_tools
from stages.envs.bfcl_multi import multi_turn_verdict, score_multi_turn

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "bfcl_v3"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared BFCL-v3 data not found at {SHARED}")
pytest.importorskip("bfcl", reason="nvidia-bfcl (import name bfcl) is not installed")


def _multi_tasks(category: str, n: int = 3, data_dir: Path | None = SHARED):
    return make_env("bfcl", data_dir=data_dir, categories=[category]).tasks("test", limit=n)


def _keyword_call(call: str, classes: list[str]) -> ToolCall:
    """A ground-truth call string (may use positional args) as a keyword-only ToolCall."""
    from bfcl.eval_checker.multi_turn_eval.multi_turn_utils import CLASS_FILE_PATH_MAPPING

    node = ast.parse(call, mode="eval").body
    name = node.func.id
    for cls_name in classes:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
        if hasattr(cls, name):
            params = list(inspect.signature(getattr(cls, name)).parameters)[1:]
            break
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return ToolCall(name=name, arguments=json.dumps(args))


def _play_ground_truth(env, task) -> tuple:
    """Drive ``env`` through ``task`` with its ground truth (one call step + a plain-text end per turn)."""
    meta = task.meta
    opening = env.reset(task)
    results = []
    for turn in meta["ground_truth"]:
        if turn:
            calls = [_keyword_call(c, meta["involved_classes"]) for c in turn]
            results.append(env.step(format_python_calls(calls)))
            assert results[-1].observation and all(m.role == "tool" for m in results[-1].observation)
        results.append(env.step("I have completed the request."))
    return opening, results


def _leftover_instances() -> list[str]:
    from bfcl.eval_checker.multi_turn_eval import multi_turn_utils

    return [k for k in vars(multi_turn_utils) if k.startswith("lopd_")]


@needs_shared
@pytest.mark.parametrize("category", MULTI_TURN)
def test_ground_truth_scores_one_and_empty_scores_zero(category):
    tasks = _multi_tasks(category)
    assert [t.task_id for t in tasks] == [f"{category}_{i}" for i in range(3)]
    for task in tasks:
        gt = task.meta["ground_truth"]
        assert score_multi_turn(task, [[turn] if turn else [] for turn in gt])
        verdict = multi_turn_verdict(task, [[] for _ in gt])
        assert not verdict["valid"] and verdict["error_type"] == "multi_turn:empty_turn_model_response"
        assert multi_turn_verdict(task, [])["error_type"] == "multi_turn:force_terminated"
    assert _leftover_instances() == []


@needs_shared
@pytest.mark.parametrize("category", MULTI_TURN)
def test_env_driven_by_ground_truth_gets_reward_one(category):
    for task in _multi_tasks(category):
        env = make_env("bfcl", data_dir=SHARED, max_turns=100)
        opening, results = _play_ground_truth(env, task)
        assert [m.role for m in opening] == ["system", "user"]
        assert [r.done for r in results] == [False] * (len(results) - 1) + [True]
        final = results[-1]
        assert final.reward == 1.0 and final.info["success"], final.info
        env.close()
    assert _leftover_instances() == []


@needs_shared
def test_miss_func_offers_held_out_functions_at_their_turn():
    task = _multi_tasks("multi_turn_miss_func", 1)[0]  # 'sort' is held out until turn 3
    names = {t["function"]["name"] for t in task.tool_schemas}
    assert "sort" not in names and "mv" in names
    env = make_env("bfcl", data_dir=SHARED, max_turns=100)
    _, results = _play_ground_truth(env, task)
    announced = [r for r in results if "tools" in r.info]
    assert len(announced) == 1
    assert {t["function"]["name"] for t in announced[0].info["tools"]} == names | {"sort"}
    assert announced[0].observation[0].content.startswith("I have updated some more functions")


@needs_shared
def test_state_is_isolated_between_sequential_and_interleaved_episodes():
    task = _multi_tasks("multi_turn_base", 1)[0]
    rewards = []
    for _ in range(2):
        env = make_env("bfcl", data_dir=SHARED, max_turns=100)
        rewards.append(_play_ground_truth(env, task)[1][-1].reward)
        env.close()
    assert rewards == [1.0, 1.0]

    # A sabotaging episode (deletes files, then gives up) interleaved step by step with a good one.
    good, bad = make_env("bfcl", data_dir=SHARED, max_turns=100), make_env("bfcl", data_dir=SHARED, max_turns=100)
    good.reset(task)
    bad.reset(task)
    first_turn = [_keyword_call(c, task.meta["involved_classes"]) for c in task.meta["ground_truth"][0]]
    bad.step("[cd(folder='document'), rm(file_name='final_report.pdf'), rmdir(dir_name='temp')]")
    good.step(format_python_calls(first_turn))
    bad_result = bad.step("[ls()]")
    assert "final_report.pdf" not in bad_result.observation[0].content
    results = [good.step("done")]
    for turn in task.meta["ground_truth"][1:]:
        if turn:
            results.append(good.step(format_python_calls([_keyword_call(c, task.meta["involved_classes"]) for c in turn])))
            bad.step("nothing to do")
        results.append(good.step("done"))
    assert results[-1].done and results[-1].reward == 1.0
    good.close()
    bad.close()
    assert _leftover_instances() == []


@needs_shared
def test_unparsable_or_unknown_multi_turn_actions_do_not_crash():
    task = _multi_tasks("multi_turn_base", 1)[0]
    env = make_env("bfcl", data_dir=SHARED)
    env.reset(task)
    unknown = env.step("[open(file='/tmp/lopd_should_not_exist', mode='w')]")
    assert not unknown.done and "not available" in unknown.observation[0].content
    assert not Path("/tmp/lopd_should_not_exist").exists()
    broken = env.step("[cd(folder='document'")
    assert not broken.done and "syntax error" in broken.info["parse_error"]
    assert broken.observation[0].role == "user" and broken.observation[0].content == task.meta["question"][1][0]["content"]
    env.close()


@needs_shared
def test_step_caps_force_quit():
    task = _multi_tasks("multi_turn_base", 1)[0]
    env = make_env("bfcl", data_dir=SHARED, max_turns=1000)
    env.reset(task)
    from bfcl.model_handler.constant import MAXIMUM_STEP_LIMIT

    results = [env.step("[pwd()]") for _ in range(MAXIMUM_STEP_LIMIT + 1)]
    assert [r.done for r in results] == [False] * MAXIMUM_STEP_LIMIT + [True]
    assert results[-1].reward == 0.0 and results[-1].info["error_type"] == "multi_turn:force_terminated"
    with pytest.raises(EnvError):
        env.step("[pwd()]")

    env = make_env("bfcl", data_dir=SHARED, max_turns=2)
    env.reset(task)
    assert not env.step("[pwd()]").done
    capped = env.step("[pwd()]")
    assert capped.done and capped.reward == 0.0 and capped.info["error_type"] == "max_steps"
    env.close()
    assert _leftover_instances() == []


def test_package_data_single_turn_and_multi_turn_tasks():
    env = make_env("bfcl")
    train = env.tasks("train", limit=8)
    assert [t.task_id for t in train[:4]] == [f"{c}_0" for c in SINGLE_TURN]
    assert all(t.split == "train" and t.env == "bfcl" for t in train)
    test = make_env("bfcl", categories=["base"]).tasks("test", limit=2)
    assert [t.task_id for t in test] == ["multi_turn_base_0", "multi_turn_base_1"]


@pytest.mark.parametrize("category", SINGLE_TURN)
def test_single_turn_possible_answer_scores_one_and_wrong_name_zero(category):
    env = make_env("bfcl", categories=[category])
    for task in env.tasks("train", limit=3):
        messages = env.reset(task)
        assert [m.role for m in messages] == ["system", "user"]
        reference = env.reference_actions(task)
        calls = parse_tool_calls(reference[0])
        result = env.step(reference[0])
        assert result.done and result.reward == 1.0, result.info
        env.reset(task)
        hermes = "".join(f'<tool_call>{{"name": "{c.name}", "arguments": {c.arguments}}}</tool_call>' for c in calls)
        assert env.step(hermes).reward == 1.0
        env.reset(task)
        wrong = [ToolCall(name=c.name + "_wrong", arguments=c.arguments) for c in calls]
        result = env.step(format_python_calls(wrong))
        assert result.done and result.reward == 0.0 and not result.info["success"]


def test_single_turn_unparsable_action_is_a_failed_step():
    env = make_env("bfcl", categories=["simple"])
    task = env.tasks("train", limit=1)[0]
    env.reset(task)
    result = env.step("[calculate_triangle_area(base=10, height=")
    assert result.done and result.reward == 0.0
    assert result.info["error_type"] == "ast_decoder:decoder_failed" and "syntax error" in result.info["error"]
    env.reset(task)
    assert env.step("The area is 25.").reward == 0.0


def test_tool_schemas_use_openai_types():
    tools = to_openai_tools([{
        "name": "f", "description": "d",
        "parameters": {"type": "dict", "properties": {
            "x": {"type": "float", "description": "x"},
            "m": {"type": "dict", "properties": {"k": {"type": "tuple", "items": {"type": "integer"}}}},
            "z": {"type": "any", "description": "z"}}},
    }])
    params = tools[0]["function"]["parameters"]
    assert tools[0]["type"] == "function" and params["type"] == "object"
    assert params["properties"]["x"]["type"] == "number" and params["properties"]["x"]["format"] == "float"
    assert params["properties"]["m"]["type"] == "object"
    assert params["properties"]["m"]["properties"]["k"] == {"type": "array", "items": {"type": "integer"}}
    assert params["properties"]["z"]["type"] == "string"
    multi = make_env("bfcl", categories=["base"]).tasks("test", limit=1)[0].tool_schemas
    assert "dict" not in json.dumps([t["function"]["parameters"] for t in multi])


def test_malformed_or_missing_files_raise_env_error(tmp_path):
    (tmp_path / "possible_answer").mkdir()
    simple = tmp_path / "BFCL_v3_simple.json"
    simple.write_text('{"id": "simple_0", "question": [[]], "function": []}\n{not json\n')
    with pytest.raises(EnvError, match=r"BFCL_v3_simple\.json:2: invalid JSON"):
        make_env("bfcl", data_dir=tmp_path, categories=["simple"]).tasks("train")
    simple.write_text('{"id": "simple_0", "function": []}\n')
    with pytest.raises(EnvError, match=r"BFCL_v3_simple\.json:1: missing field 'question'"):
        make_env("bfcl", data_dir=tmp_path, categories=["simple"]).tasks("train")
    with pytest.raises(EnvError, match=r"BFCL_v3_multi_turn_base\.json: file not found"):
        make_env("bfcl", data_dir=tmp_path, categories=["base"]).tasks("test")
    with pytest.raises(EnvError, match="unknown category"):
        make_env("bfcl", categories=["nope"])


@needs_shared
def test_bad_multi_turn_entry_names_file_and_field(tmp_path):
    line = (SHARED / "BFCL_v3_multi_turn_base.json").read_text().splitlines()[0]
    entry = json.loads(line)
    entry["involved_classes"] = ["NoSuchAPI"]
    (tmp_path / "BFCL_v3_multi_turn_base.json").write_text(json.dumps(entry) + "\n")
    (tmp_path / "possible_answer").mkdir()
    answer = (SHARED / "possible_answer" / "BFCL_v3_multi_turn_base.json").read_text().splitlines()[0]
    (tmp_path / "possible_answer" / "BFCL_v3_multi_turn_base.json").write_text(answer + "\n")
    with pytest.raises(EnvError, match=r"BFCL_v3_multi_turn_base\.json: entry 'multi_turn_base_0': field 'involved_classes'"):
        make_env("bfcl", data_dir=tmp_path, categories=["base"]).tasks("test")


def test_single_turn_accepts_underscored_dotted_names():
    env = make_env("bfcl", categories=["simple"])
    task = env.tasks("heldout", limit=1)[0]  # simple_1: held out from train (stages.envs.bfcl.is_heldout)
    assert task.task_id == "simple_1" and task.meta["function"][0]["name"] == "math.factorial"
    env.reset(task)
    assert env.step('<tool_call>{"name": "math_factorial", "arguments": {"number": 5}}</tool_call>').reward == 1.0
    env.reset(task)
    assert env.step("[math.factorial(number=6)]").reward == 0.0


def test_heldout_split_is_disjoint_from_train_and_fixed():
    env = make_env("bfcl")
    train, heldout = env.tasks("train"), env.tasks("heldout")
    # 1,000 single-turn tasks: 199 held out, 37 more left out of train for asking a held-out question
    assert len(train) == 764 and len(heldout) == 199
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert not {t.prompt.lower() for t in train} & {t.prompt.lower() for t in heldout}
    assert all(t.split == "test" for t in heldout) and all(t.split == "train" for t in train)
    assert [t.task_id for t in heldout[:4]] == ["simple_1", "multiple_8", "parallel_7", "parallel_multiple_9"]
    with pytest.raises(EnvError, match="unknown split 'dev'"):
        env.tasks("dev")


def test_reference_actions_are_single_turn_only():
    env = make_env("bfcl")
    with pytest.raises(EnvError, match="no reference actions for multi-turn"):
        env.reference_actions(make_env("bfcl", categories=["base"]).tasks("test", limit=1)[0])


def test_bfcl_modules_have_no_import_cycle():
    """bfcl imports bfcl_multi; neither bfcl_multi nor the shared _bfcl_files imports bfcl (at any level)."""
    import subprocess
    import sys

    envs = Path(__file__).resolve().parents[1] / "stages" / "envs"
    for name in ("bfcl_multi.py", "_bfcl_files.py"):
        tree = ast.parse((envs / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "stages.envs.bfcl" not in imported, name
    for first in ("stages.envs.bfcl_multi", "stages.envs.bfcl"):  # either can be imported first
        code = f"import {first}, stages.envs.bfcl as b; assert b.MultiTurnEpisode and b.to_openai_tools"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
