"""`lopd distill`: the on-policy training loop (Algorithm 1 of the LOPD paper) for every method.

Each step: the CURRENT student rolls out ``group_size`` trajectories on each of
``tasks_per_step`` training tasks (seeded task order) through one rollout engine kept for the
whole run (synced after every update); the trajectories become training rows of exactly the
sampled token ids (:func:`stages.core.data.rows.training_rows`); the method (``--method``,
:mod:`stages.methods`) attaches its privileged context to each row, gives the loss of each
micro-batch (gradients accumulated exactly) and acts after the optimizer step (LOPD: the dual
update of beta); the step's trajectories join the store and are embedded (memory grows); a
checkpoint is written after step 1, every ``checkpoint_every`` steps and after the last.

Checkpoints: :mod:`stages.core.run.checkpoint`; run-folder rules (resume, frozen config, metrics):
:mod:`stages.core.run.runs`; store consistency under SIGKILL: :mod:`stages.core.data.experience_rows`.
Data-parallel training over N processes (``torchrun`` / ``lopd distill --nproc N``):
:mod:`stages.core.run.distributed` (one process = the loop exactly as without it); a fully
fine-tuned student sharded over them (``--shard fsdp``): :mod:`stages.core.run.sharding`.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from schemas import Task, Trajectory
from stages.core.data import experience_rows
from stages.core.data.retrieval import Retriever, embeddings_info, index_new, load_embedder
from stages.core.data.rows import training_rows
from stages.core.data.store import ExperienceStore
from stages.core.models.assembly import save_final
from stages.core.models.backbone import disable_dropout, resolve_device_dtype
from stages.core.models.composer import base_model, enable_activation_checkpointing
from stages.core.run import checkpoint as ckpt
from stages.core.run import distributed, resources, runs, sharding
from stages.core.run.printing import field_lines
from stages.core.run.progress import StageProgress
from stages.core.run.provenance import git_commit
from stages.core.run.tracking import RunLogger
from stages.distill.checks import preflight
from stages.distill.settings import DistillConfig
from stages.distill.trainer import Trainer
from stages.engines import SamplingParams, make_engine
from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS
from stages.engines.rollout import RolloutStats, play
from stages.envs import make_env
from stages.methods import Method, StepBatch, StepContext
from stages.samples import chosen_samples, samples_markdown

COMMON_FIELDS = (
    "step", "reward_mean", "success_rate", "grad_norm_student", "loss", "tokens", "action_tokens",
    "skipped_rows", "context_overflows", "generations", "tokens_per_s", "rollout_s", "train_s", "seconds", "peak_rss_mb", "rss_mb",
    "prepare_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "memory_s",
)
# where a step's wall time goes (train_s = prepare + forward + backward + optimizer + sync)
PHASE_FIELDS = ("rollout_s", "prepare_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "memory_s")
TIMING_FIELDS = ("tokens_per_s", "train_s", "seconds", "peak_rss_mb", "rss_mb", *PHASE_FIELDS,
                 "gather_s")  # gather_s: a sharded run's all-gather of the full student for the rollout
ZERO_GRAD_WARN_AFTER = 2  # zero-gradient steps before the run warns that nothing is learned


def _training_modules(method: Method) -> list[torch.nn.Module]:
    """The student's module and every module ``method`` holds, as an attribute or one attribute
    down (a composer's backbone, a teacher object's model), each once."""
    found: dict[int, torch.nn.Module] = {id(method.student.model): method.student.model}
    for value in vars(method).values():
        for item in (value, *vars(value).values()) if hasattr(value, "__dict__") else (value,):
            if isinstance(item, torch.nn.Module):
                found.setdefault(id(item), item)
    return list(found.values())


class DistillReport(BaseModel):
    """Summary of a distill run (this invocation's steps; means over them)."""

    run_id: str
    method: str
    first_step: int
    last_step: int
    reward_mean: float
    success_rate: float
    method_state: dict[str, Any]
    rows_added: int
    final_dir: str
    last_checkpoint: str
    seconds: float
    zero_grad_steps: list[int] = []  # steps whose every gradient norm was 0: nothing was learned


class Distiller:
    """The state of one run: method (with its models), optimizer, engine, data position, store.

    Built from a :class:`DistillConfig` whose method options are resolved
    (:func:`stages.distill.settings.settings` or :meth:`DistillConfig.resolved`), fresh or
    resumed from ``out``'s newest checkpoint;
    :meth:`fit` runs the remaining steps. Attributes useful for inspection: ``method`` (e.g.
    :class:`stages.methods.lopd.LOPD` with ``composer`` and ``beta``), ``student``
    (:class:`stages.methods.Student`), ``step``.

    Under torchrun (``WORLD_SIZE`` > 1) it is one rank of a data-parallel run
    (:mod:`stages.core.run.distributed`, attribute ``world``): rank 0 checks and writes the run
    folder and the store, every rank builds the same models and takes the same updates.

    Raises:
        ValueError: unknown method, ``out`` holds another run (or a run with different
            settings under ``resume``), the ``log`` package is not installed (checked first:
            no model is loaded and no run folder is made), or the engine cannot run here
            or cannot sample at ``temperature``
            (:func:`stages.engines.check_engine`, checked first too); data-parallel: a method
            that cannot run so, fewer tasks per step than processes, a resume with another
            number of processes than the checkpoint's.
        StoreError, EnvError: unusable store or environment; a store that does not exist
            (unless ``new_store``). All of these come from :func:`stages.distill.checks.preflight`,
            before any model loads or any file is written.
    """

    def __init__(self, config: DistillConfig, console: Console | None = None) -> None:
        device = resolve_device_dtype(config.device, config.dtype)[0]  # gloo on the CPU, nccl on CUDA
        resources.map_large_blocks()  # freed activations leave the resident set at once
        self.world = distributed.world(torch.device(device).type)
        self.console = (console or Console()) if self.world.is_main else Console(quiet=True)
        checked = preflight(config, self.world.size, self.world.is_main)  # no model loaded, nothing written
        self.out, method_cls, self.tasks = Path(config.out), checked.method, checked.tasks
        resolved = None
        if self.world.is_main:  # rank 0 checks the run folder; the others take its run id
            if note := runs.start_note(checked.folder, config.resume):
                self.console.print(f"[bold]distill[/] {escape(note)}", soft_wrap=True)
            resolved = (checked.config, checked.folder.resuming)
            ckpt.clean_partial(self.out)
        self.config, self.resuming = distributed.broadcast(resolved, self.world)
        config = self.config
        resume_from = ckpt.latest_checkpoint(self.out) if self.resuming else None
        state = ckpt.read_state(resume_from) if resume_from else {}
        sharding.check_resume(config, self.world, resume_from, state)  # a sharded checkpoint may change N
        self.step = state.get("step", 0)
        self.cursor = state.get("data_position", 0)
        self.rows_added, self.commit = 0, git_commit()
        self.zero_grad_steps: list[int] = []  # steps whose every gradient norm was 0 (nothing learned)
        if self.world.is_main:
            self.store = ExperienceStore.open(config.store, create=config.new_store)
            if self.resuming:  # back to the store and metrics exactly as at the checkpoint
                dropped = experience_rows.drop_rows_after(self.store, config.run_id, self.step)
                runs.truncate_metrics(self.out / runs.METRICS_FILE, self.step)
                self.console.print(f"[bold]distill[/] resuming run {config.run_id} after step {self.step}"
                                   f" ({resume_from or 'no checkpoint'}); removed {dropped} stale rows")
            elif self.store.count(run_id=config.run_id):
                raise ValueError(f"store {config.store} already holds rows of run {config.run_id}: "
                                 "choose another run id")
        distributed.barrier(self.world)
        if not self.world.is_main:  # the store as rank 0 left it
            self.store = ExperienceStore.open(config.store, create=False)
        torch.manual_seed(config.seed)
        self.method: Method = method_cls(config, resume_from, state)
        self.student = self.method.student
        for module in _training_modules(self.method):  # adapters restored from checkpoints included
            disable_dropout(module)  # train() mode engages activation checkpointing, never dropout
        self.method.check_resources(self.store)
        if config.activation_checkpointing:
            if self.student.adapter is None:
                base_model(self.student.model).gradient_checkpointing_enable()
            elif not self.method.needs_composer:  # a composer method enables it on its shared backbone
                enable_activation_checkpointing(self.student.model)
        self.shard = sharding.shard_student(config, self.world, self.student, self.method.dtype)
        extra = self.method.param_groups()
        self.groups = {"student": self.student.params, **{k: params for k, (params, _) in extra.items()}}
        distributed.broadcast_params([p for params in self.groups.values() for p in params], self.world)
        self.optimizer = torch.optim.AdamW(
            [{"params": self.student.params, "lr": config.lr},
             *({"params": params, "lr": lr} for params, lr in extra.values())], weight_decay=0.0)
        self.trainer = Trainer(self.method, self.groups, self.optimizer, self.world, self.shard, self.out)
        if resume_from:
            self.trainer.restore(resume_from)
        # the prefix cache encodes the prompt the G rollouts of a task share once; cleared before
        # every update (engine.sleep) and at every weight sync
        self.engine = make_engine(config.engine, self.student.model, self.student.tokenizer,
                                  adapter=self.student.adapter, batch_size=config.rollout_batch,
                                  prefix_cache_tokens=PREFIX_CACHE_TOKENS, compile_decode=config.compile_decode)
        info = distributed.broadcast(embeddings_info(self.store) if self.world.is_main else None, self.world)
        # only a retrieving method reads embeddings: the others leave the rows for `lopd index`
        self.embedder = None
        if method_cls.retrieves:
            self.embedder = load_embedder(config.embedder or (info.embedder if info else None))
        self.index_field = info.field if info else "task"
        if self.world.is_main and self.embedder is not None:
            index_new(self.store, self.embedder, field=self.index_field)  # rows a crash left unembedded
        self.logger: RunLogger | None = None
        self.step_trajectories: list[Trajectory] = []  # the last step's rollouts (its samples go to the logger)
        if self.world.is_main:
            runs.freeze_config(self.out, "distill", config.run_id, config)  # once the whole setup succeeded
            self.logger = RunLogger(config.log, self.out, config.run_id, config.flat(), prefix="distill")
        if resume_from:
            sharding.restore_rng(resume_from, self.world)

    # ----------------------------------------------------------------------------- setup --

    def _data_dir(self) -> Path | None:
        return Path(self.config.data_dir) if self.config.data_dir else None

    # ------------------------------------------------------------------------------ loop --

    def tasks_for(self, cursor: int) -> list[Task]:
        """The ``tasks_per_step`` tasks at data position ``cursor`` of the seeded task stream.

        The stream is a fresh ``random.Random(seed, epoch)`` permutation of the train tasks per
        epoch, so the order depends only on (seed, position), never on wall-clock or resume.
        """
        stream = runs.seeded_stream(len(self.tasks), self.config.seed, cursor, self.config.tasks_per_step)
        return [self.tasks[i] for i in stream]

    def _rollout(self, step: int, stats: RolloutStats) -> list[Trajectory]:
        """Play the step's tasks with the current student; rows get deterministic ids.

        Data-parallel: each rank plays its contiguous share of the tasks and every rank gets all
        of the step's trajectories, in rank order. A rollout's seed comes from the step and its
        place in the step's whole task list (:func:`stages.engines.rollout.play`), never the rank.
        """
        c = self.config
        params = SamplingParams(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                                max_new_tokens=c.max_new_tokens, seed=c.seed * 1_000_003 + step * 10_007)
        factory = lambda: make_env(c.env, data_dir=self._data_dir(), max_turns=c.max_turns,
                                   episode_rules=c.episode_rules)  # noqa: E731
        self.student.model.eval()
        tasks = self.tasks_for(self.cursor)
        with self.shard.gathered() if self.shard else contextlib.nullcontext():
            played = list(play(self.engine, self.student.tokenizer, factory, distributed.share(tasks, self.world),
                               samples_per_task=c.group_size, params=params, policy_id=c.model,
                               run_id=c.run_id, git_commit=self.commit, max_concurrent=c.rollout_batch,
                               stats=stats, task_offset=self.world.span(len(tasks))[0]))
        return experience_rows.tag_step_rows(distributed.gather_lists(played, self.world), c.run_id, step)

    def _retriever(self) -> Retriever | None:
        if self.embedder is None or embeddings_info(self.store) is None:
            return None
        return Retriever(self.store, self.embedder)

    def train_step(self, step: int) -> dict:
        """Run step ``step``: rollout, the method's loss on micro-batches, update, memory append.

        Returns the metrics row: :data:`COMMON_FIELDS` and the method's ``metrics`` (loss
        terms are batch values, grad norms are taken before clipping, ``tokens`` = generated
        tokens (``tokens_per_s`` over generation time only), ``action_tokens`` = supervised
        tokens, ``skipped_rows`` = training sequences whose prompt alone filled ``max_len``,
        ``context_overflows`` = rollouts ended at the model's context window (scored 0),
        ``generations`` = rollouts played by this run so far, ``*_s`` wall seconds: the phases of
        :data:`PHASE_FIELDS`, ``train_s`` from the training rows to the weight sync, ``seconds``
        the whole step). Data-parallel: values of the whole step (all ranks), except the
        timings and ``peak_rss_mb`` (rank 0's; ``tokens_per_s`` = the sum of the ranks' rates;
        the gradient all-reduce counts in ``backward_s``).

        Raises:
            FloatingPointError: non-finite loss or gradient (nothing of the step is written;
                the newest checkpoint stays the last good one).
        """
        c = self.config
        t_start = time.perf_counter()
        stats = RolloutStats()
        trajectories = self._rollout(step, stats)
        self.step_trajectories = trajectories
        rollout_s = time.perf_counter() - t_start
        generated = distributed.sum_floats({"tokens": stats.generated_tokens, "tokens_per_s":
                                            stats.generated_tokens / max(stats.generate_seconds, 1e-9),
                                            "context_overflows": stats.context_overflows}, self.world)
        t_train = time.perf_counter()
        rows, skipped = training_rows(self.student.tokenizer, [t for t in trajectories if t.turns],
                                      max_len=c.max_len)  # failed resets hold no action token
        batch = StepBatch(rows, trajectories)
        batch.extras = self.method.prepare(batch, StepContext(self.store, self._retriever(), self.engine, step))
        if hasattr(self.engine, "sleep"):  # vllm: its GPU memory goes to the update; generate wakes it
            self.engine.sleep()
        self.trainer.phases = dict.fromkeys(("forward_s", "backward_s", "optimizer_s"), 0.0)
        prepare_s = time.perf_counter() - t_train
        self.student.model.train()  # train mode engages activation checkpointing (dropout is 0: disable_dropout)
        self.method.train_mode()
        epochs = self.method.update_epochs
        sums: dict[str, float] = {}
        norms: dict[str, float] = {}
        for _ in range(epochs):  # metrics are averaged over the updates of the step
            part_sums, part_norms = self.trainer.update(step, batch, c.micro_batch, c.grad_clip)
            for into, part in ((sums, part_sums), (norms, part_norms)):
                for k, v in part.items():
                    into[k] = into.get(k, 0.0) + v / epochs
        after = {}
        t_sync = time.perf_counter()
        if rows:  # no action token, no update (and no after-step: its statistics are undefined)
            after = self.method.after_step(sums)
            self.engine.sync_weights(self.student.model, self.student.adapter)
        train_s = time.perf_counter() - t_train
        sync_s = time.perf_counter() - t_sync
        t_memory = time.perf_counter()
        if self.world.is_main:
            self.rows_added += experience_rows.append_step(self.store, trajectories, self.embedder,
                                                           field=self.index_field)
        distributed.barrier(self.world)  # the next step's retrieval on every rank sees these rows
        memory_s = time.perf_counter() - t_memory
        resources.release_free_memory()  # freed activations back to the OS: RSS stays flat over steps
        self.step, self.cursor = step, self.cursor + c.tasks_per_step
        rewards = [t.reward for t in trajectories]
        row = {"step": step, "reward_mean": float(np.mean(rewards)),
               "success_rate": float(np.mean([t.success for t in trajectories])), **self._defaults(),
               **{k: v for k, v in sums.items() if k not in ("loss", "action_tokens")},
               **after, **norms, "loss": sums["loss"],
               "tokens": int(generated["tokens"]), "action_tokens": int(sums["action_tokens"]),
               "skipped_rows": len(skipped), "context_overflows": int(generated["context_overflows"]),
               "generations": step * c.tasks_per_step * c.group_size,
               "tokens_per_s": generated["tokens_per_s"],
               "rollout_s": rollout_s, "train_s": train_s, "seconds": time.perf_counter() - t_start,
               "peak_rss_mb": resources.peak_rss_mb(), "rss_mb": resources.rss_mb(),
               "prepare_s": prepare_s, **self.trainer.phases, "sync_s": sync_s, "memory_s": memory_s}
        if self.shard is not None:
            row["gather_s"] = self.shard.take_gather_seconds()
        return row

    def _defaults(self) -> dict[str, float]:
        """0.0 for every method metric, so each row has all of them (also on an empty step)."""
        return dict.fromkeys(self.method.metrics, 0.0)

    def save_checkpoint(self) -> Path:
        """Write ``out/checkpoints/step-<step>`` (:meth:`Trainer.save_checkpoint`) with the run's
        position (step, data position, run id, the method's state, the number of processes)."""
        state = {"step": self.step, "data_position": self.cursor, "run_id": self.config.run_id,
                 **self.method.state(), **({"world_size": self.world.size} if self.world.size > 1 else {})}
        return self.trainer.save_checkpoint(self.step, state, self.config.keep_checkpoints)

    def fit(self, on_step: Callable[["Distiller", dict], None] | None = None) -> DistillReport:
        """Run the remaining steps, checkpointing after step 1, every ``checkpoint_every`` and at the end.

        ``on_step(distiller, metrics_row)`` runs after each step's update and metrics row and
        BEFORE its checkpoint (`lopd study` evaluates there): a kill inside it resumes from an
        earlier checkpoint and redoes the step.
        """
        c = self.config
        first, rows, t0 = self.step + 1, [], time.perf_counter()
        todo = f"steps {first}..{c.steps}" if first <= c.steps else f"all {c.steps} steps done, nothing to train"
        self.console.print(f"[bold]distill[/] run {c.run_id} ({c.method}): {todo}, "
                           f"{c.tasks_per_step} tasks x {c.group_size} rollouts, env={c.env}, out={c.out}, "
                           f"{self.method.device} {self.method.dtype}")
        metrics_file = self.out / runs.METRICS_FILE
        # a bar on a terminal; in a log, a line every 30 s while a step (rollouts, update) runs
        with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TimeRemainingColumn(), console=self.console, transient=True,
                           disable=not self.world.is_main) as bar:
            job = bar.add_task(f"distill {c.method}", total=c.steps, completed=first - 1)
            for step in range(first, c.steps + 1):
                row = self.train_step(step)
                if self.world.is_main:
                    runs.append_metrics(metrics_file, row)
                rows.append(row)
                self._log(row)
                self._check_zero_gradient(row)
                bar.update(job, advance=1)
                if on_step is not None:
                    on_step(self, row)
                if step % c.checkpoint_every == 0 or step in (1, c.steps):  # step 1: a run that dies later resumes
                    self.save_checkpoint()
        if self.world.is_main and rows:  # the id index over this run's rollouts: a later `lopd index` has nothing to do
            self.store.index_ids()
        last = ckpt.latest_checkpoint(self.out)
        final = self.out / "final"
        student = self.shard.exported() if self.shard else self.student.model  # gathered on rank 0
        if self.world.is_main:
            final = save_final(self.out, last, model=c.model, tokenizer=self.student.tokenizer,
                               student=student, adapter=self.student.adapter,
                               export=self.method.export)
            self.logger.close()
        distributed.barrier(self.world)
        return DistillReport(
            run_id=c.run_id, method=c.method, first_step=first, last_step=self.step,
            reward_mean=float(np.mean([r["reward_mean"] for r in rows])) if rows else 0.0,
            success_rate=float(np.mean([r["success_rate"] for r in rows])) if rows else 0.0,
            method_state=self.method.state(), rows_added=self.rows_added,
            final_dir=str(final), last_checkpoint=str(last), seconds=time.perf_counter() - t0,
            zero_grad_steps=self.zero_grad_steps)

    def _check_zero_gradient(self, row: dict) -> None:
        """Record a step whose every ``grad_norm_*`` is 0 (e.g. GRPO where no group's rewards
        vary); warn once, at the second such step (the run summary lists them all)."""
        norms = [v for k, v in row.items() if k.startswith("grad_norm_")]
        if norms and all(v == 0.0 for v in norms):
            self.zero_grad_steps.append(row["step"])
            if len(self.zero_grad_steps) == ZERO_GRAD_WARN_AFTER:
                self.console.print(f"[yellow]warning:[/] steps {', '.join(map(str, self.zero_grad_steps))} had a "
                                   "zero gradient: the student did not change at those steps (e.g. GRPO with no "
                                   "reward variance in any group: more --group-size, another --temperature or task "
                                   "mix)", soft_wrap=True)

    def _log(self, row: dict) -> None:
        fields = [f"step {row['step']}/{self.config.steps}", f"reward {row['reward_mean']:.3f}",
                  f"success {row['success_rate']:.0%}", *(f"{k} {row[k]:.4g}" for k in self.method.metrics if k in row),
                  f"loss {row['loss']:.4f}", f"| {row['tokens_per_s']:.0f} tok/s,", f"{row['seconds']:.1f}s,",
                  f"{row['peak_rss_mb']:.0f} MB"]
        # one line per step where it fits; else broken between fields, never inside one
        self.console.print(field_lines(fields, self.console.width), soft_wrap=True)
        if row["skipped_rows"]:
            trained = "no action token was trained" if not row["action_tokens"] else f"{row['action_tokens']} action tokens trained"
            self.console.print(f"[yellow]warning:[/] step {row['step']}: {row['skipped_rows']} training sequences "
                               f"skipped, their prompt alone fills --max-len {self.config.max_len} ({trained}; "
                               "raise --max-len)", soft_wrap=True)
        if self.logger is not None:
            self.logger.log(row, row["step"])
            samples = chosen_samples(self.step_trajectories)  # first, best, worst, as `lopd report` shows them
            self.logger.log_samples(samples, "\n".join(samples_markdown(samples)), row["step"])


