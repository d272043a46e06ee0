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
- Held-out evaluation (:func:`stages.coldstart.ladder.heldout.evaluate_heldout`) scores held-out
  targets with experiences retrieved from the whole store (minus the target, and its task
  with ``exclude_same_task``), as at deployment: NLL with (a) no latents, (b) the untrained
  composer (same seeded init), (c) the trained composer.

The run is a recipe on the run-folder helpers distill uses (:mod:`stages.core.run.runs`,
:mod:`stages.core.run.checkpoint`): :class:`Coldstart` sets the run up (folder, data, model,
composer, optimizer, resume), takes loss steps (:meth:`Coldstart.loss_step`: the registered
objective ``config.objective``, :mod:`stages.core.losses.composer_objectives`), trains
(:meth:`Coldstart.train`), checkpoints (:meth:`Coldstart.save_checkpoint`) and saves
(:meth:`Coldstart.finish`). Data: :mod:`stages.coldstart.data`; the composer's init:
:mod:`stages.coldstart.composer`; held-out evaluation and the ladder of controls (also
`lopd ladder`): :mod:`stages.coldstart.ladder`.

Outputs in ``out/``: ``config.json`` and ``manifest.json`` (run-folder rules:
:mod:`stages.core.run.runs`), ``metrics.jsonl`` (one record per step), ``checkpoints/step-N/``
(composer + optimizer + RNG states, written atomically, last two kept), ``final/`` (the
composer, :func:`stages.core.models.composer.save_composer`), ``heldout.json``.
"""
from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import torch
from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from stages.coldstart.composer import FINAL, initial_phi, new_composer
from stages.coldstart.data import ColdstartData, split_targets, successful_trajectories
from stages.coldstart.ladder.heldout import HeldoutResult, evaluate_heldout
from stages.coldstart.ladder.rungs import LADDER, Ladder, heldout_of, print_ladder, run_ladder
from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.composer_teacher import composer_loss
from stages.core.latent.text_targets import TextTargets
from stages.core.run.checkpoint import (
    CHECKPOINTS, OPTIMIZER_FILE, read_state, readable, restore_rng, write_checkpoint,
)
from stages.core.models.composer import (
    Composer, adapter_parameters, base_parameters, enable_activation_checkpointing, save_composer,
)
from stages.core.models.assembly import load_composer
from stages.core.run.printing import titled_table
from stages.core.run.progress import StageProgress
from stages.core.run.tracking import RunLogger, check_logger
from stages.core.run.resources import map_large_blocks, peak_rss_mb, release_free_memory, rss_mb
from stages.core.run.runs import (
    METRICS_FILE, RESUMABLE, append_metrics, coldstart_stream, freeze_config, read_metrics, start_run, truncate_metrics,
)
from stages.core.data.store import ExperienceStore, StoreError

HELDOUT = "heldout.json"
TEXT_TARGETS = "text_teacher"  # the text teacher's top-M targets per training target (text_kl_top_m)
KEEP_CHECKPOINTS = 2
LOSS_WINDOW = 10  # the progress bar and the summary report the mean loss of this many last steps
# Settings a resumed run may change (they do not change the meaning of finished steps), and
# the fields holding paths (compared after resolving).
_RESUMABLE = RESUMABLE | {"eval_every", "ladder", "ladder_targets", "log"}
_PATH_FIELDS = ("experiences", "out")
_RUN_KEYS = ["experiences", "model", "steps", "lr", "batch_size", "J", "K", "depth", "qformer_shared", "lora_rank",
             "max_exp_tokens", "max_len", "placement", "heldout_fraction", "exclude_same_task",
             "seed", "env", "grad_clip"]
# later settings join the run id only when not at their default (earlier runs keep their ids)
# (``objective`` is named by its weight: a run id predating the field stays the same)
_LEVER_KEYS = ["lr_encoder", "reconstruction_steps", "self_retrieval", "memory_norm", "readout", "contrast_weight",
               "contrast_margin", "latent_scale", "text_kl_weight", "text_kl_top_m"]


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
    ladder: Ladder | None = None
    seconds: float
    seconds_per_step: float
    peak_rss_mb: float
    backbone_unchanged: bool


def _recent_loss(losses: list[float]) -> dict:
    """``{"loss": mean, "window": n}`` of the last n = min(``LOSS_WINDOW``, steps) step losses
    (loss NaN before the first step)."""
    tail = losses[-LOSS_WINDOW:]
    return {"loss": sum(tail) / len(tail) if tail else math.nan, "window": len(tail)}


def _bar_loss(losses: list[float]) -> dict:
    """The progress bar's field ``loss``: ``"loss (mean of last n) 0.123"`` (:func:`_recent_loss`),
    or ``"no step yet"`` before the first step."""
    recent = _recent_loss(losses)
    return {"loss": f"loss (mean of last {recent['window']}) {recent['loss']:.3f}" if recent["window"] else "no step yet"}


def _backbone_digest(composer: Composer) -> str:
    """sha256 over the names and bytes of the backbone's base weights (adapters left out)."""
    h = hashlib.sha256()
    for name, p in base_parameters(composer.backbone):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------------


