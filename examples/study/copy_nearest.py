"""copy_nearest: a reference line on the lopd study bed that learns nothing.

For each task it retrieves the single nearest successful TRAIN experience with the call LOPD makes
for a task's experiences (``Retriever.retrieve(task.prompt, 1, success_only=True, env=task.env,
split="train", exclude_task_ids={task.task_id})``, as ``stages/engines/latent.py`` does; the
store's own embedder), takes the tool calls of that experience's turns, puts the task's values
in (:func:`value_map`, :func:`substitute`), and plays the calls, then the final reply, through the
bed's environment (``examples/envscaler_bed/check.py``'s ``play``; ``exact`` rules). A task for
which nothing is retrieved plays the final reply alone (a failure).

Note that every bed task has ``env == "lopd-bed"``, so the ``env`` filter keeps the whole bed:
the nearest experience may come from another of the bed's environments (always so for
``transfer`` tasks, whose environments have no train task). Each row says which environment it
copied from (``copied_env_id``); the calls of another environment name tools the target lacks.

    PYTHONPATH=$PWD .venv/bin/python examples/study/copy_nearest.py --store runs/copy/store \\
        --splits test,test_values,transfer --train-sample 100 --out runs/copy/copy-nearest.json

``--store``: a store of successful train trajectories indexed by ``lopd index`` (``lopd collect
--env lopd-bed --split train --reference``). ``--train-sample N`` adds a seeded sample of N train
tasks, each copied from its nearest OTHER train task (the retrieval excludes the task itself), as a
sanity line. The JSON holds, per split, n, successes, the success rate and its standard error over
tasks, the mean reward and per-task rows (task_id, env_id, success, reward, copied_task_id,
copied_env_id, score, calls), so every number recomputes from the rows.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root, for `stages` and `schemas`

from schemas import Task, Trajectory  # noqa: E402
from stages.benches import standard_error  # noqa: E402
from stages.core.data.retrieval import Experience, Retriever  # noqa: E402
from stages.core.data.store import ExperienceStore  # noqa: E402
from stages.envs.envscaler import LopdBedEnv  # noqa: E402

Call = tuple[str, dict[str, Any]]  # (tool name, arguments)
SPLITS = ("train", "test", "test_values", "transfer")


def _bed_module(name: str) -> Any:
    """examples/envscaler_bed/<name>.py as a module (``check``: play, call_texts; ``exploits``: text_values)."""
    spec = importlib.util.spec_from_file_location(f"lopd_bed_{name}", ROOT / "examples" / "envscaler_bed" / f"{name}.py")
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


check = _bed_module("check")
exploits = _bed_module("exploits")


_WORD = re.compile(r"\b[A-Z][a-z]+\b")
_PAIR = re.compile(r"(?=\b([A-Z][a-z]+ [A-Z][a-z]+)\b)")  # overlapping pairs


def _names(text: str) -> dict[str, list[str]]:
    """Capitalised words (``words``) and adjacent pairs of them (``pairs``) outside quotes, ids and
    hours, day names left out. Unlike ``exploits.text_values`` the first word counts and a pair's
    words count alone too, so "Reserve Willow" maps "Willow" and "Sofia is ..." maps "Sofia"."""
    rest = re.sub(r"'[^']*'", " ", exploits._HOUR.sub(" ", exploits._ID.sub(" ", text)))
    keep = lambda names: [n for n in names if not any(exploits._DAY.fullmatch(w) for w in n.split())]  # noqa: E731
    return {"words": keep(_WORD.findall(rest)), "pairs": keep(_PAIR.findall(rest))}


def _groups(text: str) -> dict[str, list[Any]]:
    """The values of ``text`` by kind: ids by prefix (``ids:X``), integers, quoted strings, days and
    hours as ``exploits.text_values`` reads them, and capitalised words and pairs (:func:`_names`);
    each kind's distinct values in order of first appearance."""
    found = {k: v for k, v in exploits.text_values(text).items() if k != "names"} | _names(text)
    out: dict[str, list[Any]] = {}
    for kind, values in found.items():
        for value in values:
            key = f"ids:{value.split('-')[0]}" if kind == "ids" else kind
            if value not in out.setdefault(key, []):
                out[key].append(value)
    return out


def value_map(source: str, target: str) -> dict[str, Any]:
    """Which value of ``target`` stands for each value of ``source``: the i-th distinct value of a
    kind in ``source`` (ids of one prefix, integers, quoted strings, days, hours, capitalised words,
    pairs of them; :func:`_groups`) maps to the i-th of the same kind in ``target``; then the ids
    left without a counterpart map, in order, to the target's ids not yet used (other prefixes).
    Keys are the source values as text (``"12"`` for the integer 12); a value with no counterpart
    is not a key; where one text is two kinds' value, the first kind in that order keeps it."""
    theirs = _groups(target)
    out: dict[str, Any] = {}
    for kind, values in _groups(source).items():
        for old, new in zip(values, theirs.get(kind, [])):
            out.setdefault(str(old), new)
    ids = lambda text: list(dict.fromkeys(exploits.text_values(text)["ids"]))  # noqa: E731
    used = set(out.values())
    for old, new in zip([v for v in ids(source) if v not in out], [v for v in ids(target) if v not in used]):
        out[old] = new
    return out


