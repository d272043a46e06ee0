"""Check the lopd study bed through the project's own environment (``--env lopd-bed``, ``exact`` rules).

    python examples/envscaler_bed/check.py [--sample N] [--env PATTERN] [--jobs J] [--no-exploits]

Per task (all of them, or a seeded sample of N across all splits; PATTERN is an fnmatch pattern
or substring of env ids), each in its own sandboxed episode:

- the reference actions (``env.reference_actions``) end with reward 1.0;
- "Task Completed" alone ends with reward 0.0 (every check fails on the initial state);
- every exploit policy of ``exploits.py`` (its calls, then the final reply) is played and its
  success (reward 1.0) recorded; ``other_task`` (the next task id of the same environment) is
  left out where the two tasks ask the same (equal checklists, or this task's state-changing
  calls all among the other's);
- the prompt (``render_prompt`` of the episode's messages) is at most 450 SmolLM2 tokens and every
  reference action at most 48; the task text has at most 45 words and 1-3 checks.

On the whole bed: the splits are train/test/test_values/transfer/warmup and disjoint, no held-out
task text (test, test_values, transfer) equals a train or warmup text, no test task's phrasing
(``build.phrasing``) is a train or warmup phrasing of its environment and every test_values
task's is a train phrasing, transfer and warmup environments have no train or test task, and the
counts and split digests of ``bed.json`` match ``tasks.jsonl``. Over the tasks checked, every exploit succeeds on at most 2% of each split's tasks
it applies to. Prints a table per split and environment, one of exploit success per split, and a
summary with the elapsed time; exits 1 on any failure.
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

from schemas import Task, ToolCall  # noqa: E402
from stages.envs.envscaler import FINAL_REPLY, LopdBedEnv  # noqa: E402

PROMPT_TOKEN_LIMIT = 450
ACTION_TOKEN_LIMIT = 48
MAX_TASK_WORDS = 45
MAX_EXPLOIT_SUCCESS = 0.02  # share of a split's tasks an exploit policy may solve
SPLITS = ("train", "test", "test_values", "transfer", "warmup")
HELD_OUT = ("test", "test_values", "transfer")


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
    exploits: dict[str, bool] = field(default_factory=dict)  # policy -> succeeded (policies that apply)


def _module(name: str) -> Any:
    """examples/envscaler_bed/<name>.py as a module (build: split_digest, phrasing; exploits)."""
    spec = importlib.util.spec_from_file_location(f"lopd_bed_{name}", BED_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


exploits = _module("exploits")


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
        return {(c.name, c.arguments) for c in spec.reference if not exploits.is_lookup(c.name)}

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


def call_texts(calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Action texts of ``calls`` (one ``<tool_call>`` each), then the final reply."""
    from stages.core.text.chat import format_tool_calls

    return [format_tool_calls([ToolCall(name=n, arguments=json.dumps(a))]) for n, a in calls] + [FINAL_REPLY]


def play_exploits(env: LopdBedEnv, task: Task) -> dict[str, bool]:
    """Success (reward 1.0) of every exploit policy that applies to ``task`` (one episode each;
    ``do_nothing`` is the per-task check of :func:`check_task`)."""
    spec = env.data.tasks[task.task_id]
    ref = [(c.name, c.args) for c in spec.reference]
    other = other_task(env, task)
    other_calls = None
    if other is not None and not asks_the_same(env, task.task_id, other):
        other_calls = [(c.name, c.args) for c in env.data.tasks[other].reference]
    tools = list(env.data.envs[spec.env_id].tools)
    out = {}
    for name, policy in exploits.POLICIES.items():
        calls = None if name == "do_nothing" else policy(tools, spec.text, ref, other_calls)
        if calls is not None:
            _, result = play(env, task, call_texts(calls))
            out[name] = result is not None and result.reward >= 1.0
    return out


def check_task(env: LopdBedEnv, task: Task, with_exploits: bool = True) -> TaskResult:
    """The per-task checks (two episodes, and one per exploit policy ``with_exploits``); token
    counts are left to :func:`count_tokens`."""
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
    if with_exploits:
        out.exploits = play_exploits(env, task)
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


def phrasing_problems(env: LopdBedEnv) -> list[str]:
    """Held-out phrasing violations, as ``task_id: phrasing``: a test task whose phrasing
    (``build.phrasing`` with the vocabulary of all tasks of its environment) is also a train or
    warmup phrasing of that environment, or a test_values task whose phrasing no train task uses."""
    build = _module("build")
    by_env: dict[str, list[Any]] = {}
    for spec in env.data.tasks.values():
        by_env.setdefault(spec.env_id, []).append(spec)
    out = []
    for env_id, specs in sorted(by_env.items()):
        values = build.vocabulary([{"init_config": s.init_config, "reference_actions": [
            {"arguments": c.args} for c in s.reference or ()]} for s in specs])
        said = {s.task_id: build.phrasing(s.text, values) for s in specs}
        seen = {said[s.task_id] for s in specs if s.split in ("train", "warmup")}
        train = {said[s.task_id] for s in specs if s.split == "train"}
        for s in sorted(specs, key=lambda s: s.task_id):
            if s.split == "test" and said[s.task_id] in seen:
                out.append(f"test task {s.task_id} has a train/warmup phrasing: {said[s.task_id]!r}")
            elif s.split == "test_values" and said[s.task_id] not in train:
                out.append(f"test_values task {s.task_id} has a phrasing no train task uses: {said[s.task_id]!r}")
    return out


