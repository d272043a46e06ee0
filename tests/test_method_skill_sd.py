"""`lopd distill --method skill-sd` (stages/methods/skill_sd.py): UCB1, summary parsing, the skill
bank table, the synced teacher, and 2 CLI steps killed between steps and resumed bit-exact."""
from __future__ import annotations

import json
import math
import shutil

import lancedb
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from lopd_cli.main import app
from schemas import SkillRecord
from stages.core.data.rows import training_rows
from stages.core.data.store import StoreError
from stages.core.models.composer import adapter_parameters
from stages.distill.recipe import COMMON_FIELDS, TIMING_FIELDS, DistillConfig, Distiller
from stages.engines.rollout import RolloutStats
from stages.methods import StepBatch, StepContext
from stages.methods.skill_sd import (
    SECTIONS, SKILL_HEAD, SKILLS_TABLE, TEACHER_ADAPTER, SkillBank, SkillSD, parse_summary, summary_prompt_ids,
    ucb1_pick,
)
from tests.test_distill import ENV, _hash_embedder, _seed_trajectory, assets, metrics  # noqa: F401 (fixtures)
from tests.tiny import tiny_tokenizer

runner = CliRunner()
FAST = dict(summary_max_tokens=8, summary_prompt_tokens=256)


def test_ucb1_unseen_first_then_mean_plus_bonus():
    assert ucb1_pick([], []) is None
    assert ucb1_pick([2, 0, 0], [0.9, 0.0, 0.0]) == 1  # unseen first, the oldest of them
    # N=4: 0.9 + sqrt2 sqrt(ln4/3) = 1.8614 < 0.2 + sqrt2 sqrt(ln4) = 1.8651
    assert ucb1_pick([3, 1], [0.9, 0.2]) == 1
    assert ucb1_pick([3, 1], [0.95, 0.2]) == 0  # 1.9114 > 1.8651
    assert ucb1_pick([3, 1], [0.9, 0.2], c=0.0) == 0 and ucb1_pick([2, 2], [0.5, 0.5]) == 0  # tie: oldest


def test_parse_summary_sections_markdown_and_fallbacks():
    text, ok = parse_summary("What works: call get_weather first.\nWhat to avoid: prose answers.\n"
                             "Suggested workflow: 1. query 2. answer")
    assert ok and text.splitlines() == ["What works: call get_weather first.", "What to avoid: prose answers.",
                                        "Suggested workflow: 1. query 2. answer"]
    text, ok = parse_summary("**What works**: tools\n\n## What to avoid:\n- guessing\n**Suggested workflow:** plan")
    assert ok and text == "What works: tools\nWhat to avoid: - guessing\nSuggested workflow: plan"
    assert parse_summary("What works: x\nSuggested workflow: y") == ("What works: x\nSuggested workflow: y", False)
    assert parse_summary("What works:\nWhat to avoid: a\nSuggested workflow: b")[1] is False  # empty section
    assert parse_summary("  \n") == ("", False)


def test_summary_prompt_respects_its_token_budget():
    tok = tiny_tokenizer()
    trajs = [_seed_trajectory(i) for i in range(3)]
    full = summary_prompt_ids(tok, trajs[0].prompt, trajs, 4000)
    assert "Attempt 3 (reward 1.00)" in tok.decode(full) and tok.decode(full).endswith(f"{SECTIONS[0]}:")
    cut = summary_prompt_ids(tok, trajs[0].prompt, trajs * 20, 300)
    assert len(cut) <= 300 and tok.decode(cut).endswith(f"{SECTIONS[0]}:")


def _record(run: str, step: int, kind: str, i: int, task: str = "a", skill: str = "", reward: float = 0.0):
    rid = f"{run}-{step:06d}-{kind}-{i:04d}"
    return SkillRecord(record_id=rid, run_id=run, step=step, kind=kind, env=ENV, task_id=task,
                       skill_id=skill or rid, text="What works: x" if kind == "skill" else "",
                       sources=[f"src-{step}"] if kind == "skill" else [], reward=reward)


def test_skill_bank_table_roundtrip_credit_and_resume_drop(tmp_path):
    db = lancedb.connect(tmp_path / "store")
    bank = SkillBank(db, "run")
    s1, s2 = _record("run", 1, "skill", 0), _record("run", 2, "skill", 0)
    rows = [s1, _record("run", 1, "use", 0, skill=s1.record_id),
            _record("run", 2, "credit", 0, skill=s1.record_id, reward=1.0), s2,
            _record("run", 2, "use", 0, skill=s2.record_id),
            _record("run", 3, "credit", 0, skill=s2.record_id, reward=0.5),
            _record("run", 3, "use", 0, skill=s1.record_id)]
    for step in (1, 2, 3):
        part = [r for r in rows if r.step == step]
        bank.write(part)
        bank.apply(part)
    SkillBank(db, "other").write([_record("other", 9, "skill", 0)])
    assert bank.stats == {s1.record_id: [1, 1.0], s2.record_id: [1, 0.5]} and bank.pending == {"a": s1.record_id}
    assert bank.sources["a"] == {"src-1", "src-2"} and bank.pick("a", math.sqrt(2)) == s1  # the higher mean
    assert bank.drop_after(2) == 2  # the step-3 rows of this run only
    again = SkillBank(db, "run")
    again.load()
    assert again.records == 5 and again.stats == {s1.record_id: [1, 1.0]} and again.pending == {"a": s2.record_id}
    assert [s.record_id for s in again.skills["a"]] == [s1.record_id, s2.record_id]
    assert again.pick("a", math.sqrt(2)) == s2  # not credited yet: unseen first
    assert db.open_table(SKILLS_TABLE).count_rows("run_id = 'other'") == 1
    db.drop_table(SKILLS_TABLE)
    db.create_table(SKILLS_TABLE, data=[{"record_id": "x"}])
    with pytest.raises(StoreError, match="does not match the SkillRecord schema"):
        SkillBank(db, "run")


