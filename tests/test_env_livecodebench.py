"""LiveCodeBench environment on a 3-problem fixture in the release format (stdin, functional, compressed)."""
from __future__ import annotations

import json
import pickle
import base64
import zlib
from pathlib import Path

import pytest

from stages.envs import EnvError, make_env
from stages.envs.livecodebench import decode_tests, encode_private_tests, extract_code

FIXTURE = Path(__file__).parent / "fixtures" / "livecodebench"
SOLUTIONS = json.loads((Path(__file__).parent / "fixtures" / "livecodebench_solutions.json").read_text())


def _answer(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


def test_fixture_loads_all_styles():
    tasks = make_env("livecodebench", data_dir=FIXTURE).tasks("test")
    assert [t.task_id for t in tasks] == ["lcbfx_stdin", "lcbfx_functional", "lcbfx_compressed"]
    types = [{c["testtype"] for c in t.meta["tests"]} for t in tasks]
    assert types == [{"stdin"}, {"functional"}, {"stdin"}]
    assert len(tasks[2].meta["tests"]) == 3  # 1 public + 2 decoded private tests
    assert "starter code" in tasks[1].prompt and "stdin" in tasks[0].prompt


@pytest.mark.parametrize("task_index", [0, 1, 2])
def test_reference_solution_passes_and_empty_fails(task_index):
    env = make_env("livecodebench", data_dir=FIXTURE)
    task = env.tasks("test")[task_index]
    env.reset(task)
    good = env.step(_answer(SOLUTIONS[task.task_id]))
    assert good.done and good.reward == 1.0 and good.info["passed"] == good.info["total"]
    env.reset(task)
    empty = env.step("")
    assert empty.reward == 0.0 and empty.info["first_failure"] == "no code block in the answer"
    env.reset(task)
    wrong = env.step(_answer("print(0)\n"))
    assert wrong.reward == 0.0 and not wrong.info["success"]


def test_release_windows_filter_by_contest_date():
    v5 = [t.task_id for t in make_env("livecodebench", data_dir=FIXTURE, release="v5").tasks("test")]
    v6 = [t.task_id for t in make_env("livecodebench", data_dir=FIXTURE, release="v6").tasks("test")]
    assert v5 == ["lcbfx_stdin", "lcbfx_functional"]  # 2025-04-10 is after the v5 window
    assert v6 == ["lcbfx_stdin", "lcbfx_functional", "lcbfx_compressed"]


def test_compressed_tests_round_trip_and_reject_globals():
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    assert decode_tests(encode_private_tests(tests), "x") == tests
    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/")))).decode()
    with pytest.raises(EnvError, match="not allowed"):
        decode_tests(evil, "row 0 private_test_cases")


def test_missing_data_names_the_flag(tmp_path):
    with pytest.raises(EnvError, match="--data-dir"):
        make_env("livecodebench").tasks("test")
    with pytest.raises(EnvError, match="--data-dir"):
        make_env("livecodebench", data_dir=tmp_path).tasks("test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": "q"}) + "\n")
    with pytest.raises(EnvError, match=r"bad.jsonl row 0: missing field 'question_content'"):
        make_env("livecodebench", data_dir=bad).tasks("test")


def test_extract_code_takes_last_block():
    assert extract_code("```python\na=1\n```\ntext\n```python\nb=2\n```") == "b=2\n"
    assert extract_code("no code") == ""


@pytest.mark.parametrize("task_index", [0, 1, 2])
def test_official_grader_and_lopd_harness_agree_on_the_fixtures(task_index):
    """LiveCodeBench's own testing_util (nvidia-livecodebench, run in the sandbox) grades the fixture
    solutions as the built-in harness does: right answers pass every test, wrong ones fail."""
    from stages.envs import livecodebench as lcb

    source = lcb.official_testing_util()
    assert source is not None, "make install puts nvidia-livecodebench in (--no-deps)"
    task = make_env("livecodebench", data_dir=FIXTURE).tasks("test")[task_index]
    tests, fn = task.meta["tests"], task.meta.get("func_name")
    right, wrong = extract_code(_answer(SOLUTIONS[task.task_id])), "print(0)\n"
    for code, passes in ((right, True), (wrong, False)):
        official = lcb.grade_official(code, tests, fn, source=source)
        ours = lcb.grade(code, tests, fn)
        assert (official["passed"] == official["total"]) == (ours["passed"] == ours["total"]) == passes
    env = make_env("livecodebench", data_dir=FIXTURE)
    env.reset(task)
    assert env.step(_answer(SOLUTIONS[task.task_id])).info["grader"] == "livecodebench testing_util"


def test_official_grader_failures_are_labelled_as_it_means_them():
    """testing_util's -2 is a wrong answer (it was reported as "compile error"); its message is kept."""
    from stages.envs import livecodebench as lcb

    tasks = make_env("livecodebench", data_dir=FIXTURE).tasks("test")
    stdin, functional = tasks[0], tasks[1]
    assert functional.meta.get("func_name") and not stdin.meta.get("func_name")
    wrong = lcb.grade_official("print(30)\n", stdin.meta["tests"], None)
    assert wrong["passed"] == 0 and wrong["first_failure"].startswith("wrong answer (Wrong answer at output_line_idx=0: 30 != ")
    called = lcb.grade_official("class Solution:\n    def maxElement(self, nums):\n        return -1\n",
                                functional.meta["tests"], functional.meta["func_name"])
    assert called["first_failure"] == "wrong answer (Wrong Answer)"
    broken = lcb.grade_official("raise ValueError('boom')\n", stdin.meta["tests"], None)
    assert broken["first_failure"] == "runtime error (Runtime Error)"


def test_the_harness_grades_when_the_official_grader_is_missing(monkeypatch):
    from stages.envs import livecodebench as lcb

    monkeypatch.setattr(lcb, "official_testing_util", lambda: None)
    env = make_env("livecodebench", data_dir=FIXTURE)
    task = env.tasks("test")[0]
    env.reset(task)
    result = env.step(_answer(SOLUTIONS[task.task_id]))
    assert result.reward == 1.0 and result.info["grader"] == "lopd harness"
    with pytest.raises(EnvError, match="nvidia-livecodebench"):
        lcb.grade_official("print(1)", task.meta["tests"], None)