class Coldstart:
    """One `lopd coldstart` run: set up on construction, then :meth:`run`.

    Setup, in this order (a failure leaves no run behind: the frozen config is written last):
    the run folder (:func:`stages.core.run.runs.open_run`), the store's successes, the backbone,
    the targets and their task split, the composer (fresh at its seeded init, or the latest
    checkpoint's), the optimizer and the resume point.

    Args:
        config: the run's settings.
        console: where progress and the summary go.
        embedder: query embedder for retrieval (default: the one the store was indexed with).

    Raises:
        StoreError: no store / no embeddings, or fewer than 2 successful trajectories (that fit
            ``max_len``).
        ValueError: ``out`` already holds a run and ``resume`` is False, or a resumed run
            changes a setting that may not change (file and field named), or the ``log``
            package is not installed (checked first: :func:`stages.core.run.tracking.check_logger`).
    """

    def __init__(self, config: ColdstartConfig, console: Console | None = None, embedder=None):
        from stages.core.data.retrieval import Retriever, unembedded_count
        from stages.core.run.resources import check_experience_count

        self.config, self.console = config, console or Console()
        self.t_start = time.perf_counter()
        self.out = Path(config.out)
        check_logger(config.log)  # a missing logger package, before any run folder or model
        run_keys = _RUN_KEYS + [k for k in _LEVER_KEYS if getattr(config, k) != ColdstartConfig.model_fields[k].default]
        start = start_run(self.out, "coldstart", config, run_keys, resume=config.resume, may_change=_RESUMABLE,
                          path_fields=_PATH_FIELDS, say=self.console.print)
        self.run_id, ckpt = start.run_id, start.checkpoint
        store = ExperienceStore.open(config.experiences, create=False)
        successes = successful_trajectories(store, config)
        check_experience_count(config.J, len(successes), store=config.experiences)
        retriever = Retriever(store, embedder)
        if (missing := unembedded_count(store)):
            self.console.print(f"[yellow]note: {missing} trajectories of {config.experiences} have no embedding and "
                               f"are not retrieved (rollouts of a method that retrieves nothing): "
                               f"`lopd index --store {config.experiences}` embeds them[/]")
        model = self._load_backbone()
        self._split(successes)
        self._build_composer(model, ckpt)
        self.data = ColdstartData(retriever, self.tokenizer, config, self.targets.heldout_tasks)
        self.start_step = self._resume(ckpt)
        freeze_config(self.out, "coldstart", self.run_id, config)
        self.logger = RunLogger(config.log, self.out, self.run_id, config.model_dump(), prefix="coldstart")
        self.metrics_path = self.out / METRICS_FILE
        # rows of steps after the checkpoint (and a line cut short by a kill) are dropped
        truncate_metrics(self.metrics_path, self.start_step)
        self.losses = [r["loss"] for r in read_metrics(self.metrics_path)]
        self.step_seconds: list[float] = []
        self.result: HeldoutResult | None = None
        self.ladder_scored = False  # this process scored the ladder (ladder.json is its)

    def _load_backbone(self):
        """Load the backbone and tokenizer; check a step's memory. Returns the model."""
        from stages.core.models.backbone import DEFAULT_MODEL, load_policy, resolve_device_dtype, resolve_model
        from stages.core.run.resources import check_step_memory, shape_of

        c = self.config
        # the name, not this machine's cache path, for the embedded default backbone
        self.backbone_id = c.model if c.model == DEFAULT_MODEL else resolve_model(c.model)
        self.device, self.dtype = resolve_device_dtype(c.device, c.dtype)
        model, self.tokenizer = load_policy(c.model, dtype=self.dtype, device=self.device)
        check_step_memory(shape_of(model.config, batch=c.batch_size, J=c.J, K=c.K,
                                   max_exp_tokens=c.max_exp_tokens, seq_len=c.max_len,
                                   activation_checkpointing=c.activation_checkpointing),
                          stage="coldstart", knobs="--J, --max-exp-tokens, --batch-size or --max-len")
        return model

    def _split(self, successes) -> None:
        """The targets (``self.targets``), with warnings about too few of them."""
        c, console = self.config, self.console
        self.targets = t = split_targets(self.tokenizer, successes, c)
        if t.too_long:
            console.print(f"[yellow]{t.too_long} successful trajectories have a prompt of {c.max_len}+ "
                          "tokens and are not used as targets (raise --max-len to keep them)[/]")
        fits = len(t.train) + len(t.heldout)
        if fits < 2:
            raise StoreError(f"store {c.experiences}: only {fits} successful trajectories fit "
                             f"max_len={c.max_len}; coldstart needs at least 2: verified answers come from "
                             f"`lopd collect --env ENV --split train --reference --store {c.experiences}` "
                             "(bfcl, lopd-bed, the code envs), more successes from a larger --model")
        if len(t.train) < c.batch_size:
            console.print(f"[yellow]warning: {len(t.train)} training trajectories for --batch-size {c.batch_size}: "
                          "every step sees the same few targets (collect more successes first)[/]", soft_wrap=True)
        if c.heldout_fraction > 0 and len(t.heldout_tasks) < 5:
            console.print(f"[yellow]warning: {len(t.heldout_tasks)} held-out task(s): the held-out NLL is too noisy "
                          "to compare (more tasks, or a larger --heldout-fraction)[/]", soft_wrap=True)

    def _build_composer(self, model, ckpt: Path | None) -> None:
        """The composer (fresh or the checkpoint's), its untrained phi, the backbone digest, the optimizer."""
        from stages.core.models.backbone import disable_dropout

        c = self.config
        if ckpt is None:
            self.composer = new_composer(model, c, self.tokenizer)
            self.untrained_phi = [p.detach().clone() for p in self.composer.trainable_parameters()]
        else:
            self.composer = load_composer(model, ckpt, trainable=True, backbone_id=self.backbone_id)
            self.untrained_phi = initial_phi(self.composer, c, self.tokenizer)
        disable_dropout(self.composer.backbone)  # a restored adapter's lora_dropout too: train() mode never drops
        self.params = self.composer.trainable_parameters()
        self.objective_settings = c.objective_settings()
        self.digest_before = _backbone_digest(self.composer)
        self.text_targets = None if c.text_kl_top_m is None else TextTargets(
            self.out / TEXT_TARGETS, self.digest_before[:16], c.text_kl_top_m)
        if c.activation_checkpointing:
            enable_activation_checkpointing(self.composer.backbone)
        groups = [{"params": self.params}]  # one group unless psi has its own lr (earlier checkpoints: one)
        if c.lr_encoder is not None:
            groups = [{"params": adapter_parameters(self.composer.backbone, self.composer.adapter_name),
                       "lr": c.lr_encoder}, {"params": list(self.composer.compressor.parameters())}]
        self.optimizer = torch.optim.AdamW(groups, lr=c.lr, weight_decay=0.0)

    def _resume(self, ckpt: Path | None) -> int:
        """Restore the optimizer and RNG states of ``ckpt``; returns the step to start from."""
        if ckpt is not None:
            with readable(ckpt / OPTIMIZER_FILE, "optimizer state"):
                self.optimizer.load_state_dict(torch.load(ckpt / OPTIMIZER_FILE, weights_only=True,
                                                          map_location=self.device))
            restore_rng(ckpt)
            return int(read_state(ckpt)["step"])
        if self.config.resume:
            self.console.print(f"[yellow]no checkpoint in {self.out / CHECKPOINTS}: starting from step 0[/]")
        return 0

    def heldout_eval(self, baselines: bool) -> HeldoutResult | None:
        """The held-out NLL (four ways with ``baselines``); None when nothing is held out."""
        c, heldout = self.config, self.targets.heldout
        if not heldout:
            return None
        return evaluate_heldout(
            self.composer, self.tokenizer, heldout, self.data.experiences(heldout, heldout=True), J=c.J,
            max_exp_tokens=c.max_exp_tokens, max_len=c.max_len, placement=c.placement,
            batch_size=c.batch_size, tools=self.data.tools(heldout),
            untrained_phi=self.untrained_phi if baselines else None, baselines=baselines, console=self.console)

    def loss_step(self, step: int) -> dict:
        """Train 0-based step ``step`` on its seeded batch; returns its metrics row (step + 1)."""
        c, t0 = self.config, time.perf_counter()
        self.composer.backbone.train(c.activation_checkpointing)  # HF checkpoints layers in train mode only
        batch_ids = coldstart_stream(len(self.targets.train), c.seed, step * c.batch_size, c.batch_size)
        batch = self.data.batch([self.targets.train[i] for i in batch_ids], heldout=False, device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        objective = "reconstruction" if step < c.reconstruction_steps else c.objective
        loss, m = composer_loss(objective, self.composer, batch, c.placement, self.objective_settings,
                                text_targets=self.text_targets)
        for p in self.params:  # adapter switching may clear the requires_grad flags
            p.requires_grad_(True)
        loss.backward()
        max_norm = c.grad_clip if c.grad_clip is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        self.optimizer.step()
        loss = float(loss.detach())  # the graph is freed before the trim
        release_free_memory()  # freed activations back to the OS: RSS stays flat over steps
        done = step + 1
        record = {"step": done, "loss": loss, "nll": m["nll"], "grad_norm": grad_norm,
                  "lr": c.lr, "tokens": int(m["num_tokens"]),
                  "seconds": time.perf_counter() - t0, "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(),
                  **{k: v for k, v in m.items() if k.startswith(("contrast_", "text_kl"))}}
        return record

    def evaluate_into(self, record: dict) -> dict:
        """Add the held-out NLL to the metrics row ``record`` every ``eval_every`` steps, four ways
        (:meth:`final_heldout`) at the last step; returns it."""
        c, done = self.config, record["step"]
        if done == c.steps and self.targets.heldout:  # the final evaluation, four ways, on the curve too
            self.result = self.final_heldout()
            record.update(heldout_nll=self.result.nll_trained, heldout_nll_no_latents=self.result.nll_no_latents)
            if self.result.nll_untrained is not None:
                record["heldout_nll_untrained"] = self.result.nll_untrained
            if self.result.nll_other_experiences is not None:
                record["heldout_nll_other_experiences"] = self.result.nll_other_experiences
        elif done % c.eval_every == 0 and self.targets.heldout:
            record["heldout_nll"] = self.heldout_eval(baselines=False).nll_trained
        return record

    def save_checkpoint(self, step: int) -> Path:
        """Write ``out/checkpoints/step-<step>`` atomically (composer, optimizer, RNG states)."""

        def fill(folder: Path) -> None:
            save_composer(self.composer, folder, {"backbone_id": self.backbone_id,
                                                  "placement": self.config.placement, "coldstart_step": step})
            torch.save(self.optimizer.state_dict(), folder / OPTIMIZER_FILE)

        return write_checkpoint(self.out, step, fill, {"step": step}, keep=KEEP_CHECKPOINTS)

    def train(self) -> None:
        """The remaining steps: a metrics row each, a checkpoint every ``checkpoint_every`` and at the end."""
        c = self.config
        with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[loss]}"),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False) as bar:
            job = bar.add_task("coldstart", total=c.steps, completed=self.start_step,
                               **_bar_loss(self.losses))
            for step in range(self.start_step, c.steps):
                record = self.loss_step(step)
                self.losses.append(record["loss"])
                bar.update(job, advance=1, **_bar_loss(self.losses))  # done before the held-out scoring below
                self.evaluate_into(record)
                self.step_seconds.append(record["seconds"])
                append_metrics(self.metrics_path, record)
                self.logger.log(record, record["step"])
                done = record["step"]
                if done % c.checkpoint_every == 0 or done == c.steps:
                    self.save_checkpoint(done)

    def finish(self) -> ColdstartReport:
        """Write ``final/`` and ``heldout.json``, check the backbone, and summarise the run.

        Raises:
            RuntimeError: the backbone's weights changed (only phi may be trained).
        """
        c, out, t = self.config, self.out, self.targets
        self.composer.backbone.eval()
        if self.start_step == c.steps and (out / FINAL).is_dir() and (out / HELDOUT).is_file():
            # a finished run resumed again (a second `make demo`): its final composer and report stand
            final, result = out / FINAL, HeldoutResult.model_validate_json((out / HELDOUT).read_text())
        else:
            final = save_composer(self.composer, out / FINAL, {
                "backbone_id": self.backbone_id, "placement": c.placement, "coldstart_steps": c.steps,
                "store": c.experiences})
            result = self.result
            if result is None:  # not evaluated in the loop (nothing held out, or nothing left to train)
                result = self.final_heldout()
            if result is not None:
                (out / HELDOUT).write_text(result.model_dump_json(indent=2))
        ladder = self._ladder() if c.ladder else None  # scored by final_heldout, or read back
        unchanged = _backbone_digest(self.composer) == self.digest_before
        recent = _recent_loss(self.losses)
        report = ColdstartReport(
            run_id=self.run_id, out=str(out), final=str(final), backbone_id=self.backbone_id, steps=c.steps,
            start_step=self.start_step, train_trajectories=len(t.train), train_tasks=len(t.train_tasks),
            too_long=t.too_long, heldout_trajectories=len(t.heldout), heldout_tasks=len(t.heldout_tasks),
            final_loss=recent["loss"], final_loss_steps=recent["window"], heldout=result, ladder=ladder,
            seconds=time.perf_counter() - self.t_start,
            seconds_per_step=sum(self.step_seconds) / max(len(self.step_seconds), 1), peak_rss_mb=peak_rss_mb(),
            backbone_unchanged=unchanged,
        )
        if not unchanged:
            raise RuntimeError("coldstart changed the backbone weights: only phi may be trained")
        return report

    def final_heldout(self) -> HeldoutResult | None:
        """The final held-out check: with ``ladder``, rungs (a)-(d) of the ladder (:func:`heldout_of`,
        on its targets); else (or with too few targets for a ladder) four ways on every held-out
        target (:meth:`heldout_eval`). None when nothing is held out."""
        if self.config.ladder and self.targets.heldout and (ladder := self._ladder()) is not None:
            return heldout_of(ladder)
        return self.heldout_eval(baselines=True)

    def _ladder(self) -> Ladder | None:
        """The ladder of controls (:mod:`stages.coldstart.ladder`), read from ``ladder.json`` when this
        process or a finished run wrote it, else scored and written there; None when too few
        targets are held out."""
        path = self.out / LADDER
        if (self.start_step == self.config.steps or self.ladder_scored) and path.is_file():
            return Ladder.model_validate_json(path.read_text())
        self.ladder_scored = True
        ladder = self.ladder_eval()
        if ladder is not None:
            path.write_text(ladder.model_dump_json(indent=2))
        return ladder

    def ladder_eval(self, limit: int | None = None, seed: int | None = None) -> Ladder | None:
        """The ladder on at most ``limit`` held-out targets chosen with ``seed`` (defaults: the config's)."""
        return run_ladder(self.composer, self.tokenizer, self.data, self.targets.train, self.targets.heldout,
                          self.config, self.untrained_phi, self.out, limit=limit, seed=seed, console=self.console)

    def run(self) -> ColdstartReport:
        """Train the remaining steps and finish; returns the summary (also printed as a table)."""
        c, t = self.config, self.targets
        self.console.print(
            f"[bold]coldstart[/] run {self.run_id}: {len(t.train)} train / {len(t.heldout)} held-out successful "
            f"trajectories ({len(t.train_tasks)} / {len(t.heldout_tasks)} tasks), steps {self.start_step}->{c.steps}, "
            f"J={c.J} K={c.K} depth={c.depth} placement={c.placement}, model={c.model} "
            f"on {self.device} {self.dtype}")
        self.train()
        self.logger.close()
        report = self.finish()
        _print_summary(self.console, report)
        if report.ladder is not None:
            print_ladder(self.console, report.ladder)
        return report


