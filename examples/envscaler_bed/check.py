"""Check the lopd study bed through the project's own environment (``--env lopd-bed``).

    python examples/envscaler_bed/check.py [--sample N] [--env PATTERN] [--jobs J] [--no-cross]

Per task (all of them, or a seeded sample of N across all splits; PATTERN is an fnmatch pattern
or substring of env ids), each in its own sandboxed episode:

- the reference actions (``env.reference_actions``) end with reward 1.0;
- "Task Completed" alone ends with reward 0.0 (every check fails on the initial state);
- the reference actions of another task of the same environment (the next task id) end below
  1.0, unless the two tasks ask the same (equal checklists, or this task's state-changing calls
  all among the other's; read-only tools are those named get_/list_/find_/search_/lookup_/view_);
- the prompt (``render_prompt`` of the episode's messages) is at most 450 SmolLM2 tokens and every
  reference action at most 48; the task text has at most 45 words and 1-3 checks.

On the whole bed: the splits are train/test/transfer/warmup and disjoint, no held-out task text
(test, transfer) equals a train or warmup text, transfer and warmup environments have no train or
test task, and the counts and split digests of ``bed.json`` match ``tasks.jsonl``. Prints a table
per split and environment and a summary with the elapsed time; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import queue
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BED_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BED_DIR.parents[1]))  # the repository root, for `stages` and `schemas`

from schemas import Task  # noqa: E402
from stages.core.envs.envscaler import FINAL_REPLY, LopdBedEnv  # noqa: E402

PROMPT_TOKEN_LIMIT = 450
ACTION_TOKEN_LIMIT = 48
MAX_TASK_WORDS = 45
SPLITS = ("train", "test", "transfer", "warmup")
READ_ONLY_PREFIXES = ("get_", "list_", "find_", "search_", "lookup_", "view_")


@dataclass
class TaskResult:
    """What :func:`check_task` found for one task (token counts filled by :func:`count_tokens`)."""

    task_id: str
    env_id: str
    split: str
    problems: list[str] = field(default_factory=list)
    prompt_text: str = ""  # the reset messages, as JSON
    tools: str = "[]"  # the task's tool schemas, as JSON
    action_texts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    action_tokens: int = 0


def _build_module() -> Any:
    """examples/envscaler_bed/build.py as a module (for split_digest)."""
    spec = importlib.util.spec_from_file_location("lopd_bed_build", BED_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def all_tasks(env: LopdBedEnv) -> list[Task]:
    """Every task of the bed, all splits, sorted by task id."""
    return sorted((t for s in env.data.splits for t in env.tasks(s)), key=lambda t: t.task_id)


def select(tasks: list[Task], sample: int | None = None, pattern: str | None = None, seed: int = 0) -> list[Task]:
    """Tasks whose env id matches ``pattern`` (fnmatch, or substring), then a seeded sample of ``sample``."""
    if pattern:
        tasks = [t for t in tasks if fnmatch.fnmatch(json.loads(t.metadata)["env_id"], pattern)
                 or pattern in json.loads(t.metadata)["env_id"]]
    if sample is not None and sample < len(tasks):
        tasks = sorted(random.Random(seed).sample(tasks, sample), key=lambda t: t.task_id)
    return tasks


def other_task(env: LopdBedEnv, task: Task) -> str | None:
    """The next task id (cyclic) of the same environment, or None when it has only one task."""
    env_id = env.data.tasks[task.task_id].env_id
    ids = sorted(tid for tid, spec in env.data.tasks.items() if spec.env_id == env_id)
    return ids[(ids.index(task.task_id) + 1) % len(ids)] if len(ids) > 1 else None


def asks_the_same(env: LopdBedEnv, task_id: str, other_id: str) -> bool:
    """Whether ``other_id``'s reference may legitimately solve ``task_id`` (see the module docstring)."""
    a, b = env.data.tasks[task_id], env.data.tasks[other_id]
    if [c[1] for c in a.checks] == [c[1] for c in b.checks]:
        return True

    def changes(spec: Any) -> set[tuple[str, str]]:
        return {(c.name, c.arguments) for c in spec.reference if not c.name.startswith(READ_ONLY_PREFIXES)}

    return changes(a) <= changes(b)


