"""The quickstart's closing words: what moved, by how much, and what did not (examples/quickstart/run.sh).

Usage: ``python examples/quickstart/closing.py RUN`` (default ``runs/quickstart``). Reads the run
folder the script leaves: ``eval/lopd-bed-warm.json`` and ``eval/lopd-bed-lopd.json`` (the warm start
and LOPD's student on the same held-out bed tasks), ``composer/ladder.json`` (the composer's control on
held-out train-task targets) and ``lopd/metrics.jsonl``. A difference "moved" when it lies more than
two paired standard errors from zero. Prints plain sentences; writes nothing.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from stages.compare import paired_difference, plus_minus

MOVED_SE = 2.0  # a paired difference beyond this many standard errors is reported as a change


def verdict(diff: float, se: float, lower_is_better: bool = False) -> str:
    """"better" / "worse" when ``diff`` lies beyond :data:`MOVED_SE` standard errors, else "no change"."""
    if se > 0 and abs(diff) > MOVED_SE * se or se == 0 and diff != 0:
        return "better" if (diff < 0) == lower_is_better else "worse"
    return "no change beyond 2 SE"


def evaluation_words(warm: dict, lopd: dict) -> list[str]:
    """Sentences on LOPD's student against the warm start, task by task (paired)."""
    tasks = len(warm.get("per_task", []))
    solved = [sum(bool(r.get("success")) for r in rep.get("per_task", [])) for rep in (warm, lopd)]
    rate = sum(solved) / max(2 * tasks, 1)  # the two models' pooled success rate
    lines = [f"On {tasks} held-out bed tasks the warm start solved {solved[0]} and LOPD's student {solved[1]} "
             f"(one evaluation at their rate {rate:.3f} has two standard errors of "
             f"±{2 * (rate * (1 - rate) / max(tasks, 1)) ** 0.5:.3f})."]
    for key, what, lower in (("success", "success rate", False), ("reward", "share of checks passed", False),
                             ("reference_nll", "NLL of each task's verified first action (nats/token)", True)):
        stat = paired_difference(warm.get("per_task", []), lopd.get("per_task", []), key)
        if stat is None:
            continue
        diff, se, n, up, down = stat
        lines.append(f"  {what}: {plus_minus(diff, se)} paired over {n} tasks ({up} higher, {down} lower): "
                     f"{verdict(diff, se, lower)}.")
    return lines


def composer_words(ladder: dict) -> list[str]:
    """Sentences on the composer's control: retrieved experiences (c) against another task's (d) and none (a)."""
    diffs = {(d["x"], d["y"]): d for d in ladder.get("differences", [])}
    lines = [f"The composer, on {ladder.get('targets', 0)} held-out train-task targets "
             f"({ladder.get('decisive_tokens', 0)} decisive tokens), teacher NLL on decisive tokens:"]
    for pair, what in ((("c", "a"), "with its latents against without"),
                       (("c", "d"), "the retrieved experiences against another task's (the content)")):
        d = diffs.get(pair)
        if d is not None:
            lines.append(f"  {what}: {d['diff_decisive']:+.3f} ± {d['se_decisive']:.3f} nats: "
                         f"{verdict(d['diff_decisive'], d['se_decisive'], lower_is_better=True)}.")
    return lines


def training_words(rows: list[dict]) -> list[str]:
    """Sentences on LOPD's training: the reverse KL from first to last step, the margin Delta, reward."""
    if not rows:
        return []
    first, last = rows[0], rows[-1]
    steps = last.get("step", len(rows))
    out = [f"LOPD trained {steps} step{'s' if steps != 1 else ''}."]
    if "reverse_kl" in first and "reverse_kl" in last:
        out.append(f"  reverse KL to the latent teacher: {first['reverse_kl']:.3f} at step 1, "
                   f"{last['reverse_kl']:.3f} at the last step.")
    deltas = [r["Delta"] for r in rows if isinstance(r.get("Delta"), (int, float))]
    if deltas:
        out.append(f"  privileged margin Delta (teacher with latents vs without): mean {sum(deltas) / len(deltas):+.3f}.")
    rewards = [r["reward_mean"] for r in rows if isinstance(r.get("reward_mean"), (int, float))]
    if rewards:
        out.append(f"  mean reward of its train rollouts: {sum(rewards) / len(rewards):.3f}.")
    return out


def main(run: Path) -> int:
    lines = ["", "What happened:"]
    evals = [run / "eval" / "lopd-bed-warm.json", run / "eval" / "lopd-bed-lopd.json"]
    if all(p.is_file() for p in evals):
        lines += evaluation_words(*(json.loads(p.read_text()) for p in evals))
    ladder = run / "composer" / "ladder.json"
    if ladder.is_file():
        lines += composer_words(json.loads(ladder.read_text()))
    metrics = run / "lopd" / "metrics.jsonl"
    if metrics.is_file():
        lines += training_words([json.loads(x) for x in metrics.read_text().splitlines() if x.strip()])
    lines.append("The bed study (docs/study.md) compares LOPD with its baselines at 256 generations on 270 tasks.")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/quickstart")))