def run(config: ColdstartConfig, console: Console | None = None, embedder=None) -> ColdstartReport:
    """Train the composer as configured (:class:`Coldstart`); returns the summary (also printed).

    Raises:
        StoreError, ValueError: see :class:`Coldstart`; RuntimeError: see :meth:`Coldstart.finish`.
    """
    map_large_blocks()  # freed activations leave the resident set at once
    return Coldstart(config, console, embedder).run()


def _print_summary(console: Console, r: ColdstartReport) -> None:
    table = titled_table(f"coldstart -> {r.out}")
    table.add_column("what")
    table.add_column("value", justify="right", overflow="fold")  # the composer's path wraps, never cut to "…"
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
        if h.nll_other_experiences is not None:
            table.add_row("held-out NLL, trained composer, another task's experiences", f"{h.nll_other_experiences:.4f}")
        table.add_row("held-out action tokens", str(h.tokens))
    trained_now = r.start_step < r.steps
    table.add_row("s / step", f"{r.seconds_per_step:.2f}" if trained_now else "- (nothing left to train)")
    table.add_row("peak RSS (MB)" if trained_now else "peak RSS of this run (MB)", f"{r.peak_rss_mb:.0f}")
    table.add_row("backbone unchanged", str(r.backbone_unchanged))
    table.add_row("composer", r.final)
    console.print(table)
