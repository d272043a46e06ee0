"""Peak resident memory of every method's distill step, by phase, and what its tensors hold.

Each method runs ``--steps`` steps of `lopd distill` on BFCL (the defaults of `lopd distill`:
SmolLM2-135M-Instruct, float32, LoRA rank 8, 2 tasks x 2 rollouts, 256 new tokens, micro-batch
4, no ``max_len``; LOPD with its cold-start composer and that composer's J and K) in a child process of its own, once per
``--mmap-thresholds`` value: ``glibc`` (glibc's own dynamic mmap threshold: lopd before it set
one), ``lopd`` (what the training stages set, :func:`stages.core.run.resources.map_large_blocks`)
or bytes for ``MALLOC_MMAP_THRESHOLD_`` (65536: every block above 64 KiB is a mapping of its own,
returned to the OS when freed, so the resident set follows the live tensors; the difference to
``glibc`` is memory the allocator keeps, not tensors). Per step the child resets the kernel's
resident high-water mark (``/proc/self/clear_refs`` = 5, Linux) before the rollout and again
before the training part (retrieval, teacher and student forwards, backward, optimizer, weight
sync, store append), and reads ``VmHWM`` after each, so a phase's peak is its own. ``tensors
held`` is the bytes of every distinct tensor storage Python can reach after set-up (weights of
every model copy, LoRA and composer, optimizer state), counted with :mod:`gc`.

    python benchmarks/bench_method_memory.py --store runs/study-bfcl-cpu-prep/store \\
        --composer runs/study-bfcl-cpu-prep/composer0/final --threads 1

The store is the BFCL train references (``lopd collect --env bfcl --split train --reference``),
copied per child; ``--composer`` the cold-start composer LOPD needs. Results and the exact run:
docs/results/method-memory.md.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stages.core.run.resources import reset_peak_rss, status_mb

METHODS = ("lopd", "grpo", "opsd", "sdft", "sdpo", "skill-sd")


def _tensor_mb() -> float:
    """Bytes of the distinct storages of every tensor the garbage collector can reach, in MiB."""
    import torch

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and not obj.is_meta:
            storage = obj.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()) / 2**20


def _longest_row(distiller) -> int:
    """Tokens of the step's longest training sequence."""
    from stages.core.data.rows import training_rows

    rows, _ = training_rows(distiller.student.tokenizer, [t for t in distiller.step_trajectories if t.turns],
                            max_len=distiller.config.max_len)
    return max((len(r.ids_T) for r in rows), default=0)


def child(args: argparse.Namespace) -> dict:
    """Set up one method's Distiller, run ``args.steps`` steps with per-phase peaks, return them."""
    import torch

    from stages.distill import recipe as distill
    from stages.core.run import resources

    torch.set_num_threads(args.threads)
    if args.mmap_threshold == "glibc":
        resources.map_large_blocks = lambda *_, **__: False
    root = Path(tempfile.mkdtemp(prefix="method-memory-"))
    store = root / "store"
    shutil.copytree(args.store, store)
    options = {}
    if args.method == "lopd":  # J and K of the composer's cold start
        composer = json.loads((Path(args.composer) / "composer_config.json").read_text())
        options = {"composer": args.composer, "J": composer["J"], "K": composer["K"]}
    config = distill.DistillConfig(env="bfcl", store=str(store), out=str(root / "run"), method=args.method,
                                   steps=args.steps, seed=0, checkpoint_every=args.steps + 1, **options).resolved()
    distiller = distill.Distiller(config)
    gc.collect()
    result = {"method": args.method, "setup_rss_mb": status_mb("VmRSS"), "tensors_mb": _tensor_mb(), "steps": []}
    rollout = distiller._rollout
    phases: dict[str, float] = {}

    def timed_rollout(step, stats):  # the rollout's own peak, then a fresh mark for the rest of the step
        trajectories = rollout(step, stats)
        phases["rollout_peak_mb"] = status_mb("VmHWM")
        reset_peak_rss()
        return trajectories

    distiller._rollout = timed_rollout
    for step in range(1, args.steps + 1):
        reset_peak_rss()
        cpu0 = time.process_time()
        row = distiller.train_step(step)
        result["steps"].append({**phases, "train_peak_mb": status_mb("VmHWM"), "rss_after_mb": status_mb("VmRSS"),
                                "action_tokens": row["action_tokens"], "skipped_rows": row["skipped_rows"],
                                "seconds": row["seconds"], "cpu_s": time.process_time() - cpu0,
                                "longest_row": _longest_row(distiller)})
    shutil.rmtree(root, ignore_errors=True)
    return result


def run_child(args: argparse.Namespace, method: str, threshold: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if threshold not in ("glibc", "lopd"):
        env["MALLOC_MMAP_THRESHOLD_"] = threshold
    cmd = [sys.executable, __file__, "--child", method, "--store", args.store, "--steps", str(args.steps),
           "--threads", str(args.threads), "--mmap-thresholds", threshold] + (["--composer", args.composer] if args.composer else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{method}: child failed\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> str:
    """One row per (method, mmap threshold): the largest peaks over the steps, the summed CPU time."""
    lines = ["| method | MALLOC_MMAP_THRESHOLD_ | tensors held after set-up (MiB) | RSS after set-up (MiB) | "
             "rollout peak (MiB) | training peak (MiB) | longest row (tokens) | CPU s of the steps |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        steps = r["steps"]
        lines.append(f"| {r['method']} | {r['mmap_threshold']} | {r['tensors_mb']:,.0f} | {r['setup_rss_mb']:,.0f} | "
                     f"{max(s['rollout_peak_mb'] for s in steps):,.0f} | {max(s['train_peak_mb'] for s in steps):,.0f} | "
                     f"{max(s['longest_row'] for s in steps)} | {sum(s['cpu_s'] for s in steps):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="BFCL train references (lopd collect --reference)")
    parser.add_argument("--composer", help="cold-start composer folder (LOPD)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mmap-thresholds", default="glibc,lopd,65536",
                        help="one child each: glibc (its dynamic threshold), lopd (the stages' setting) or "
                             "MALLOC_MMAP_THRESHOLD_ bytes")
    parser.add_argument("--out", default="method-memory.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.method, args.mmap_threshold = args.child, args.mmap_thresholds
        print(json.dumps(child(args)))
        return
    results = []
    for method in args.methods.split(","):
        for threshold in args.mmap_thresholds.split(","):
            r = {**run_child(args, method, threshold), "mmap_threshold": threshold}
            results.append(r)
            print(json.dumps(r), flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
