"""`lopd coldstart`: train the composer phi on successful experiences (Section 3.2 of the LOPD paper).

Cold start objective: for a successful target trajectory tau of task x, retrieve J OTHER
successful experiences m_1..m_J, compose c_phi = Comp(Enc_psi(x, m_j)) (Eq. 5-6), and minimise
the masked NLL of tau's action tokens under the latent-conditioned teacher
pi_{theta_bar, phi}^T (Eq. 7-8: the frozen backbone with every adapter disabled and c_phi
spliced into its input). Only phi = (composer LoRA psi, QFormer compressor chi) is trained; the
backbone stays bit-identical (checked at the end of every run).

Data protocol:

- Targets are the store's successful train-split trajectories (optionally of one env). Tasks
  are split deterministically (seeded hash of the task id) into train and held-out tasks.
- Retrieval for a training target never returns the target itself, never a held-out task's
  trajectory (held-out trajectories play no role at all in training) and, with
  ``exclude_same_task`` (default), no trajectory of the target's own task. Why exclude the
  same task: with G > 1 samples per task another success of the same task holds the answer
  almost verbatim, so the composer would learn to copy it (a shortcut that lowers the NLL
  without learning to distil transferable guidance), and at distill time a fresh task has
  no stored success to copy from, so the teacher would be trained on a context it never gets.
- Held-out evaluation (:func:`evaluate_heldout`) scores held-out targets with experiences
  retrieved from the whole store (minus the target, and its task with ``exclude_same_task``),
  as at deployment: NLL with (a) no latents, (b) the untrained composer (same seeded init),
  (c) the trained composer.

Outputs in ``out/``: ``config.json`` and ``manifest.json`` (run-folder rules:
:mod:`stages.core.runs`), ``metrics.jsonl`` (one record per step), ``checkpoints/step-N/``
(composer + optimizer + RNG states, written atomically, last two kept), ``final/`` (the
composer, :func:`stages.core.composer.save_composer`), ``heldout.json``.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import time
from pathlib import Path
from typing import Iterator, Literal

import torch
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from schemas import Trajectory
from stages.core.chat import action_spans, tokenize_for_training
from stages.core.checkpoint import (
    CHECKPOINTS, OPTIMIZER_FILE, clean_partial, latest_checkpoint, read_state, restore_rng, write_checkpoint,
)
from stages.core.composer import (
    Composer, base_parameters, enable_activation_checkpointing, preserve_requires_grad, save_composer,
)
from stages.core.contexts import build_batch, lookup_tools, retrieve_experiences, shift_for_loss
from stages.core.losses import masked_nll
from stages.core.models import load_composer
from stages.core.policy import DType
from stages.core.resources import peak_rss_mb, release_free_memory, rss_mb
from stages.core.provenance import config_run_id
from stages.core.runs import (
    METRICS_FILE, RESUMABLE, append_metrics, coldstart_stream, describe_changes, freeze_config, open_run,
    read_metrics, truncate_metrics,
)
from stages.core.store import ExperienceStore, StoreError
from stages.core.teacher import teacher_logits

FINAL = "final"
HELDOUT = "heldout.json"
KEEP_CHECKPOINTS = 2
# Settings a resumed run may change (they do not change the meaning of finished steps), and
# the fields holding paths (compared after resolving).
_RESUMABLE = RESUMABLE | {"eval_every"}
_PATH_FIELDS = ("experiences", "out")
_RUN_KEYS = ["experiences", "model", "steps", "lr", "batch_size", "J", "K", "depth", "qformer_shared", "lora_rank",
             "max_exp_tokens", "max_len", "placement", "heldout_fraction", "exclude_same_task",
             "seed", "env", "grad_clip"]
_SCRATCH_ADAPTER = "composer_init"  # briefly holds the seeded init on resume (untrained baseline)


class ColdstartConfig(BaseModel):
    """Settings of one `lopd coldstart` run (the CLI flags, validated).

    Attributes:
        experiences: experience store (indexed with `lopd index`).
        out: output folder.
        model: backbone (``smollm2-135m``, HF id or local folder).
        steps, lr, batch_size: AdamW steps (constant lr, no weight decay), targets per step.
        J, K, depth, lora_rank, max_exp_tokens: composer (experiences per target, latents per
            experience, QFormer block applications, composer LoRA rank, token cap of one experience).
        qformer_shared: one QFormer block applied ``depth`` times (the paper's) or ``depth`` blocks.
        max_len: token cap of a target conversation (keeps the start, never cuts the prompt).
        placement: where the latents go: ``prefix`` (after the task prompt), ``per-turn``
            (before each action, Eq. 8) or ``framed`` (inside the first user message between
            framing texts, A.4; :mod:`stages.core.framing`).
        heldout_fraction: share of the tasks held out for evaluation.
        exclude_same_task: retrieve no trajectory of the target's own task (module docstring).
        checkpoint_every, eval_every: steps between checkpoints / held-out evaluations.
        seed: seeds the composer init, the task split and the batch order.
        resume: continue from the latest checkpoint in ``out``; only ``steps``,
            ``checkpoint_every``, ``eval_every``, ``max_len``, ``device``, ``dtype`` and the
            spelling of paths may change (:mod:`stages.core.runs`).
        env: use only this environment's trajectories (None = all).
        activation_checkpointing: recompute the backbone layers in backward (less memory);
            also accepted as ``grad_checkpointing``.
        grad_clip: gradient-norm clipping of phi (None = off); also accepted as ``max_grad_norm``.
        device, dtype: where the backbone and composer live and the backbone's dtype (None:
            CUDA in bfloat16 when a GPU is visible, else the CPU in float32;
            :func:`stages.core.policy.resolve_device_dtype`).
    """

    model_config = ConfigDict(extra="forbid")

    experiences: str
    out: str
    model: str = "smollm2-135m"
    steps: int = Field(default=200, ge=1)
    lr: float = Field(default=1e-4, gt=0)
    batch_size: int = Field(default=2, ge=1)
    J: int = Field(default=3, ge=1)
    K: int = Field(default=32, ge=1)
    depth: int = Field(default=8, ge=1)
    qformer_shared: bool = True
    lora_rank: int = Field(default=8, ge=1)
    max_exp_tokens: int = Field(default=256, ge=1)
    max_len: int = Field(default=1024, ge=2)
    placement: Literal["prefix", "per-turn", "framed"] = "prefix"
    heldout_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    exclude_same_task: bool = True
    checkpoint_every: int = Field(default=50, ge=1)
    eval_every: int = Field(default=50, ge=1)
    seed: int = 0
    resume: bool = False
    env: str | None = None
    activation_checkpointing: bool = Field(
        default=True, validation_alias=AliasChoices("activation_checkpointing", "grad_checkpointing"))
    grad_clip: float | None = Field(default=1.0, gt=0, validation_alias=AliasChoices("grad_clip", "max_grad_norm"))
    device: str | None = None
    dtype: DType | None = None


class HeldoutResult(BaseModel):
    """Masked NLL (nats per action token, pooled over held-out tokens) of held-out actions.

    Attributes:
        nll_no_latents: the teacher without any latent context (the plain backbone).
        nll_untrained: latents of the untrained composer (same seeded init); None if not run.
        nll_trained: latents of the trained composer.
        trajectories, tokens: how many held-out targets / action tokens were scored.
    """

    nll_no_latents: float
    nll_untrained: float | None
    nll_trained: float
    trajectories: int
    tokens: int


class ColdstartReport(BaseModel):
    """Summary of a coldstart run."""

    run_id: str
    out: str
    final: str
    backbone_id: str
    steps: int
    start_step: int
    train_trajectories: int
    train_tasks: int
    too_long: int
    heldout_trajectories: int
    heldout_tasks: int
    final_loss: float
    final_loss_steps: int = 0
    heldout: HeldoutResult | None
    seconds: float
    seconds_per_step: float
    peak_rss_mb: float
    backbone_unchanged: bool


# ---------------------------------------------------------------------------------------------
# Data: split, batches, retrieval
# ---------------------------------------------------------------------------------------------


def split_tasks(task_ids: set[str], heldout_fraction: float, seed: int) -> tuple[set[str], set[str]]:
    """Deterministic (train, held-out) task split: tasks ordered by sha1(seed:task_id).

    The first ``round(fraction * n)`` tasks are held out, at least one and at most n - 1 when
    ``fraction > 0`` and there are 2+ tasks; none with a single task or ``fraction == 0``.
    """
    order = sorted(task_ids, key=lambda t: hashlib.sha1(f"{seed}:{t}".encode()).hexdigest())
    n = len(order)
    k = 0
    if heldout_fraction > 0 and n >= 2:
        k = min(max(1, round(heldout_fraction * n)), n - 1)
    return set(order[k:]), set(order[:k])


class _Data:
    """Targets, cached retrievals and cached tool schemas."""

    def __init__(self, retriever, tokenizer, config: ColdstartConfig, heldout_tasks: set[str]):
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.config = config
        self.heldout_tasks = heldout_tasks
        self._exps: dict[tuple[str, bool], list[Trajectory]] = {}
        self._tools: dict[str, list[dict]] = {}

    def experiences(self, trajs: list[Trajectory], heldout: bool) -> list[list[Trajectory]]:
        todo = [t for t in trajs if (t.trajectory_id, heldout) not in self._exps]
        if todo:
            # training: held-out tasks never enter the pool; evaluation: the whole store
            found = retrieve_experiences(
                self.retriever, todo, self.config.J, exclude_same_task=self.config.exclude_same_task,
                exclude_task_ids=() if heldout else self.heldout_tasks,
            )
            for t, exps in zip(todo, found):
                self._exps[(t.trajectory_id, heldout)] = exps
        return [self._exps[(t.trajectory_id, heldout)] for t in trajs]

    def tools(self, trajs: list[Trajectory]) -> list[list[dict]]:
        todo = [t for t in trajs if t.trajectory_id not in self._tools]
        for t, tools in zip(todo, lookup_tools(todo)):
            self._tools[t.trajectory_id] = tools
        return [self._tools[t.trajectory_id] for t in trajs]

    def batch(self, trajs: list[Trajectory], heldout: bool, device: str):
        return build_batch(
            self.tokenizer, trajs, self.experiences(trajs, heldout), J=self.config.J,
            max_exp_tokens=self.config.max_exp_tokens, max_len=self.config.max_len,
            tools=self.tools(trajs), framed=self.config.placement == "framed",
        ).to(device)


# ---------------------------------------------------------------------------------------------
# Forward, loss, evaluation
# ---------------------------------------------------------------------------------------------


def _teacher_nll(composer: Composer, batch, placement: str, latents: bool = True):
    """Masked NLL of the batch's action tokens under the teacher (with or without c_phi)."""
    if latents:
        c_phi = composer(batch.exp_ids_BJL, batch.exp_mask_BJL)
    else:
        embeds = composer.backbone.get_input_embeddings().weight
        c_phi = embeds.new_zeros(batch.input_ids_BT.shape[0], 0, embeds.shape[1])  # no latent
    logits = teacher_logits(
        composer.backbone, batch.input_ids_BT, batch.attn_mask_BT, c_phi, batch.insert_at_B,
        placement=placement if latents else "prefix", action_starts=batch.action_starts,
        frame_ids=batch.frame_ids,
    )
    lg, tgt, mask = shift_for_loss(logits, batch)
    return masked_nll(lg, tgt, mask)