def exploit_rates(results: list[TaskResult]) -> dict[str, dict[str, tuple[int, int]]]:
    """Per split and exploit policy: (tasks it succeeded on, tasks it applied to)."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for r in results:
        for name, won in r.exploits.items():
            k, n = out.setdefault(r.split, {}).get(name, (0, 0))
            out[r.split][name] = (k + won, n + 1)
    return out


def exploit_problems(results: list[TaskResult]) -> list[str]:
    """One line per split and exploit policy that succeeds on more than MAX_EXPLOIT_SUCCESS of its tasks."""
    return [f"exploit {name} succeeds on {k}/{n} {split} tasks (> {MAX_EXPLOIT_SUCCESS:.0%}), e.g. "
            + ", ".join(r.task_id for r in results if r.split == split and r.exploits.get(name))[:200]
            for split, rates in sorted(exploit_rates(results).items()) for name, (k, n) in rates.items()
            if k > MAX_EXPLOIT_SUCCESS * n]


def exploit_table(results: list[TaskResult]) -> str:
    """Exploit success per split: successes/tasks it applied to, one column per policy."""
    rates = exploit_rates(results)
    names = [n for n in exploits.POLICIES if n != "do_nothing"]
    lines = [f"{'split':12s} " + " ".join(f"{n:>15s}" for n in names)]
    for split in [s for s in SPLITS if s in rates]:
        lines.append(f"{split:12s} " + " ".join(f"{'%d/%d' % rates[split].get(n, (0, 0)):>15s}" for n in names))
    return "\n".join(lines)


def check_bed(env: LopdBedEnv, meta: dict[str, Any]) -> list[str]:
    """Whole-bed problems (splits, held-out texts and phrasings, environment roles, bed.json), one line each."""
    problems = []
    splits = env.data.splits
    if set(splits) - set(SPLITS):
        problems.append(f"unknown split(s) {sorted(set(splits) - set(SPLITS))}; want {', '.join(SPLITS)}")
    ids = [tid for s in splits.values() for tid in s]
    if len(ids) != len(set(ids)):
        problems.append("a task id is in more than one split")
    text = {s: {env.data.tasks[tid].text for tid in splits.get(s, ())} for s in SPLITS}
    for held in HELD_OUT:
        for seen in ("train", "warmup"):
            same = text[held] & text[seen]
            if same:
                problems.append(f"{len(same)} {held} task text(s) also in {seen}, e.g. {sorted(same)[0]!r}")
    wrong = phrasing_problems(env)
    if wrong:
        problems.append(f"{len(wrong)} held-out phrasing problem(s), e.g. {wrong[0]}")
    envs_of = {s: {env.data.tasks[tid].env_id for tid in splits.get(s, ())} for s in SPLITS}
    for only in ("transfer", "warmup"):
        mixed = envs_of[only] & (envs_of["train"] | envs_of["test"] | envs_of["test_values"])
        if mixed:
            problems.append(f"{only} environment(s) with train/test tasks: {sorted(mixed)}")
    counts = {s: len(v) for s, v in sorted(splits.items())}
    if meta.get("counts", {}).get("tasks") != counts:
        problems.append(f"bed.json counts.tasks {meta.get('counts', {}).get('tasks')} != tasks.jsonl {counts}")
    digest = _module("build").split_digest
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


def run(sample: int | None = None, pattern: str | None = None, seed: int = 0, jobs: int = 1, with_exploits: bool = True,
        data_dir: Path = BED_DIR, progress: bool = False) -> tuple[list[TaskResult], list[str]]:
    """Check a selection of tasks (``jobs`` episodes at a time) and the whole bed.

    Returns:
        (per-task results sorted by task id, whole-bed problems, exploit rates over the selection
        included). ``with_exploits=False`` leaves out the exploit episodes.

    Raises:
        EnvError: the bed does not load (from the environment).
        FileNotFoundError: the SmolLM2 tokenizer is not installed.
    """
    from stages.core.models.backbone import load_tokenizer

    env = LopdBedEnv(data_dir=data_dir, max_turns=8)
    meta = json.loads((Path(data_dir) / "bed.json").read_text(encoding="utf-8"))
    tasks = select(all_tasks(env), sample, pattern, seed)
    idle = queue.SimpleQueue()  # one environment per running episode
    for k in range(max(1, jobs)):
        idle.put(env if k == 0 else LopdBedEnv(data_dir=data_dir, max_turns=8))

    def work(task: Task) -> TaskResult:
        e = idle.get()
        try:
            return check_task(e, task, with_exploits)
        finally:
            idle.put(e)

    start, results = time.monotonic(), []
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for i, result in enumerate(pool.map(work, tasks), 1):
            results.append(result)
            if progress and (i % 25 == 0 or i == len(tasks)):
                print(f"  checked {i}/{len(tasks)} tasks ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    count_tokens(results, load_tokenizer("smollm2-135m"))
    return results, check_bed(env, meta) + exploit_problems(results)


def main(argv: list[str] | None = None) -> int:
    """Run the checks and print the table and summary; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=None, help="check a seeded sample of N tasks (all splits)")
    parser.add_argument("--env", default=None, help="only environments matching this fnmatch pattern or substring")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--jobs", type=int, default=1, help="episodes run in parallel")
    parser.add_argument("--no-exploits", action="store_true", help="skip the exploit policies' episodes")
    args = parser.parse_args(argv)
    start = time.monotonic()
    results, bed_problems = run(args.sample, args.env, args.seed, args.jobs, not args.no_exploits, progress=True)
    print(table(results) if results else "no task matches")
    if not args.no_exploits and results:
        print(f"exploit success (tasks solved / tasks the policy applies to; limit {MAX_EXPLOIT_SUCCESS:.0%} per split):")
        print(exploit_table(results))
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
