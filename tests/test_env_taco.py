"""TACO-format coding environment (the paper's coding training corpus) on a 3-problem fixture in
DeepCoder's format: stdin and call-based tests, reference solutions pass, wrong answers fail, an
endless loop times out, a malformed row is named."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.core.data.store import ExperienceStore
from stages.envs import EnvError, make_env

FIXTURE = Path(__file__).parent / "fixtures" / "taco"


def _env():
    return make_env("taco", data_dir=FIXTURE, test_percent=0)


def _answer(code: str) -> str:
    return f"My solution:\n```python\n{code}\n```\n"


def test_fixture_loads_stdin_and_call_based_problems():
    tasks = _env().tasks("train")
    assert [t.task_id for t in tasks] == ["taco/sum-two", "taco/double", "taco/count-vowels"]
    assert [t.meta["func_name"] for t in tasks] == [None, "double", None]
    assert [{c["testtype"] for c in t.meta["tests"]} for t in tasks] == [{"stdin"}, {"functional"}, {"stdin"}]
    assert "stdin" in tasks[0].prompt and "def double(x):" in tasks[1].prompt
    split = make_env("taco", data_dir=FIXTURE)  # the default 10% test bucket: train and test disjoint
    assert {t.task_id for t in split.tasks("train")} | {t.task_id for t in split.tasks("test")} == {t.task_id for t in tasks}


@pytest.mark.parametrize("index", [0, 1, 2])
def test_reference_passes_and_a_wrong_answer_fails(index):
    env = _env()
    task = env.tasks("train")[index]
    env.reset(task)
    good = env.step(env.reference_actions(task)[0])
    assert good.done and good.reward == 1.0 and good.info["passed"] == good.info["total"] > 1
    env.reset(task)
    wrong = env.step(_answer("print(42)" if index != 1 else "def double(x):\n    return x + 1"))
    assert wrong.reward == 0.0 and wrong.info["first_failure"] == "wrong answer"
    env.reset(task)
    assert env.step("no code at all").reward == 0.0


def test_call_based_outputs_may_be_unwrapped_or_a_solution_class():
    env = _env()
    task = env.tasks("train")[1]
    env.reset(task)
    as_class = _answer("class Solution:\n    def double(self, x):\n        return 2 * x")
    assert env.step(as_class).reward == 1.0


def test_an_endless_loop_times_out():
    env = _env()
    task = env.tasks("train")[0]
    env.reset(task)
    result = env.step(_answer("while True:\n    pass"))
    assert result.reward == 0.0 and result.info["passed"] == 0
    assert "Timeout" in result.info["first_failure"] or "timeout" in result.info["first_failure"].lower()


def test_a_malformed_row_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "x", "tests": json.dumps({"inputs": ["1"], "outputs": []})}) + "\n")
    with pytest.raises(EnvError, match=r"bad.jsonl row 0: field 'tests' must hold equal-length"):
        make_env("taco", data_dir=bad).tasks("train")
    with pytest.raises(EnvError, match="no .parquet/.jsonl/.json files"):
        make_env("taco", data_dir=tmp_path / "none").tasks("train")


def test_collect_reference_on_taco_fixtures(tmp_path):
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["collect", "--env", "taco", "--data-dir", str(FIXTURE), "--reference",
                                      "--store", str(store)])
    assert result.exit_code == 0, result.output
    rows = ExperienceStore.open(store).query()
    assert rows and all(r.success and r.env == "taco" for r in rows)


def test_the_bundled_practice_set_is_the_offline_default_and_every_reference_passes():
    env = make_env("taco", test_percent=0)
    tasks = env.tasks("train")
    assert len(tasks) == 20 and "practice problems written for lopd, not TACO" in env.data_source
    assert {t.meta["func_name"] is None for t in tasks} == {True, False}  # stdin and call-based
    for task in tasks:
        env.reset(task)
        assert env.step(env.reference_actions(task)[0]).reward == 1.0, task.task_id


def test_collect_reference_skips_tasks_without_a_solution_and_refuses_a_split_with_none(tmp_path):
    rows = [json.loads(line) for line in (FIXTURE / "problems.jsonl").read_text().splitlines()]
    data = tmp_path / "data"
    data.mkdir()
    rows[0]["solutions"] = "[]"
    (data / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = tmp_path / "store"
    args = ["collect", "--env", "taco", "--data-dir", str(data), "--reference", "--allow-overlap"]
    result = CliRunner().invoke(app, [*args, "--store", str(store)])
    assert result.exit_code == 0, result.output
    tasks = len(make_env("taco", data_dir=data).tasks("train"))
    assert f"note: 1 of {tasks} task(s) have no reference" in result.output
    stored = {r.task_id for r in ExperienceStore.open(store).query()}
    assert stored == {"taco/double", "taco/count-vowels"}  # not taco/sum-two

    for r in rows:
        r["solutions"] = "[]"
    (data / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, [*args, "--store", str(tmp_path / "store2")])
    assert result.exit_code == 2 and "error: --reference: none of the" in result.output, result.output
    assert not (tmp_path / "store2").exists()
