"""LOPD-text (stages/methods/lopd_text.py): LOPD's loop with the retrieved experiences as text in the
frozen teacher's context. The text teacher against a naive token-level reference, its loss against
the reverse KL of stages/core/losses/lopd.py, and whole steps through the distill loop."""
from __future__ import annotations

import pytest
import torch

from stages.core.data.rows import training_rows
from stages.core.latent.contexts import build_batch, shift_for_loss
from stages.core.latent.teacher import text_teacher_logits
from stages.core.losses.lopd import topm_tail_reverse_kl
from stages.core.models.student import student_logits
from stages.distill.recipe import Distiller
from stages.methods import get_method, method_options
from tests.test_coldstart_ladder import two_env_trajs
from tests.test_distill import _hash_embedder, assets, metrics  # noqa: F401 (fixtures)
from tests.test_head_losses import _method_config
from tests.tiny import tiny_model, tiny_tokenizer


@pytest.mark.parametrize("placement", ["framed", "prefix"])
def test_text_teacher_reads_the_experiences_as_ordinary_tokens(placement):
    """Naive reference: each row's teacher input written out as token ids (prompt around the text of
    its composer rows, then its completion) through the plain model; the logits that score the
    completion must equal text_teacher_logits' at the same tokens."""
    tok = tiny_tokenizer()
    model = tiny_model(tok).eval().requires_grad_(False)
    trajs = two_env_trajs()
    batch = build_batch(tok, trajs[:2], [[trajs[3], trajs[4]], [trajs[5]]], J=2, max_exp_tokens=40,
                        framed=placement == "framed")
    got_BTV = text_teacher_logits(model, batch, placement)
    assert got_BTV.shape == (*batch.input_ids_BT.shape, model.config.vocab_size) and not got_BTV.requires_grad
    for b in range(2):
        start, length = int(batch.insert_at_B[b]), int(batch.attn_mask_BT[b].sum())
        text = batch.exp_ids_BJL[b][batch.exp_mask_BJL[b]].tolist()
        completion = batch.input_ids_BT[b, start:length].tolist()
        if placement == "framed":
            before, after = batch.frame_ids[b]
        else:
            before, after = batch.input_ids_BT[b, :start].tolist(), []
        ids = before + text + after + completion
        with torch.no_grad():
            naive = model(torch.tensor([ids])).logits[0]
        first = len(ids) - len(completion)  # position of the completion's first token
        # logits[b, i] scores token i + 1: positions start - 1 .. length - 2 score the completion
        torch.testing.assert_close(got_BTV[b, start - 1:length - 1], naive[first - 1:len(ids) - 1],
                                   rtol=1e-4, atol=1e-5)


def test_options_and_registry():
    assert get_method("lopd-text").Options is method_options("lopd-text")
    o = method_options("lopd-text")()
    assert (o.J, o.M, o.placement, o.exclude_same_task) == (3, 20, "framed", True)
    with pytest.raises(ValueError):
        method_options("lopd-text")(composer="x")  # no composer: an unknown option


@pytest.mark.parametrize("lora_rank", [4, 0])  # 0: full fine-tuning, the teacher a frozen copy
def test_two_steps_train_the_student_only_toward_the_text_teacher(assets, tmp_path, lora_rank):
    config = _method_config(assets, tmp_path, "lopd-text", f"text{lora_rank}", J=2, M=5, max_exp_tokens=64)
    config = config.model_copy(update={"student_lora_rank": lora_rank})
    trainer = Distiller(config)
    method = trainer.method
    teacher = method.teacher.model
    before = {n: p.detach().clone() for n, p in teacher.named_parameters() if "lora_" not in n}
    student_before = [p.detach().clone() for p in trainer.student.params]
    trainer.fit()
    rows = metrics(trainer.out)
    assert len(rows) == 2
    for r in rows:
        assert r["reverse_kl"] > 0 and r["context_tokens"] > 0 and 0 < r["experiences"] <= 2, r
        assert "beta" not in r and "anchor" not in r
    for n, p in teacher.named_parameters():  # the frozen teacher never moves
        if "lora_" not in n:
            assert torch.equal(p, before[n]), n
    assert any(not torch.equal(p, q) for p, q in zip(trainer.student.params, student_before))


def test_the_loss_is_the_top_m_tail_reverse_kl_to_the_text_teacher(assets, tmp_path):
    """One micro-batch's loss against topm_tail_reverse_kl on the student's logits and the text
    teacher's, computed here from the same rows."""
    config = _method_config(assets, tmp_path, "lopd-text", "kl", J=2, M=5, max_exp_tokens=64)
    trainer = Distiller(config)
    method = trainer.method
    store_rows = trainer.store.query(split="train", success=True)
    rows = training_rows(trainer.student.tokenizer, store_rows[:2], max_len=256)[0]
    extras = [[store_rows[2]], [store_rows[3]]]
    loss, m = method.loss(rows, extras, weight=1.0)
    batch = build_batch(trainer.student.tokenizer, rows, extras, J=2, max_exp_tokens=64, framed=True)
    with torch.no_grad():
        s = student_logits(trainer.student.model, batch.input_ids_BT, batch.attn_mask_BT, adapter=trainer.student.adapter)
        t = text_teacher_logits(method.teacher.model, batch, "framed")
    s, _, mask = shift_for_loss(s, batch)
    ref, ref_m = topm_tail_reverse_kl(s, shift_for_loss(t, batch)[0], mask, M=5)
    assert float(loss.detach()) == pytest.approx(float(ref), rel=1e-4) and m["reverse_kl"] == pytest.approx(ref_m["reverse_kl"], rel=1e-4)
    loss.backward()
    assert all(p.grad is None for n, p in method.teacher.model.named_parameters() if "lora_" not in n)
