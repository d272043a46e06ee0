"""`lopd sft`: supervised fine-tuning of the student on verified trajectories from the store.

Two uses, one objective (the token-mean negative log-likelihood of the action tokens, nothing
else supervised):

- the **warm start** every method of a study starts from: the verified reference trajectories
  of a split no train, held-out or transfer task uses (the study bed's ``warmup`` split,
  collected with ``lopd collect --env lopd-bed --split warmup --reference``), so that the
  student knows the call format;
- two **baselines**: SFT on the train split's verified references (``--source reference``), and
  rejection-sampling fine-tuning on the student's own successes (``--source student``: rows
  that a model policy produced, reward at least ``--min-reward``).

Training reads exactly the token ids the store holds (the ids the policy sampled, or the ids a
reference replay recorded for the policy's tokenizer); rows of another tokenizer are
re-tokenized from their text, with a warning (:func:`stages.core.data.rows.training_rows`).

Run folder ``out`` (rules of :mod:`stages.core.run.runs`): ``config.json``, ``manifest.json``,
``metrics.jsonl`` (one row per step: nll, tokens, seconds), ``checkpoints/step-N``
(student + optimizer, resumable with ``--resume``), and ``final/student``: a plain
``save_pretrained`` folder (a LoRA student merged) that ``--model`` of every stage takes. Under a
bf16/fp16 run a fully fine-tuned student keeps float32 weights and AdamW state (its forwards
compute in the run dtype under autocast), so checkpoints and ``final/student`` hold float32.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape

from schemas import Trajectory
from stages.core.models.backbone import DEFAULT_MODEL
from stages.settings import DEFAULT_STORE, Device, Log, ResumeRun, RunDType

if TYPE_CHECKING:
    import torch

    from stages.core.data.store import ExperienceStore

Source = Literal["reference", "student", "any"]
REFERENCE_POLICY = "reference"  # Trajectory.policy of rows that `lopd collect --reference` wrote
_RUN_KEYS = ["store", "model", "env", "split", "source", "min_reward", "batch_size", "lr", "lora_rank", "seed"]


class SftConfig(BaseModel):
    """Settings of one `lopd sft` run: the flags, each described by its field. Rows train when
    they count as successes with reward >= ``min_reward``; a LoRA adapter (``lora_rank`` > 0)
    has alpha 2 x rank."""

    model_config = ConfigDict(extra="forbid")

    store: str = Field(DEFAULT_STORE, description="Experience store whose verified trajectories train the student.")
    out: str = Field("runs/sft", description="Output folder (checkpoints, metrics.jsonl, final/student: use it as --model).")
    model: str = Field(DEFAULT_MODEL, description="Student to fine-tune: smollm2-135m, an HF id or a local path.")
    env: str | None = Field(None, description="Use only this environment's rows.")
    split: str = Field("warmup", description=(
        "Split of the rows: warmup (the warm start), train (an SFT / rejection-sampling baseline)."))
    source: Source = Field("any", description=(
        "reference (replayed verified references), student (a model's own successes: rejection-sampling "
        "fine-tuning) or any."))
    from_run: str | None = Field(None, description=(
        "Only the rows of this run id (e.g. one lopd collect run: lopd show STORE lists them)."))
    min_reward: float = Field(default=1.0, ge=0.0, le=1.0, description=(
        "Least reward of a row that trains (rows must also count as successes)."))
    steps: int = Field(default=40, ge=1, description="Optimizer steps.")
    batch_size: int = Field(default=4, ge=1, description="Training sequences per step.")
    lr: float = Field(default=5e-5, gt=0.0, description="AdamW learning rate.")
    lora_rank: int = Field(default=0, ge=0, description=(
        "0: fine-tune every weight; else a LoRA adapter of this rank, merged into final/student."))
    max_len: int = Field(default=1024, ge=2, description="Token cap of a training sequence.")
    grad_clip: float = Field(default=1.0, gt=0.0, description="Gradient-norm clipping.")
    checkpoint_every: int = Field(default=20, ge=1, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(default=1, ge=1, description="Checkpoints kept (the newest).")
    seed: int = Field(0, description="Seed of the data order.")
    device: Device = None
    dtype: RunDType = None
    log: Log = "none"
    resume: ResumeRun = False


def select(store: ExperienceStore, config: SftConfig) -> list[Trajectory]:
    """The store's rows that train: split/env as asked, successful, reward >= ``min_reward``,
    from the asked ``source``; ordered by trajectory id (a stable order for the seeded stream).

    Raises:
        StoreError: no row qualifies (the filters are named; where other splits have rows that
            would, their counts and the ``--split`` flag).
    """
    from stages.core.data.store import StoreError

    def qualifies(t: Trajectory) -> bool:
        return t.reward >= config.min_reward and (
            config.source == "any" or (t.policy == REFERENCE_POLICY) == (config.source == "reference"))

    rows = [t for t in store.query(env=config.env, split=config.split, success=True, run_id=config.from_run)
            if qualifies(t)]
    if not rows:
        where = (f"env {config.env!r}, " if config.env else "") + (f"run {config.from_run}, " if config.from_run else "")
        message = (f"store {config.store}: no successful rows ({where}split {config.split!r}, source "
                   f"{config.source}, reward >= {config.min_reward}) to fine-tune on")
        others = Counter(t.split for t in store.query(env=config.env, success=True, run_id=config.from_run)
                         if qualifies(t))
        if others:
            counts = ", ".join(f"{split} {n}" for split, n in sorted(others.items()))
            raise StoreError(f"{message}; successful rows by split: {counts}: pick one with --split "
                             f"(e.g. --split {others.most_common(1)[0][0]})")
        raise StoreError(f"{message}: collect them first (e.g. lopd collect --env lopd-bed --split {config.split} "
                         f"--reference --store {config.store})")
    return sorted(rows, key=lambda t: t.trajectory_id)


def nll_step(student: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean NLL of the action tokens of one padded batch (:func:`pad_rows`'s first three).

    Args:
        batch: ids_BT (int64), attn_BT (bool), mask_BT (bool: True on action ids).

    Returns:
        ``(loss, metrics)`` from :func:`stages.core.losses.lopd.masked_nll` on next-token logits.
    """
    from stages.core.losses.lopd import masked_nll

    ids_BT, attn_BT, mask_BT = batch[:3]
    logits_BTV = student(input_ids=ids_BT, attention_mask=attn_BT.long()).logits
    return masked_nll(logits_BTV[:, :-1], ids_BT[:, 1:], mask_BT[:, 1:])


