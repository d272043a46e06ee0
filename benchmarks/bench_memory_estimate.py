"""`lopd plan`'s step estimate against the measured peak of real distill steps (CPU).

Each grid point is one `Distiller.train_step` (rollout, teacher and student forwards, loss,
backward, optimizer, weight sync, store append) in a fresh child process on the one-turn
environment of benchmarks/bench_vs_trl.py: SmolLM2-135M-Instruct, float32, LoRA rank 8,
``--batch`` tasks x ``--generations`` rollouts = one micro-batch, chat-templated prompts of at
most ``prompt`` tokens, at most ``response`` sampled tokens (temperature 1), references of
``--context`` tokens in the store (OPSD's and SDFT's demonstrations, LOPD's retrieved
experiences, J=3 of at most ``--max-exp-tokens`` tokens, K=32, an untrained composer of the
cold-start shape). ``max_len`` is ``prompt + response``, so every row fits it.

Measured: the kernel's resident high-water mark (``VmHWM``) over the step, reset just before
it (``/proc/self/clear_refs`` = 5, Linux): the whole process (weights, libraries, the store's
embedder, activations, allocator slack). Estimated: the peak of :func:`stages.plan.plan` for the
run's settings (:func:`stages.plan.run_plan_input`, what `lopd distill`'s pre-flight compares
with the free memory) on this device. The children run one at a time; peaks do not depend on
CPU contention, so a shared machine gives the same bytes.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_memory_estimate.py --json runs/memest.json
    # the estimates of other code (e.g. stages/ of an older commit) for the same measured steps
    PYTHONPATH=/tmp/base python benchmarks/bench_memory_estimate.py --estimate runs/memest.json

Results: docs/results/memory-estimate.md.
"""
from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# (method, tasks, generations per task, prompt tokens, response tokens)
GRID = [("opsd", 2, 1, 128, 64), ("opsd", 8, 1, 128, 64), ("opsd", 16, 1, 128, 64), ("opsd", 4, 1, 512, 64),
        ("grpo", 2, 1, 128, 64), ("sdft", 8, 1, 128, 64), ("lopd", 2, 1, 128, 64),
        ("opsd", 2, 8, 128, 64),  # benchmarks/bench_vs_trl.py --generations 8: 16 rows, 8 per prompt
        ("opsd", 8, 1, 512, 64), ("grpo", 8, 1, 128, 64), ("lopd", 8, 1, 128, 64)]
CONTEXT_TOKENS, MAX_EXP_TOKENS = 256, 192


def child(method: str, tasks: int, generations: int, prompt: int, response: int, threads: int) -> dict:
    """One step of ``method`` in this process; its peak and the settings the estimate needs."""
    import io

    import torch
    from rich.console import Console

    import bench_vs_trl as bench
    from stages.core.run.resources import reset_peak_rss, status_mb
    from stages.distill.recipe import DistillConfig, Distiller
    from stages.methods import get_method

    torch.set_num_threads(threads)
    root = Path(tempfile.mkdtemp(prefix="memest-"))
    spec_args = argparse.Namespace(model="smollm2-135m", tasks=max(tasks, 8), prompt=prompt, context=CONTEXT_TOKENS,
                                   batch=tasks, response=response, warmup=0, rounds=1, threads=threads,
                                   generations=generations, profile=0)
    spec, _ = bench.prepare(spec_args, root)
    options = {"opsd": {"reduction": "sequence"}, "sdft": {}, "grpo": {},
               "lopd": {"composer": str(root / "composer"), "max_exp_tokens": MAX_EXP_TOKENS}}[method]
    rows = tasks * generations
    config = DistillConfig(method=method, env=bench.BENCH_ENV, data_dir=str(root), store=str(root / "store-lopd-opsd"),
                           out=str(root / "out"), model=spec.model_path, steps=1, tasks_per_step=tasks,
                           group_size=generations, max_turns=1, max_new_tokens=response, temperature=1.0, top_p=1.0,
                           student_lora_rank=8, micro_batch=rows, rollout_batch=rows, max_len=prompt + response,
                           checkpoint_every=2, run_id="memest", **options).resolved()
    if method == "lopd":  # the pre-flight of the code under test must not stop the measurement
        get_method("lopd").check_resources = lambda self, store: None
    distiller = Distiller(config, console=Console(file=io.StringIO()))
    setup_mb = status_mb("VmRSS")
    reset_peak_rss()
    metrics = distiller.train_step(1)
    peak_mb = status_mb("VmHWM")
    lengths = [len(r.ids_T) for r in bench_rows(distiller)]
    return {"method": method, "tasks": tasks, "generations": generations, "prompt": prompt, "response": response,
            "micro_batch": rows, "max_len": prompt + response, "longest_row": max(lengths),
            "action_tokens": int(metrics.get("action_tokens", 0)), "setup_mb": setup_mb, "peak_mb": peak_mb,
            "config": config.model_dump(mode="json"), "options": distiller.method.options.model_dump(mode="json")}


def bench_rows(distiller) -> list:
    """The step's training rows (as the trainer built them)."""
    from stages.core.data.rows import training_rows

    rows, _ = training_rows(distiller.student.tokenizer, [t for t in distiller.step_trajectories if t.turns],
                            max_len=distiller.config.max_len)
    return rows


def estimate_mb(result: dict) -> float:
    """The pre-flight's planned peak for the measured run's settings, in MiB."""
    from stages.distill.settings import DistillConfig
    from stages.plan import plan, run_plan_input

    config = DistillConfig.model_validate({**result["config"], "options": result["options"]})  # resolved options
    cpu = {"device": "cpu"} if "device" in inspect.signature(run_plan_input).parameters else {}  # older code: none
    p = run_plan_input(config, nproc=1, dtype="float32", available_bytes=0, **cpu)
    return plan(p).peak / 2**20


def table(results: list[dict]) -> str:
    lines = ["| method | tasks x rollouts | prompt + response tokens (longest row) | measured peak MiB | "
             "estimate MiB | estimate / measured |", "|---|---|---|---|---|---|"]
    for r in results:
        est = estimate_mb(r)
        lines.append(f"| {r['method']} | {r['tasks']} x {r['generations']} | {r['prompt']} + {r['response']} "
                     f"({r['longest_row']}) | {r['peak_mb']:,.0f} | {est:,.0f} | {est / r['peak_mb']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the measured steps here (one object per grid point)")
    parser.add_argument("--estimate", help="only print the table for the steps measured in this file")
    parser.add_argument("--only", type=int, nargs="+", help="grid points by index, run in this order (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        method, *sizes = args.child
        print(json.dumps(child(method, *map(int, sizes[:4]), threads=int(sizes[4]))))
        return
    if args.estimate:
        print(table(json.loads(Path(args.estimate).read_text())))
        return
    results = []
    for point in [GRID[i] for i in args.only] if args.only else GRID:
        done = subprocess.run([sys.executable, __file__, "--child", *map(str, point), str(args.threads)],
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"grid point {point} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{point}: peak {results[-1]['peak_mb']:.0f} MiB, longest row {results[-1]['longest_row']}",
              file=sys.stderr, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
