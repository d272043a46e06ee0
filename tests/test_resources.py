"""The step-memory estimate and the experience-count check of stages/core/run/resources.py."""
from __future__ import annotations

import pytest

import torch

from stages.core.run import resources
from stages.core.run.resources import StepShape, check_experience_count, check_step_memory, step_memory_bytes

GB = 2**30
# a measured LOPD step: SmolLM2-135M, batch 4, J=3, K=32, 512 experience tokens, ~384-token sequences
MEASURED_STEP = StepShape(layers=30, hidden=576, intermediate=1536, vocab=49152, batch=4, J=3, K=32,
                        max_exp_tokens=512, seq_len=384, activation_checkpointing=False)


def test_estimate_matches_the_measured_step_and_its_knobs():
    need = step_memory_bytes(MEASURED_STEP)
    assert 12 * GB < need < 20 * GB  # measured ~15 GB peak
    hand = 4 * (12 * 576 + 4 * 1536) * 30 * (4 * 3 * 512 + 2 * 4 * (384 + 96)) + 3 * 4 * 49152 * 2 * 4 * 384
    assert need == hand
    ckpt = step_memory_bytes(StepShape(**{**MEASURED_STEP.__dict__, "activation_checkpointing": True}))
    assert ckpt < need / 3
    more_j = step_memory_bytes(StepShape(**{**MEASURED_STEP.__dict__, "J": 30}))
    assert more_j > 5 * need


def test_checks_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^--J 40: store s holds 33 successful train trajectories, so at most 32"):
        check_experience_count(40, 33, store="s")
    check_experience_count(32, 33, store="s")
    with pytest.raises(ValueError, match=r"distill: one step needs about 16.3 GB .* 8.0 GB are available; "
                                         r"lower micro_batch, or turn on activation checkpointing$"):
        check_step_memory(MEASURED_STEP, stage="distill", knobs="micro_batch", available=8 * GB)
    assert check_step_memory(MEASURED_STEP, stage="distill", knobs="x", available=64 * GB) == step_memory_bytes(MEASURED_STEP)


@pytest.mark.skipif(resources._glibc_malloc_trim() is None, reason="glibc malloc_trim only")
def test_release_free_memory_hands_freed_tensor_memory_back():
    """Freed mid-size tensors stay resident in glibc's arenas (the dynamic mmap threshold rose
    after one large free) until release_free_memory: the step-to-step RSS growth it fixes."""
    gen = torch.Generator().manual_seed(0)
    big = torch.zeros(2_000_000)  # 8 MB: freeing it raises glibc's mmap threshold
    del big
    sizes = torch.randint(25_000, 475_000, (600,), generator=gen).tolist()  # 0.1-1.9 MB each
    tensors = [torch.zeros(n) for n in sizes]
    live_mb = sum(sizes) * 4 / 2**20
    del tensors
    held = resources.rss_mb()
    resources.release_free_memory()
    after = resources.rss_mb()
    assert held - after > 0.5 * live_mb, (held, after, live_mb)