def play(env: LopdBedEnv, task: Task, actions: list[str]) -> tuple[list, Any]:
    """Reset to ``task`` and step ``actions`` until the episode ends: (reset messages, last StepResult)."""
    messages = env.reset(task)
    result = None
    for action in actions:
        result = env.step(action)
        if result.done:
            break
    if result is None or not result.done:
        env.close()
    return messages, result


def check_task(env: LopdBedEnv, task: Task, index: dict[str, Task], cross: bool = True) -> TaskResult:
    """The per-task checks (two or three episodes; ``index`` maps task ids to tasks); token counts
    are left to :func:`count_tokens`."""
    spec = env.data.tasks[task.task_id]
    out = TaskResult(task.task_id, spec.env_id, task.split)
    if len(task.prompt.split()) > MAX_TASK_WORDS:
        out.problems.append(f"task text has {len(task.prompt.split())} words (> {MAX_TASK_WORDS})")
    if not 1 <= len(spec.checks) <= 3:
        out.problems.append(f"{len(spec.checks)} checks (want 1-3)")
    out.action_texts = env.reference_actions(task)
    messages, result = play(env, task, out.action_texts)
    out.prompt_text, out.tools = json.dumps([m.model_dump() for m in messages]), task.tools
    if result is None or result.reward != 1.0:
        out.problems.append(f"reference actions: reward {None if result is None else result.reward}, "
                            f"info {None if result is None else result.info}")
    _, result = play(env, task, [FINAL_REPLY])
    if result is None or result.reward != 0.0:
        out.problems.append(f"'{FINAL_REPLY}' alone: reward {None if result is None else result.reward} (want 0)")
    other = other_task(env, task) if cross else None
    if other is not None and not asks_the_same(env, task.task_id, other):
        _, result = play(env, task, env.reference_actions(index[other]))
        if result is not None and result.reward >= 1.0:
            out.problems.append(f"the reference actions of {other} also reach reward 1")
    return out


def count_tokens(results: list[TaskResult], tokenizer: Any) -> None:
    """Fill prompt/action token counts (SmolLM2 tokenizer) and add over-limit problems."""
    from schemas import Message
    from stages.core.text.chat import render_prompt

    for r in results:
        messages = [Message(**m) for m in json.loads(r.prompt_text)]
        r.prompt_tokens = len(tokenizer(render_prompt(tokenizer, messages, json.loads(r.tools)))["input_ids"])
        r.action_tokens = max(len(tokenizer(a)["input_ids"]) for a in r.action_texts)
        if r.prompt_tokens > PROMPT_TOKEN_LIMIT:
            r.problems.append(f"prompt {r.prompt_tokens} tokens (> {PROMPT_TOKEN_LIMIT})")
        if r.action_tokens > ACTION_TOKEN_LIMIT:
            r.problems.append(f"a reference action of {r.action_tokens} tokens (> {ACTION_TOKEN_LIMIT})")


def check_bed(env: LopdBedEnv, meta: dict[str, Any]) -> list[str]:
    """Whole-bed problems (splits, held-out texts, environment roles, bed.json), one line each."""
    problems = []
    splits = env.data.splits
    if set(splits) - set(SPLITS):
        problems.append(f"unknown split(s) {sorted(set(splits) - set(SPLITS))}; want {', '.join(SPLITS)}")
    ids = [tid for s in splits.values() for tid in s]
    if len(ids) != len(set(ids)):
        problems.append("a task id is in more than one split")
    text = {s: {env.data.tasks[tid].text for tid in splits.get(s, ())} for s in SPLITS}
    for held in ("test", "transfer"):
        for seen in ("train", "warmup"):
            same = text[held] & text[seen]
            if same:
                problems.append(f"{len(same)} {held} task text(s) also in {seen}, e.g. {sorted(same)[0]!r}")
    envs_of = {s: {env.data.tasks[tid].env_id for tid in splits.get(s, ())} for s in SPLITS}
    for only in ("transfer", "warmup"):
        mixed = envs_of[only] & (envs_of["train"] | envs_of["test"])
        if mixed:
            problems.append(f"{only} environment(s) with train/test tasks: {sorted(mixed)}")
    counts = {s: len(v) for s, v in sorted(splits.items())}
    if meta.get("counts", {}).get("tasks") != counts:
        problems.append(f"bed.json counts.tasks {meta.get('counts', {}).get('tasks')} != tasks.jsonl {counts}")
    digest = _build_module().split_digest
    digests = {s: digest(list(v)) for s, v in sorted(splits.items())}
    if meta.get("split_digests") != digests:
        problems.append(f"bed.json split_digests {meta.get('split_digests')} != tasks.jsonl {digests} (rebuild?)")
    return problems


