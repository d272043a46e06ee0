"""Rollout engine with and without prefix caching on BFCL-v3 multi-turn prompts.

Plays the first steps of real BFCL-v3 multi-turn episodes (package data, one task per category)
with greedy decoding, once with ``prefix_cache_tokens=0`` and once with the default cache, and
prints seconds per engine, prompt tokens encoded vs served from the cache, and whether the
completions are identical.

    PYTHONPATH=. python benchmarks/bench_prefix_cache.py --steps 2 --max-new-tokens 32
"""
from __future__ import annotations

import argparse
import time

from stages.benches import BENCHES
from stages.core.models.backbone import load_policy
from stages.engines import SamplingParams
from stages.engines.hf import HFRolloutEngine
from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS
from stages.engines.rollout import RolloutStats, play
from stages.evaluate import EvaluateConfig


def rollout(engine, tokenizer, bench_run, params: SamplingParams) -> tuple[float, list[str]]:
    """Seconds to play every task of ``bench_run``, and every action text in task order."""
    t0 = time.perf_counter()
    trajs = list(play(engine, tokenizer, bench_run.env_factory, bench_run.tasks, samples_per_task=1,
                      params=params, policy_id="bench", run_id="bench", max_concurrent=len(bench_run.tasks),
                      stats=RolloutStats()))
    trajs.sort(key=lambda t: t.task_id)
    return time.perf_counter() - t0, [turn.action for t in trajs for turn in t.turns]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=2, help="agent actions per episode (step cap)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    model, tokenizer = load_policy(args.model)
    bench_run = BENCHES["bfcl-v3"].prepare(EvaluateConfig(bench="bfcl-v3", limit=1, max_turns=args.steps))
    params = SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens)
    results = {}
    for budget in (0, PREFIX_CACHE_TOKENS):
        engine = HFRolloutEngine(model, tokenizer, batch_size=len(bench_run.tasks), prefix_cache_tokens=budget)
        seconds, actions = rollout(engine, tokenizer, bench_run, params)
        cache = engine.prefix_cache
        counts = f"encoded {cache.miss_tokens}, from cache {cache.hit_tokens}" if cache else "all encoded"
        print(f"prefix_cache_tokens={budget}: {seconds:.1f} s, {len(actions)} actions, prompt tokens {counts}")
        results[budget] = (seconds, actions)
    (plain_s, plain_actions), (cached_s, cached_actions) = results[0], results[PREFIX_CACHE_TOKENS]
    print(f"speed-up {plain_s / cached_s:.2f}x; identical actions: {plain_actions == cached_actions}")


if __name__ == "__main__":
    main()
