"""examples/study/bed_v2_verdicts.py: the bed-v2 hypotheses read off a results.json (synthetic here)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bed_v2_verdicts", Path(__file__).resolve().parents[1] / "examples" / "study" / "bed_v2_verdicts.py")
verdicts_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(verdicts_mod)

N = 40


def _report(successes: list[bool], calls: int = 2) -> dict:
    return {"per_task": [{"task_id": f"t{i}", "success": s, "reward": float(s), "steps": 2, "tool_calls": calls,
                          "repeated_calls": calls - 2} for i, s in enumerate(successes)]}


def _results(runs: dict[tuple[str, int], list[bool]], base: list[bool]) -> dict:
    finished = {f"{r}-seed{s}": {"run": r, "seed": s, "finals": {"lopd-bed": _report(v, 2 if r == "lopd" else 4)}}
                for (r, s), v in runs.items()}
    return {"finished": finished, "base_finals": {"lopd-bed": _report(base)}, "evaluations": []}


def test_lopd_above_vanilla_and_a_one_seed_run_meets_lopds_seed_0_only():
    base = [False] * N
    lopd0 = [i < 20 for i in range(N)]
    lopd1 = [False] * N  # seed 1 learned nothing: a seed average would halve the gain
    results = _results({("lopd", 0): lopd0, ("lopd", 1): lopd1, ("lopd-composer-v1", 0): lopd0}, base)
    d = verdicts_mod.diff(results, "lopd", "vanilla")
    assert d["mean"] == pytest.approx(0.25) and d["up"] == 20 and verdicts_mod.above(d) == "holds"
    same = verdicts_mod.diff(results, "lopd", "lopd-composer-v1")  # seed 0 against seed 0: identical
    assert same["mean"] == 0 and same["up"] == same["down"] == 0 and verdicts_mod.above(same) == "not shown"


def test_pending_runs_and_the_behaviour_hypothesis():
    lopd = [i % 2 == 0 for i in range(N)]
    results = _results({("lopd", 0): lopd, ("lopd", 1): lopd, ("grpo", 0): lopd, ("grpo", 1): lopd}, [False] * N)
    table = dict((h[:1], (e, v)) for h, e, v in verdicts_mod.verdicts(results))
    assert table["6"][1] == "pending" and "lopd-text" in table["6"][0]
    assert table["8"][1] == "holds"  # GRPO makes 4 calls per task, LOPD 2: fewer calls per step and repeats
    assert table["2"][1] == "not contradicted (within 2 SE)"


def test_the_reference_line_pairs_lopd_with_copy_nearest_on_the_same_tasks():
    lopd = [i < 30 for i in range(N)]
    results = _results({("lopd", 0): lopd}, [False] * N)
    copied = [i < 10 for i in range(N)]
    reference = {"splits": {"test": {"n": N, "success_rate": 0.25, "success_rate_se": 0.07,
                                     "rows": [{"task_id": f"t{i}", "success": s} for i, s in enumerate(copied)]}}}
    lines = verdicts_mod.reference_lines(results, reference)
    assert lines[-1] == "- `test`: copy-nearest 0.250 ± 0.070 (n 40); LOPD - copy-nearest = +0.500 ± 0.080 (20 up, 0 down)"
