"""The lopd study bed (examples/envscaler_bed): generated files up to date, splits stable, held-out
phrasings, and seeded samples of tasks and of exploit policies played through the lopd-bed
environment by examples/envscaler_bed/check.py."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

BED = Path(__file__).resolve().parents[1] / "examples" / "envscaler_bed"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"lopd_bed_{name}", BED / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = _module("check")
build = _module("build")


def test_generated_files_match_a_fresh_build():
    env_rows, task_rows, meta, problems = build.build()
    assert problems == []
    assert (BED / "environments.jsonl").read_text(encoding="utf-8") == build.jsonl(env_rows)
    assert (BED / "tasks.jsonl").read_text(encoding="utf-8") == build.jsonl(task_rows)
    assert json.loads((BED / "bed.json").read_text(encoding="utf-8")) == meta
    roles = {r["env_id"]: r["role"] for r in env_rows}
    per_split = {}
    for row in task_rows:
        per_split.setdefault((row["env_id"], row["split"]), 0)
        per_split[(row["env_id"], row["split"])] += 1
    want = {"main": {"train": 40, "test": 15, "test_values": 10}, "transfer": {"transfer": 34}, "warmup": {"warmup": 40}}
    for env_id, role in roles.items():
        assert {s: n for (e, s), n in per_split.items() if e == env_id} == want[role], env_id
    assert sum(r == "transfer" for r in roles.values()) >= 6 and meta["counts"]["tasks"]["transfer"] >= 200
    assert sum(len(r["checklist_with_func"]) >= 2 for r in task_rows) >= 0.35 * len(task_rows)


def test_no_test_task_shares_a_phrasing_with_train_or_warmup():
    env = check.LopdBedEnv()
    assert check.phrasing_problems(env) == []
    test = [s for s in env.data.tasks.values() if s.split == "test"]
    values = [s for s in env.data.tasks.values() if s.split == "test_values"]
    assert len(test) >= 200 and len(values) >= 100
    # the phrasing masks values: a train text with other ids and numbers has the same phrasing
    spec = next(s for s in env.data.tasks.values() if s.split == "train" and re.search(r"\d", s.text))
    vocab = build.vocabulary([{"init_config": spec.init_config, "reference_actions": []}])
    assert build.phrasing(spec.text, vocab) == build.phrasing(re.sub(r"\d", "7", spec.text), vocab)


def test_exploit_policies_do_not_succeed_on_a_sample():
    results, bed_problems = check.run(sample=36, seed=5, jobs=4)
    assert bed_problems == []  # includes every exploit's success share <= MAX_EXPLOIT_SUCCESS
    assert [f"{r.task_id}: {r.problems}" for r in results if r.problems] == []  # reference 1.0, do-nothing 0.0
    rates = check.exploit_rates(results)
    played = {name for split in rates.values() for name in split}
    assert played == set(check.exploits.POLICIES) - {"do_nothing"}
    assert all(k == 0 for split in rates.values() for k, _ in split.values())


def test_sample_of_tasks_passes_every_check():
    results, bed_problems = check.run(sample=104, seed=7, jobs=4, with_exploits=False)  # episodes mostly wait on sandbox start-up
    assert bed_problems == []
    assert len(results) == 104 and {r.split for r in results} == set(check.SPLITS)
    assert [f"{r.task_id}: {r.problems}" for r in results if r.problems] == []
    assert 0 < max(r.prompt_tokens for r in results) <= check.PROMPT_TOKEN_LIMIT
    assert 0 < max(r.action_tokens for r in results) <= check.ACTION_TOKEN_LIMIT


def test_build_names_a_broken_module_and_skips_it_only_when_asked(tmp_path):
    domains = tmp_path / "domains"
    domains.mkdir()
    shutil.copy(BED / "domains" / "personal.py", domains / "personal.py")
    (domains / "broken.py").write_text('ENVS = [{"env_id": "bed_x", "env_class_name": "X", "role": "main"}]\n')
    env_rows, task_rows, _, problems = build.build(domains)
    assert problems == ["domains/broken.py: env 'bed_x': missing field 'environment_introduction'"]
    assert env_rows == task_rows == []
    env_rows, task_rows, meta, problems = build.build(domains, skip_broken=True)
    assert len(problems) == 1 and [r["env_id"] for r in env_rows] == [
        "bed_personal_notes", "bed_personal_todo", "bed_personal_contacts"]
    assert meta["counts"]["tasks"] == {"warmup": 120} and len(task_rows) == 120


def test_build_loads_a_domain_package_and_reloads_it_from_another_folder(tmp_path):
    first, second = tmp_path / "a" / "domains", tmp_path / "b" / "domains"
    for folder in (first, second):
        shutil.copytree(BED / "domains" / "smart_home", folder / "smart_home",
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(BED / "domains" / "personal.py", first / "personal.py")
    lights = second / "smart_home" / "lights.py"
    lights.write_text(lights.read_text().replace('"bed_smart_home_lights"', '"bed_smart_home_lamps"'))
    env_rows, _, _, problems = build.build(first)
    assert problems == [] and [r["env_id"] for r in env_rows] == [
        "bed_personal_notes", "bed_personal_todo", "bed_personal_contacts", "bed_smart_home_lights",
        "bed_smart_home_thermostats", "bed_smart_home_security", "bed_smart_home_irrigation"]
    env_rows, _, _, problems = build.build(second)  # same package name: its own lights module, not the first's
    assert problems == [] and env_rows[0]["env_id"] == "bed_smart_home_lamps"


@pytest.fixture
def bed_copy(tmp_path):
    """A bed of the first two calendar tasks, with broken reference actions and a leaked test text;
    a third task has the train task's phrasing with other digits."""
    rows = [json.loads(line) for line in (BED / "tasks.jsonl").read_text(encoding="utf-8").splitlines()]
    a, b, c = [r for r in rows if r["env_id"] == "bed_calendar_rooms"][:3]
    a["split"], b["split"], c["split"] = "train", "test", "test"
    a["reference_actions"] = a["reference_actions"][:-1] or [{"name": "list_rooms", "arguments": {}}]
    b["task"] = a["task"]
    c["task"] = re.sub(r"\d", "7", a["task"])
    shutil.copy(BED / "environments.jsonl", tmp_path / "environments.jsonl")
    (tmp_path / "tasks.jsonl").write_text(build.jsonl([a, b, c]), encoding="utf-8")
    meta = dict(build.BED_META, counts={"tasks": {"test": 2, "train": 1}}, split_digests={})
    (tmp_path / "bed.json").write_text(json.dumps(meta), encoding="utf-8")
    return tmp_path, a["task_id"]


def test_checker_reports_a_broken_task_and_a_leaked_text(bed_copy):
    folder, broken = bed_copy
    results, bed_problems = check.run(data_dir=folder, with_exploits=False)
    problems = {r.task_id: r.problems for r in results}
    assert any(p.startswith("reference actions: reward 0") for p in problems[broken]), problems[broken]
    assert [p for tid, ps in problems.items() if tid != broken for p in ps] == []
    assert any("test task text(s) also in train" in p for p in bed_problems)
    assert any("2 held-out phrasing problem(s), e.g. test task" in p for p in bed_problems), bed_problems
    assert any("split_digests" in p for p in bed_problems)
