"""pi_old is the training forward before the first update: the first-epoch ratio is exactly 1
in bf16, where the engine's KV-cached log-probs differ from the full-sequence forward
(verl#2088); the engine's values drive only the optional rollout correction (token-tis)."""
from __future__ import annotations

import math

import pytest
import torch

from schemas import Message, Trajectory, Turn
from stages.core.data.rows import TrainRow, training_rows
from stages.core.losses.pg import ppo_clip_loss, truncated_is_weights
from stages.distill.recipe import Distiller
from stages.engines.rollout import RolloutStats
from stages.methods import StepBatch, StepContext
from stages.methods.grpo import PGExtra, pi_old
from tests.test_distill import assets  # noqa: F401 (fixture)
from tests.test_method_grpo import grpo_config


def _first_epoch(trainer):
    trajs = trainer._rollout(1, RolloutStats())
    rows, _ = training_rows(trainer.student.tokenizer, [t for t in trajs if t.turns], max_len=256)
    extras = trainer.method.prepare(StepBatch(rows, trajs), StepContext(trainer.store, None, trainer.engine, 1))
    return rows, extras


@pytest.mark.parametrize("method", ["grpo", "skill-sd"])
def test_first_epoch_ratio_is_one_in_bf16(assets, tmp_path, method):
    trainer = Distiller(grpo_config(assets, tmp_path, f"bf16-{method}", method=method, dtype="bfloat16",
                                    device="cpu", temperature=1.0, max_new_tokens=16))
    rows, extras = _first_epoch(trainer)
    _, m = trainer.method.loss(rows, extras, 1.0)
    assert m["ratio_mean"] == 1.0 and m["clip_frac"] == 0.0  # main: the engine's log-probs, ratio != 1
    assert m["rollout_logp_abs_diff"] > 1e-3  # the engine's bf16 KV-cache values do differ
    assert all(e.old_logp_T is not None and e.old_logp_T.shape == (len(r.ids_T) - 1,) for r, e in zip(rows, extras))


def test_rollout_correction_weights_the_loss_in_bf16(assets, tmp_path):
    trainer = Distiller(grpo_config(assets, tmp_path, "bf16-tis", dtype="bfloat16", device="cpu", temperature=1.0,
                                    max_new_tokens=16, options={"rollout_correction": "token-tis"}))
    rows, extras = _first_epoch(trainer)
    _, m = trainer.method.loss(rows, extras, 1.0)
    assert m["ratio_mean"] == 1.0
    assert m["rollout_is_mean"] != pytest.approx(1.0, abs=1e-4)


def _rows(lengths: list[int]) -> list[TrainRow]:
    traj = Trajectory(trajectory_id="t", task_id="a", env="e", split="train", prompt="p", policy="x",
                      messages=[Message(role="user", content="p")], turns=[Turn(action="a", action_tokens=1)],
                      reward=1.0, success=True, num_steps=1, num_tool_calls=0, run_id="r")
    return [TrainRow(traj, torch.arange(n), torch.ones(n, dtype=torch.bool), torch.zeros(n)) for n in lengths]


def test_pi_old_is_the_first_epochs_forward_kept_per_row():
    rows = _rows([5, 3])
    extras = [PGExtra(advantage=1.0), PGExtra(advantage=-1.0)]
    first_BT = torch.randn(2, 4, requires_grad=True)
    old_BT = pi_old(rows, extras, first_BT)
    assert torch.equal(old_BT, first_BT.detach()) and not old_BT.requires_grad
    later_BT = first_BT.detach() + 0.3  # the policy moved after the first update
    again_BT = pi_old(rows, extras, later_BT)
    assert torch.equal(again_BT[0], first_BT.detach()[0])
    assert torch.equal(again_BT[1, :2], first_BT.detach()[1, :2]) and torch.equal(again_BT[1, 2:], torch.zeros(2))


def test_truncated_is_weights_match_a_naive_reference():
    old_BT = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -1.0]], dtype=torch.float64)
    behaviour_BT = torch.tensor([[-1.5, float("nan"), -0.2], [-2.0, -3.0, -9.0]], dtype=torch.float64)
    mask_BT = torch.tensor([[True, True, True], [True, False, True]])
    w_BT, m = truncated_is_weights(old_BT, behaviour_BT, mask_BT, cap=2.0)
    expected = [[min(math.exp(0.5), 2.0), 1.0, math.exp(-0.3)], [2.0, 1.0, 2.0]]
    assert w_BT.flatten().tolist() == pytest.approx(expected[0] + expected[1])
    assert m["rollout_is_mean"] == pytest.approx(sum(expected[0]) / 5 + (expected[1][0] + expected[1][2]) / 5)
    assert m["rollout_is_clip_frac"] == pytest.approx(2 / 4)
    assert m["rollout_logp_abs_diff"] == pytest.approx((0.5 + 0.3 + 1.9 + 8.0) / 4)
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(old_BT, behaviour_BT, mask_BT, cap=0.0)


def test_ppo_weights_scale_each_tokens_loss():
    logp_BT = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    old_BT = logp_BT.detach() + torch.tensor([[0.1, -0.1], [0.0, 0.3]])
    adv_B, mask_BT = torch.tensor([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool)
    w_BT = torch.tensor([[2.0, 0.5], [1.0, 0.25]])
    loss, _ = ppo_clip_loss(logp_BT, old_BT, adv_B, mask_BT, weights_BT=w_BT)
    ratio = torch.exp(logp_BT.detach() - old_BT)
    per_token = -torch.minimum(ratio * adv_B[:, None], ratio.clamp(0.8, 1.2) * adv_B[:, None])
    assert float(loss) == pytest.approx(float((per_token * w_BT).sum() / 4))


@pytest.mark.parametrize("correction", ["off", "token-tis"])
def test_sdpo_ratio_is_one_in_bf16_unless_corrected(assets, tmp_path, correction):
    trainer = Distiller(grpo_config(assets, tmp_path, f"bf16-sdpo-{correction}", method="sdpo", dtype="bfloat16",
                                    device="cpu", temperature=1.0, max_new_tokens=16,
                                    options={"rollout_correction": correction}))
    rows, extras = _first_epoch(trainer)
    _, m = trainer.method.loss(rows, extras, 1.0)
    assert m["distill_loss"] != 0.0  # rows with a teacher context were distilled
    if correction == "off":
        assert m["is_ratio"] == 1.0 and m["is_clip_frac"] == 0.0  # main: the engine's log-probs, ratio != 1
    else:
        assert m["is_ratio"] != pytest.approx(1.0, abs=1e-5)
