"""`lopd distill`: the LOPD training loop (Algorithm 1 of the LOPD paper).

Each step: the CURRENT student rolls out ``group_size`` trajectories on each of
``tasks_per_step`` training tasks (seeded task order); J successful experiences are retrieved
per trajectory (never the trajectory itself); the composer turns them into latents c_phi
(Eq. 5-7); the frozen teacher (adapters disabled) re-scores the student's own tokens with
c_phi spliced in (Eq. 8); the loss of Eq. 13 = top-M+tail reverse KL (Eq. 9-10) +
beta * (m - Delta) (Eq. 11-12) + lambda * ||c_phi - sg[c_phi0]||^2 updates the student
(LoRA, or all weights) and the composer phi jointly with AdamW; beta takes a projected dual
step; the step's trajectories join the store and are embedded (memory grows).

One peft backbone holds the adapters "composer" (phi's encoder LoRA), "composer0" (frozen
cold-start copy phi_0, the anchor's target) and "student"; the teacher is that backbone with
every adapter disabled. With ``student_lora_rank=0`` the student is a separate, fully
trainable model and the composers live on a frozen teacher copy. Checkpoints, resume and
store consistency under SIGKILL: see :mod:`stages.core.checkpoint`.
"""
from __future__ import annotations

import functools
import json
import random
import resource
import time
import uuid
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from rich.console import Console

from schemas import Task, Trajectory
from stages.core import checkpoint as ckpt
from stages.core.composer import (
    adapter_scope, base_model, enable_activation_checkpointing, read_composer_config,
)
from stages.core.contexts import build_batch, retrieve_experiences, shift_for_loss
from stages.core.envs import make_env
from stages.core.losses import (
    dual_update, latent_anchor, privileged_margin, sampled_token_logprobs, topm_tail_reverse_kl,
)
from stages.core.policy import HFRolloutEngine, SamplingParams
from stages.core.provenance import git_commit, write_manifest
from stages.core.retrieval import Retriever, embeddings_info, index_new, load_embedder
from stages.core.rollout import RolloutStats, play
from stages.core.store import ExperienceStore
from stages.core.teacher import student_logits, teacher_logits

ANCHOR_ADAPTER = "composer0"
# Fields that may differ between a run and its --resume (everything else must match).
_RESUMABLE = {"steps", "resume", "checkpoint_every", "keep_checkpoints", "tensorboard"}
METRIC_FIELDS = (
    "step", "reward_mean", "success_rate", "reverse_kl", "Delta", "beta", "anchor", "margin_term",
    "latent_norm", "grad_norm_student", "grad_norm_composer", "loss", "tokens", "action_tokens",
    "tokens_per_s", "rollout_s", "train_s", "seconds", "peak_rss_mb",
)
TIMING_FIELDS = ("tokens_per_s", "rollout_s", "train_s", "seconds", "peak_rss_mb")


