"""The bed version 2 study's hypotheses (docs/study.md, "Hypotheses of the bed version 2 study"), read off
its results.json alone: per hypothesis the paired difference over the same tasks with its standard
error, the seeds' spread, and the verdict. Written before the study's first run, so the reading of
every hypothesis is fixed before any number exists.

    python examples/study/bed_v2_verdicts.py docs/results/bed-cpu-v2/results.json [--out verdicts.md] \
        [--reference docs/results/bed-cpu-v2/copy-nearest.json]

``--reference``: the copy-nearest policy's scores (examples/study/copy_nearest.py), what retrieval alone
solves, shown per split with LOPD's paired difference to it.

Rules (docs/study.md): success under the `exact` rules on the final evaluations (`lopd-bed` = the 270
`test` tasks, `lopd-bed-values` = `test_values`, `lopd-bed-transfer` = `transfer`); a run on
several seeds is averaged per task; a one-seed run is compared with LOPD's seed 0 only (never with
a seed average); "above" holds when the difference clears 2 paired SE, "at least" fails only when
it is below by 2 SE. A hypothesis whose runs have not finished is "pending".
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from stages.compare import paired_difference

TEST, VALUES, TRANSFER = "lopd-bed", "lopd-bed-values", "lopd-bed-transfer"


class Pending(Exception):
    """A run the hypothesis needs has not finished."""


def per_task(results: dict[str, Any], run: str, bench: str, key: str, seeds: list[int] | None = None) -> list[dict]:
    """``[{task_id, key}]``: run's final ``bench`` value per task, averaged over ``seeds`` (None:
    all its finished seeds); the base model for ``vanilla``. ``key`` ``calls_per_step`` is
    tool_calls / steps of the task (0 for a task of no step).

    Raises:
        Pending: the run (or one of ``seeds``) has no final evaluation on ``bench``, or its rows
            lack ``key``.
    """
    if run == "vanilla":
        reports = [results.get("base_finals", {}).get(bench)]
    else:
        done = {f["seed"]: f for f in results.get("finished", {}).values() if f["run"] == run}
        chosen = sorted(done) if seeds is None else seeds
        reports = [done[s].get("finals", {}).get(bench) if s in done else None for s in chosen]
    if not reports or any(r is None for r in reports):
        raise Pending(f"{run} (seeds {seeds or 'all'}) on {bench}")
    needs = ("tool_calls", "steps") if key == "calls_per_step" else (key,)
    if any(k not in t for r in reports for t in r["per_task"] for k in needs):
        raise Pending(f"{run} on {bench}: results without per-task {'/'.join(needs)}")
    values: dict[str, list[float]] = {}
    for report in reports:
        for t in report["per_task"]:
            if key == "calls_per_step":
                value = t["tool_calls"] / t["steps"] if t.get("steps") else 0.0
            else:
                value = float(t[key])
            values.setdefault(t["task_id"], []).append(value)
    return [{"task_id": k, key: sum(v) / len(v)} for k, v in values.items() if len(v) == len(reports)]


def seeds_of(results: dict[str, Any], run: str) -> list[int]:
    return sorted(f["seed"] for f in results.get("finished", {}).values() if f["run"] == run)


def _seeds_paired(results: dict, a: str, b: str) -> tuple[list[int] | None, list[int] | None]:
    """The seeds each side is averaged over: vanilla has none (all of the other's); two runs on
    several seeds share their common seeds; a one-seed run meets the other's same seed."""
    if "vanilla" in (a, b):
        return None, None
    sa, sb = seeds_of(results, a), seeds_of(results, b)
    if len(sa) > 1 and len(sb) > 1:
        common = sorted(set(sa) & set(sb))
        return common, common
    one = sa if len(sa) == 1 else sb
    if not one:
        raise Pending(f"{a} or {b}: no finished seed")
    return one, one


def diff(results: dict, a: str, b: str, bench: str = TEST, key: str = "success") -> dict:
    """``a`` minus ``b`` per task: mean, SE, n, tasks up, tasks down (seeds: :func:`_seeds_paired`)."""
    seeds_a, seeds_b = _seeds_paired(results, a, b)
    stat = paired_difference(per_task(results, b, bench, key, seeds_b), per_task(results, a, bench, key, seeds_a), key)
    if stat is None:
        raise Pending(f"{a} vs {b}: under two common tasks")
    mean, se, n, up, down = stat
    return {"a": a, "b": b, "bench": bench, "key": key, "mean": mean, "se": se, "n": n, "up": up, "down": down}


def spread(results: dict, run: str, bench: str = TEST) -> str:
    """The run's per-seed success on ``bench`` (its spread over seeds)."""
    values = []
    for seed in seeds_of(results, run):
        rows = per_task(results, run, bench, "success", [seed])
        values.append(f"seed {seed} {statistics.fmean(r['success'] for r in rows):.3f}")
    return ", ".join(values)


def above(d: dict) -> str:
    return "holds" if d["mean"] > 2 * d["se"] else "not shown"


def at_least(d: dict) -> str:
    return "contradicted" if d["mean"] < -2 * d["se"] else ("holds (above by 2 SE)" if d["mean"] > 2 * d["se"]
                                                            else "not contradicted (within 2 SE)")


def fmt(d: dict) -> str:
    return (f"{d['a']} - {d['b']} on {d['bench']} ({d['key']}) = {d['mean']:+.3f} ± {d['se']:.3f} "
            f"(n {d['n']}, {d['up']} up, {d['down']} down)")


def curve(results: dict, run: str, generations: int) -> float:
    """The run's 100-task success at ``generations``, the mean over its seeds."""
    rows = [e["success_rate"] for e in results.get("evaluations", [])
            if e["run"] == run and e["generations"] == generations]
    if not rows:
        raise Pending(f"{run} at {generations} generations")
    return statistics.fmean(rows)


def verdicts(results: dict) -> list[tuple[str, str, str]]:
    """``[(hypothesis, evidence, verdict)]`` for hypotheses 1-8 (module docstring)."""
    final_gen = max((e["generations"] for e in results.get("evaluations", []) if e["run"] == "grpo"), default=256)
    checks = {
        "1 LOPD > vanilla on test": lambda: [(d := diff(results, "lopd", "vanilla"), above(d))],
        "2 LOPD >= GRPO on test": lambda: [(d := diff(results, "lopd", "grpo"), at_least(d))],
        "3 LOPD at 64 generations >= GRPO at its last": lambda: [(
            {"text": f"LOPD {curve(results, 'lopd', 64):.3f} at 64, GRPO {curve(results, 'grpo', final_gen):.3f} at {final_gen}"},
            "holds" if curve(results, "lopd", 64) >= curve(results, "grpo", final_gen) else "does not hold")],
        "4 LOPD > m = 0, frozen composer, v1 composer": lambda: [
            (d := diff(results, "lopd", other), above(d)) for other in ("lopd-m0", "lopd-frozen-composer", "lopd-composer-v1")],
        "5 gain on test >= gain on values - 2 SE; LOPD > vanilla on transfer": lambda: [
            (g := _gain_gap(results), "holds" if g["mean"] >= -2 * g["se"] else "does not hold"),
            (d := diff(results, "lopd", "vanilla", TRANSFER), above(d))],
        "6 LOPD > LOPD-text on test": lambda: [(d := diff(results, "lopd", "lopd-text"), above(d))],
        "7 LOPD > lopd-composer-v1 on test": lambda: [(d := diff(results, "lopd", "lopd-composer-v1"), above(d))],
        "8 fewer calls per step and fewer repeats than GRPO": lambda: [
            (d := diff(results, "grpo", "lopd", key="calls_per_step"), above(d)),
            (d := diff(results, "grpo", "lopd", key="repeated_calls"), above(d))],
    }
    out = []
    for name, check in checks.items():
        try:
            parts = check()
        except Pending as missing:
            out.append((name, f"pending: {missing}", "pending"))
            continue
        evidence = "; ".join(p[0].get("text") or fmt(p[0]) for p in parts)
        verdict = "holds" if all(p[1].startswith("holds") for p in parts) else "; ".join(p[1] for p in parts)
        out.append((name, evidence, verdict))
    return out


def _gain_gap(results: dict) -> dict:
    """(LOPD - vanilla on test) - (LOPD - vanilla on test_values): the two gains' difference, its
    SE from the two independent task sets (sqrt of the summed squares)."""
    t, v = diff(results, "lopd", "vanilla", TEST), diff(results, "lopd", "vanilla", VALUES)
    return {"mean": t["mean"] - v["mean"], "se": (t["se"] ** 2 + v["se"] ** 2) ** 0.5,
            "text": f"gain on test {t['mean']:+.3f} ± {t['se']:.3f}, on test_values {v['mean']:+.3f} ± {v['se']:.3f}"}


SPLIT_OF = {TEST: "test", VALUES: "test_values", TRANSFER: "transfer"}


def reference_lines(results: dict, reference: dict) -> list[str]:
    """Per split: the copy-nearest policy's success ± SE and LOPD minus it, paired over tasks."""
    lines = ["", "Reference line that learns nothing (copy the nearest train reference's calls, the task's values "
             "put in):"]
    for bench, split in SPLIT_OF.items():
        got = reference["splits"].get(split)
        if got is None:
            continue
        text = f"- `{split}`: copy-nearest {got['success_rate']:.3f} ± {got['success_rate_se']:.3f} (n {got['n']})"
        try:
            lopd = per_task(results, "lopd", bench, "success")
            stat = paired_difference([{"task_id": r["task_id"], "success": r["success"]} for r in got["rows"]], lopd,
                                     "success")
            if stat is not None:
                text += f"; LOPD - copy-nearest = {stat[0]:+.3f} ± {stat[1]:.3f} ({stat[3]} up, {stat[4]} down)"
        except Pending:
            text += "; LOPD pending"
        lines.append(text)
    return lines


def markdown(results: dict, reference: dict | None = None) -> str:
    lines = ["| hypothesis | evidence (paired over tasks) | verdict |", "|---|---|---|"]
    lines += [f"| {h} | {e} | {v} |" for h, e, v in verdicts(results)]
    runs = sorted({f["run"] for f in results.get("finished", {}).values()})
    lines += ["", "Per-seed success on `test`: " + "; ".join(
        f"{run}: {spread(results, run)}" for run in runs if _has(results, run))]
    if reference is not None:
        lines += reference_lines(results, reference)
    return "\n".join(lines) + "\n"


def _has(results: dict, run: str) -> bool:
    try:
        spread(results, run)
        return True
    except Pending:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the study's results.json")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--reference", type=Path, help="copy_nearest.py's JSON (what retrieval alone solves)")
    args = parser.parse_args()
    reference = json.loads(args.reference.read_text()) if args.reference else None
    text = markdown(json.loads(args.results.read_text()), reference)
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