@contextlib.contextmanager
def swapped_phi(composer: Composer, phi: list[torch.Tensor]) -> Iterator[None]:
    """Temporarily load the parameter values ``phi`` (order of ``trainable_parameters``)."""
    params = composer.trainable_parameters()
    if len(params) != len(phi):
        raise ValueError(f"phi has {len(phi)} tensors, the composer {len(params)}")
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, phi):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)


@torch.no_grad()
def _pooled_nll(composer: Composer, batches: list, placement: str, latents: bool) -> tuple[float, int]:
    total, tokens = 0.0, 0
    for batch in batches:
        _, m = _teacher_nll(composer, batch, placement, latents)
        total += m["nll"] * m["num_tokens"]
        tokens += int(m["num_tokens"])
    return total / max(tokens, 1), tokens


def evaluate_heldout(
    composer: Composer,
    tokenizer,
    trajectories: list[Trajectory],
    experiences: list[list[Trajectory]],
    *,
    J: int,
    max_exp_tokens: int,
    max_len: int | None,
    placement: str = "prefix",
    batch_size: int = 2,
    tools: list[list[dict]] | None = None,
    untrained_phi: list[torch.Tensor] | None = None,
    baselines: bool = True,
) -> HeldoutResult:
    """Masked NLL of held-out trajectories' actions under the teacher, three ways.

    (a) no latent context (adapters disabled, nothing spliced in), (b) latents of the composer
    with ``untrained_phi`` loaded (its initial parameters; skipped when None), (c) latents of
    ``composer`` as it is. Pooled over all held-out action tokens (nats per token). With
    ``baselines=False`` only (c) is computed and (a) is reported as NaN.

    Args:
        experiences: per trajectory, the retrieved experiences (the target itself excluded).
        tools: per trajectory, its tool schemas (default: ``info["tools"]``).
    """
    if not trajectories:
        raise ValueError("evaluate_heldout: no trajectories")
    device = composer.backbone.get_input_embeddings().weight.device
    was_training = composer.backbone.training
    composer.backbone.eval()
    try:
        batches = []
        for lo in range(0, len(trajectories), batch_size):
            sl = slice(lo, lo + batch_size)
            batches.append(build_batch(tokenizer, trajectories[sl], experiences[sl], J=J,
                                       max_exp_tokens=max_exp_tokens, max_len=max_len,
                                       tools=None if tools is None else tools[sl],
                                       framed=placement == "framed").to(device))
        trained, tokens = _pooled_nll(composer, batches, placement, latents=True)
        none = _pooled_nll(composer, batches, placement, latents=False)[0] if baselines else math.nan
        untrained = None
        if untrained_phi is not None and baselines:
            with swapped_phi(composer, untrained_phi):
                untrained = _pooled_nll(composer, batches, placement, latents=True)[0]
    finally:
        composer.backbone.train(was_training)
    return HeldoutResult(nll_no_latents=none, nll_untrained=untrained, nll_trained=trained,
                         trajectories=len(trajectories), tokens=tokens)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def _save_checkpoint(out: Path, step: int, composer: Composer, optimizer, config: ColdstartConfig,
                     backbone_id: str) -> Path:
    """Write ``out/checkpoints/step-<step>`` atomically (composer, optimizer, RNG states)."""

    def fill(folder: Path) -> None:
        save_composer(composer, folder, {"backbone_id": backbone_id, "placement": config.placement,
                                         "coldstart_step": step})
        torch.save(optimizer.state_dict(), folder / OPTIMIZER_FILE)

    return write_checkpoint(out, step, fill, {"step": step}, keep=KEEP_CHECKPOINTS)


