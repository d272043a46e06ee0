"""The cold start's text-teacher KL (the ``text-kl`` objective, stages.core.losses.composer_objectives)."""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.composer_teacher import composer_loss
from stages.core.latent.contexts import build_batch, shift_for_loss
from stages.core.losses.composer_objectives import ObjectiveSettings
from stages.core.latent.teacher import latent_teacher_logits, text_latents, text_teacher_logits
from stages.core.models.composer import Composer, base_parameters
from tests.test_coldstart_ladder import two_env_trajs
from tests.tiny import tiny_model, tiny_tokenizer


def text_distilled_nll(composer, batch, placement, weight):
    return composer_loss("text-kl", composer, batch, placement, ObjectiveSettings(text_kl_weight=weight))


def action_nll(composer, batch, placement):
    return composer_loss("action-nll", composer, batch, placement)


def _setup(framed: bool = False):
    tok = tiny_tokenizer()
    composer = Composer(tiny_model(tok), J=2, K=3, depth=1, lora_rank=2, adapter_name="c_tkl", max_exp_tokens=40)
    trajs = two_env_trajs()
    batch = build_batch(tok, trajs[:2], [[trajs[3], trajs[4]], [trajs[5]]], J=2, max_exp_tokens=40, framed=framed)
    return composer, batch


@pytest.mark.parametrize("placement", ["prefix", "framed"])
def test_loss_is_the_nll_plus_a_per_token_forward_kl_to_each_rows_text_teacher(placement):
    composer, batch = _setup(framed=placement == "framed")
    loss, m = text_distilled_nll(composer, batch, placement, weight=0.5)
    plain, pm = action_nll(composer, batch, placement)
    assert m["nll"] == pytest.approx(pm["nll"], rel=1e-5) and m["num_tokens"] == pm["num_tokens"]
    # naive: each row alone, its experiences' token embeddings as the context, a loop over action tokens
    c_phi = composer(batch.exp_ids_BJL, batch.exp_mask_BJL)
    lat, tgt, mask = shift_for_loss(latent_teacher_logits(composer.backbone, batch, c_phi, placement), batch)
    total, n = 0.0, 0
    for b in range(2):
        row = batch.row(b)
        text, _, _ = shift_for_loss(latent_teacher_logits(composer.backbone, row, text_latents(composer.backbone, batch, b),
                                                          placement), row)
        for t in mask[b].nonzero().flatten().tolist():
            p = torch.softmax(text[0, t].double(), -1)
            total += float((p * (p.log() - torch.log_softmax(lat[b, t].detach().double(), -1))).sum())
            n += 1
    assert n == pm["num_tokens"] and m["text_kl"] == pytest.approx(total / n, rel=1e-4)
    assert float(loss.detach()) == pytest.approx(pm["nll"] + 0.5 * total / n, rel=1e-4)
    assert m["text_kl"] > 0  # latents are not the text


def test_gradient_reaches_phi_only_and_the_text_teacher_is_a_constant():
    composer, batch = _setup()
    assert not text_teacher_logits(composer.backbone, batch, "prefix").requires_grad
    loss, _ = text_distilled_nll(composer, batch, "prefix", weight=1.0)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in composer.compressor.parameters()
               if p.requires_grad)
    assert all(p.grad is None for _, p in base_parameters(composer.backbone))


def test_weight_zero_is_the_action_nll():
    composer, batch = _setup()
    loss, m = text_distilled_nll(composer, batch, "prefix", weight=0.0)
    assert float(loss) == pytest.approx(float(action_nll(composer, batch, "prefix")[0]), rel=1e-6)
    assert m["text_kl"] > 0  # still measured


def test_text_kl_and_contrast_are_exclusive():
    with pytest.raises(ValidationError, match="set one of them"):
        ColdstartConfig(experiences="s", out="o", contrast_weight=1.0, text_kl_weight=1.0)
    assert ColdstartConfig(experiences="s", out="o").text_kl_weight == 0.0


def test_free_vectors_train_on_the_same_objective():
    """Rung (h) of a text-KL run: the free vectors' losses are the NLL plus the text KL."""
    from stages.coldstart.ladder.free_prompt import FreePrompt, train_free_prompt

    composer, batch = _setup()
    prompt = FreePrompt(composer.backbone, J=2, K=3, seed=0)
    first = float(text_distilled_nll(prompt, batch, "prefix", 1.0)[0].detach())
    losses = train_free_prompt(prompt, lambda step: batch, steps=4, lr=5e-2, grad_clip=None, placement="prefix",
                               objective="text-kl", settings=ObjectiveSettings(text_kl_weight=1.0))
    assert losses[0] == pytest.approx(first, rel=1e-5) and losses[-1] < losses[0]
    assert losses[0] > float(action_nll(FreePrompt(composer.backbone, J=2, K=3, seed=0), batch, "prefix")[0].detach())
