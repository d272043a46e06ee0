"""`lopd distill --method grpo` (stages/methods/grpo.py) on the tiny in-process model and the toy
environment of test_distill: advantages and accounting, the ratio against the recorded sampling
log-probs, and 2 steps through the CLI (PPO epochs, KL to the initial policy, no composer)."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from lopd_cli.main import app
from schemas import Message, Trajectory, Turn
from stages.core.data.retrieval import index_new, open_embeddings, unembedded_count
from stages.core.data.rows import TrainRow, training_rows
from stages.core.data.store import ExperienceStore
from stages.distill.recipe import COMMON_FIELDS, DistillConfig, Distiller
from stages.engines.rollout import RolloutStats
from stages.methods import StepBatch, StepContext, get_method
from stages.methods.grpo import GRPO, GRPOOptions
from tests.test_distill import ENV, HashEmbedder, _hash_embedder, assets, metrics  # noqa: F401 (fixtures)

runner = CliRunner()


def grpo_config(assets, tmp_path, name: str, **overrides) -> DistillConfig:
    model_dir, _, store_template = assets
    store = tmp_path / f"store-{name}"
    if not store.exists():
        shutil.copytree(store_template, store)
    values = dict(method="grpo", env=ENV, store=str(store), out=str(tmp_path / name), model=str(model_dir),
                  lr=1e-2, steps=2, tasks_per_step=2, group_size=2, max_new_tokens=8, temperature=0.7,
                  student_lora_rank=4, checkpoint_every=1, micro_batch=2, max_len=256, run_id=f"{name}-test")
    return DistillConfig(**{**values, **overrides})


def _traj(i: int, task: str, reward: float) -> Trajectory:
    return Trajectory(trajectory_id=f"t{i}", task_id=task, env=ENV, split="train", prompt="p", policy="x",
                      messages=[Message(role="user", content="p"), Message(role="assistant", content="a")],
                      turns=[Turn(action="a", action_tokens=2)], reward=reward, success=reward == 1.0,
                      num_steps=1, num_tool_calls=0, run_id="r")


def _row(traj: Trajectory, logprobs: list[float]) -> TrainRow:
    return TrainRow(traj, torch.tensor([5, 6, 7, 8]), torch.tensor([False, False, True, True]),
                    torch.tensor([float("nan"), float("nan"), *logprobs]))


def test_registry_and_options():
    assert get_method("grpo") is GRPO and not GRPO.needs_composer
    o = GRPOOptions()
    assert (o.eps_lo, o.eps_hi, o.ppo_epochs, o.scale_std, o.kl_coef, o.aggregation) == (
        0.2, 0.2, 1, True, 0.0, "token-mean")  # B.1; beta 0, std on, token-mean where it is silent
    with pytest.raises(ValueError, match="aggregation"):
        GRPOOptions(aggregation="sum")


@pytest.mark.parametrize("drop_zero_var", [False, True])
def test_prepare_group_advantages_and_counts(drop_zero_var):
    trajs = [_traj(0, "a", 1.0), _traj(1, "a", 1.0), _traj(2, "b", 0.0), _traj(3, "b", 1.0),
             _traj(4, "c", 0.0).model_copy(update={"turns": []})]  # a failed reset: no row, still in its group
    rows = [_row(trajs[0], [-1.0, -2.0]), _row(trajs[1], [-1.0, float("nan")]), _row(trajs[2], [-0.5, -0.5]),
            _row(trajs[3], [-0.1, -0.2])]
    method = GRPO.__new__(GRPO)
    method.options = GRPOOptions(drop_zero_var=drop_zero_var)
    extras = method.prepare(StepBatch(rows, trajs), StepContext(None, None, None, 1))
    s = math.sqrt(0.5)
    assert [e.advantage for e in extras] == pytest.approx([0.0, 0.0, -0.5 / s, 0.5 / s], rel=1e-5)
    assert [e.keep for e in extras] == [not drop_zero_var, not drop_zero_var, True, True]
    assert method.step_metrics["zero_var_groups"] == 2.0  # group a (all 1) and group c (one rollout)
    assert method.step_metrics["no_logprob_rows"] == 1.0
    assert method.step_tokens == (4 if drop_zero_var else 8) and method.step_rows == (2 if drop_zero_var else 4)


def test_ratio_is_one_on_policy_and_missing_logprobs_are_counted(assets, tmp_path):
    trainer = Distiller(grpo_config(assets, tmp_path, "ratio", temperature=0.7))
    trajs = trainer._rollout(1, RolloutStats())
    rows, _ = training_rows(trainer.student.tokenizer, [t for t in trajs if t.turns], max_len=256)
    method = trainer.method
    batch = StepBatch(rows, trajs)
    extras = method.prepare(batch, StepContext(trainer.store, None, trainer.engine, 1))
    _, m = method.loss(rows, extras, 1.0)
    # the sampling log-probs the engine recorded are the student's log_softmax(logits / 0.7)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["clip_frac"] == 0.0
    stripped = [TrainRow(r.trajectory, r.ids_T, r.mask_T, torch.full_like(r.logprobs_T, float("nan")))
                for r in rows]
    extras = method.prepare(StepBatch(stripped, trajs), StepContext(trainer.store, None, trainer.engine, 1))
    _, m = method.loss(stripped, extras, 1.0)
    assert m["ratio_mean"] == 1.0 and method.step_metrics["no_logprob_rows"] == len(rows)


def test_two_steps_through_the_cli_with_ppo_epochs_and_kl(assets, tmp_path):
    model_dir, _, store_template = assets
    store, out = tmp_path / "store", tmp_path / "grpo"
    shutil.copytree(store_template, store)
    embedded_before = open_embeddings(ExperienceStore.open(store)).count_rows()
    args = ["distill", "--method", "grpo", "--env", ENV, "--store", str(store), "--out", str(out),
            "--model", str(model_dir), "--steps", "2", "--tasks-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "8", "--student-lora-rank", "4", "--lr", "5e-2", "--checkpoint-every", "1",
            "-o", "max_len=256", "-o", "micro_batch=2", "-o", "temperature=1.0", "-o", "run_id=grpo-cli",
            "-o", "ppo_epochs=3", "-o", "kl_coef=0.1", "-o", "eps_hi=0.05", "-o", "eps_lo=0.05"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and [r["generations"] for r in rows] == [4, 8]
    for r in rows:
        assert set(COMMON_FIELDS + GRPO.metrics) <= set(r)
        assert all(math.isfinite(r[k]) for k in COMMON_FIELDS + GRPO.metrics)
    # later PPO epochs move the policy: the ratio leaves 1, the clip bites, the KL to the start grows
    assert any(r["ratio_mean"] != pytest.approx(1.0, abs=1e-6) for r in rows)
    assert any(r["clip_frac"] > 0 for r in rows) and rows[-1]["kl_ref"] > 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["method"] == "grpo" and saved["options"]["ppo_epochs"] == 3 and "composer" not in saved["options"]
    assert (out / "final" / "student" / "model.safetensors").is_file() and not (out / "final" / "composer").exists()
    # GRPO retrieves nothing: its 8 rollouts are stored unembedded, for `lopd index` to embed
    opened = ExperienceStore.open(store)
    assert len(opened.query(run_id="grpo-cli")) == 8 and open_embeddings(opened).count_rows() == embedded_before
    assert unembedded_count(opened) == 8
    assert index_new(opened, HashEmbedder()) == 8 and open_embeddings(opened).count_rows() == opened.count()
    assert unembedded_count(opened) == 0