def skill_config(assets, tmp_path, name: str, **overrides) -> DistillConfig:
    model_dir, _, store_template = assets
    store = tmp_path / f"store-{name}"
    if not store.exists():
        shutil.copytree(store_template, store)
    values = dict(method="skill-sd", env=ENV, store=str(store), out=str(tmp_path / name), model=str(model_dir),
                  lr=1e-2, steps=1, tasks_per_step=2, group_size=2, max_new_tokens=8, temperature=1.0,
                  student_lora_rank=4, checkpoint_every=1, micro_batch=2, max_len=256, run_id=f"{name}-test",
                  sdl_coef=1.0, **FAST)
    return DistillConfig(**{**values, **overrides})


class _Broken:
    def generate(self, prompts, params):
        raise RuntimeError("out of memory")


def test_synced_teacher_skills_and_a_separate_summarizer(assets, tmp_path):
    model_dir = assets[0]
    trainer = Distiller(skill_config(assets, tmp_path, "sync", summarizer=str(model_dir)))
    method = trainer.method
    teacher = adapter_parameters(trainer.student.model, TEACHER_ADAPTER)
    assert teacher and not any(p.requires_grad for p in teacher)
    trainer.fit()
    student = adapter_parameters(trainer.student.model, "student")
    assert any(bool(p.abs().sum() > 0) for p in student[1::2])  # LoRA B moved from zero
    assert all(torch.equal(t, s) for t, s in zip(teacher, student))  # synced after the step
    row = metrics(trainer.out)[0]
    assert set(COMMON_FIELDS + SkillSD.metrics) <= set(row) and row["skills_written"] >= 1
    assert row["no_skill_frac"] < 1 and row["sdl"] > 0  # a skill moved the teacher away from the student
    records = [SkillRecord.model_validate(r) for r in
               trainer.store.db.open_table(SKILLS_TABLE).to_arrow().to_pylist()]
    skills = [r for r in records if r.kind == "skill"]
    assert skills and all(r.summarizer == str(model_dir) and r.sources for r in skills)
    assert {r.kind for r in records} == {"skill", "use"}
    assert json.loads((trainer.out / "checkpoints" / "step-1" / "state.json").read_text())[
        "skill_records"] == len(records)
    # the teacher's prompt is the student's with the skill in the first user message
    trajs = trainer.store.query(run_id="sync-test")  # step 1's groups again: their tasks have skills
    rows, _ = training_rows(trainer.student.tokenizer, [t for t in trajs if t.turns], max_len=256)
    extras = method.prepare(StepBatch(rows, trajs), StepContext(trainer.store, None, trainer.engine, 2))
    assert all(e.skill_id for e in extras) and method.step_metrics["skill_credits"] == 2  # step 1's uses
    text = trainer.student.tokenizer.decode(extras[0].prefix_ids)
    assert SKILL_HEAD in text and text.startswith(trainer.student.tokenizer.decode(rows[0].ids_T[:5]))
    # a failing summariser is a warning, never a dead run: the step goes on without skills
    method._summarizer = (_Broken(), trainer.student.tokenizer, "broken")
    fresh = trainer._rollout(3, RolloutStats())  # other tasks: nothing in their banks yet
    rows, _ = training_rows(trainer.student.tokenizer, [t for t in fresh if t.turns], max_len=256)
    with pytest.warns(UserWarning, match="summariser failed at step 3 .*out of memory"):
        extras = method.prepare(StepBatch(rows, fresh), StepContext(trainer.store, None, trainer.engine, 3))
    assert not any(e.skill_id for e in extras) and method.step_metrics["no_skill_frac"] == 1.0


def _cli(args):
    res = runner.invoke(app, args)
    return res


