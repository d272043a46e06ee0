"""Benchmark the cost of OS isolation per sandboxed program.

Runs ``run_python("print(1)")`` alternately with isolation (bubblewrap) and with the unisolated
fallback that ``--unsafe-exec`` allows where isolation is missing (audit hook, rlimits,
``unshare --net``), interleaved so that machine load affects both alike, plus the bare commands
underneath.

Usage: ``PYTHONPATH=. python benchmarks/bench_sandbox.py [--runs 40]``. Prints a markdown table of
median and p90 wall-clock milliseconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from stages.core.exec import isolation, sandbox


_REQUIRE = isolation.require


def _isolated(on: bool) -> None:
    """Isolated runs, or the fallback that ``--unsafe-exec`` allows where isolation is missing."""
    isolation.require = _REQUIRE if on else (lambda: False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    runs = ap.parse_args().runs
    if not isolation.available():
        raise SystemExit(f"no isolation here: {isolation.unavailable_reason()}")
    py = [sys.executable, "-I", "-B", "-c", "pass"]
    cases = {
        "run_python, isolated": lambda: (_isolated(True), sandbox.run_python("print(1)")),
        "run_python, unisolated fallback": lambda: (_isolated(False), sandbox.run_python("print(1)")),
        "bare `python -I -c pass`": lambda: subprocess.run(py, env=isolation.base_env()),
        "bwrap + setpriv + prlimit + `python -I -c pass`": lambda: subprocess.run(
            isolation.wrap(py), env=isolation.base_env()),
        "bwrap + setpriv + prlimit + `/bin/true`": lambda: subprocess.run(
            isolation.wrap(["/bin/true"]), env=isolation.base_env()),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, case in cases.items():
            t0 = time.perf_counter()
            case()
            times[name].append((time.perf_counter() - t0) * 1000)
    _isolated(True)
    print(f"| {runs} runs each, interleaved | median ms | p90 ms |\n|---|---|---|")
    for name, ts in times.items():
        ts.sort()
        print(f"| {name} | {statistics.median(ts):.1f} | {ts[int(0.9 * len(ts))]:.1f} |")


if __name__ == "__main__":
    main()
