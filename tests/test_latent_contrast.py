"""The latent contrast hinge (stages.core.losses.contrast) and the cold start's contrastive step."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from pydantic import ValidationError

from stages.core.latent.composer_teacher import composer_loss
from stages.core.losses.composer_objectives import ObjectiveSettings
from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.contexts import build_batch
from stages.core.losses.contrast import latent_contrast_hinge, row_nll
from stages.core.losses.lopd import masked_nll
from stages.core.models.composer import Composer
from tests.test_coldstart_ladder import two_env_trajs
from tests.tiny import tiny_model, tiny_tokenizer


def test_hinge_matches_a_loop_and_hand_values():
    own = torch.tensor([0.30, 0.10, 0.50, 0.20])
    other = torch.tensor([0.40, 0.10, 0.45, 0.60])
    loss, m = latent_contrast_hinge(own, other, margin=0.2)
    naive = sum(max(0.0, 0.2 - (o - w)) for w, o in zip(own.tolist(), other.tolist())) / 4
    assert float(loss) == pytest.approx(naive, abs=1e-7)
    assert float(loss) == pytest.approx((0.1 + 0.2 + 0.25 + 0.0) / 4, abs=1e-7)  # by hand
    assert m["contrast_gap"] == pytest.approx((0.1 + 0.0 - 0.05 + 0.4) / 4, abs=1e-7)
    assert m["contrast_short"] == 0.75


def test_hinge_edge_cases_and_gradients():
    own = torch.tensor([0.3, 0.2], requires_grad=True)
    other = own.detach().clone().requires_grad_(True)
    loss, _ = latent_contrast_hinge(own, other, margin=0.05)  # a constant prompt: equal NLLs
    assert float(loss) == pytest.approx(0.05)
    loss.backward()
    torch.testing.assert_close(own.grad, torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(other.grad, torch.tensor([-0.5, -0.5]))
    own2 = torch.tensor([0.1], requires_grad=True)
    met, m = latent_contrast_hinge(own2, torch.tensor([0.5]), margin=0.05)  # the gap is reached
    met.backward()
    assert float(met) == 0 and float(own2.grad) == 0 and m["contrast_short"] == 0
    assert float(latent_contrast_hinge(torch.tensor([0.2]), torch.tensor([0.2]), 0.0)[0]) == 0  # p = q, no margin
    with pytest.raises(ValueError, match="margin"):
        latent_contrast_hinge(own2, own2, -1.0)
    with pytest.raises(ValueError, match=r"\(B,\)"):
        latent_contrast_hinge(torch.zeros(2), torch.zeros(3), 0.1)


def test_row_nll_is_each_rows_masked_nll():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen)
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    nll_B, tokens_B = row_nll(logits, ids, mask)
    for b in range(3):
        logp = torch.log_softmax(logits[b], -1)[torch.arange(5), ids[b]]
        assert float(nll_B[b]) == pytest.approx(float(-logp[mask[b]].mean()), rel=1e-6)
    assert tokens_B.tolist() == [3.0, 4.0, 1.0]
    pooled = (nll_B * tokens_B).sum() / tokens_B.sum()
    assert float(pooled) == pytest.approx(float(masked_nll(logits, ids, mask)[0]), rel=1e-6)


def test_contrastive_step_is_the_action_nll_plus_the_hinge_on_rolled_latents():
    tok = tiny_tokenizer()
    composer = Composer(tiny_model(tok), J=2, K=3, depth=1, lora_rank=2, adapter_name="c_con", max_exp_tokens=40)
    trajs = two_env_trajs()
    batch = build_batch(tok, trajs[:3], [[trajs[3], trajs[4]], [trajs[5]], [trajs[6], trajs[7]]], J=2,
                        max_exp_tokens=40)
    loss, m = composer_loss("contrast", composer, batch, "prefix", ObjectiveSettings(contrast_weight=2.0, contrast_margin=0.5))
    plain, pm = composer_loss("action-nll", composer, batch, "prefix")
    assert m["nll"] == pytest.approx(pm["nll"], rel=1e-5) and m["num_tokens"] == pm["num_tokens"]
    # naive: each row alone with its own composer rows, then with row b-1's (another target's task and
    # experiences), scored as plain action NLLs
    exps = [[trajs[3], trajs[4]], [trajs[5]], [trajs[6], trajs[7]]]
    own_B, other_B = [], []
    for b, t in enumerate(trajs[:3]):
        alone = build_batch(tok, [t], [exps[b]], J=2, max_exp_tokens=40)
        own_B.append(composer_loss("action-nll", composer, alone, "prefix")[0])
        swapped = replace(alone, exp_ids_BJL=batch.exp_ids_BJL[[b - 1]], exp_mask_BJL=batch.exp_mask_BJL[[b - 1]])
        other_B.append(composer_loss("action-nll", composer, swapped, "prefix")[0])
    own_B, other_B = torch.stack(own_B), torch.stack(other_B)
    hinge = torch.relu(0.5 - (other_B - own_B)).mean()
    assert float(loss) == pytest.approx(pm["nll"] + 2.0 * float(hinge), rel=1e-4)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in composer.compressor.parameters())
    with pytest.raises(ValueError, match="at least 2"):
        one = build_batch(tok, trajs[:1], [[trajs[3]]], J=2, max_exp_tokens=40)
        composer_loss("contrast", composer, one, "prefix", ObjectiveSettings(contrast_weight=1.0, contrast_margin=0.1))


def test_contrast_weight_needs_two_targets_per_batch():
    with pytest.raises(ValidationError, match="batch-size 2"):
        ColdstartConfig(experiences="s", out="o", contrast_weight=1.0, batch_size=1)
    assert ColdstartConfig(experiences="s", out="o", contrast_weight=1.0).contrast_margin == 0.05
