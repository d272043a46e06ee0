"""The reference-context baselines sdft and opsd (B.1 of the LOPD paper) in the distill loop.

Tiny in-process model, the toy two-turn environment and seed store of tests/test_distill.py
(verified seed rows for tasks train-0..3; train-4 has none, so no-context masking happens).
"""
from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from lopd_cli.main import app
from schemas import Message, Trajectory, Turn
from stages.core.data.rows import TrainRow, training_rows
from stages.core.data.store import ExperienceStore
from stages.core.models.composer import adapter_parameters, base_parameters
from stages.distill.recipe import TIMING_FIELDS, DistillConfig, Distiller
from stages.methods import StepBatch, StepContext, get_method
from stages.methods._text_context import TEACHER_ADAPTER, demonstration_text, verified_references
from tests.test_distill import ENV, _hash_embedder, assets, metrics  # noqa: F401 (fixtures)
from tests.tiny import tiny_tokenizer

runner = CliRunner()


def _config(assets, tmp_path, name: str, method: str, **overrides) -> DistillConfig:
    model_dir, _, store_template = assets
    store = tmp_path / f"store-{name}"
    if not store.exists():
        shutil.copytree(store_template, store)
    values = dict(method=method, env=ENV, store=str(store), out=str(tmp_path / name), model=str(model_dir),
                  lr=1e-2, steps=2, tasks_per_step=2, group_size=2, max_new_tokens=8, temperature=1.0,
                  student_lora_rank=4, checkpoint_every=1, micro_batch=2, max_len=256, run_id=f"{name}-test")
    return DistillConfig(**{**values, **overrides})


def _traj(tid: str, task: str, *, reward=1.0, success=True, split="train", policy="seed", minutes=0,
          actions=("I think 7.",), observations=None) -> Trajectory:
    observations = observations or [""] * len(actions)
    messages = [Message(role="system", content="You are a helpful assistant."),
                Message(role="user", content=f"Task {task}?")]
    for a, o in zip(actions, observations):
        messages.append(Message(role="assistant", content=a))
        if o:
            messages.append(Message(role="user", content=o))
    return Trajectory(
        trajectory_id=tid, task_id=task, env=ENV, split=split, prompt=f"Task {task}?", policy=policy,
        messages=messages, turns=[Turn(action=a, observation=o) for a, o in zip(actions, observations)],
        reward=reward, success=success, num_steps=len(actions), num_tool_calls=0, run_id="r",
        created_at=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=minutes))


def _row(traj: Trajectory) -> TrainRow:
    return training_rows(tiny_tokenizer(), [traj])[0][0]


# ------------------------------------------------------------------------ reference pool --


def test_reference_pool_is_verified_train_same_task_never_self_and_deterministic(tmp_path):
    store = ExperienceStore.open(tmp_path / "pool")
    store.append([
        _traj("own-success", "a", minutes=0),                      # the row itself: never its own context
        _traj("late-ref", "a", policy="reference", minutes=9),
        _traj("early-ref", "a", policy="reference", minutes=5),    # <- a: reference, then earliest
        _traj("student-win", "a", minutes=1),
        _traj("half", "a", reward=0.5, success=True, policy="reference"),
        _traj("failed", "b", reward=0.0, success=False),
        _traj("test-split", "b", split="test"),                     # never context
        _traj("c-partial", "c", reward=0.6, minutes=1),
        _traj("c-best", "c", reward=0.9, minutes=2),               # <- c: highest reward first
    ])
    rows = [_row(_traj("own-success", "a")), _row(_traj("x", "b", success=False, reward=0.0)),
            _row(_traj("y", "c")), _row(_traj("z", "d"))]
    picked = verified_references(store, rows)
    assert [p.trajectory_id if p else None for p in picked] == ["early-ref", None, "c-best", None]
    assert verified_references(store, rows[:1])[0].trajectory_id == "early-ref"  # same pick alone


def test_demonstration_shows_actions_short_results_and_is_clipped():
    tok = tiny_tokenizer()
    ref = _traj("r", "a", actions=("get the weather", "The weather is sunny."),
                observations=("sunny, 21", "x" * 500))
    demo = demonstration_text(ref, tok, max_tokens=10_000, max_observation_chars=300)
    assert demo.text.splitlines() == ["Step 1: get the weather", "Result: sunny, 21",
                                      "Step 2: The weather is sunny.", "Result: (500 characters, not shown)"]
    assert not demo.clipped and demo.trajectory_id == "r"
    short = demonstration_text(ref, tok, max_tokens=5, max_observation_chars=300)
    assert short.clipped and short.tokens == 5 and short.text.endswith("cut ...]")
    assert short.text.startswith(tok.decode(tok(demo.text, add_special_tokens=False)["input_ids"][:5]).rstrip())