class DistillConfig(BaseModel):
    """Settings of one `lopd distill` run (the CLI flags, validated); defaults = the paper's.

    ``K`` must equal the cold-start composer's K; the latent placement ("prefix" |
    "per-turn") comes from the composer checkpoint. ``lam`` is the anchor weight lambda (also
    accepted as ``lambda`` in config files). ``composer_lr`` None = ``lr``;
    ``student_lora_rank=0`` = full fine-tuning; ``max_exp_tokens`` None = the composer's value
    (512 if it has none); ``max_len`` None = whole conversations; ``micro_batch`` = trajectories
    per forward/backward (gradients are accumulated exactly); ``embedder`` None = the store's.
    """

    model_config = ConfigDict(extra="forbid")

    env: str
    store: str
    composer: str
    out: str
    model: str = "smollm2-135m"
    data_dir: str | None = None
    method: Literal["lopd"] = "lopd"
    margin: float = Field(0.05, ge=0.0)
    J: int = Field(3, ge=1)
    K: int = Field(32, ge=1)
    M: int = Field(20, ge=1)
    lam: float = Field(0.2, ge=0.0, validation_alias=AliasChoices("lam", "lambda"))
    eta_beta: float = Field(0.5, ge=0.0)
    beta0: float = Field(0.0, ge=0.0)
    lr: float = Field(1e-5, gt=0.0)
    composer_lr: float | None = Field(None, gt=0.0)
    steps: int = Field(10, ge=1)
    tasks_per_step: int = Field(2, ge=1)
    group_size: int = Field(2, ge=1)
    max_steps: int = Field(30, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    seed: int = 0
    student_lora_rank: int = Field(8, ge=0)
    freeze_composer: bool = False
    max_exp_tokens: int | None = Field(None, ge=1)
    max_len: int | None = Field(None, ge=2)
    micro_batch: int = Field(4, ge=1)
    rollout_batch: int = Field(8, ge=1)
    activation_checkpointing: bool = False
    embedder: str | None = None
    checkpoint_every: int = Field(5, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    tensorboard: bool = False
    grad_clip: float = Field(1.0, ge=0.0)
    run_id: str | None = None
    resume: bool = False


class DistillReport(BaseModel):
    """Summary of a distill run (this invocation's steps; means over them)."""

    run_id: str
    first_step: int
    last_step: int
    reward_mean: float
    success_rate: float
    beta: float
    rows_added: int
    final_dir: str
    last_checkpoint: str
    seconds: float


def load_config(path: str | Path) -> dict:
    """Read a TOML (``.toml``) or YAML/JSON (``.yaml``, ``.yml``, ``.json``) config file.

    Returns the mapping (CLI flags override its keys before ``DistillConfig`` validation), with
    the paper's name ``lambda`` for the anchor weight renamed to the field name ``lam``.

    Raises:
        ValueError: unknown extension, unparsable file, a top level that is no mapping, or both
            ``lambda`` and ``lam`` given (one line naming the file).
    """
    import tomllib

    import yaml

    path = Path(path)
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ValueError(f"{path}: unknown config format {path.suffix!r} (use .toml, .yaml or .json)")
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"{path}: cannot read the config file ({err.strerror})") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: not valid {path.suffix[1:]}: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of option names to values")
    if "lambda" in data:
        if "lam" in data:
            raise ValueError(f"{path}: give the anchor weight once, as `lambda` or as `lam`")
        data["lam"] = data.pop("lambda")
    return data


class Distiller:
    """The state of one LOPD run: models, optimizer, dual variable, data position, store.

    Built from a :class:`DistillConfig` (fresh, or resumed from ``out``'s newest checkpoint);
    :meth:`fit` runs the remaining steps. Attributes useful for inspection: ``composer``
    (phi; ``composer.backbone`` is the shared peft model whose disabled-adapter forward is the
    teacher), ``student`` / ``student_adapter`` (the module and adapter of pi_theta^S),
    ``beta``, ``step``.

    Raises:
        ValueError: K differs from the composer checkpoint's, ``out`` holds another run (or a
            run with different settings under ``resume``), tensorboard is not installed.
        StoreError, EnvError: unusable store or environment.
    """

    def __init__(self, config: DistillConfig, console: Console | None = None) -> None:
        self.console = console or Console()
        self.out = Path(config.out)
        composer_dir = Path(config.composer)
        cfg_file = composer_dir / "composer_config.json"
        if not cfg_file.is_file():
            raise ValueError(f"{cfg_file}: no composer checkpoint (composer_config.json missing)")
        self.composer_cfg = read_composer_config(composer_dir)
        if self.composer_cfg["K"] != config.K:
            raise ValueError(f"{cfg_file}: field 'K' is {self.composer_cfg['K']}, but the run asks "
                             f"for K={config.K} (K must match the cold-start composer)")
        self.placement = self.composer_cfg.get("placement", "prefix")
        self.config = self._resolve(config)
        config = self.config
        ckpt.clean_partial(self.out)
        resume_from = ckpt.latest_checkpoint(self.out) if self.resuming else None
        state = ckpt.read_state(resume_from) if resume_from else {}
        self.step = state.get("step", 0)
        self.beta = state.get("beta", config.beta0)
        self.cursor = state.get("data_position", 0)
        self.rows_added, self.commit = 0, git_commit()
        self.store = ExperienceStore.open(config.store)
        if self.resuming:  # back to the store and metrics exactly as at the checkpoint
            dropped = ckpt.drop_rows_after(self.store, config.run_id, self.step)
            ckpt.truncate_metrics(self.out / "metrics.jsonl", self.step)
            self.console.print(f"[bold]distill[/] resuming run {config.run_id} after step {self.step}"
                               f" ({resume_from or 'no checkpoint'}); removed {dropped} stale rows")
        elif self.store.count(run_id=config.run_id):
            raise ValueError(f"store {config.store} already holds rows of run {config.run_id}: "
                             "choose another run id")
        torch.manual_seed(config.seed)
        self._build_models(composer_dir, resume_from)
        self._build_optimizer(resume_from)
        info = embeddings_info(self.store)
        self.embedder = load_embedder(config.embedder or (info.embedder if info else None))
        self.index_field = info.field if info else "task"
        index_new(self.store, self.embedder, field=self.index_field)  # rows a crash left unembedded
        probe = make_env(config.env, data_dir=self._data_dir(), max_steps=config.max_steps)
        self.tasks: list[Task] = probe.tasks("train")
        probe.close()
        if not self.tasks:
            raise ValueError(f"env {config.env}: no train tasks")
        self.out.mkdir(parents=True, exist_ok=True)  # written once the whole setup succeeded
        (self.out / "config.json").write_text(config.model_dump_json(indent=2))
        write_manifest(self.out / "manifest.json", "distill", config.run_id, config)
        self.writer = self._tensorboard() if config.tensorboard else None
        if resume_from:
            ckpt.restore_rng(resume_from)

    # ----------------------------------------------------------------------------- setup --

    def _resolve(self, config: DistillConfig) -> DistillConfig:
        """Fill run_id / max_exp_tokens and check ``out`` against the run it may hold."""
        saved_file = self.out / "config.json"
        saved = json.loads(saved_file.read_text()) if saved_file.is_file() else None
        if saved is not None and not config.resume:
            raise ValueError(f"{self.out} already holds distill run {saved['run_id']}: pass --resume "
                             "to continue it or choose another --out")
        self.resuming = saved is not None
        updates = {
            "max_exp_tokens": config.max_exp_tokens or self.composer_cfg.get("max_exp_tokens") or 512,
            "run_id": config.run_id or (saved or {}).get("run_id") or f"distill-{uuid.uuid4().hex[:12]}",
        }
        config = config.model_copy(update=updates)
        for key, value in config.model_dump().items() if saved is not None else ():
            if key not in _RESUMABLE and saved.get(key) != value:
                raise ValueError(f"{saved_file}: field '{key}' is {saved.get(key)!r}, the resumed "
                                 f"run asks for {value!r} (only {sorted(_RESUMABLE)} may change)")
        return config

    def _tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ValueError("tensorboard=True needs the `tensorboard` package "
                             "(pip install tensorboard), or run without --tensorboard") from None
        return SummaryWriter(str(self.out / "tensorboard"))

    def _data_dir(self) -> Path | None:
        return Path(self.config.data_dir) if self.config.data_dir else None

    def _build_models(self, composer_dir: Path, resume_from: Path | None) -> None:
        c = self.config
        m = ckpt.load_models(c.model, composer_dir, resume_from, lora_rank=c.student_lora_rank,
                             freeze_composer=c.freeze_composer, anchor_adapter=ANCHOR_ADAPTER)
        self.tokenizer, self.student, self.student_adapter = m.tokenizer, m.student, m.student_adapter
        self.composer, self.anchor = m.composer, m.anchor
        self.student_params, self.composer_params = m.student_params, m.composer_params
        if c.activation_checkpointing:
            enable_activation_checkpointing(self.composer.backbone)
            if self.student_adapter is None:
                base_model(self.student).gradient_checkpointing_enable()

    def _build_optimizer(self, resume_from: Path | None) -> None:
        groups = [{"params": self.student_params, "lr": self.config.lr}]
        if self.composer_params:
            groups.append({"params": self.composer_params, "lr": self.config.composer_lr or self.config.lr})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        if resume_from:
            self.optimizer.load_state_dict(torch.load(resume_from / ckpt.OPTIMIZER_FILE))

    # ------------------------------------------------------------------------------ loop --

    def tasks_for(self, cursor: int) -> list[Task]:
        """The ``tasks_per_step`` tasks at data position ``cursor`` of the seeded task stream.

        The stream is a fresh ``random.Random(seed, epoch)`` permutation of the train tasks per
        epoch, so the order depends only on (seed, position), never on wall-clock or resume.
        """
        n = len(self.tasks)
        out = []
        for pos in range(cursor, cursor + self.config.tasks_per_step):
            order = list(range(n))
            random.Random(f"{self.config.seed}-{pos // n}").shuffle(order)
            out.append(self.tasks[order[pos % n]])
        return out

    def _rollout(self, step: int, stats: RolloutStats) -> list[Trajectory]:
        """Play the step's tasks with the current student; rows get deterministic ids."""
        c = self.config
        params = SamplingParams(temperature=c.temperature, top_p=c.top_p,
                                max_new_tokens=c.max_new_tokens, seed=c.seed * 1_000_003 + step * 10_007)
        engine = HFRolloutEngine(self.student, self.tokenizer, batch_size=c.rollout_batch)
        factory = lambda: make_env(c.env, data_dir=self._data_dir(), max_steps=c.max_steps)  # noqa: E731
        self.student.eval()
        with adapter_scope(self.student, self.student_adapter):
            played = list(play(engine, self.tokenizer, factory, self.tasks_for(self.cursor),
                               samples_per_task=c.group_size, params=params, policy_id=c.model,
                               run_id=c.run_id, git_commit=self.commit, max_concurrent=c.rollout_batch,
                               stats=stats))
        return [t.model_copy(update={"trajectory_id": ckpt.step_row_id(c.run_id, step, i),
                                     "info": json.dumps({**json.loads(t.info), ckpt.STEP_KEY: step})})
                for i, t in enumerate(played)]

    def _experiences(self, trajectories: list[Trajectory]) -> list[list[Trajectory]]:
        """J retrieved successful experiences per trajectory ([] while the store has none)."""
        if embeddings_info(self.store) is None:
            return [[] for _ in trajectories]
        retriever = Retriever(self.store, self.embedder)
        # training experiences only: held-out (test split) rows never become privileged context
        return retrieve_experiences(retriever, trajectories, self.config.J, split="train")

    def _losses(self, trajectories: list[Trajectory], experiences: list[list[Trajectory]],
                weight: float) -> tuple[torch.Tensor, dict]:
        """Eq. 13 on one micro-batch times ``weight`` (its share of the step's rows).

        Every row holds action tokens, so the per-trajectory means of Eq. 10 / Eq. 12 and the
        anchor's batch mean all accumulate exactly over micro-batches with this weight.
        """
        c = self.config
        batch = build_batch(self.tokenizer, trajectories, experiences, J=c.J,
                            max_exp_tokens=c.max_exp_tokens, max_len=c.max_len)
        exp = (batch.exp_ids_BJL, batch.exp_mask_BJL)
        with torch.set_grad_enabled(not c.freeze_composer):
            c_phi = self.composer(*exp)  # (B, J*K, d)
        with torch.no_grad():
            c_phi0 = c_phi.detach() if self.anchor is None else self.anchor(*exp)
        ids, attn = batch.input_ids_BT, batch.attn_mask_BT
        s_logits = student_logits(self.student, ids, attn, adapter=self.student_adapter)
        t_logits = teacher_logits(self.composer.backbone, ids, attn, c_phi, batch.insert_at_B,
                                  placement=self.placement, action_starts=batch.action_starts)
        s_logits, targets, mask = shift_for_loss(s_logits, batch)
        t_logits = shift_for_loss(t_logits, batch)[0]
        kl, kl_m = topm_tail_reverse_kl(s_logits, t_logits, mask, M=c.M)
        with torch.no_grad():
            s_logp = sampled_token_logprobs(s_logits, targets)  # sg[log p_S(a)] of Eq. 11
        margin_term, margin_m = privileged_margin(sampled_token_logprobs(t_logits, targets), s_logp,
                                                  mask, batch.rewards_B, c.margin, self.beta)
        anchor_term, anchor_m = latent_anchor(c_phi, c_phi0, c.lam)
        loss = weight * (kl + margin_term + anchor_term)
        metrics = {"reverse_kl": weight * kl_m["reverse_kl"], "Delta": weight * margin_m["Delta"],
                   "margin_term": weight * margin_m["margin_term"], "anchor": weight * anchor_m["anchor"],
                   "latent_norm": weight * float(c_phi.detach().norm(dim=-1).mean()),
                   "action_tokens": batch.num_action_tokens}
        return loss, metrics

    def train_step(self, step: int) -> dict:
        """Run step ``step`` of Algorithm 1 (rollout, update, dual step, memory append).

        Returns the metrics row (:data:`METRIC_FIELDS`): losses and Delta are batch values of
        Eq. 10-13 (nats), ``beta`` the dual variable AFTER this step's update, grad norms are
        taken before clipping, ``tokens`` = generated tokens (``tokens_per_s`` over generation
        time only), ``action_tokens`` = supervised tokens, ``*_s`` wall seconds.

        Raises:
            FloatingPointError: non-finite loss or gradient (nothing of the step is written;
                the newest checkpoint stays the last good one).
        """
        c = self.config
        t_start = time.perf_counter()
        stats = RolloutStats()
        trajectories = self._rollout(step, stats)
        rollout_s = time.perf_counter() - t_start
        t_train = time.perf_counter()
        trainable = [t for t in trajectories if t.turns]  # failed resets hold no action token
        experiences = self._experiences(trainable)
        self.student.train()  # train mode engages activation checkpointing (no dropout here)
        self.composer.backbone.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("reverse_kl", "Delta", "margin_term", "anchor", "latent_norm",
                              "action_tokens", "loss"), 0.0)
        for lo in range(0, len(trainable), c.micro_batch):
            part, exps = trainable[lo:lo + c.micro_batch], experiences[lo:lo + c.micro_batch]
            loss, m = self._losses(part, exps, len(part) / len(trainable))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at step {step}; last good checkpoint: "
                                         f"{ckpt.latest_checkpoint(self.out) or 'none'}")
            for p in self.student_params + self.composer_params:  # FIELD-NOTES pitfall 2
                p.requires_grad_(True)
            loss.backward()
            for k in m:
                sums[k] += m[k]
            sums["loss"] += float(loss.detach())
        norm_s, norm_c = _grad_norm(self.student_params), _grad_norm(self.composer_params)
        if not (np.isfinite(norm_s) and np.isfinite(norm_c)):
            raise FloatingPointError(f"non-finite gradient at step {step}; last good checkpoint: "
                                     f"{ckpt.latest_checkpoint(self.out) or 'none'}")
        if c.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.student_params + self.composer_params, c.grad_clip)
        if trainable:  # Delta is undefined without action tokens: no update, no dual step
            self.optimizer.step()
            self.beta = dual_update(self.beta, c.margin, sums["Delta"], c.eta_beta)
        train_s = time.perf_counter() - t_train
        self.rows_added += self.store.append(trajectories)  # one transaction: memory grows
        index_new(self.store, self.embedder, field=self.index_field)
        self.step, self.cursor = step, self.cursor + c.tasks_per_step
        rewards = [t.reward for t in trajectories]
        return {"step": step, "reward_mean": float(np.mean(rewards)),
                "success_rate": float(np.mean([t.success for t in trajectories])),
                **{k: sums[k] for k in ("reverse_kl", "Delta", "anchor", "margin_term", "latent_norm")},
                "beta": self.beta, "grad_norm_student": norm_s, "grad_norm_composer": norm_c,
                "loss": sums["loss"], "tokens": stats.generated_tokens,
                "action_tokens": int(sums["action_tokens"]),
                "tokens_per_s": stats.generated_tokens / max(stats.generate_seconds, 1e-9),
                "rollout_s": rollout_s,
                "train_s": train_s, "seconds": time.perf_counter() - t_start,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def save_checkpoint(self) -> Path:
        """Write ``out/checkpoints/step-<step>`` (student, composer, optimizer, beta, RNG, position)."""
        state = {"step": self.step, "beta": self.beta, "data_position": self.cursor,
                 "run_id": self.config.run_id}
        fill = functools.partial(ckpt.save_models, student=self.student, adapter=self.student_adapter,
                                 tokenizer=self.tokenizer, composer=self.composer,
                                 composer_config=self.composer_cfg, optimizer=self.optimizer)
        return ckpt.write_checkpoint(self.out, self.step, fill, state, self.config.keep_checkpoints)

    def fit(self) -> DistillReport:
        """Run the remaining steps, checkpointing every ``checkpoint_every`` and at the end."""
        c = self.config
        first, rows, t0 = self.step + 1, [], time.perf_counter()
        todo = f"steps {first}..{c.steps}" if first <= c.steps else f"all {c.steps} steps done, nothing to train"
        self.console.print(f"[bold]distill[/] run {c.run_id}: {todo}, "
                           f"{c.tasks_per_step} tasks x {c.group_size} rollouts, env={c.env}, "
                           f"placement={self.placement}, out={c.out}")
        metrics_file = self.out / "metrics.jsonl"
        for step in range(first, c.steps + 1):
            row = self.train_step(step)
            with metrics_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            self._log(row)
            if step % c.checkpoint_every == 0 or step == c.steps:
                self.save_checkpoint()
        last = ckpt.latest_checkpoint(self.out)
        final = ckpt.save_final(self.out, last, model=c.model, tokenizer=self.tokenizer,
                                student=self.student, adapter=self.student_adapter,
                                composer=self.composer, composer_config=self.composer_cfg)
        if self.writer is not None:
            self.writer.close()
        return DistillReport(
            run_id=c.run_id, first_step=first, last_step=self.step,
            reward_mean=float(np.mean([r["reward_mean"] for r in rows])) if rows else 0.0,
            success_rate=float(np.mean([r["success_rate"] for r in rows])) if rows else 0.0,
            beta=self.beta, rows_added=self.rows_added,
            final_dir=str(final), last_checkpoint=str(last), seconds=time.perf_counter() - t0)

    def _log(self, row: dict) -> None:
        self.console.print(
            f"step {row['step']}/{self.config.steps} reward {row['reward_mean']:.3f} "
            f"success {row['success_rate']:.0%} KL {row['reverse_kl']:.4f} Delta {row['Delta']:+.4f} "
            f"beta {row['beta']:.3f} anchor {row['anchor']:.4f} loss {row['loss']:.4f} "
            f"| {row['tokens_per_s']:.0f} tok/s, {row['seconds']:.1f}s, {row['peak_rss_mb']:.0f} MB")
        if self.writer is not None:
            for k, v in row.items():
                if k != "step":
                    self.writer.add_scalar(f"distill/{k}", v, row["step"])
            self.writer.flush()


def _grad_norm(params: list[torch.nn.Parameter]) -> float:
    """L2 norm of the gradients of ``params`` (missing gradients count as zero)."""
    grads = [p.grad.detach().double().pow(2).sum() for p in params if p.grad is not None]
    return float(torch.stack(grads).sum().sqrt()) if grads else 0.0


def run(config: DistillConfig, console: Console | None = None) -> DistillReport:
    """Train with LOPD as configured (Algorithm 1 of the LOPD paper); returns the summary.

    Raises:
        ValueError: bad config against the composer checkpoint or ``out`` (see :class:`Distiller`).
        FloatingPointError: non-finite loss or gradient ("... last good checkpoint: DIR").
        StoreError, EnvError: unusable store or environment.
    """
    return Distiller(config, console).fit()
