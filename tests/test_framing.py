"""The ``framed`` latent placement (A.4 of the LOPD paper): latents inside the first user message
between framing texts, the id-vs-embedding equivalence check, gradient routing, and a distill run
with a framed composer."""
from __future__ import annotations

import math

import pytest
import torch

from stages.core.data.rows import training_rows
from stages.core.latent.contexts import build_batch
from stages.core.latent.framing import FRAMES, SENTINEL, frame_domain, framed_prompt_ids
from stages.core.latent.teacher import teacher_logits
from stages.core.models.composer import add_lora_adapter, base_parameters
from stages.core.text.chat import action_spans
from stages.distill.recipe import Distiller
from tests.test_distill import _hash_embedder, assets, composer_placed, make_config, metrics  # noqa: F401 (fixtures)
from tests.test_onpolicy_tokens import Scripted, _play
from tests.tiny import tiny_model, tiny_tokenizer


def _rows(tok):
    return training_rows(tok, _play(Scripted(tok), tok, samples=1))[0]


def test_latent_span_sits_in_the_first_user_message_between_the_frames():
    tok = tiny_tokenizer()
    before, after = FRAMES["agentic"]
    for row in _rows(tok):
        head, tail = framed_prompt_ids(tok, row)
        head_text, tail_text = tok.decode(head), tok.decode(tail)
        start = action_spans(row.mask_T)[0][0]
        # the student's prompt up to the end of the first user message's own content
        task_end = head_text.index(row.trajectory.prompt) + len(row.trajectory.prompt)
        assert head_text[:task_end] == tok.decode(row.ids_T[:start])[:task_end]
        assert head_text.rstrip().endswith(before) and head_text.count("<|im_start|>user") == 1
        assert tail_text.lstrip().startswith(after)
        # the first user turn closes after the frame; then the generation prompt, nothing else
        assert tail_text.endswith("<|im_start|>assistant\n") and tail_text.count("<|im_end|>") == 1
    assert frame_domain("livecodebench") == frame_domain("code") == "coding"
    assert frame_domain("bfcl") == frame_domain("envscaler") == "agentic"


def test_a_trajectory_holding_the_sentinel_is_named():
    tok = tiny_tokenizer()
    row = _rows(tok)[0]
    traj = row.trajectory
    messages = list(traj.messages)
    messages[0] = messages[0].model_copy(update={"content": f"system {SENTINEL}"})
    bad = type(row)(traj.model_copy(update={"messages": messages}), row.ids_T, row.mask_T, row.logprobs_T)
    with pytest.raises(ValueError, match=traj.trajectory_id):
        framed_prompt_ids(tok, bad)


def test_known_embeddings_in_the_latent_span_equal_the_same_tokens_as_ids():
    """A.4's equivalence check: token embeddings as latents == those tokens in the prompt."""
    tok = tiny_tokenizer()
    model = tiny_model(tok).requires_grad_(False)  # the frozen teacher
    rows = _rows(tok)
    batch = build_batch(tok, rows, [[] for _ in rows], J=1, max_exp_tokens=8, framed=True)
    ids, attn, starts = batch.input_ids_BT, batch.attn_mask_BT, batch.insert_at_B
    span = tok("reference: call get_weather(city)", add_special_tokens=False)["input_ids"]
    latents_BNd = model.get_input_embeddings()(torch.tensor(span)).detach().expand(len(rows), -1, -1)
    with torch.no_grad():
        got = teacher_logits(model, ids, attn, latents_BNd, starts, placement="framed", frame_ids=batch.frame_ids)
        plain = teacher_logits(model, ids, attn, latents_BNd[:, :0], starts)
    compared = 0
    for b, (head, tail) in enumerate(batch.frame_ids):
        s, n = int(starts[b]), int(attn[b].sum())
        completion = ids[b, s:n].tolist()
        alone = model(input_ids=torch.tensor([head + span + tail + completion])).logits[0]
        P = len(head) + len(span) + len(tail)
        for i in range(s - 1, n - 1):  # logits[i] scores token i + 1
            torch.testing.assert_close(got[b, i], alone[P + i - s], atol=1e-5, rtol=0)
            assert int(got[b, i].argmax()) == int(alone[P + i - s].argmax())  # the same greedy decode
            compared += 1
        # the framed context changes what the teacher predicts
        assert (got[b, s - 1:n - 1] - plain[b, s - 1:n - 1]).abs().max() > 1e-3
    assert compared > 10


def test_gradient_reaches_the_latents_and_no_teacher_weight():
    tok = tiny_tokenizer()
    backbone = add_lora_adapter(tiny_model(tok), "student", rank=4, alpha=8)
    for _, p in base_parameters(backbone):
        p.requires_grad_(False)
    rows = _rows(tok)
    batch = build_batch(tok, rows, [[] for _ in rows], J=1, max_exp_tokens=8, framed=True)
    d = backbone.get_input_embeddings().weight.shape[1]
    latents_BNd = torch.randn(len(rows), 3, d, requires_grad=True)
    out = teacher_logits(backbone, batch.input_ids_BT, batch.attn_mask_BT, latents_BNd, batch.insert_at_B,
                         placement="framed", frame_ids=batch.frame_ids)
    out[batch.action_mask_BT].logsumexp(-1).sum().backward()
    assert (latents_BNd.grad.abs().sum(-1) > 0).all()
    assert all(p.grad is None for _, p in backbone.named_parameters())
    with pytest.raises(ValueError, match="needs frame_ids"):
        teacher_logits(backbone, batch.input_ids_BT, batch.attn_mask_BT, latents_BNd, batch.insert_at_B,
                       placement="framed")


def test_distill_with_a_framed_composer(assets, tmp_path):
    model_dir, composer_dir, _ = assets
    framed = composer_placed(composer_dir, tmp_path, "framed")
    trainer = Distiller(make_config(assets, tmp_path, "framed", steps=1, composer=str(framed)))
    assert trainer.method.placement.name == "framed"
    trainer.fit()
    rows = metrics(trainer.out)
    assert len(rows) == 1 and math.isfinite(rows[0]["reverse_kl"]) and math.isfinite(rows[0]["Delta"])
    assert rows[0]["action_tokens"] > 0
