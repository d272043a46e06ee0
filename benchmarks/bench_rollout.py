"""Seconds per rollout call of the ``hf`` engine at a real backbone shape, by decoding mode.

On a GPU, transformers' ``generate`` compiles the decoding forward with ``torch.compile`` when it
is handed a ``StaticCache``, which the engine's prefix-cached path does; every new cache shape
compiles again. This benchmark times the engine's ``generate`` calls of a LoRA student (random
weights, :func:`benchmarks.bench_step.random_model`) in each mode, each mode in its own process
(dynamo's caches and recompile counts are per process), under ``--timeout`` seconds:

* ``eager``: prefix cache on, ``compile_decode=False`` (``disable_compile``): no compilation.
* ``compile``: prefix cache on, ``compile_decode=True``: the static cache's length rounded up to
  a multiple of ``COMPILED_CACHE_MULTIPLE``.
* ``compile-exact``: as ``compile`` with the length not rounded (every call a new shape).
* ``compile-dynamic``: as ``compile``, compiled with ``dynamic=True`` (one graph for all shapes).
* ``no-prefix-cache``: the plain ``generate`` path (a ``DynamicCache``, never compiled).
* ``plain-linear``: as ``eager`` with every linear layer through ``F.linear`` (on a CPU the engine
  computes a product of at most ``FEW_ROWS`` rows as ``(W @ x.T).T``: decode steps of few rows).

transformers compiles on a GPU only: on a CPU the compile modes decode eagerly (with the
rounded cache) and sample the same tokens as ``eager``.

Each call rolls out ``--batch`` rows: ``--group-size`` rows per task share their whole prompt, all
tasks share a system prompt, and every call has new tasks of a different length
(``--task-len`` + 13 x call), as a run's steps do. Between calls the engine's cache is dropped,
as distill does before each update. Printed: one row per mode, the first call (compilation
included) and the median of the later calls, generated tokens/s and peak GPU memory::

    PYTHONPATH=. python benchmarks/bench_rollout.py --shape qwen3-4b               # one GPU
    PYTHONPATH=. python benchmarks/bench_rollout.py --shape smollm2-135m --layers 2 --device cpu \\
        --prompt-len 64 --task-len 16 --response-len 8 --batch 4 --calls 2 --modes eager no-prefix-cache
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODES = ("eager", "compile", "compile-exact", "compile-dynamic", "no-prefix-cache", "plain-linear")


def run_mode(args: argparse.Namespace) -> None:
    """The child: build the student and engine of ``args.mode``, then print one JSON line per call."""
    import torch

    from benchmarks.bench_step import SHAPES, random_model, word_tokenizer, words
    from stages.core.models.backbone import resolve_device_dtype
    from stages.core.models.composer import add_lora_adapter
    from stages.engines import SamplingParams
    from stages.engines import prefix_cache as prefix_cache_module
    from stages.engines.hf import HFRolloutEngine
    from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS

    device, dtype = resolve_device_dtype(args.device, args.dtype)
    vocab = SHAPES[args.shape][1]["vocab_size"]
    tokenizer = word_tokenizer(vocab)
    model = random_model(args.shape, args.layers, dtype, device).requires_grad_(False)
    model = add_lora_adapter(model, "student", args.lora_rank, 2 * args.lora_rank)
    engine = HFRolloutEngine(model.eval(), tokenizer, adapter="student", batch_size=args.batch,
                             prefix_cache_tokens=0 if args.mode == "no-prefix-cache" else PREFIX_CACHE_TOKENS,
                             compile_decode=args.mode.startswith("compile"))
    if args.mode == "plain-linear":
        import stages.engines.hf as hf

        mock.patch.object(hf, "FEW_ROWS", 0).start()
    if args.mode == "compile-exact":
        mock.patch.object(prefix_cache_module, "COMPILED_CACHE_MULTIPLE", 1).start()
    if args.mode == "compile-dynamic":
        from transformers import CompileConfig

        import stages.engines.hf as hf

        plain = hf.generation_config

        def dynamic(*a, **k):
            config = plain(*a, **k)
            config.compile_config = CompileConfig(dynamic=True)
            return config
        mock.patch.object(hf, "generation_config", dynamic).start()
    rng = random.Random(0)
    system = words(rng, args.prompt_len - args.task_len, vocab)
    for call in range(args.calls):
        batch = args.batches[call % len(args.batches)] if args.batches else args.batch
        task_len = args.task_lens[call % len(args.task_lens)] if args.task_lens else args.task_len + 13 * call
        group = min(args.group_size, batch)
        prompts = []
        for _ in range(max(1, batch // group)):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": words(rng, task_len, vocab)}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            prompts += [list(ids)] * group
        params = SamplingParams(temperature=0.7, top_p=0.95, top_k=20, max_new_tokens=args.response_len, seed=call)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        generations = engine.generate(prompts, params)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        engine.sleep()
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0
        generated = sum(len(g.token_ids) for g in generations)
        print(json.dumps({"call": call, "rows": len(prompts), "seconds": seconds, "generated": generated,
                          "prompt": len(prompts[0]), "peak_gib": peak}), flush=True)


def measure(args: argparse.Namespace, argv: list[str], mode: str) -> tuple[list[dict], str]:
    """Run ``mode`` in a child process (``argv``: the benchmark's arguments); its finished calls
    and how it ended."""
    command = [sys.executable, __file__, "--child", mode, *argv]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        out, status = done.stdout, "ok" if done.returncode == 0 else f"exit {done.returncode}"
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
    except subprocess.TimeoutExpired as stop:
        out = stop.stdout.decode() if isinstance(stop.stdout, bytes) else (stop.stdout or "")
        status = f"stopped at {args.timeout} s"
    calls = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return calls, status


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-4b", help="a shape of benchmarks/bench_step.py")
    parser.add_argument("--layers", type=int, help="override the number of decoder layers (smoke runs)")
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--prompt-len", type=int, default=1024, help="prompt words (= tokens) of the first call")
    parser.add_argument("--task-len", type=int, default=128, help="words of the task text (the rest is shared)")
    parser.add_argument("--response-len", type=int, default=256, help="max new tokens per row")
    parser.add_argument("--batch", type=int, default=8, help="rows per call (the engine's batch)")
    parser.add_argument("--group-size", type=int, default=4, help="rows per task")
    parser.add_argument("--batches", type=int, nargs="+", help="rows of each call, cycled (default: --batch)")
    parser.add_argument("--task-lens", type=int, nargs="+",
                        help="task words of each call, cycled (default: --task-len + 13 x call)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4, help="generate calls per mode (the first one warms up)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=[m for m in MODES if m != "plain-linear"],
                        help="default: all but plain-linear (on a GPU the same as eager)")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per mode (its process is stopped)")
    parser.add_argument("--child", choices=MODES, dest="mode", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.mode:
        run_mode(args)
        return []
    rows = []
    print("| mode | first call s | later calls s (median) | generated tokens/s (later) | peak GiB | calls | ended |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes:
        calls, status = measure(args, argv, mode)
        later = calls[1:]
        median = statistics.median(c["seconds"] for c in later) if later else float("nan")
        rate = sum(c["generated"] for c in later) / sum(c["seconds"] for c in later) if later else float("nan")
        first = f"{calls[0]['seconds']:.2f}" if calls else "-"
        peak = max((c["peak_gib"] for c in calls), default=0.0)
        each = ", ".join(f"{c['seconds']:.2f}" + (f" [{c['rows']} x {c['prompt']}]" if args.batches or args.task_lens
                                                      else "") for c in later)
        print(f"| {mode} | {first} | {median:.2f} ({each}) | {rate:,.0f} "
              f"| {peak:.1f} | {len(calls)} | {status} |", flush=True)
        rows.append({"mode": mode, "calls": calls, "status": status})
    return rows


if __name__ == "__main__":
    main()
