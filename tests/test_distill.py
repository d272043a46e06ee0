"""`lopd distill` (Algorithm 1 of the LOPD paper) end to end on a tiny in-process model.

A toy two-turn environment (registered here), a hashing embedder (no model download) and a
fresh composer saved as the cold-start phi_0 keep every run to a few seconds.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from schemas import Message, Task, Trajectory, Turn
from stages.core.data.experience_rows import STEP_KEY
from stages.core.run import checkpoint as ckpt
import stages.distill.recipe as distill
from stages.core.models.composer import (
    Composer, adapter_parameters, adapter_scope, base_parameters, save_composer,
)
from stages.core.data.retrieval import index_new, open_embeddings
from stages.core.data.store import ExperienceStore
from stages.core.losses.lopd import dual_update
from stages.core.models.backbone import load_policy
from stages.distill.recipe import COMMON_FIELDS, TIMING_FIELDS, DistillConfig, Distiller
from stages.distill.settings import load_config
from stages.envs import StepResult, register
from stages.methods import lopd as lopd_method

METRIC_FIELDS = COMMON_FIELDS + lopd_method.LOPD.metrics
from tests.tiny import save_tiny

ENV = "toy-distill"
SEED_ROWS = 4


@register(ENV)
class ToyEnv:
    """Two turns: a follow-up question, then reward 1 iff the final answer has even length."""

    name = ENV

    def __init__(self, data_dir=None, max_turns: int = 30):
        self.max_turns, self.turn = max_turns, 0

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        tasks = [Task(task_id=f"{split}-{i}", env=ENV, split=split, prompt=f"What is {i} + {i}?")
                 for i in range(5)]
        return tasks[:limit]

    def reset(self, task: Task) -> list[Message]:
        self.turn = 0
        return [Message(role="system", content="You are a helpful assistant."),
                Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        self.turn += 1
        if self.turn == 1:
            return StepResult(observation=[Message(role="user", content="Are you sure?")])
        reward = float(len(action) % 2 == 0)
        return StepResult(observation=[], reward=reward, done=True, info={"success": reward == 1.0})

    def close(self) -> None:
        pass


class HashEmbedder:
    """Deterministic 16-d bag-of-bytes embedding (unit norm)."""

    name, dim = "hash16", 16

    def embed(self, texts: list[str], role: str = "text") -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            for word in text.split():
                out[i, hashlib.md5(word.encode()).digest()[0] % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture(scope="module", autouse=True)
def _hash_embedder():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distill, "load_embedder", lambda name=None, **kw: HashEmbedder())
        yield


def _seed_trajectory(i: int) -> Trajectory:
    prompt = f"What is {i} + {i}?"
    answer = f"The answer is {2 * i}."
    return Trajectory(
        trajectory_id=f"seed-{i}", task_id=f"train-{i}", env=ENV, split="train", prompt=prompt,
        policy="seed", messages=[Message(role="user", content=prompt),
                                 Message(role="assistant", content=answer)],
        turns=[Turn(action=answer, action_tokens=5)], reward=1.0, success=True, num_steps=1,
        num_tool_calls=0, run_id="seed")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """(tiny model folder, cold-start composer folder, indexed seed store folder)."""
    root = tmp_path_factory.mktemp("distill-assets")
    model_dir = save_tiny(root / "tiny")
    model, _ = load_policy(str(model_dir))
    torch.manual_seed(0)
    composer = Composer(model, J=2, K=4, depth=1, lora_rank=4, lora_alpha=8, max_exp_tokens=64)
    save_composer(composer, root / "composer0", {"backbone_id": str(model_dir)})
    store = ExperienceStore.open(root / "store")
    store.append([_seed_trajectory(i) for i in range(SEED_ROWS)])
    index_new(store, HashEmbedder())
    return model_dir, root / "composer0", root / "store"


def make_config(assets, tmp_path, name: str, **overrides) -> DistillConfig:
    model_dir, composer_dir, store_template = assets
    store = tmp_path / f"store-{name}"
    if not store.exists():
        shutil.copytree(store_template, store)
    values = dict(env=ENV, store=str(store), composer=str(composer_dir), out=str(tmp_path / name),
                  model=str(model_dir), J=2, K=4, M=5, lr=1e-2, steps=3, tasks_per_step=2,
                  group_size=2, max_new_tokens=8, temperature=1.0, student_lora_rank=4,
                  checkpoint_every=2, micro_batch=2, max_len=256, run_id="lopd-test")
    return DistillConfig(**{**values, **overrides}).resolved()


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(assets, tmp_path_factory):
    """A straight 3-step run: (distiller after fit, its config, its report)."""
    tmp = tmp_path_factory.mktemp("straight")
    config = make_config(assets, tmp, "run")
    trainer = Distiller(config)
    report = trainer.fit()
    return trainer, trainer.config, report


def test_three_steps_metrics_store_and_dual_update(straight):
    trainer, config, report = straight
    out = trainer.out
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and report.last_step == 3
    for r in rows:
        assert set(METRIC_FIELDS) <= set(r)
        assert all(math.isfinite(r[k]) for k in METRIC_FIELDS), r
        assert r["action_tokens"] > 0 and r["tokens"] > 0
        assert 0 < r["experiences"] <= config.options.J and 0 <= r["no_experience_frac"] < 1  # per row, this step
        # where the time went: the training phases add up to train_s, the step holds them all
        phases = [r[k] for k in ("prepare_s", "forward_s", "backward_s", "optimizer_s", "sync_s")]
        assert all(v >= 0 for v in phases) and r["forward_s"] > 0 and r["backward_s"] > 0
        assert sum(phases) == pytest.approx(r["train_s"], abs=0.05)
        assert r["rollout_s"] + r["train_s"] + r["memory_s"] <= r["seconds"] + 1e-6
    beta = config.options.beta0
    for r in rows:  # Eq. 13 dual ascent from the logged Delta
        beta = dual_update(beta, config.options.margin, r["Delta"], config.options.eta_beta)
        assert r["beta"] == pytest.approx(beta, abs=1e-12)
    assert report.method_state == {"beta": rows[-1]["beta"]}
    store = ExperienceStore.open(config.store)
    ours = store.query(run_id=config.run_id)
    assert store.count() == SEED_ROWS + 3 * 4 and len(ours) == 12 and report.rows_added == 12
    assert sorted(json.loads(t.info)[STEP_KEY] for t in ours) == [1] * 4 + [2] * 4 + [3] * 4
    assert open_embeddings(store).count_rows() == store.count()  # every row retrievable
    # the id index covers the appended rollouts: a later `lopd index` with nothing new writes no version
    versions = len(store.versions())
    assert store.index_ids() is False and len(store.versions()) == versions
    assert [p.name for p in ckpt.checkpoint_dirs(out)] == ["step-2", "step-3"]
    state = ckpt.read_state(out / "checkpoints" / "step-3")
    assert state == {"step": 3, "beta": rows[-1]["beta"], "data_position": 6, "run_id": "lopd-test"}
    assert json.loads((out / "config.json").read_text())["options"]["max_exp_tokens"] == 64


def test_trainable_parameters_move_and_backbone_stays(straight, assets):
    trainer, config, _ = straight
    backbone = trainer.method.composer.backbone
    student_b = [p for n, p in backbone.named_parameters() if "lora_B.student." in n]
    composer_b = [p for n, p in backbone.named_parameters() if "lora_B.composer." in n]
    assert student_b and all(bool(p.abs().sum() > 0) for p in student_b)  # LoRA B starts at zero
    assert composer_b and any(bool(p.abs().sum() > 0) for p in composer_b)
    start = load_file(str(assets[1] / "compressor.safetensors"))
    now = trainer.method.composer.compressor.state_dict()
    assert any(not torch.equal(start[k], now[k]) for k in start)
    anchor = trainer.method.anchor.compressor.state_dict()  # phi_0 stays frozen
    assert all(torch.equal(start[k], anchor[k]) for k in start)
    fresh = AutoModelForCausalLM.from_pretrained(assets[0]).state_dict()
    base = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
            for n, p in base_parameters(backbone)}
    assert set(base) == set(fresh)
    assert all(torch.equal(base[n], fresh[n]) for n in fresh)


def test_final_student_is_merged_plain_model(straight, assets):
    trainer, _, report = straight
    merged = AutoModelForCausalLM.from_pretrained(f"{report.final_dir}/student")
    assert not hasattr(merged, "peft_config")
    ids = trainer.student.tokenizer(["What is 3 + 3? The answer is 6."], return_tensors="pt")["input_ids"]
    with torch.no_grad(), adapter_scope(trainer.method.composer.backbone, "student"):
        expected = trainer.method.composer.backbone(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    base = AutoModelForCausalLM.from_pretrained(assets[0])(input_ids=ids).logits.detach()
    assert torch.allclose(got, expected, atol=1e-4)
    assert not torch.allclose(got, base, atol=1e-4)  # the merge carries the trained delta


def test_resume_after_kill_matches_straight_run(straight, assets, tmp_path, monkeypatch):
    _, straight_config, _ = straight
    config = make_config(assets, tmp_path, "killed")
    real_save = Distiller.save_checkpoint

    def die_at_step_3(self):
        if self.step == 3:  # rows and metrics of step 3 are written, its checkpoint is not
            (self.out / "checkpoints" / ".step-3.tmp-dead").mkdir()
            raise KeyboardInterrupt("simulated SIGKILL")
        return real_save(self)

    monkeypatch.setattr(Distiller, "save_checkpoint", die_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        Distiller(config).fit()
    monkeypatch.setattr(Distiller, "save_checkpoint", real_save)
    out = tmp_path / "killed"
    assert len(metrics(out)) == 3 and ExperienceStore.open(config.store).count() == SEED_ROWS + 12
    with (out / "metrics.jsonl").open("a") as f:  # a row cut short by the kill
        f.write('{"step": 4, "rew')
    with pytest.raises(ValueError, match="pass --resume"):
        Distiller(config)
    Distiller(config.model_copy(update={"resume": True})).fit()
    assert not (out / "checkpoints" / ".step-3.tmp-dead").exists()
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]  # noqa: E731
    assert strip(metrics(out)) == strip(metrics(straight[0].out))
    assert ExperienceStore.open(config.store).count() == SEED_ROWS + 12
    a = load_file(str(out / "final" / "student" / "model.safetensors"))
    b = load_file(str(straight[0].out / "final" / "student" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_non_finite_loss_stops_and_keeps_last_checkpoint(assets, tmp_path, monkeypatch):
    config = make_config(assets, tmp_path, "nan", steps=2, checkpoint_every=1, micro_batch=4)
    real_kl, calls = lopd_method.head_topm_tail_reverse_kl, []

    def kl_nan_on_step_2(*args, **kwargs):
        calls.append(1)
        loss, m = real_kl(*args, **kwargs)
        return (loss * float("nan"), m) if len(calls) == 2 else (loss, m)

    monkeypatch.setattr(lopd_method, "head_topm_tail_reverse_kl", kl_nan_on_step_2)
    expected = r"non-finite loss at step 2; last good checkpoint: .*step-1"
    with pytest.raises(FloatingPointError, match=expected):
        Distiller(config).fit()
    out = tmp_path / "nan"
    assert [p.name for p in ckpt.checkpoint_dirs(out)] == ["step-1"]
    assert ckpt.read_state(out / "checkpoints" / "step-1")["step"] == 1
    assert (out / "checkpoints" / "step-1" / "student" / "adapter_model.safetensors").is_file()
    assert len(metrics(out)) == 1 and ExperienceStore.open(config.store).count() == SEED_ROWS + 4


def test_freeze_composer_keeps_phi(assets, tmp_path):
    config = make_config(assets, tmp_path, "frozen", steps=1, freeze_composer=True)
    trainer = Distiller(config)
    before = [p.detach().clone() for p in trainer.method.composer.trainable_parameters()]
    student_before = [p.detach().clone() for p in adapter_parameters(trainer.method.composer.backbone, "student")]
    trainer.fit()
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.method.composer.trainable_parameters()))
    assert any(not torch.equal(a, p) for a, p in
               zip(student_before, adapter_parameters(trainer.method.composer.backbone, "student")))
    row = metrics(trainer.out)[0]
    assert row["grad_norm_composer"] == 0.0 and row["anchor"] == 0.0 and row["grad_norm_student"] > 0


def test_full_fine_tuning_uses_a_frozen_teacher_copy(assets, tmp_path):
    config = make_config(assets, tmp_path, "full", steps=1, student_lora_rank=0, lr=1e-3)
    trainer = Distiller(config)
    trainer.fit()
    assert trainer.student.model is not trainer.method.composer.backbone and trainer.student.adapter is None
    fresh = AutoModelForCausalLM.from_pretrained(assets[0]).state_dict()
    student = trainer.student.model.state_dict()
    assert any(not torch.equal(student[k], fresh[k]) for k in fresh)
    teacher = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
               for n, p in base_parameters(trainer.method.composer.backbone)}
    assert all(torch.equal(teacher[k], fresh[k]) for k in fresh)
    final = load_file(str(trainer.out / "final" / "student" / "model.safetensors"))
    assert torch.equal(final["model.embed_tokens.weight"], student["model.embed_tokens.weight"])


def test_k_mismatch_is_a_clear_error(assets, tmp_path):
    with pytest.raises(ValueError, match=r"composer_config.json: field 'K' is 4, but the run asks for K=8"):
        Distiller(make_config(assets, tmp_path, "k", K=8))


def test_lopd_refuses_options_not_resolved_against_the_composer():
    """A config built by hand must be resolved (DistillConfig.resolved) before LOPD trains on it."""
    from stages.methods.lopd import LOPD
    from stages.methods.options import LOPDOptions

    with pytest.raises(ValueError, match=r"^lopd: options not resolved against the composer"):
        LOPD(SimpleNamespace(options=LOPDOptions(composer="c")), None, {})


def test_load_config_toml_yaml_and_overrides(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('env = "bfcl"\nstore = "s"\ncomposer = "c"\nout = "o"\nlambda = 0.3\nJ = 2\n')
    yml = tmp_path / "run.yaml"
    yml.write_text("env: bfcl\nstore: s\ncomposer: c\nout: o\nlam: 0.3\nJ: 2\n")
    assert load_config(toml)["lam"] == load_config(yml)["lam"] == 0.3
    for path in (toml, yml):
        config = DistillConfig.model_validate({**load_config(path), "steps": 7})
        o = config.options
        assert (o.lam, o.J, config.steps, o.K) == (0.3, 2, 7, 32)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="bad.yaml: the top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ValueError, match=r"run.ini: unknown config format"):
        load_config(tmp_path / "run.ini")
    broken = tmp_path / "broken.toml"
    broken.write_text("env = \n")
    with pytest.raises(ValueError, match="broken.toml: not valid toml"):
        load_config(broken)
    both = tmp_path / "both.toml"
    both.write_text("lambda = 0.3\nlam = 0.2\n")
    with pytest.raises(ValueError, match="both.toml: give the anchor weight once"):
        load_config(both)


def test_micro_batches_and_activation_checkpointing_give_the_same_step(assets, tmp_path):
    rows, adapters = [], []
    for micro in (1, 4):  # the second run also recomputes activations in the backward pass
        trainer = Distiller(make_config(assets, tmp_path, f"micro{micro}", steps=1, micro_batch=micro,
                                        activation_checkpointing=micro == 4))
        trainer.fit()
        rows.append(metrics(trainer.out)[0])
        adapters.append(load_file(str(trainer.out / "checkpoints" / "step-1" / "student" /
                                      "adapter_model.safetensors")))
    for key in ("reverse_kl", "Delta", "anchor", "loss", "beta", "grad_norm_student", "grad_norm_composer"):
        assert rows[0][key] == pytest.approx(rows[1][key], rel=1e-4, abs=1e-6), key
    assert all(torch.allclose(adapters[0][k], adapters[1][k], atol=1e-6) for k in adapters[0])


def composer_placed(composer_dir, tmp_path, placement: str):
    """A copy of the cold-start composer recorded with another latent placement."""
    folder = tmp_path / f"composer-{placement}"
    shutil.copytree(composer_dir, folder)
    cfg = json.loads((folder / "composer_config.json").read_text())
    (folder / "composer_config.json").write_text(json.dumps({**cfg, "placement": placement}))
    return folder


def test_per_turn_placement_and_empty_store(assets, tmp_path):
    model_dir, composer_dir, _ = assets
    per_turn = composer_placed(composer_dir, tmp_path, "per-turn")
    empty = tmp_path / "store-empty"
    ExperienceStore.open(empty)
    config = make_config(assets, tmp_path, "per-turn", steps=2, composer=str(per_turn), store=str(empty))
    trainer = Distiller(config)
    assert trainer.method.placement.name == "per-turn"
    trainer.fit()
    rows = metrics(trainer.out)
    assert len(rows) == 2 and all(math.isfinite(r["reverse_kl"]) and r["action_tokens"] > 0 for r in rows)
    assert rows[0]["experiences"] == 0 and rows[0]["no_experience_frac"] == 1  # step 1: nothing to retrieve yet
    store = ExperienceStore.open(empty)  # step 1 trained without experiences; memory grew
    assert store.count() == 8 and open_embeddings(store).count_rows() == 8


def test_resume_refuses_changed_settings(assets, tmp_path):
    config = make_config(assets, tmp_path, "changed", steps=1)
    Distiller(config).fit()
    with pytest.raises(ValueError, match=r"config.json: field 'lr' is 0.01, the resumed run asks for 0.5"):
        Distiller(config.model_copy(update={"resume": True, "lr": 0.5}))
    resumed = Distiller(config.model_copy(update={"resume": True, "steps": 2}))
    assert (resumed.step, resumed.cursor) == (1, 2)


def test_resume_may_change_max_len_compile_decode_and_path_spelling(assets, tmp_path, monkeypatch):
    config = make_config(assets, tmp_path, "respell", steps=1)
    first = Distiller(config)
    assert not first.engine.compile_decode  # eager decoding unless asked
    first.fit()
    monkeypatch.chdir(tmp_path)  # the same store and run folder, spelled relative
    again = config.model_copy(update={"resume": True, "steps": 2, "max_len": 300, "compile_decode": True,
                                      "store": "store-respell", "out": "respell"})
    out = io.StringIO()
    resumed = Distiller(again, console=Console(file=out, width=200))
    assert resumed.step == 1 and "resume: changed" in out.getvalue()
    assert "max_len 256 -> 300" in out.getvalue() and "store" not in out.getvalue().split("changed")[1]
    assert "compile_decode False -> True" in out.getvalue() and resumed.engine.compile_decode


def test_missing_logger_package_is_one_line_before_anything_loads(assets, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ValueError, match=r"--log tensorboard needs the `tensorboard` package") as err:
        Distiller(make_config(assets, tmp_path, "tb", steps=1, log="tensorboard"))
    assert "\n" not in str(err.value) and "'.[tensorboard]'" in str(err.value)
    assert not (tmp_path / "tb").exists()  # no run folder left behind: a plain rerun just works


def test_resume_may_switch_the_logger_and_wandb_runs_offline(assets, tmp_path, monkeypatch):
    import importlib.machinery
    import types

    calls = {"init": [], "log": [], "finish": 0}

    class FakeRun:
        def log(self, scalars, step):
            calls["log"].append((step, scalars))

        def finish(self):
            calls["finish"] += 1

    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kw: calls["init"].append(kw) or FakeRun()
    fake.Table = lambda columns, data: {"columns": columns, "data": data}
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = make_config(assets, tmp_path, "logswitch", steps=1)
    Distiller(config).fit()
    out = io.StringIO()
    resumed = Distiller(config.model_copy(update={"resume": True, "steps": 2, "log": "wandb"}),
                        console=Console(file=out, width=200))
    resumed.fit()
    assert "log none -> wandb" in out.getvalue()
    (init,) = calls["init"]
    assert init["mode"] == "offline" and init["id"] == "lopd-test" and init["dir"] == str(tmp_path / "logswitch")
    assert [step for step, _ in calls["log"]] == [2, 2] and calls["finish"] == 1  # scalars, then samples
    assert "distill/reward_mean" in calls["log"][0][1] and "distill/step" not in calls["log"][0][1]
    assert calls["log"][1][1]["distill/samples"]["columns"][:3] == ["step", "roles", "task_id"]


def test_old_tensorboard_setting_reads_as_log():
    base = dict(env=ENV, composer="c", store="s", out="o")
    with pytest.warns(FutureWarning, match='use log = "tensorboard"'):
        assert DistillConfig(**base, tensorboard=True).log == "tensorboard"
    assert DistillConfig(**base, tensorboard=False).log == "none"  # runs saved before --log existed


def test_composer_of_another_backbone_is_a_clear_error(assets, tmp_path):
    other = tmp_path / "composer-other"
    shutil.copytree(assets[1], other)
    cfg = json.loads((other / "composer_config.json").read_text())
    (other / "composer_config.json").write_text(json.dumps({**cfg, "backbone_id": "other/model"}))
    with pytest.raises(ValueError, match="was trained on backbone other/model"):
        Distiller(make_config(assets, tmp_path, "other", composer=str(other)))


def test_method_options_from_the_command_line():
    from stages.distill.settings import parse_options

    assert parse_options(["margin=0.1", "freeze_composer=true", "composer=runs/c0", "J=2"]) == {
        "margin": 0.1, "freeze_composer": True, "composer": "runs/c0", "J": 2}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_options(["margin"])


def test_a_log_shows_the_run_s_progress_from_its_start(assets, tmp_path):
    """Output to a file (no terminal): a progress line before the first step's rollouts, then one every
    30 s while a step runs, and the last when the run ends (a CPU step takes about a minute)."""
    import io

    from rich.console import Console

    log = io.StringIO()
    Distiller(make_config(assets, tmp_path, "progress", steps=2), console=Console(file=log, width=100)).fit()
    text = log.getvalue()
    assert text.index("distill lopd: 0/2 (0%)") < text.index("step 1/2") < text.index("distill lopd: 2/2 (100%)")
