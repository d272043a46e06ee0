"""The whole-tree memory probe: a sandboxed program forks 6 children that each write 700 MB,
under ``memory_mb=1024``; how much the tree held at its peak, and how it ended.

An outside sampler sums the resident memory of every process this one started (the sandbox's
tree) every 5 ms, whatever mechanism caps the tree (:mod:`stages.core.exec.tree_memory`). Runs the best
mechanism of this machine, then the summed-memory watchdog (forced), ``--runs`` times each.

Usage (with bubblewrap): ``PYTHONPATH=. python benchmarks/bench_tree_memory.py [--runs 5]``.
Prints a markdown table: mechanism, runs, status, peak held MiB (mean, max), seconds to the end.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from stages.core.exec import isolation, tree_memory
from stages.core.exec.sandbox import run_python
from tests.test_sandbox_tree_memory import TREE, _Sampler


def probe() -> tuple[str, float, float]:
    """(status: reason, peak MiB held by the tree, seconds) of one run of the probe."""
    start = time.monotonic()
    with _Sampler() as sampler:
        res = run_python(TREE.format(children=6, mb=700), memory_mb=1024, audit_hook=False, timeout_s=60)
    return f"{res.status}: {res.reason}", sampler.peak_mb, time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    if not isolation.available():
        raise SystemExit(f"needs bubblewrap isolation: {isolation.unavailable_reason()}")
    print("| mechanism | runs | ended | peak held MiB (mean / max) | seconds (mean) |")
    print("|---|---|---|---|---|")
    for forced in ("", "rss-watchdog"):
        os.environ[tree_memory.FORCE_VAR] = forced
        tree_memory.mechanism.cache_clear()
        kind = tree_memory.mechanism()[0]
        results = [probe() for _ in range(runs)]
        ended = sorted({r[0] for r in results})
        peaks = [r[1] for r in results]
        print(f"| {kind} | {runs} | {'; '.join(ended)} | {statistics.mean(peaks):.0f} / {max(peaks):.0f} | "
              f"{statistics.mean(r[2] for r in results):.2f} |")


if __name__ == "__main__":
    main()
