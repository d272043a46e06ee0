"""`lopd collect`: roll out a policy on an environment's tasks and store scored trajectories.

Trajectories are appended to the experience store task by task (all G samples of a task in one
transaction), so a killed run loses at most the tasks in flight and ``--resume`` continues with
the tasks the run has not stored yet.
"""
from __future__ import annotations

import time
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from schemas import Task, Trajectory
from stages.envs import EnvError, make_env
from stages.core.exec import isolation
from stages.core.models.backbone import DEFAULT_MODEL
from stages.core.run.printing import titled_table
from stages.core.run.progress import StageProgress
from stages.core.run.provenance import config_run_id, git_commit, write_manifest
from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS
from stages.engines.rollout import RolloutStats, play
from stages.settings import DEFAULT_STORE, AllowOverlap, Device, EpisodeBatch, PrefixCacheTokens, Rules, RunDType, UnsafeExec


class CollectConfig(BaseModel):
    """Settings of one `lopd collect` run: the flags, each described by its field. ``device`` /
    ``dtype`` (:func:`stages.core.models.backbone.resolve_device_dtype`) are no part of the run id."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field(description="Environment: bfcl, code, envscaler, lopd-bed (lopd's bundled study bed), acebench, "
                     "livecodebench, taco (required, as a flag or in --config).")
    store: str = Field(DEFAULT_STORE, description="Experience store directory or URI.")
    split: str = Field(default="train", min_length=1, description=(  # the env refuses a split it does not have
        "Task split: train or test (bfcl also has heldout, its held-out single-turn tasks; lopd-bed also has "
        "warmup, test_values and transfer)."))
    limit: int | None = Field(default=None, ge=1, description="Play at most N tasks. (default: all)")
    samples_per_task: int = Field(default=1, ge=1, description="Rollouts per task (G).",
                                  json_schema_extra={"flag": ["--samples-per-task", "-G"]})
    model: str = Field(DEFAULT_MODEL, description="Policy: smollm2-135m (embedded), an HF id or a local path.")
    device: Device = None
    dtype: RunDType = None
    data_dir: str | None = Field(None, description="Read the environment's task files from here.")
    max_turns: int = Field(default=30, ge=1, validation_alias=AliasChoices("max_turns", "max_steps"),
                           json_schema_extra={"flag": ["--max-turns", "--max-steps"]},
                           description="Action cap per episode (--max-steps: older spelling).")
    episode_rules: Rules = None
    max_new_tokens: int = Field(default=256, ge=1, description="Generated tokens per action.")
    temperature: float = Field(default=0.7, ge=0.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(default=0, ge=0, description=(
        "Sample from the k most likely tokens only; 0 = off (the paper samples with 20, B.2)."))
    seed: int = Field(0, description="Sampling seed.")
    batch_size: EpisodeBatch = 8
    prefix_cache_tokens: PrefixCacheTokens = PREFIX_CACHE_TOKENS
    run_id: str | None = Field(None, description="Run name (default: derived from the settings).")
    resume: bool = Field(False, description="Skip tasks this run already stored.", json_schema_extra={"flag": "--resume"})
    reference: bool = Field(False, json_schema_extra={"flag": "--reference"}, description=(
        "Play each task's reference solution (BFCL possible answer, HumanEval canonical solution) through the real "
        "environment and checker instead of a model: seeds the store with verified demonstrations."))
    unsafe_exec: UnsafeExec = False
    allow_overlap: AllowOverlap = Field(False, json_schema_extra={"flag": "--allow-overlap"})


class CollectReport(BaseModel):
    """Summary of a collect run."""

    run_id: str
    tasks: int
    skipped_tasks: int
    trajectories: int
    mean_reward: float
    success_rate: float
    generated_tokens: int
    tokens_per_s: float
    seconds: float
    context_overflows: int = 0  # episodes ended at the model's context window (scored 0)


_RUN_KEYS = ["env", "split", "samples_per_task", "model", "data_dir", "max_turns",
             "max_new_tokens", "temperature", "top_p", "top_k", "seed", "reference"]


def _with_reference(env, tasks: list[Task], config: CollectConfig, console: Console) -> list[Task]:
    """The ``tasks`` that have a reference solution (``--reference``); a note names how many are skipped.

    Raises:
        EnvError: the env has no reference solutions, or none of the tasks has one.
    """
    if not hasattr(env, "reference_actions"):
        raise EnvError(f"env {config.env!r} has no reference solutions; drop --reference, or collect them from "
                       "an env that has them (bfcl, lopd-bed, envscaler's own tasks, the code envs)")
    kept, first_missing, skipped = [], None, 0
    for task in tasks:
        try:
            env.reference_actions(task)
            kept.append(task)
        except EnvError as err:
            first_missing, skipped = first_missing or str(err), skipped + 1
    if not kept and tasks:
        raise EnvError(f"--reference: none of the {len(tasks)} {config.split} task(s) has a reference solution "
                       f"({first_missing}); drop --reference to roll them out with --model, or use an env whose "
                       "train tasks have them (--env lopd-bed: the study bed; --env bfcl: single-turn)")
    if skipped:
        console.print(f"[yellow]note: {skipped} of {len(tasks)} task(s) have no reference solution and are "
                      f"skipped ({first_missing})[/]", soft_wrap=True)
    return kept


def run(config: CollectConfig, console: Console | None = None) -> CollectReport:
    """Collect trajectories as configured; returns the summary (also printed as a table).

    Raises:
        StoreError: unusable store, or the run already has rows and ``resume`` is False.
        EnvError: unknown environment or unusable task data.
    """
    from stages.core.models.backbone import load_policy, load_tokenizer
    from stages.engines import SamplingParams, make_engine
    from stages.leakage import check_train_tasks

    isolation.prepare(config.env, config.unsafe_exec)
    console = console or Console()
    run_keys = _RUN_KEYS + (["episode_rules"] if config.episode_rules else [])  # ids of earlier runs unchanged
    run_id = config.run_id or config_run_id("collect", config, run_keys)
    data_dir = Path(config.data_dir) if config.data_dir else None
    env_factory = lambda: make_env(config.env, data_dir=data_dir, max_turns=config.max_turns,
                                   episode_rules=config.episode_rules)  # noqa: E731
    probe = env_factory()
    tasks = probe.tasks(config.split, config.limit)
    if config.reference:
        tasks = _with_reference(probe, tasks, config, console)
    probe.close()
    # training data (train, warmup...): never a task an evaluation benchmark scores; tasks of an
    # evaluation split (test, bfcl's heldout) carry split "test"
    train = [t for t in tasks if t.split != "test"]
    if train:
        overlap = check_train_tasks(config.env, train, data_dir, allow_overlap=config.allow_overlap)
        if overlap:
            console.print(f"[yellow]--allow-overlap: {len(overlap)} of {len(train)} train tasks are scored by "
                          f"{', '.join(sorted({o.bench for o in overlap}))}[/]", soft_wrap=True)
    # the store is opened (and created) only once the tasks are known to be playable and the
    # policy has loaded: a run that cannot start leaves no empty store behind
    policy_id, engine = "reference", None
    if config.reference:  # no model runs, but the rows keep the ids the policy would be trained on
        tokenizer = load_tokenizer(config.model)
    else:
        policy_id = config.model
        model, tokenizer = load_policy(config.model, dtype=config.dtype, device=config.device)
        engine = make_engine("hf", model, tokenizer, batch_size=config.batch_size,
                             prefix_cache_tokens=config.prefix_cache_tokens)
    from stages.core.data.store import ExperienceStore, StoreError  # lancedb: once the tasks and policy are known

    store = ExperienceStore.open(config.store)
    done_ids = store.task_ids(run_id=run_id)
    if done_ids and not config.resume:
        raise StoreError(
            f"run {run_id} already has trajectories for {len(done_ids)} tasks in {config.store}; "
            "pass --resume to continue it or --run-id NAME to start another run"
        )
    todo = [t for t in tasks if t.task_id not in done_ids]
    data = getattr(probe, "data_source", None) or (str(data_dir) if data_dir else f"the {config.env} package data")
    if "://" not in config.store:  # manifests live beside a local store
        write_manifest(Path(config.store) / "runs" / f"{run_id}.json", "collect", run_id, config, data=data)
    console.print(
        f"[bold]collect[/] run {run_id}: {len(todo)} tasks to play "
        f"({len(tasks) - len(todo)} already stored), {config.samples_per_task} sample(s) each, "
        f"env={config.env} split={config.split} "
        f"policy={'reference solutions' if config.reference else config.model}; data: {data}", soft_wrap=True
    )
    params = SamplingParams(
        temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
        max_new_tokens=config.max_new_tokens, seed=config.seed,
    )
    stats = RolloutStats()
    pending: dict[str, list[Trajectory]] = {}
    written: list[Trajectory] = []
    t0 = time.perf_counter()
    with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("reward {task.fields[reward]:.3f}"), TextColumn("{task.fields[actions]} actions"),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        job = bar.add_task("tasks", total=len(todo), reward=0.0, actions=0)
        for traj in play(engine, tokenizer, env_factory, todo,
                         samples_per_task=config.samples_per_task, params=params,
                         policy_id=policy_id, run_id=run_id, git_commit=git_commit(),
                         max_concurrent=config.batch_size, stats=stats, reference=config.reference,
                         on_step=lambda s: bar.update(job, actions=s.actions)):
            group = pending.setdefault(traj.task_id, [])
            group.append(traj)
            if len(group) == config.samples_per_task:
                store.append(pending.pop(traj.task_id))
                written.extend(group)
                mean = sum(t.reward for t in written) / len(written)
                bar.update(job, advance=1, reward=mean)
    seconds = time.perf_counter() - t0
    report = CollectReport(
        run_id=run_id, tasks=len(todo), skipped_tasks=len(tasks) - len(todo),
        trajectories=len(written),
        mean_reward=sum(t.reward for t in written) / max(1, len(written)),
        success_rate=sum(t.success for t in written) / max(1, len(written)),
        generated_tokens=stats.generated_tokens,
        tokens_per_s=stats.generated_tokens / max(stats.generate_seconds, 1e-9),
        seconds=seconds, context_overflows=stats.context_overflows,
    )
    _print_summary(console, report, config)
    return report


def _print_summary(console: Console, r: CollectReport, config: CollectConfig) -> None:
    table = titled_table(f"collect {config.env}/{config.split} -> {config.store}")
    for col in ("tasks", "trajectories", "mean reward", "success rate", "tokens/s", "wall s"):
        table.add_column(col, justify="right")
    table.add_row(str(r.tasks), str(r.trajectories), f"{r.mean_reward:.3f}",
                  f"{r.success_rate:.1%}", f"{r.tokens_per_s:.1f}", f"{r.seconds:.0f}")
    console.print(table)
    if r.context_overflows:
        console.print(f"[yellow]warning:[/] {r.context_overflows} of {r.trajectories} episodes ended at the model's "
                      "context window, scored 0 (info.stopped 'context window'): lower --max-new-tokens or "
                      "--max-turns", soft_wrap=True)