def run(config: SftConfig, console: Console | None = None,
        on_step: Callable[[int, torch.nn.Module, str | None, Any], None] | None = None) -> Path:
    """Fine-tune and write ``out/final/student``; returns that folder.

    ``on_step(step, student, adapter, tokenizer)`` runs after each step's metrics row and BEFORE
    its checkpoint (`lopd study` evaluates there; a kill inside it redoes the step); ``adapter``
    is the LoRA adapter's name, None for full fine-tuning.

    Raises:
        StoreError: missing store or no qualifying row. ValueError: ``out`` holds another run
            (see :func:`stages.core.run.runs.open_run`), no row fits ``max_len``, or the ``log``
            package is not installed (checked first).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from stages.core.data.store import ExperienceStore
    from stages.core.run.checkpoint import (
        OPTIMIZER_FILE, clean_partial, latest_checkpoint, read_state, readable, restore_rng, write_checkpoint,
    )
    from stages.core.run.progress import StageProgress
    from stages.core.run.provenance import config_run_id
    from stages.core.run.resources import map_large_blocks, peak_rss_mb, release_free_memory
    from stages.core.run.runs import (
        METRICS_FILE, RESUMABLE, append_metrics, freeze_config, open_run, seeded_stream, start_note,
        truncate_metrics,
    )
    from stages.core.run.tracking import RunLogger, check_logger

    console = console or Console()
    check_logger(config.log)  # a missing logger package, before any run folder or model
    map_large_blocks()  # freed activations leave the resident set at once
    out = Path(config.out)
    run_id = config_run_id("sft", config, _RUN_KEYS + (["from_run"] if config.from_run else []))  # ids of runs before it kept
    clean_partial(out)
    folder = open_run(out, "sft", config, resume=config.resume, may_change=RESUMABLE | {"log"}, path_fields=("store",))
    if note := start_note(folder, config.resume):
        console.print(escape(note), soft_wrap=True)
    ckpt = latest_checkpoint(out) if config.resume else None
    trajectories = select(ExperienceStore.open(config.store, create=False), config)
    # the training libraries load once the settings, run folder and rows are known good (a refusal stays fast)
    import torch

    from stages.core.data.rows import pad_rows, training_rows
    from stages.core.models.assembly import load_student, save_final, save_student
    from stages.core.models.backbone import compute_autocast, resolve_device_dtype

    device, dtype = resolve_device_dtype(config.device, config.dtype)
    student, adapter, tokenizer, params = load_student(config.model, config.lora_rank, ckpt,
                                                       device=device, dtype=dtype)
    rows, skipped = training_rows(tokenizer, trajectories, max_len=config.max_len)
    if not rows:
        raise ValueError(f"no row of {len(trajectories)} fits --max-len {config.max_len}: raise it")
    optimizer = torch.optim.AdamW(params, lr=config.lr)
    # a whole student keeps float32 weights under bf16/fp16 (load_student) and computes in the run dtype
    forwards = compute_autocast(device, dtype) if adapter is None else contextlib.nullcontext()
    start = 0
    if ckpt is not None:
        with readable(ckpt / OPTIMIZER_FILE, "optimizer state"):
            optimizer.load_state_dict(torch.load(ckpt / OPTIMIZER_FILE, weights_only=True))
        start = read_state(ckpt)["step"]
        restore_rng(ckpt)
        truncate_metrics(out / METRICS_FILE, start)
    freeze_config(out, "sft", run_id, config)
    logger = RunLogger(config.log, out, run_id, config.model_dump(), prefix="sft")
    torch.manual_seed(config.seed + start)
    console.print(f"sft {run_id}: {len(rows)} rows from {len(trajectories)} trajectories "
                  f"(split {config.split}, source {config.source}{', ' + str(len(skipped)) + ' too long' if skipped else ''}); "
                  f"{'full fine-tuning' if adapter is None else f'LoRA rank {config.lora_rank}'} of {config.model} on {device}",
                  soft_wrap=True)
    if ckpt is not None:
        console.print(f"sft resuming run {run_id} after step {start} of {config.steps} (checkpoint {ckpt})", soft_wrap=True)
    elif folder.resuming:
        console.print(f"sft resuming run {run_id}: no checkpoint in {out} yet, starting at step 1", soft_wrap=True)

    student.train()
    last = ckpt
    with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[status]}"), console=console) as bar:
        task = bar.add_task("sft", total=config.steps, completed=start, status="")
        for step in range(start + 1, config.steps + 1):
            t0 = time.perf_counter()
            picked = [rows[i] for i in seeded_stream(len(rows), config.seed, (step - 1) * config.batch_size,
                                                     config.batch_size)]
            with forwards:
                loss, metrics = nll_step(student, pad_rows(tokenizer, picked, device=device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.grad_clip))
            optimizer.step()
            release_free_memory()
            row = {"step": step, **metrics, "grad_norm": grad_norm, "seconds": time.perf_counter() - t0,
                   "peak_rss_mb": peak_rss_mb()}
            append_metrics(out / METRICS_FILE, row)
            logger.log(row, step)
            if on_step is not None:
                on_step(step, student, adapter, tokenizer)
                student.train()
            if step % config.checkpoint_every == 0 or step == config.steps:
                last = write_checkpoint(
                    out, step, lambda f: save_student(f, student=student, adapter=adapter, tokenizer=tokenizer,
                                                      optimizer=optimizer),
                    {"step": step, "run_id": run_id}, config.keep_checkpoints)
            bar.update(task, advance=1, status=f"nll {metrics['nll']:.3f}")
    logger.close()
    final = save_final(out, last, model=config.model, tokenizer=tokenizer, student=student, adapter=adapter)
    console.print(f"wrote {final / 'student'} (use it as --model), metrics {out / METRICS_FILE}", soft_wrap=True)
    return final / "student"