def table(results: list[TaskResult]) -> str:
    """One line per split and environment: tasks, max prompt and action tokens, tasks passing."""
    groups: dict[tuple[str, str], list[TaskResult]] = {}
    for r in results:
        groups.setdefault((r.split, r.env_id), []).append(r)
    lines = [f"{'split':9s} {'environment':32s} {'tasks':>5s} {'prompt_max':>10s} {'action_max':>10s} {'ok':>5s}"]
    for (split, env_id), rs in sorted(groups.items(), key=lambda kv: (SPLITS.index(kv[0][0]) if kv[0][0] in SPLITS
                                                                       else len(SPLITS), kv[0][1])):
        ok = sum(not r.problems for r in rs)
        lines.append(f"{split:9s} {env_id:32s} {len(rs):5d} {max(r.prompt_tokens for r in rs):10d} "
                     f"{max(r.action_tokens for r in rs):10d} {ok:5d}")
    return "\n".join(lines)


def run(sample: int | None = None, pattern: str | None = None, seed: int = 0, jobs: int = 1, cross: bool = True,
        data_dir: Path = BED_DIR, progress: bool = False) -> tuple[list[TaskResult], list[str]]:
    """Check a selection of tasks (``jobs`` episodes at a time) and the whole bed.

    Returns:
        (per-task results sorted by task id, whole-bed problems). ``cross=False`` leaves out the
        episode with another task's reference actions.

    Raises:
        EnvError: the bed does not load (from the environment).
        FileNotFoundError: the SmolLM2 tokenizer is not installed.
    """
    from stages.core.models.backbone import load_tokenizer

    env = LopdBedEnv(data_dir=data_dir, max_turns=8)
    meta = json.loads((Path(data_dir) / "bed.json").read_text(encoding="utf-8"))
    index = {t.task_id: t for t in all_tasks(env)}
    tasks = select(sorted(index.values(), key=lambda t: t.task_id), sample, pattern, seed)
    idle = queue.SimpleQueue()  # one environment per running episode
    for k in range(max(1, jobs)):
        idle.put(env if k == 0 else LopdBedEnv(data_dir=data_dir, max_turns=8))

    def work(task: Task) -> TaskResult:
        e = idle.get()
        try:
            return check_task(e, task, index, cross)
        finally:
            idle.put(e)

    start, results = time.monotonic(), []
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for i, result in enumerate(pool.map(work, tasks), 1):
            results.append(result)
            if progress and (i % 25 == 0 or i == len(tasks)):
                print(f"  checked {i}/{len(tasks)} tasks ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    count_tokens(results, load_tokenizer("smollm2-135m"))
    return results, check_bed(env, meta)


def main(argv: list[str] | None = None) -> int:
    """Run the checks and print the table and summary; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=None, help="check a seeded sample of N tasks (all splits)")
    parser.add_argument("--env", default=None, help="only environments matching this fnmatch pattern or substring")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--jobs", type=int, default=1, help="episodes run in parallel")
    parser.add_argument("--no-cross", action="store_true", help="skip the episode with another task's reference actions")
    args = parser.parse_args(argv)
    start = time.monotonic()
    results, bed_problems = run(args.sample, args.env, args.seed, args.jobs, not args.no_cross, progress=True)
    print(table(results) if results else "no task matches")
    failed = [r for r in results if r.problems]
    for r in failed[:30]:
        print(f"FAIL {r.task_id} ({r.split}): " + "; ".join(r.problems))
    for p in bed_problems:
        print(f"FAIL bed: {p}")
    print(f"{len(results)} tasks checked, {len(failed)} failed; bed-wide problems: {len(bed_problems)}; "
          f"prompt max {max((r.prompt_tokens for r in results), default=0)} tokens (limit {PROMPT_TOKEN_LIMIT}), "
          f"action max {max((r.action_tokens for r in results), default=0)} (limit {ACTION_TOKEN_LIMIT}); "
          f"{time.monotonic() - start:.0f} s")
    return 1 if failed or bed_problems else 0


if __name__ == "__main__":
    sys.exit(main())