# ------------------------------------------------------------------------ teacher views --


def test_contexts_go_where_b1_puts_them_and_rows_without_one_are_masked(assets, tmp_path):
    tok = tiny_tokenizer()
    rows = [_row(_traj("t0", "train-1", success=False, reward=0.0)), _row(_traj("t1", "train-4"))]
    store = ExperienceStore.open(assets[2])
    for method, role in (("sdft", "user"), ("opsd", "system")):
        trainer = Distiller(_config(assets, tmp_path, f"ctx-{method}", method, steps=1))
        extras = trainer.method.prepare(StepBatch(rows, []), StepContext(store, None, None, 1))
        assert extras[1].prefix_ids is None and extras[1].demonstration is None  # train-4: no reference
        assert (extras[0].step_sequences, extras[0].step_tokens) == (1, int(rows[0].mask_T.sum()))
        assert trainer.method._step_stats["no_context_frac"] == 0.5
        text = tok.decode(extras[0].prefix_ids)
        system, user = text.split("<|im_start|>user")[:2]
        where, other = (user, system) if role == "user" else (system, user)
        assert "The answer is 2." in where and "The answer is 2." not in other  # seed-1's action
        assert "Task train-1?" in user and text.endswith("<|im_start|>assistant\n")
        assert ("Reference plan" in where) == (method == "opsd")
        loss, m = trainer.method.loss(rows[1:], extras[1:], 0.5)  # only masked rows: no forward
        loss.backward()
        assert float(loss.detach()) == 0.0 and all(p.grad is None for p in trainer.student.params)
        assert set(m) == set(trainer.method.loss_metrics)


# ------------------------------------------------------------------- teacher maintenance --


def test_frozen_teacher_stays_the_initial_weights(assets, tmp_path):
    fresh = AutoModelForCausalLM.from_pretrained(assets[0]).state_dict()
    lora = Distiller(_config(assets, tmp_path, "frozen-lora", "opsd"))
    before = [p.detach().clone() for p in lora.student.params]
    lora.fit()
    assert lora.method.teacher.adapter is None and lora.method.teacher.model is lora.student.model
    assert any(not torch.equal(a, p) for a, p in zip(before, lora.student.params))  # the student moved
    base = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
            for n, p in base_parameters(lora.student.model)}
    assert all(torch.equal(base[k], fresh[k]) for k in fresh)  # bit-identical teacher
    full = Distiller(_config(assets, tmp_path, "frozen-full", "opsd", student_lora_rank=0, lr=1e-3, steps=1))
    full.fit()
    teacher = full.method.teacher.model.state_dict()
    assert full.method.teacher.model is not full.student.model
    assert all(torch.equal(teacher[k], fresh[k]) for k in fresh)
    assert any(not torch.equal(full.student.model.state_dict()[k], fresh[k]) for k in fresh)


def _record_students(trainer, params):
    """Snapshot ``params`` right after each optimizer step (before the method's after-step)."""
    seen, real = [], trainer.method.after_step

    def after_step(sums):
        seen.append([p.detach().double().clone() for p in params()])
        return real(sums)

    trainer.method.after_step = after_step
    return seen


def test_ema_teacher_is_the_closed_form_mix_after_two_steps(assets, tmp_path):
    assert get_method("sdft").Options().ema_rate == 0.01 and get_method("sdft").Options().teacher == "ema"
    rate = 0.25  # large enough that every term of the mix shows
    trainer = Distiller(_config(assets, tmp_path, "ema", "sdft", ema_rate=rate))
    net = trainer.student.model
    teacher = lambda: adapter_parameters(net, TEACHER_ADAPTER)  # noqa: E731
    t0 = [p.detach().double().clone() for p in teacher()]
    assert all(torch.equal(a, p.double()) for a, p in zip(t0, trainer.student.params))  # a copy at start
    assert not any(p.requires_grad for p in teacher())
    seen = _record_students(trainer, lambda: trainer.student.params)
    trainer.fit()
    s1, s2 = seen
    for t, a, b, now in zip(t0, s1, s2, teacher()):
        expected = (1 - rate) ** 2 * t + rate * (1 - rate) * a + rate * b
        assert torch.allclose(now.double(), expected, atol=1e-7, rtol=1e-6)
    assert any(not torch.allclose(now.double(), b) for now, b in zip(teacher(), s2))
    saved = load_file(str(trainer.out / "checkpoints" / "step-2" / "teacher" / "adapter_model.safetensors"))
    assert len(saved) == len(t0)