def test_cli_two_steps_killed_between_steps_resumes_bit_exact(assets, tmp_path, monkeypatch):
    model_dir, _, store_template = assets
    config = tmp_path / "skill.toml"
    config.write_text('max_len = 256\nmicro_batch = 2\ntemperature = 1.0\nrun_id = "skill-cli"\n'
                      'summary_max_tokens = 8\nsummary_prompt_tokens = 256\nsdl_coef = 1.0\n')

    def args(name):
        shutil.copytree(store_template, tmp_path / f"store-{name}", dirs_exist_ok=True)
        return ["distill", "--method", "skill-sd", "--config", str(config), "--env", ENV,
                "--store", str(tmp_path / f"store-{name}"), "--out", str(tmp_path / name), "--model", str(model_dir),
                "--steps", "2", "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "8",
                "--student-lora-rank", "4", "--lr", "1e-2", "--checkpoint-every", "1"]

    res = _cli(args("straight"))
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    real_save = Distiller.save_checkpoint

    def die_at_step_2(self):
        if self.step == 2:  # rows, skills and metrics of step 2 are written, its checkpoint is not
            raise RuntimeError("simulated SIGKILL")
        return real_save(self)

    monkeypatch.setattr(Distiller, "save_checkpoint", die_at_step_2)
    res = _cli(args("killed"))
    assert res.exit_code != 0 and "simulated SIGKILL" in repr(res.exception)
    monkeypatch.setattr(Distiller, "save_checkpoint", real_save)

    def skill_rows(name):
        table = lancedb.connect(tmp_path / f"store-{name}").open_table(SKILLS_TABLE)
        return sorted(table.to_arrow().to_pylist(), key=lambda r: r["record_id"])

    assert any(r["step"] == 2 for r in skill_rows("killed"))  # stale rows the resume must drop
    res = _cli(["distill", "--out", str(tmp_path / "killed"), "--resume"])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]  # noqa: E731
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "killed")
    assert [r["step"] for r in resumed] == [1, 2] and strip(resumed) == strip(straight)
    assert straight[1]["bank_size"] >= 1 and skill_rows("killed") == skill_rows("straight")
    a = load_file(str(tmp_path / "killed" / "final" / "student" / "model.safetensors"))
    b = load_file(str(tmp_path / "straight" / "final" / "student" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class _FakeStore:
    def __init__(self, rows):
        self.rows = rows

    def query(self, task_ids=None, env=None, split=None):
        return [t for t in self.rows if t.task_id in task_ids]


class _Echo:
    def __init__(self):
        self.prompts = []

    def generate(self, prompts, params):
        self.prompts += prompts
        assert params.temperature == 0.0 and params.max_new_tokens == 8  # greedy, bounded
        return [type("G", (), {"text": " tools\nWhat to avoid: prose\nSuggested workflow: call"})() for _ in prompts]


@pytest.mark.parametrize("source", ["step", "store"])
def test_which_rollouts_a_skill_is_written_from_and_the_cap(tmp_path, source):
    from stages.methods.skill_sd import SkillSDOptions
    method = SkillSD.__new__(SkillSD)
    method.options = SkillSDOptions(skill_source=source, max_skills=2, **FAST)
    method.config = type("C", (), {"run_id": "r"})()
    method.bank = SkillBank(lancedb.connect(tmp_path / "db"), "r")
    engine = _Echo()
    method._summarizer = (engine, tiny_tokenizer(), "echo")
    old = _seed_trajectory(0)  # an earlier rollout of task train-0 in the store
    group = [_seed_trajectory(0).model_copy(update={"trajectory_id": f"g{i}"}) for i in range(2)]
    context = StepContext(_FakeStore([old]), None, None, 1)
    first = method.write_skills({"train-0": group}, 1, context)
    expected = ["seed-0", "g0", "g1"] if source == "step" else ["seed-0"]
    assert [r.sources for r in first] == [expected] and first[0].parsed
    assert first[0].text == "What works: tools\nWhat to avoid: prose\nSuggested workflow: call"
    method.bank.apply(first)
    again = method.write_skills({"train-0": group}, 2, context)  # nothing new: no second summary
    assert again == [] and len(engine.prompts) == 1
    newer = [g.model_copy(update={"trajectory_id": f"h{i}"}) for i, g in enumerate(group)]
    second = method.write_skills({"train-0": newer}, 3, StepContext(_FakeStore([old, *group]), None, None, 3))
    assert [r.sources for r in second] == [["h0", "h1"] if source == "step" else ["g0", "g1"]]
    method.bank.apply(second)  # the bank is full (max_skills=2): later visits only choose
    assert method.write_skills({"train-0": newer}, 4, StepContext(_FakeStore([old, *group, *newer]), None, None, 4)) == []


def test_full_fine_tuning_teacher_copy_and_kl_reference(assets, tmp_path):
    from transformers import AutoModelForCausalLM
    trainer = Distiller(skill_config(assets, tmp_path, "full", student_lora_rank=0, kl_coef=0.5))
    method = trainer.method
    assert method.teacher_model is not None and method.reference_policy is not None
    trainer.fit()
    student = dict(trainer.student.model.named_parameters())
    teacher = dict(method.teacher_model.named_parameters())
    assert not any(p.requires_grad for p in teacher.values())
    assert all(torch.equal(teacher[k], student[k]) for k in student)  # synced after the step
    initial = AutoModelForCausalLM.from_pretrained(assets[0]).state_dict()
    reference = method.reference_policy.state_dict()
    assert all(torch.equal(reference[k], initial[k]) for k in initial)  # the KL's frozen start
    assert any(not torch.equal(student[k], initial[k]) for k in initial if k in student)
    assert metrics(trainer.out)[0]["kl_ref"] >= 0.0