def _new_composer(backbone, config: ColdstartConfig, adapter_name: str = "composer",
                  shared: bool | None = None) -> Composer:
    """The composer of a fresh run at its seeded init (seeds torch's global RNG); ``shared``
    overrides ``config.qformer_shared`` (a resumed run keeps its checkpoint's kind)."""
    torch.manual_seed(config.seed)
    shared = config.qformer_shared if shared is None else shared
    return Composer(backbone, J=config.J, K=config.K, depth=config.depth, qformer_shared=shared,
                    lora_rank=config.lora_rank,
                    lora_alpha=2 * config.lora_rank, max_exp_tokens=config.max_exp_tokens,
                    adapter_name=adapter_name)


def _initial_phi(composer: Composer, config: ColdstartConfig) -> list[torch.Tensor]:
    """phi of a fresh run's seeded init (the untrained baseline) for a resumed ``composer``.

    Built on a scratch adapter of the same backbone (same init as a fresh run's composer),
    copied, and the scratch adapter deleted again.
    """
    scratch = _new_composer(composer.backbone, config, adapter_name=_SCRATCH_ADAPTER,
                            shared=composer.hparams["qformer_shared"])
    phi = [p.detach().clone() for p in scratch.trainable_parameters()]
    with preserve_requires_grad(composer.backbone):
        composer.backbone.delete_adapter(_SCRATCH_ADAPTER)
    return phi


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------


