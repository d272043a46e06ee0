"""The step-memory estimate, the experience-count check and the allocator settings of stages/core/run/resources.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stages.core.run import resources
from stages.core.run.resources import StepShape, check_experience_count, check_step_memory, step_memory_bytes

GB = 2**30
# SmolLM2-135M (its config.json), a LOPD step: batch 4, J=3, K=32, 512 experience tokens, 384-token sequences
LOPD_STEP = StepShape(layers=30, hidden=576, intermediate=1536, vocab=49152, heads=9, kv_heads=3, head_dim=64,
                      batch=4, J=3, K=32, max_exp_tokens=512, seq_len=384, activation_checkpointing=False)


def _saved_bytes(trained: str, batch: int, seq: int) -> tuple[int, StepShape]:
    """Bytes of the (non-parameter) tensors autograd saves in a tiny Llama's decoder forward with
    ``trained`` weights (resources.adapter_input_elements' names), and the model's StepShape."""
    import torch

    from stages.core.models.composer import add_lora_adapter
    from stages.core.run.resources import shape_of
    from tests.tiny import tiny_model, tiny_tokenizer

    model = tiny_model(tiny_tokenizer()).train()
    model.requires_grad_(trained == "full")
    targets = {"attention-lora": ("q_proj", "k_proj", "v_proj", "o_proj"),
               "all-lora": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
    if trained in targets:
        model = add_lora_adapter(model, "adapter", rank=1, alpha=2, target_modules=targets[trained]).get_base_model()
    ids = torch.randint(10, 300, (batch, seq), generator=torch.Generator().manual_seed(0))
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(trained == "frozen")
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(inputs_embeds=embeds)
    shape = shape_of(model.config, batch=batch, J=0, K=0, max_exp_tokens=0, seq_len=seq,
                     activation_checkpointing=False)
    return sum(saved.values()), shape


@pytest.mark.parametrize("trained", ["frozen", "attention-lora", "all-lora", "full"])
def test_forward_bytes_are_what_autograd_saves(trained):
    """The per-token terms of the estimate against the tensors a real decoder forward saves
    for its backward (a tiny Llama: hidden 64, 2 layers; final norm and LoRA-rank terms are the rest)."""
    saved, shape = _saved_bytes(trained, batch=2, seq=48)
    estimate = resources.forward_bytes(shape, 2 * 48, trained)
    assert 0.9 < estimate / saved < 1.1, (trained, estimate, saved)


def test_estimate_grows_with_its_knobs():
    need = step_memory_bytes(LOPD_STEP)
    ckpt = step_memory_bytes(StepShape(**{**LOPD_STEP.__dict__, "activation_checkpointing": True}))
    assert ckpt < need / 3
    more_j = step_memory_bytes(StepShape(**{**LOPD_STEP.__dict__, "J": 30}))
    assert more_j > 5 * need
    no_lopd = step_memory_bytes(StepShape(**{**LOPD_STEP.__dict__, "J": 0}))
    assert no_lopd < need / 4  # the teacher's and the composer's forwards keep activations in LOPD only
    half = step_memory_bytes(StepShape(**{**LOPD_STEP.__dict__, "dtype_bytes": 2}))
    assert half < 0.6 * need


def test_checks_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^--J 40: store s holds 33 successful train trajectories, so at most 32"):
        check_experience_count(40, 33, store="s")
    check_experience_count(32, 33, store="s")
    with pytest.raises(ValueError, match=r"distill: one step needs about \d+\.\d GB .* 4.0 GB are available; "
                                         r"lower micro_batch, or turn on activation checkpointing$"):
        check_step_memory(LOPD_STEP, stage="distill", knobs="micro_batch", available=4 * GB)
    assert check_step_memory(LOPD_STEP, stage="distill", knobs="x", available=64 * GB) == step_memory_bytes(LOPD_STEP)


_FRAGMENTED_FREE = """
import sys, torch
from stages.core.run import resources
big = torch.zeros(4_000_000); del big  # 16 MB: freeing it raises glibc's dynamic mmap threshold
if sys.argv[1] == "map":
    assert resources.map_large_blocks()
sizes = torch.randint(300_000, 1_000_000, (300,), generator=torch.Generator().manual_seed(0)).tolist()
tensors = [torch.ones(n) for n in sizes]  # 1.2-4 MB each
held = resources.rss_mb()
del tensors[::2]  # every other one: holes in the heap that no trim of its top returns
at_free = held - resources.rss_mb()
resources.release_free_memory()
print(sum(sizes[::2]) * 4 / 2**20, at_free, held - resources.rss_mb())
"""


def _fragmented_free(mode: str) -> tuple[float, float, float]:
    """MiB freed, MiB that left the resident set at the frees, and after release_free_memory, in a
    fresh process (the allocator setting is process-wide)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    done = subprocess.run([sys.executable, "-c", _FRAGMENTED_FREE, mode], env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, check=True)
    freed, at_free, after_trim = map(float, done.stdout.split())
    return freed, at_free, after_trim


@pytest.mark.skipif(resources._glibc_malloc_trim() is None, reason="glibc malloc_trim only")
def test_release_free_memory_hands_freed_tensor_memory_back():
    """Freed mid-size tensors stay resident in glibc's arenas (its dynamic mmap threshold rose
    after one large free) until release_free_memory: the step-to-step RSS growth it fixes."""
    freed, at_free, after_trim = _fragmented_free("glibc")
    assert at_free < 0.2 * freed, (at_free, freed)
    assert after_trim > 0.9 * freed, (after_trim, freed)


@pytest.mark.skipif(resources._glibc_mallopt() is None, reason="glibc mallopt only")
def test_map_large_blocks_returns_freed_blocks_at_once():
    """With map_large_blocks each freed block of >= 1 MiB leaves the resident set when it is freed
    (under glibc's own threshold the same frees stay resident: the test above)."""
    freed, at_free, _ = _fragmented_free("map")
    assert at_free > 0.9 * freed, (at_free, freed)


def test_map_large_blocks_leaves_an_environment_setting_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert resources.map_large_blocks() is False


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_reset_peak_rss_makes_the_high_water_mark_one_phases_peak():
    import torch

    big = torch.ones(50_000_000)  # 190 MiB, touched
    del big
    resources.release_free_memory()
    resources.reset_peak_rss()
    assert resources.status_mb("VmHWM") - resources.status_mb("VmRSS") < 50  # the old peak is gone
    phase = torch.ones(25_000_000)  # 95 MiB
    assert resources.status_mb("VmHWM") - resources.status_mb("VmRSS") < 50
    del phase
    resources.release_free_memory()
    assert resources.status_mb("VmHWM") - resources.status_mb("VmRSS") > 80  # this phase's peak is kept
    with pytest.raises(KeyError):
        resources.status_mb("NoSuchField")


_TRANSIENT = """
import resource, sys, torch
from stages.core.run import resources
torch.set_num_threads(1)
if sys.argv[1] == "map":
    assert resources.map_large_blocks()
x, w = torch.randn(8, 64, 576), torch.randn(576, 1536)

def layers():  # a no-grad forward's pattern: each layer's 1.2-3 MB temporaries die before the next layer
    h = x
    for _ in range(30):
        a = h @ w
        h = (a * torch.sigmoid(a)) @ w.T + h
    return h

def faults(scope):  # minor page faults of the second pass (the first one warms the allocator)
    with scope():
        layers()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        layers()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

import contextlib
outside = faults(contextlib.nullcontext)
inside = faults(resources.transient_blocks)
with resources.transient_blocks():
    nested = faults(resources.transient_blocks)  # an inner block leaves the outer one's setting
print(outside, inside, nested)
"""


@pytest.mark.skipif(resources._glibc_mallopt() is None, reason="glibc mallopt only")
def test_transient_blocks_reuse_freed_blocks_instead_of_fresh_pages():
    """Under map_large_blocks every 1.2-3 MB temporary is a fresh mapping whose pages fault in;
    inside transient_blocks glibc reuses the freed blocks (a tenth of the page faults at most),
    nested blocks too. (After the block, blocks it freed may serve later requests: what is
    restored is checked by the next test.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", _TRANSIENT, "map"], env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, check=True)
    outside, inside, nested = map(int, done.stdout.split()[:3])
    assert outside > 20_000, outside  # ~60 blocks x ~700 pages
    assert inside < outside / 10 and nested < outside / 10, (outside, inside, nested)  # a few trims of the heap top


def test_transient_blocks_set_and_restore_only_lopds_thresholds(monkeypatch):
    """The glibc calls: none without map_large_blocks's setting; the mmap and trim thresholds
    raised and restored around the block, the trim one left alone when the environment sets it."""
    calls = []
    monkeypatch.setattr(resources, "_glibc_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    monkeypatch.setattr(resources, "_threshold", None)
    with resources.transient_blocks():
        pass
    assert calls == []
    monkeypatch.setattr(resources, "_threshold", resources.MMAP_THRESHOLD_BYTES)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with resources.transient_blocks():
        assert resources._threshold == 4 << 20
        with resources.transient_blocks():  # nested: no calls of its own
            pass
    assert resources._threshold == 1 << 20
    assert calls == [(-3, 4 << 20), (-1, 64 << 20), (-3, 1 << 20), (-1, 128 << 10)]
    calls.clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000")
    with resources.transient_blocks():
        pass
    assert calls == [(-3, 4 << 20), (-3, 1 << 20)]
