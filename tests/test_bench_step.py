"""benchmarks/bench_step.py keeps running on the project's code paths (no timing is checked here):
a one-layer SmolLM2-shaped model, one step of LOPD (composer, latent teacher, in-memory
retrieval) and of OPSD (verified references from the in-memory store)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_step", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_step"] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_step"]


@pytest.mark.parametrize("method, extra", [("lopd", []), ("lopd", ["--no-shared-latents"]), ("opsd", []),
                                           ("lopd", ["--no-head-at-supervised"])])
def test_one_small_step_trains_on_the_sampled_tokens(bench, method, extra, capsys):
    rows = bench.main(["--shape", "smollm2-135m", "--method", method, "--device", "cpu", "--layers", "1",
                       "--prompt-len", "16", "--response-len", "4", "--batch", "2", "--warmup", "0",
                       "--steps", "1", "--J", "2", "--K", "4", "--depth", "1", "--exp-tokens", "32",
                       "--matmul-n", "64", *extra])
    out = capsys.readouterr().out
    (row,) = rows
    assert row["rows"] == 2 and row["generated"] > 0
    assert row["trained"] == row["prompt"] + row["generated"]  # a row = the prompt + the sampled ids
    tokens = row["tokens"]
    assert tokens[("body", False)] >= row["prompt"] + row["generated"] - 2  # the rollout's forwards
    assert tokens[("body", True)] >= row["trained"]  # the student at least (+ LOPD's teacher and composer)
    if method == "lopd":
        assert tokens[("body", True)] >= 2 * row["trained"] + 2 * 2 * 4 + 2 * 2 * 16  # + teacher, latents, composer
        assert {"student_s", "teacher_s", "composer_s"} <= set(row)
    assert row["flops"] > 0 and "FLOP-bound time:" in out and "peak memory: RSS" in out
    if "--no-head-at-supervised" in extra:  # logits at every position the student's forward computes
        assert tokens[("head", True)] >= row["trained"]
    else:  # the losses' heads only at the sampled tokens (LOPD: student KL, teacher KL and log-probs)
        assert 0 < tokens[("head", True)] <= 3 * row["generated"] < row["trained"]


@pytest.fixture(scope="module")
def meter_module(bench):
    return sys.modules["benchmarks.step_meter"]


@pytest.mark.parametrize("x_grad, w_grad, mode, backward", [
    (False, False, "grad", 0), (True, False, "grad", 120), (True, True, "grad", 240), (False, True, "grad", 120),
    (True, True, "no_grad", 0), (True, True, "inference", 0)])
def test_a_linear_layer_s_backward_counts_only_the_gradients_it_needs(meter_module, x_grad, w_grad, mode, backward):
    import torch

    layer = torch.nn.Linear(5, 4, bias=False).requires_grad_(w_grad)
    meter = meter_module.Meter("cpu")
    meter.watch_compressor(torch.nn.Sequential(layer))
    x = torch.randn(3, 5, requires_grad=x_grad)
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}[mode]
    with context():
        layer(x)
    assert (meter.forward_flops, meter.backward_flops) == (2 * 5 * 4 * 3, backward)


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_counts_its_projections_and_products_in_either_layout(meter_module, batch_first):
    import torch

    d, kdim, heads, B, Lq, Lk = 8, 6, 2, 3, 4, 5
    attn = torch.nn.MultiheadAttention(d, heads, kdim=kdim, vdim=kdim, batch_first=batch_first).requires_grad_(False)
    meter = meter_module.Meter("cpu")
    meter.watch_compressor(attn)
    query, key = torch.randn(B, Lq, d), torch.randn(B, Lk, kdim)
    if not batch_first:
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    with torch.no_grad():
        attn(query, key, key)
    # q and out projections (d x d) at Lq, k and v (kdim -> d) at Lk, QK^T and PV over Lq x Lk
    assert meter.forward_flops == 2 * 2 * d * d * B * Lq + 2 * d * 2 * kdim * B * Lk + 2 * 2 * d * B * Lq * Lk
    assert meter.backward_flops == 0


def test_a_recomputed_forward_counts_its_backward_only(meter_module):
    import torch

    layer = torch.nn.Linear(5, 4, bias=False)
    meter = meter_module.Meter("cpu")
    meter.watch_compressor(torch.nn.Sequential(layer))
    x = torch.randn(3, 5, requires_grad=True)
    with torch.no_grad():  # the forward without a graph
        layer(x)
    with meter.recomputing():  # the same forward again, with its graph, for the backward
        layer(x)
    assert (meter.forward_flops, meter.backward_flops) == (2 * 5 * 4 * 3, 2 * 2 * 5 * 4 * 3)
    layer(x)  # after the block: counted as a forward again
    assert meter.forward_flops == 2 * 2 * 5 * 4 * 3


def test_bench_composer_counts_the_frozen_backbone_and_the_lora_exactly(bench):
    spec = importlib.util.spec_from_file_location("bench_composer", BENCH.parent / "bench_composer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    J, L, K, depth = 2, 16, 4, 1
    rows = {r["part"]: r["flops"] for r in module.main(["--layers", "1", "--J", str(J), "--tokens", str(L), "--K", str(K),
                                                         "--depth", str(depth), "--repeats", "1", "--matmul-n", "64"])}
    c = bench.SHAPES["smollm2-135m"][1]
    d, kv, ff, r = c["hidden_size"], c["num_key_value_heads"] * c["head_dim"], c["intermediate_size"], 8
    weights = 2 * d * d + 2 * d * kv + 3 * d * ff  # q, o; k, v; gate, up, down
    attention = 4 * d * J * (L * (L + 1) // 2)  # QK^T and PV over the causal pairs of each input
    assert rows["backbone forward, adapters off, no graph"] == 2 * weights * J * L + attention
    lora = r * (4 * d + 2 * (d + kv) + 2 * (d + ff) + (ff + d))  # A and B of the seven projections
    assert rows["encoder forward with psi, no graph"] == 2 * (weights + lora) * J * L + attention
    assert rows["encoder forward with psi, graph (trained)"] == rows["encoder forward with psi, no graph"]
    qformer = rows["QFormer forward (trained)"]
    assert rows["anchor phi_0 forward, no graph"] == rows["encoder forward with psi, no graph"] + qformer
    # the backward, matmul by matmul: a frozen weight costs its input's gradient (1x its forward)
    # where the input needs one, a LoRA matrix its weight's gradient too (2x); layer 0's input (the
    # frozen embeddings) needs none, so its base q/k/v projections cost nothing and their LoRA A
    # its weight's gradient only; the QFormer's inputs (learned queries, the hidden states) and
    # weights all take a gradient: 2x its forward
    rank = r
    base_rest = 2 * d * d + 3 * 2 * d * ff  # o, gate, up, down: input gradients
    lora_qkv = 3 * 2 * d * rank + 2 * 2 * rank * (d + 2 * kv)  # A: weight gradient; B: both
    lora_rest = 2 * 2 * rank * (d + d) + 2 * 2 * 2 * rank * (d + ff) + 2 * 2 * rank * (ff + d)  # o; gate, up; down
    encoder_backward = (base_rest + lora_qkv + lora_rest) * J * L + 2 * attention
    assert rows["backward (encoder + QFormer)"] == encoder_backward + 2 * qformer


def test_a_forward_after_a_cached_prefix_counts_as_the_whole_sequence(bench, meter_module):
    """The attention pairs of a forward that reads a KV cache (the shared-prefix forward, the
    engine's decoding) are its queries against the cached keys and its own: the prefix's forward
    and then the rest's add up to one forward of the whole sequence."""
    import torch

    model = bench.random_model("smollm2-135m", 1, "float32", "cpu")
    meter = meter_module.Meter("cpu")
    meter.watch(model)
    ids = torch.randint(4, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
        whole = meter.forward_flops
        meter.reset()
        prefix = model(input_ids=ids[:, :7], use_cache=True)
        model(input_ids=ids[:, 7:], cache=prefix.cache, use_cache=True)
    assert meter.forward_flops == whole and meter.tokens[("body", False)] == 2 * 12
