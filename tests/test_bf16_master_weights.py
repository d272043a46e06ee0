"""A bfloat16 run keeps every small update (issue 65): trainable weights and EMA teacher copies stay
float32 while frozen weights are bf16 and forwards compute in bf16 (CPU bf16 is a GPU run's
arithmetic). A bf16 weight moves only by steps of 2^-8 of its magnitude, so an lr-1e-5 AdamW update
or a rate-0.001 EMA step of a bf16 tensor rounds away on most entries."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from stages import sft
from stages.core.models.assembly import ema_update_, frozen_teacher_copy, load_composer, load_student
from stages.core.models.backbone import load_policy
from stages.core.models.composer import Composer, save_composer
from stages.sft import SftConfig
from tests.test_coldstart import one_thread  # noqa: F401 (fixture)
from tests.test_sft import store_path  # noqa: F401 (fixture)
from tests.tiny import save_tiny

SMALL_LR = 1e-5  # an update far below half a bf16 step of the tiny model's weights (std 0.02)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    """The tiny model saved in bf16, as released checkpoints are: a float32 load is then exact, so
    the float32 and the bf16 run start from the same values."""
    folder = save_tiny(tmp_path_factory.mktemp("tiny-bf16"))
    load_policy(str(folder), dtype="bfloat16", device="cpu")[0].save_pretrained(folder)
    return str(folder)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors])


def _stuck(delta_ref: torch.Tensor, delta: torch.Tensor) -> float:
    """Of the entries ``delta_ref`` moves, the fraction ``delta`` leaves exactly where they were."""
    moved = delta_ref != 0
    return float((moved & (delta == 0)).sum()) / int(moved.sum())


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def test_sft_in_bf16_moves_what_the_float32_run_moves(tmp_path, store_path, bf16_dir):
    initial = _flat(load_policy(bf16_dir, dtype="float32", device="cpu")[0].parameters())
    deltas = {}
    for dtype in ("float32", "bfloat16"):
        config = SftConfig(store=store_path, out=str(tmp_path / dtype), model=bf16_dir, steps=3, batch_size=2,
                           lr=SMALL_LR, seed=0, device="cpu", dtype=dtype)
        final = load_policy(str(sft.run(config)), dtype="float32", device="cpu")[0]
        deltas[dtype] = _flat(final.parameters()) - initial
    assert int((deltas["float32"] != 0).sum()) > 0.9 * initial.numel()
    assert _stuck(deltas["float32"], deltas["bfloat16"]) < 0.01  # main: bf16 parameters left ~90% stuck
    assert _cosine(deltas["float32"], deltas["bfloat16"]) > 0.98


def _composer_step(backbone_dir: str, dtype: str) -> tuple[Composer, torch.Tensor, torch.Tensor]:
    backbone = load_policy(backbone_dir, dtype=dtype, device="cpu")[0]
    torch.manual_seed(0)
    composer = Composer(backbone, K=4, depth=2)
    start = _flat(composer.compressor.parameters())
    optimizer = torch.optim.AdamW(composer.trainable_parameters(), lr=SMALL_LR, weight_decay=0.0)
    ids_NL = torch.randint(3, 300, (3, 12), generator=torch.Generator().manual_seed(1))
    latents_NKd = composer.encode(ids_NL, torch.ones_like(ids_NL, dtype=torch.bool))
    assert latents_NKd.dtype == getattr(torch, dtype)  # the latents enter the backbone in its dtype
    target_NKd = torch.randn(latents_NKd.shape, generator=torch.Generator().manual_seed(2))
    (latents_NKd.float() * target_NKd).sum().backward()  # (a squared norm after the LayerNorm readout is constant)
    optimizer.step()
    return composer, start, _flat(composer.compressor.parameters()) - start


def test_the_composers_compressor_moves_under_a_bf16_backbone(bf16_dir):
    _, _, delta_fp32 = _composer_step(bf16_dir, "float32")
    composer, _, delta_bf16 = _composer_step(bf16_dir, "bfloat16")
    assert {p.dtype for p in composer.trainable_parameters()} == {torch.float32}
    assert _stuck(delta_fp32, delta_bf16) < 0.01  # main: the bf16 compressor left ~95% stuck
    assert _cosine(delta_fp32, delta_bf16) > 0.98


def test_a_full_fine_tuning_ema_teacher_moves_at_rate_0_001_in_bf16(bf16_dir):
    student = load_student(bf16_dir, 0, None, device="cpu", dtype="bfloat16")[0]
    teacher = frozen_teacher_copy(student)
    reference = [p.detach().double().clone() for p in student.parameters()]
    start = _flat(teacher.parameters())
    rate = 0.001  # OPSD's teacher=ema
    with torch.no_grad():
        for _ in range(20):
            for p in student.parameters():  # the student moves 1% of each weight per step
                p.add_(p.abs() * 0.01)
            ema_update_(teacher, student, rate)
            for r, p in zip(reference, student.parameters()):
                r.mul_(1 - rate).add_(p.double(), alpha=rate)
    delta_ref = _flat(reference) - start
    delta = _flat(teacher.parameters()) - start
    assert _stuck(delta_ref, delta) < 0.001  # main: the bf16 copy left 100% stuck
    assert torch.allclose(delta, delta_ref, rtol=1e-3, atol=1e-9)


def test_an_ema_step_of_a_bf16_teacher_is_refused(bf16_dir):
    model = load_policy(bf16_dir, dtype="bfloat16", device="cpu")[0]
    with pytest.raises(ValueError, match="EMA teacher in torch.bfloat16: a rate-0.01 step rounds away"):
        ema_update_(frozen_teacher_copy(model), model, 0.01)
    ema_update_(frozen_teacher_copy(model), model, 1.0)  # a copy rounds nothing away


def test_a_resumed_bf16_run_continues_from_the_float32_values(tmp_path, store_path, bf16_dir):
    config = SftConfig(store=store_path, out=str(tmp_path / "run"), model=bf16_dir, steps=2, batch_size=2,
                       lr=SMALL_LR, checkpoint_every=1, seed=0, device="cpu", dtype="bfloat16")
    sft.run(config)
    ckpt = tmp_path / "run" / "checkpoints" / "step-2"
    saved = load_file(str(ckpt / "student" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    student, _, _, params = load_student(bf16_dir, 0, ckpt, device="cpu", dtype="bfloat16")
    assert {p.dtype for p in params} == {torch.float32}
    resumed = dict(student.named_parameters())
    assert all(torch.equal(resumed[name], value) for name, value in saved.items())
    off_grid = [v for v in saved.values() if not torch.equal(v, v.to(torch.bfloat16).float())]
    assert off_grid  # the saved values are no bf16 rounding

    backbone = load_policy(bf16_dir, dtype="bfloat16", device="cpu")[0]
    composer, _, _ = _composer_step(bf16_dir, "bfloat16")
    save_composer(composer, tmp_path / "composer", {"backbone_id": bf16_dir})
    restored = load_composer(backbone, tmp_path / "composer", trainable=True, backbone_id=bf16_dir)
    assert all(torch.equal(a, b) and a.dtype == torch.float32
               for a, b in zip(restored.compressor.parameters(), composer.compressor.parameters()))
