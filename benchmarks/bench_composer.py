"""Where the time of one LOPD composer update goes, phase by phase, against its FLOP bound.

One update encodes each distinct composer input once (``stages.core.latent.shared``): the J
inputs ``Enc(x, m_j)`` of ``--rows`` tasks go through the backbone with the composer's LoRA psi
(gradient recorded), the QFormer compressor reads the hidden states, the frozen cold-start
composer phi_0 (a second LoRA on the same backbone) encodes the same inputs for the anchor, and
one backward runs from the latents. This script times each of those parts on a randomly
initialised backbone of a real shape (no download), plus the same forward with the adapters
disabled (the frozen weights alone: the LoRA's own cost is the difference), and divides each
part's matmul FLOPs (``benchmarks/step_meter.py``, counted exactly) by a measured matmul rate
(per wall second and per CPU second: on a GPU the wall ratio is the one to read)::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_composer.py --shape smollm2-135m \\
        --J 3 --tokens 512 --K 32 --depth 8

Times are medians over ``--repeats`` runs of each part, as wall and as the process's CPU time
(one thread on a shared machine: the CPU seconds are the comparable figure).
"""
from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.bench_step import SHAPES, random_model
from benchmarks.step_meter import Meter, matmul_rate, now, since, sync
from stages.core.models.backbone import resolve_device_dtype
from stages.core.models.composer import Composer, adapter_scope, base_model


# the parts one update runs (the others are references: the frozen weights alone, psi without a graph)
UPDATE = ("encoder forward with psi, graph (trained)", "QFormer forward (trained)", "backward (encoder + QFormer)",
          "anchor phi_0 forward, no graph")


def parts(composer: Composer, anchor: Composer, ids_NL: torch.Tensor, mask_NL: torch.Tensor) -> dict:
    """The update's parts as zero-argument calls, in order (each leaves what the next reads)."""
    decoder = base_model(composer.backbone).get_decoder()
    state: dict = {}

    def encoder(adapter: str | None, grad: bool):
        def run():
            with torch.set_grad_enabled(grad), adapter_scope(composer.backbone, adapter):
                hidden = decoder(input_ids=ids_NL, attention_mask=mask_NL.long(), use_cache=False).last_hidden_state
            if grad:
                state["hidden"] = hidden
        return run

    def compressor():
        state["latents"] = composer.compressor(state["hidden"], mask_NL)

    def anchor_forward():
        with torch.no_grad():
            anchor.encode(ids_NL, mask_NL)

    def backward():
        state["latents"].backward(torch.ones_like(state["latents"]))
        composer.backbone.zero_grad(set_to_none=True)
        composer.compressor.zero_grad(set_to_none=True)

    return {"backbone forward, adapters off, no graph": encoder(None, False),
            "encoder forward with psi, no graph": encoder(composer.adapter_name, False),
            "encoder forward with psi, graph (trained)": encoder(composer.adapter_name, True),
            "QFormer forward (trained)": compressor,
            "backward (encoder + QFormer)": backward,
            "anchor phi_0 forward, no graph": anchor_forward}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", help="(default: bfloat16 on cuda, else float32)")
    parser.add_argument("--layers", type=int, help="override the number of decoder layers (smoke runs)")
    parser.add_argument("--rows", type=int, default=1, help="distinct composer inputs (tasks) per update")
    parser.add_argument("--J", type=int, default=3, help="experiences per task")
    parser.add_argument("--tokens", type=int, default=512, help="tokens of each composer input (max_exp_tokens)")
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--depth", type=int, default=8, help="QFormer block applications")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul-n", type=int, help="side of the timed square matmul (default: 8192 cuda, 1024 cpu)")
    args = parser.parse_args(argv)
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    rate = matmul_rate(device, dtype, args.matmul_n or (8192 if torch.device(device).type == "cuda" else 1024))
    backbone = random_model(args.shape, args.layers, dtype, device)
    composer = Composer(backbone, J=args.J, K=args.K, depth=args.depth, max_exp_tokens=args.tokens)
    anchor = Composer(composer.backbone, J=args.J, K=args.K, depth=args.depth, max_exp_tokens=args.tokens,
                      adapter_name="anchor")
    for p in anchor.trainable_parameters():  # phi_0 is frozen, as LOPD loads it
        p.requires_grad_(False)
    for lora in (composer, anchor):  # LoRA B starts at zero; a trained adapter is not
        for name, p in composer.backbone.named_parameters():
            if f"lora_B.{lora.adapter_name}." in name:
                torch.nn.init.normal_(p.data, std=0.01)
    vocab = SHAPES[args.shape][1]["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    ids_NL = torch.randint(4, vocab, (args.rows * args.J, args.tokens), generator=generator).to(device)
    mask_NL = torch.ones_like(ids_NL, dtype=torch.bool)
    meter = Meter(device)
    meter.watch(composer.backbone)
    meter.watch_compressor(composer.compressor)
    meter.watch_compressor(anchor.compressor)
    print(f"bench_composer: {args.shape} shape, random weights, {device} {dtype}, {torch.get_num_threads()} threads; "
          f"{args.rows} task(s) x J {args.J} inputs of {args.tokens} tokens, K {args.K}, QFormer depth {args.depth}; "
          f"matmul {rate[0] / 1e12:.3f} TFLOP/s ({rate[1] / 1e12:.3f} per CPU second)")
    rows = []
    calls = parts(composer, anchor, ids_NL, mask_NL)
    timings: dict[str, list[tuple[float, float, float]]] = {name: [] for name in calls}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, call in calls.items():
            meter.reset()
            sync(device)
            t0 = now()
            call()
            sync(device)
            timings[name].append((*since(t0), meter.forward_flops, meter.backward_flops))
    backward = "backward (encoder + QFormer)"  # its FLOPs are counted where the forwards it follows ran
    flops = {name: runs[-1][2] for name, runs in timings.items()}
    flops[backward] = sum(runs[-1][3] for runs in timings.values())
    print("| part | wall s | CPU s | GFLOP | wall / bound | CPU / bound |\n|---|---|---|---|---|---|")
    for name, runs in timings.items():
        wall, cpu = (statistics.median(r[i] for r in runs[1:]) for i in (0, 1))
        bound_wall, bound_cpu = flops[name] / rate[0], flops[name] / rate[1]
        rows.append({"part": name, "update": name in UPDATE, "wall_s": wall, "cpu_s": cpu, "flops": flops[name],
                     "bound_wall_s": bound_wall, "bound_cpu_s": bound_cpu})
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {flops[name] / 1e9:,.1f} | {wall / bound_wall:.2f}x | "
              f"{cpu / bound_cpu:.2f}x |")
    return rows


if __name__ == "__main__":
    main()