def substitute(value: Any, mapping: dict[str, Any]) -> Any:
    """``value`` (decoded call arguments) with every whole string or integer that is a key of
    ``mapping`` replaced: a string by the new value as text, an integer by the new value where it
    is an integer (else kept). Dicts and lists are walked; text inside a string is never edited."""
    if isinstance(value, dict):
        return {k: substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, mapping) for v in value]
    if isinstance(value, str) and value in mapping:
        return str(mapping[value])
    if isinstance(value, int) and not isinstance(value, bool) and str(value) in mapping:
        new = mapping[str(value)]
        return new if isinstance(new, int) and not isinstance(new, bool) else value
    return value


def nearest(retriever: Retriever, task: Task) -> Experience | None:
    """The nearest successful train experience of ``task`` (LOPD's call, J=1), or None."""
    found = retriever.retrieve(task.prompt, 1, success_only=True, env=task.env, split="train",
                               exclude_task_ids={task.task_id})
    return found[0] if found else None


def copy_calls(experience: Trajectory, target_text: str) -> list[Call]:
    """The tool calls of ``experience``'s turns, in order, with ``target_text``'s values put in."""
    mapping = value_map(experience.prompt, target_text)
    return [(c.name, substitute(c.args, mapping)) for turn in experience.turns for c in turn.tool_calls]


def score(env: LopdBedEnv, task: Task, calls: list[Call]) -> tuple[bool, float]:
    """Play ``calls`` (one per action), then the final reply, on ``task``: (success, reward)."""
    _, result = check.play(env, task, check.call_texts(calls))
    reward = 0.0 if result is None else float(result.reward)
    return reward >= 1.0, reward


def run_task(env: LopdBedEnv, retriever: Retriever, task: Task) -> dict[str, Any]:
    """One task's row: retrieve, copy, play."""
    found = nearest(retriever, task)
    calls = copy_calls(found.trajectory, task.prompt) if found is not None else []
    success, reward = score(env, task, calls)
    copied = env.data.tasks.get(found.trajectory.task_id) if found is not None else None
    return {"task_id": task.task_id, "env_id": env.data.tasks[task.task_id].env_id, "success": success,
            "reward": reward, "copied_task_id": found.trajectory.task_id if found is not None else None,
            "copied_env_id": copied.env_id if copied is not None else None,
            "score": round(found.score, 6) if found is not None else None, "calls": [[n, a] for n, a in calls]}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """n, successes, success rate and its standard error over tasks, mean reward, and the tasks
    that copied from their own environment."""
    wins = [float(r["success"]) for r in rows]
    n = len(rows)
    return {"n": n, "successes": int(sum(wins)), "success_rate": sum(wins) / n if n else 0.0,
            "success_rate_se": standard_error(wins),
            "mean_reward": sum(r["reward"] for r in rows) / n if n else 0.0,
            "copied_same_env": sum(r["copied_env_id"] == r["env_id"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    """Score the splits and write the JSON; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="indexed store of successful train trajectories")
    parser.add_argument("--splits", default="test,test_values,transfer", help="comma-separated splits, all tasks")
    parser.add_argument("--train-sample", type=int, default=0, help="also N seeded train tasks (sanity line)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train sample")
    parser.add_argument("--limit", type=int, default=None, help="first N tasks of each split (a quick look)")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    bad = [s for s in splits if s not in SPLITS]
    if bad:
        parser.error(f"--splits: unknown split(s) {bad}; use {', '.join(SPLITS)}")
    if not (Path(args.store) / "trajectories.lance").is_dir():
        parser.error(f"--store {args.store}: no experience store there (run `lopd collect` and `lopd index`)")
    retriever = Retriever(ExperienceStore.open(args.store))
    env = LopdBedEnv()
    bed = json.loads((check.BED_DIR / "bed.json").read_text(encoding="utf-8"))
    plan = {s: env.tasks(s, args.limit) for s in splits}
    if args.train_sample:
        tasks = env.tasks("train")
        plan["train_sample"] = sorted(random.Random(args.seed).sample(tasks, min(args.train_sample, len(tasks))),
                                      key=lambda t: t.task_id)
    out: dict[str, Any] = {"policy": "copy_nearest", "store": args.store, "embedder": retriever.embedder.name,
                           "field": retriever.field, "bed": {k: bed[k] for k in ("name", "version", "label")},
                           "episode_rules": env.episode_rules, "argv": sys.argv[1:] if argv is None else argv,
                           "splits": {}}
    start = time.monotonic()
    for split, tasks in plan.items():
        rows = []
        for i, task in enumerate(tasks, 1):
            rows.append(run_task(env, retriever, task))
            if i % 50 == 0 or i == len(tasks):
                print(f"  {split}: {i}/{len(tasks)} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
        out["splits"][split] = {**summary(rows), "rows": rows}
        s = out["splits"][split]
        print(f"{split:12s} n={s['n']:4d} success {s['success_rate']:.3f} ± {s['success_rate_se']:.3f} "
              f"({s['successes']}), mean reward {s['mean_reward']:.3f}, same-env copies {s['copied_same_env']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
