"""Seconds and peak memory of one cold-start step: the plain action NLL against the text KL over the
full vocabulary (the text teacher run at every step) and over its top-M tokens with the targets kept
per training target (`--text-kl-top-m`: computed on a target's first visit, read back after).

Each variant runs in a fresh process (its own peak RSS), sets up a real `lopd coldstart` run on the
given store and backbone, and times `--steps` loss steps (each a new batch of targets); the kept
variant then times the same steps again (every target seen: the steady state of later epochs).
CPU seconds (`time.process_time`, one thread) are the figure to compare on a shared machine.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_coldstart_step.py \\
        --store runs/bed-v2/store --model runs/bed-v2/sft0/final/student --steps 6
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "action-nll": {},
    "text-kl (full vocabulary)": {"text_kl_weight": 1.0},
    "text-kl (top-64, kept)": {"text_kl_weight": 1.0, "text_kl_top_m": 64},
}


def measure(variant: str, store: str, model: str, steps: int) -> dict:
    """One variant in this process: CPU and wall seconds per step (and per kept-target step)."""
    import torch

    from stages.coldstart.recipe import Coldstart
    from stages.coldstart.settings import ColdstartConfig

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        # steps far beyond the timed ones: a run's last step scores the held-out targets four ways
        config = ColdstartConfig(experiences=store, out=out, model=model, steps=1_000_000, J=2, K=8, depth=2,
                                 max_exp_tokens=192, lr=1e-4, batch_size=2, self_retrieval=True, memory_norm="token",
                                 placement="framed", activation_checkpointing=False, ladder=False,
                                 heldout_fraction=0.2, eval_every=1_000_000, checkpoint_every=1_000_000,
                                 **VARIANTS[variant])
        run = Coldstart(config)
        passes = {}
        for name in ("first visit", "kept") if config.text_kl_top_m else ("first visit",):
            cpu, wall = [], []
            for step in range(steps):
                c0, w0 = time.process_time(), time.perf_counter()
                run.loss_step(step)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
            passes[name] = {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall)}
    return {"variant": variant, **passes, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: measure this variant
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.store, args.model, args.steps)))
        return
    rows = []
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--store", args.store, "--model", args.model,
                              "--steps", str(args.steps), "--one", variant], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["first visit"]["cpu_s"]
    print("| variant | CPU s/step (first visit) | CPU s/step (kept) | x action-nll | peak RSS MB |")
    print("|---|---|---|---|---|")
    for r in rows:
        kept = r.get("kept", r["first visit"])["cpu_s"]
        print(f"| {r['variant']} | {r['first visit']['cpu_s']:.2f} | {kept:.2f} | {kept / base:.2f} | "
              f"{r['peak_rss_mb']:.0f} |")
    print(f"\n(median of {args.steps} steps each; {Path(args.model).name} backbone; J 2, K 8, depth 2, batch 2)")


if __name__ == "__main__":
    main()