def zero_gradient_summary(report: DistillReport, total: int) -> str:
    """``"2 of the 2 steps run now (steps 2..3 of 3) had a zero gradient: steps 2, 3; ..."``: the
    zero-gradient steps of this call among the steps it ran (a resumed run ran only those after
    its checkpoint; ``total``: the run's ``--steps``)."""
    ran = report.last_step - report.first_step + 1
    span = (f"step {report.first_step}" if ran == 1 else f"steps {report.first_step}..{report.last_step}")
    listed = ", ".join(map(str, report.zero_grad_steps))
    return (f"{len(report.zero_grad_steps)} of the {ran} step{'s' * (ran != 1)} run now ({span} of {total}) had a "
            f"zero gradient: step{'s' * (len(report.zero_grad_steps) != 1)} {listed}; the student was not "
            "trained on them")


def run(config: DistillConfig, console: Console | None = None) -> DistillReport:
    """Train with ``config.method`` as configured (Algorithm 1 of the LOPD paper); returns the summary.

    Raises:
        ValueError: a config that cannot run (e.g. against ``out``; see :class:`Distiller`).
        FloatingPointError: non-finite loss or gradient ("... last good checkpoint: DIR").
        StoreError, EnvError: unusable store or environment.
    """
    console = console or Console()
    distiller = Distiller(config, console)
    report = distiller.fit()
    if not distiller.world.is_main:
        return report
    out = Path(config.out)
    steps = report.last_step - report.first_step + 1
    peak_mb = resources.peak_rss_mb()
    done = (f"steps {report.first_step}..{report.last_step} ({steps} this call)" if steps > 0 else
            f"all {report.last_step} steps were done already (0 this call)")
    console.print(f"[bold]distill[/] {config.method} run {report.run_id}: {done} "
                  f"in {report.seconds / 60:.1f} min, peak RSS {peak_mb:.0f} MB; "
                  f"mean reward {report.reward_mean:.3f}, success {report.success_rate:.0%}, "
                  f"{report.rows_added} rollouts added to {config.store}", soft_wrap=True)
    console.print(f"  student: {report.final_dir}/student (a plain Hugging Face model: lopd evaluate --model ...)\n"
                  f"  metrics: {out / runs.METRICS_FILE} (plots: lopd report {out})\n"
                  f"  last checkpoint: {report.last_checkpoint}", soft_wrap=True)
    if report.zero_grad_steps:
        console.print(f"[yellow]warning:[/] {zero_gradient_summary(report, config.steps)}", soft_wrap=True)
    return report
