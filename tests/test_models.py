"""Model assembly: the one composer loader and the teacher-copy helpers (tiny in-process Llama)."""
from __future__ import annotations

import copy

import pytest
import torch

from stages.core.models.composer import adapter_parameters, add_lora_adapter, save_composer
from stages.core.models.assembly import (
    copy_adapter_, ema_update_, ema_update_adapter_, frozen_teacher_copy, load_composer,
)
from tests.test_composer import experiences, perturb_lora_b, setup, tiny_llama  # noqa: F401 (fixture)


def test_frozen_composer_next_to_a_trainable_one(setup, tmp_path):  # noqa: F811
    initial, composer = setup
    ids, mask = experiences()
    with torch.no_grad():
        ref = composer(ids, mask)
    out = save_composer(composer, tmp_path / "phi0", {"backbone_id": "tiny-llama"})
    backbone = add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8)
    phi = load_composer(backbone, out, trainable=True, backbone_id="tiny-llama")
    student_flags = [p.requires_grad for p in adapter_parameters(phi.backbone, "student")]
    anchor = load_composer(phi.backbone, out, trainable=False, backbone_id="tiny-llama", adapter_name="composer0")
    assert set(phi.backbone.peft_config) == {"student", "composer", "composer0"}
    assert all(p.requires_grad for p in phi.trainable_parameters())  # untouched by the second load
    assert not any(p.requires_grad for p in anchor.trainable_parameters())
    assert [p.requires_grad for p in adapter_parameters(phi.backbone, "student")] == student_flags
    with torch.no_grad():
        torch.testing.assert_close(anchor(ids, mask), ref, atol=0, rtol=0)
        torch.testing.assert_close(phi(ids, mask), ref, atol=0, rtol=0)
    with pytest.raises(ValueError, match="already has an adapter called 'composer0'"):
        load_composer(phi.backbone, out, trainable=False, backbone_id="tiny-llama", adapter_name="composer0")


def test_frozen_teacher_copy():
    model = tiny_llama().train()
    teacher = frozen_teacher_copy(model)
    assert not teacher.training and model.training
    assert not any(p.requires_grad for p in teacher.parameters())
    assert all(p.requires_grad for p in model.parameters())
    for (n, a), b in zip(model.named_parameters(), teacher.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), n


def test_ema_update_closed_form_after_two_updates():
    student = tiny_llama(seed=1)
    teacher = frozen_teacher_copy(tiny_llama(seed=2))
    t0 = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    s1 = {n: p.detach().clone() for n, p in student.named_parameters()}
    rate = 0.25
    ema_update_(teacher, student, rate)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.5)
    s2 = {n: p.detach().clone() for n, p in student.named_parameters()}
    ema_update_(teacher, student, rate)
    for n, p in teacher.named_parameters():
        expected = (1 - rate) ** 2 * t0[n] + rate * (1 - rate) * s1[n] + rate * s2[n]
        torch.testing.assert_close(p, expected, atol=1e-6, rtol=1e-6)
        assert not p.requires_grad
    ema_update_(teacher, student, 1.0)
    assert all(torch.equal(p, s2[n]) for n, p in teacher.named_parameters())
    with pytest.raises(ValueError, match=r"rate must lie in \[0, 1\]"):
        ema_update_(teacher, student, 1.5)
    with pytest.raises(ValueError, match="parameters differ"):
        ema_update_(teacher, add_lora_adapter(tiny_llama(), "student"), 0.1)


def two_adapters(rank: int = 4):
    backbone = add_lora_adapter(tiny_llama(), "student", rank=4, alpha=8)
    add_lora_adapter(backbone, "teacher", rank=rank, alpha=2 * rank)
    perturb_lora_b(backbone, "student", seed=1)
    perturb_lora_b(backbone, "teacher", seed=2)
    return backbone


def test_ema_update_adapter_and_copy_adapter():
    backbone = two_adapters()
    base = {n: p.detach().clone() for n, p in backbone.named_parameters() if "lora_" not in n}
    t0 = [p.detach().clone() for p in adapter_parameters(backbone, "teacher")]
    s = [p.detach().clone() for p in adapter_parameters(backbone, "student")]
    rate = 0.1
    ema_update_adapter_(backbone, "teacher", "student", rate)
    ema_update_adapter_(backbone, "teacher", "student", rate)
    for p, a, b in zip(adapter_parameters(backbone, "teacher"), t0, s):
        torch.testing.assert_close(p, (1 - rate) ** 2 * a + (1 - (1 - rate) ** 2) * b, atol=1e-6, rtol=1e-6)
    assert all(torch.equal(p, b) for p, b in zip(adapter_parameters(backbone, "student"), s))  # student untouched
    copy_adapter_(backbone, "student", "teacher")
    assert all(torch.equal(p, b) for p, b in zip(adapter_parameters(backbone, "teacher"), s))
    assert all(torch.equal(p, base[n]) for n, p in backbone.named_parameters() if "lora_" not in n)
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        backbone.set_adapter("student")
        out_s = backbone(input_ids=ids).logits
        backbone.set_adapter("teacher")
        out_t = backbone(input_ids=ids).logits
    torch.testing.assert_close(out_t, out_s, atol=0, rtol=0)  # the synced teacher computes the same
    with pytest.raises(ValueError, match="no adapter 'nope'"):
        copy_adapter_(backbone, "nope", "teacher")
    with pytest.raises(ValueError, match="differ in rank or alpha"):
        ema_update_adapter_(two_adapters(rank=2), "teacher", "student", 0.5)