def _backbone_digest(composer: Composer) -> str:
    h = hashlib.sha256()
    for name, p in base_parameters(composer.backbone):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _prompt_fits(tokenizer, traj: Trajectory, tools: list[dict], max_len: int) -> bool:
    """Whether at least one action token of ``traj`` lies within the first ``max_len`` tokens."""
    ids, mask = tokenize_for_training(tokenizer, traj.messages, tools)
    spans = action_spans(mask)
    return bool(spans) and spans[0][0] < max_len


def run(config: ColdstartConfig, console: Console | None = None, embedder=None) -> ColdstartReport:
    """Train the composer as configured; returns the summary (also printed as a table).

    Args:
        embedder: query embedder for retrieval (default: the one the store was indexed with).

    Raises:
        StoreError: no store / no embeddings, or fewer than 2 successful trajectories.
        ValueError: ``out`` already holds a run and ``resume`` is False, or a resumed run
            changes a setting that may not change (file and field named).
    """
    from stages.core.policy import DEFAULT_MODEL, disable_dropout, load_policy, resolve_device_dtype, resolve_model
    from stages.core.resources import check_experience_count, check_step_memory, shape_of
    from stages.core.retrieval import Retriever

    console = console or Console()
    t_start = time.perf_counter()
    out = Path(config.out)
    run_id = config_run_id("coldstart", config, _RUN_KEYS)
    clean_partial(out)
    folder = open_run(out, "coldstart", config, resume=config.resume, may_change=_RESUMABLE,
                      path_fields=_PATH_FIELDS)
    if folder.changes:
        console.print(describe_changes(folder.changes))
    ckpt = latest_checkpoint(out) if config.resume else None

    # data
    store = ExperienceStore.open(config.experiences, create=False)
    successes = store.query(success=True, split="train", env=config.env)
    successes.sort(key=lambda t: t.trajectory_id)
    if len(successes) < 2:
        where = f" of env {config.env!r}" if config.env else ""
        raise StoreError(
            f"store {config.experiences} holds {len(successes)} successful train trajectories{where}; "
            "coldstart needs at least 2 (one target and one experience): collect more first")
    check_experience_count(config.J, len(successes), store=config.experiences)
    retriever = Retriever(store, embedder)

    # model
    # the name, not this machine's cache path, for the embedded default backbone
    backbone_id = config.model if config.model == DEFAULT_MODEL else resolve_model(config.model)
    device, dtype = resolve_device_dtype(config.device, config.dtype)
    model, tokenizer = load_policy(config.model, dtype=dtype, device=device)
    check_step_memory(shape_of(model.config, batch=config.batch_size, J=config.J, K=config.K,
                               max_exp_tokens=config.max_exp_tokens, seq_len=config.max_len,
                               activation_checkpointing=config.activation_checkpointing),
                      stage="coldstart", knobs="--J, --max-exp-tokens, --batch-size or --max-len")

    # targets whose prompt alone fills max_len cannot be scored: leave them out (not as experiences)
    fits = [t for t, tools in zip(successes, lookup_tools(successes))
            if _prompt_fits(tokenizer, t, tools, config.max_len)]
    too_long = len(successes) - len(fits)
    if too_long:
        console.print(f"[yellow]{too_long} successful trajectories have a prompt of {config.max_len}+ "
                      "tokens and are not used as targets (raise --max-len to keep them)[/]")
    if len(fits) < 2:
        raise StoreError(f"store {config.experiences}: only {len(fits)} successful trajectories fit "
                         f"max_len={config.max_len}; coldstart needs at least 2")
    train_tasks, heldout_tasks = split_tasks({t.task_id for t in fits}, config.heldout_fraction, config.seed)
    train = [t for t in fits if t.task_id in train_tasks]
    heldout = [t for t in fits if t.task_id in heldout_tasks]
    if len(train) < config.batch_size:
        console.print(f"[yellow]warning: {len(train)} training trajectories for --batch-size {config.batch_size}: "
                      "every step sees the same few targets (collect more successes first)[/]", soft_wrap=True)
    if config.heldout_fraction > 0 and len(heldout_tasks) < 5:
        console.print(f"[yellow]warning: {len(heldout_tasks)} held-out task(s): the held-out NLL is too noisy "
                      "to compare (more tasks, or a larger --heldout-fraction)[/]", soft_wrap=True)
    if ckpt is None:
        composer = _new_composer(model, config)
        untrained_phi = [p.detach().clone() for p in composer.trainable_parameters()]
    else:
        composer = load_composer(model, ckpt, trainable=True, backbone_id=backbone_id)
        untrained_phi = _initial_phi(composer, config)
    disable_dropout(composer.backbone)  # a restored adapter's lora_dropout too: train() mode never drops
    params = composer.trainable_parameters()
    digest_before = _backbone_digest(composer)
    if config.activation_checkpointing:
        enable_activation_checkpointing(composer.backbone)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    data = _Data(retriever, tokenizer, config, heldout_tasks)

    start_step = 0
    if ckpt is not None:
        optimizer.load_state_dict(torch.load(ckpt / OPTIMIZER_FILE, weights_only=True, map_location=device))
        restore_rng(ckpt)
        start_step = int(read_state(ckpt)["step"])
    elif config.resume:
        console.print(f"[yellow]no checkpoint in {out / CHECKPOINTS}: starting from step 0[/]")
    freeze_config(out, "coldstart", run_id, config)
    metrics_path = out / METRICS_FILE
    # rows of steps after the checkpoint (and a line cut short by a kill) are dropped
    truncate_metrics(metrics_path, start_step)
    history = read_metrics(metrics_path)

    console.print(
        f"[bold]coldstart[/] run {run_id}: {len(train)} train / {len(heldout)} held-out successful "
        f"trajectories ({len(train_tasks)} / {len(heldout_tasks)} tasks), steps {start_step}->{config.steps}, "
        f"J={config.J} K={config.K} depth={config.depth} placement={config.placement}, model={config.model} "
        f"on {device} {dtype}")

    def heldout_eval(baselines: bool) -> HeldoutResult | None:
        if not heldout:
            return None
        return evaluate_heldout(
            composer, tokenizer, heldout, data.experiences(heldout, heldout=True), J=config.J,
            max_exp_tokens=config.max_exp_tokens, max_len=config.max_len, placement=config.placement,
            batch_size=config.batch_size, tools=data.tools(heldout),
            untrained_phi=untrained_phi if baselines else None, baselines=baselines)

    step_seconds: list[float] = []
    result: HeldoutResult | None = None
    losses = [r["loss"] for r in history]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=False) as bar:
        job = bar.add_task("steps", total=config.steps, completed=start_step,
                           loss=losses[-1] if losses else float("nan"))
        for step in range(start_step, config.steps):
            t0 = time.perf_counter()
            composer.backbone.train(config.activation_checkpointing)  # HF checkpoints layers in train mode only
            batch_ids = coldstart_stream(len(train), config.seed, step * config.batch_size, config.batch_size)
            targets = [train[i] for i in batch_ids]
            batch = data.batch(targets, heldout=False, device=device)
            optimizer.zero_grad(set_to_none=True)
            loss, m = _teacher_nll(composer, batch, config.placement)
            for p in params:  # FIELD-NOTES pitfall 2: adapter switching may clear the flags
                p.requires_grad_(True)
            loss.backward()
            max_norm = config.grad_clip if config.grad_clip is not None else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            optimizer.step()
            loss = float(loss.detach())  # the graph is freed before the trim
            release_free_memory()  # freed activations back to the OS: RSS stays flat over steps
            done = step + 1
            record = {"step": done, "loss": loss, "nll": m["nll"], "grad_norm": grad_norm,
                      "lr": optimizer.param_groups[0]["lr"], "tokens": int(m["num_tokens"]),
                      "seconds": time.perf_counter() - t0, "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb()}
            step_seconds.append(record["seconds"])
            if done == config.steps and heldout:  # the final evaluation, three ways, on the curve too
                result = heldout_eval(baselines=True)
                record.update(heldout_nll=result.nll_trained, heldout_nll_no_latents=result.nll_no_latents)
                if result.nll_untrained is not None:
                    record["heldout_nll_untrained"] = result.nll_untrained
            elif done % config.eval_every == 0 and heldout:
                record["heldout_nll"] = heldout_eval(baselines=False).nll_trained
            append_metrics(metrics_path, record)
            losses.append(record["loss"])
            if done % config.checkpoint_every == 0 or done == config.steps:
                _save_checkpoint(out, done, composer, optimizer, config, backbone_id)
            bar.update(job, advance=1, loss=record["loss"])

    composer.backbone.eval()
    if start_step == config.steps and (out / FINAL).is_dir() and (out / HELDOUT).is_file():
        # a finished run resumed again (a second `make demo`): its final composer and report stand
        final, result = out / FINAL, HeldoutResult.model_validate_json((out / HELDOUT).read_text())
    else:
        final = save_composer(composer, out / FINAL, {"backbone_id": backbone_id, "placement": config.placement,
                                                      "coldstart_steps": config.steps, "store": config.experiences})
        if result is None:  # not evaluated in the loop (nothing held out, or nothing left to train)
            result = heldout_eval(baselines=True)
        if result is not None:
            (out / HELDOUT).write_text(result.model_dump_json(indent=2))
    unchanged = _backbone_digest(composer) == digest_before
    tail = losses[-max(1, min(10, len(losses))):] if losses else [math.nan]  # the last (up to) 10 steps
    report = ColdstartReport(
        run_id=run_id, out=str(out), final=str(final), backbone_id=backbone_id, steps=config.steps,
        start_step=start_step, train_trajectories=len(train), train_tasks=len(train_tasks), too_long=too_long,
        heldout_trajectories=len(heldout), heldout_tasks=len(heldout_tasks),
        final_loss=sum(tail) / len(tail), final_loss_steps=len(losses[-10:]), heldout=result, seconds=time.perf_counter() - t_start,
        seconds_per_step=sum(step_seconds) / max(len(step_seconds), 1), peak_rss_mb=peak_rss_mb(),
        backbone_unchanged=unchanged,
    )
    if not unchanged:
        raise RuntimeError("coldstart changed the backbone weights: only phi may be trained")
    _print_summary(console, report)
    return report


def _print_summary(console: Console, r: ColdstartReport) -> None:
    table = Table(title=f"coldstart -> {r.out}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("steps", f"{r.start_step} -> {r.steps}")
    table.add_row("train / held-out trajectories", f"{r.train_trajectories} / {r.heldout_trajectories}")
    table.add_row(f"final train loss (mean of the last {r.final_loss_steps} steps)" if r.final_loss_steps
                  else "final train loss", f"{r.final_loss:.4f}")
    if r.heldout is not None:
        h = r.heldout
        table.add_row("held-out NLL, no latents", f"{h.nll_no_latents:.4f}")
        table.add_row("held-out NLL, untrained composer",
                      "-" if h.nll_untrained is None else f"{h.nll_untrained:.4f}")
        table.add_row("held-out NLL, trained composer", f"{h.nll_trained:.4f}")
        table.add_row("held-out action tokens", str(h.tokens))
    trained_now = r.start_step < r.steps
    table.add_row("s / step", f"{r.seconds_per_step:.2f}" if trained_now else "- (nothing left to train)")
    table.add_row("peak RSS (MB)" if trained_now else "peak RSS of this run (MB)", f"{r.peak_rss_mb:.0f}")
    table.add_row("backbone unchanged", str(r.backbone_unchanged))
    table.add_row("composer", r.final)
    console.print(table)