def test_ema_teacher_of_a_fully_fine_tuned_student(assets, tmp_path):
    rate = 0.5
    trainer = Distiller(_config(assets, tmp_path, "ema-full", "sdft", ema_rate=rate, student_lora_rank=0,
                                lr=1e-3, steps=1))
    t0 = [p.detach().double().clone() for p in trainer.method.teacher.model.parameters()]
    seen = _record_students(trainer, lambda: list(trainer.student.model.parameters()))
    trainer.fit()
    for t, s, now in zip(t0, seen[0], trainer.method.teacher.model.parameters()):
        assert torch.allclose(now.double(), (1 - rate) * t + rate * s, atol=1e-7)
    assert (trainer.out / "checkpoints" / "step-1" / "teacher" / "model.safetensors").is_file()


# -------------------------------------------------------------------------------- CLI --


def _cli(args: list[str]):
    return runner.invoke(app, args)


def _cli_args(assets, tmp_path, name: str, method: str, *extra: str) -> list[str]:
    store = tmp_path / f"store-{name}"
    if not store.exists():
        shutil.copytree(assets[2], store)
    return ["distill", "--method", method, "--env", ENV, "--store", str(store), "--out", str(tmp_path / name),
            "--model", str(assets[0]), "--steps", "2", "--tasks-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "8", "--lr", "1e-2", "--student-lora-rank", "4", "--checkpoint-every", "1",
            "-o", "max_len=256", "-o", "micro_batch=2", "-o", f"run_id={name}", *extra]


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def test_opsd_two_steps_through_the_cli_without_a_composer(assets, tmp_path):
    res = _cli(_cli_args(assets, tmp_path, "opsd-cli", "opsd", "-o", "beta=0.5"))
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    rows = metrics(tmp_path / "opsd-cli")
    assert [r["step"] for r in rows] == [1, 2] and [r["generations"] for r in rows] == [4, 8]
    cls = get_method("opsd")
    for r in rows:
        assert set(cls.metrics) <= set(r) and "beta" not in r
        assert 0.0 <= r["no_context_frac"] <= 1.0
        if r["no_context_frac"] < 1.0:
            assert r["kd_loss"] > 0 and r["forward_kl"] > 0 and r["reverse_kl"] > 0 and r["grad_norm_student"] > 0
            assert r["loss"] == pytest.approx(r["kd_loss"])
    saved = json.loads((tmp_path / "opsd-cli" / "config.json").read_text())
    assert saved["method"] == "opsd" and saved["options"]["beta"] == 0.5 and saved["options"]["teacher"] == "frozen"
    assert (tmp_path / "opsd-cli" / "final" / "student" / "model.safetensors").is_file()
    assert not (tmp_path / "opsd-cli" / "checkpoints" / "step-2" / "teacher").exists()  # frozen: nothing to save


def test_sdft_killed_between_steps_resumes_bit_exact(assets, tmp_path, monkeypatch):
    straight = _cli(_cli_args(assets, tmp_path, "sdft-straight", "sdft"))
    assert straight.exit_code == 0, f"{straight.output}\n{straight.exception!r}"
    real_save = Distiller.save_checkpoint

    def die_at_step_2(self):
        if self.step == 2:  # step 2's rows and metrics are written, its checkpoint is not
            raise RuntimeError("simulated SIGKILL")
        return real_save(self)

    monkeypatch.setattr(Distiller, "save_checkpoint", die_at_step_2)
    args = _cli_args(assets, tmp_path, "sdft-killed", "sdft")
    killed = _cli(args)
    assert killed.exit_code != 0 and "simulated SIGKILL" in repr(killed.exception)
    monkeypatch.setattr(Distiller, "save_checkpoint", real_save)
    resumed = _cli(["distill", "--out", str(tmp_path / "sdft-killed"), "--resume"])
    assert resumed.exit_code == 0, f"{resumed.output}\n{resumed.exception!r}"
    a_out, b_out = tmp_path / "sdft-straight", tmp_path / "sdft-killed"
    a, b = metrics(a_out), metrics(b_out)
    assert [r["step"] for r in b] == [1, 2] and _strip(a) == _strip(b)
    assert all(set(get_method("sdft").metrics) <= set(r) for r in a)
    assert any(r["forward_kl"] > 0 for r in a)
    for path in ("final/student/model.safetensors", "checkpoints/step-2/teacher/adapter_model.safetensors",
                 "checkpoints/step-2/student/adapter_model.safetensors"):
        x, y = load_file(str(a_out / path)), load_file(str(b_out / path))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), path
    assert ExperienceStore.open(tmp_path / "store-sdft-killed").count() == \
        ExperienceStore.open(tmp_path / "store-sdft-straight").count()
