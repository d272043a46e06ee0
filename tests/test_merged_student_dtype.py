"""The saved LoRA student computes what was trained when training ran in bf16.

A bf16 merge rounds W + s B A back onto W's bf16 grid: with a small update most entries are
the base's again (peft#2502). :func:`save_final` merges in float32 and :func:`load_policy`
keeps such a folder in float32, whatever dtype a later stage asks for.
"""
from __future__ import annotations

import torch

from stages.core.models.assembly import save_final, save_student
from stages.core.models.backbone import load_policy
from stages.core.models.composer import add_lora_adapter
from tests.tiny import save_tiny, tiny_tokenizer

TRAINED_SCALE = 1e-3  # a LoRA update of lr-1e-5-like size: far below half a bf16 step of W


def _trained_bf16_student(folder):
    """The tiny model in bf16 with a float32 LoRA adapter whose B was set to small values."""
    model, tok = load_policy(str(folder), dtype="bfloat16", device="cpu")
    model = add_lora_adapter(model, "student", rank=4, alpha=8)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(TRAINED_SCALE * torch.randn(p.shape, generator=gen))
            elif "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return model, tok


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _bf16_base(folder):
    """The tiny model saved in bf16, as released checkpoints are (a float32 load is then exact)."""
    save_tiny(folder)
    load_policy(str(folder), dtype="bfloat16", device="cpu")[0].save_pretrained(folder)
    return folder


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def test_saved_student_keeps_the_bf16_run_update(tmp_path):
    base_dir = _bf16_base(tmp_path / "base")
    student, tok = _trained_bf16_student(base_dir)
    ckpt = tmp_path / "run" / "checkpoints" / "step-1"
    ckpt.mkdir(parents=True)
    save_student(ckpt, student=student, adapter="student", tokenizer=tok,
                 optimizer=torch.optim.SGD(student.parameters(), lr=0.1))
    final = save_final(tmp_path / "run", ckpt, model=str(base_dir), tokenizer=tok, student=student,
                       adapter="student")
    ids = torch.tensor([tok.encode("What is the weather in Paris today? The answer is 4.")])

    trained = _logits(student, ids)  # bf16 base + float32 adapter: what training computed
    reference = _logits(_trained_bf16_student_f32(base_dir, student), ids)  # its exact value
    base = _logits(load_policy(str(base_dir), dtype="float32", device="cpu")[0], ids)
    saved_model = load_policy(str(final / "student"), dtype="bfloat16", device="cpu")[0]  # a bf16 stage
    saved = _logits(saved_model, ids)

    assert saved_model.dtype == torch.float32
    assert (saved - reference).abs().max() < 1e-4 * float(reference.abs().max())
    assert (saved - trained).abs().max() <= 1.5 * (trained - reference).abs().max()  # bf16 noise
    assert (saved - base).abs().max() > 10 * (saved - reference).abs().max()
    assert _cosine(saved - base, reference - base) > 0.999  # main: the bf16 merge gave ~0.4


def _trained_bf16_student_f32(folder, student):
    """The same adapter weights on the base loaded in float32 (an exact unmerged forward)."""
    model, _ = load_policy(str(folder), dtype="float32", device="cpu")
    model = add_lora_adapter(model, "student", rank=4, alpha=8)
    with torch.no_grad():
        trained = dict(student.named_parameters())
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(trained[name].float())
    return model


def test_adapter_folder_loads_merged_in_float32(tmp_path):
    """`lopd export` without --merge: an adapter folder as --model is merged in float32."""
    base_dir = _bf16_base(tmp_path / "base")
    student, tok = _trained_bf16_student(base_dir)
    student.save_pretrained(str(tmp_path / "export"), selected_adapters=["student"])
    folder = tmp_path / "export" / "student"
    tiny_tokenizer().save_pretrained(folder)
    ids = torch.tensor([tok.encode("def add(a, b): return a + b")])
    loaded = load_policy(str(folder), dtype="bfloat16", device="cpu")[0]
    reference = _logits(_trained_bf16_student_f32(base_dir, student), ids)
    assert loaded.dtype == torch.float32
    assert (_logits(loaded, ids) - reference).abs().max() < 1e-4 * max(1.0, float(reference.abs().max()))
