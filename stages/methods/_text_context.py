"""Parts shared by the text-context baselines (sdft, opsd; reusable by sdpo): the verified
reference pool, how a reference is rendered as text, and the teacher's weights.

Verified reference pool (B.1 of the LOPD paper: SDFT and OPSD need a verified demonstration per
task, from a shared pool of the base model's own successes, topped up with stronger
trajectories). For a training row of task x, the candidates are the store's trajectories with

- the same ``env`` and ``task_id``, ``split == "train"`` (test rows never become context),
- ``success == True`` (the environment's checker verified them): reference rows written by
  ``lopd collect --reference`` and the student's own successful rollouts of earlier steps,
- a ``trajectory_id`` other than the row's own (the rollout being scored is never its context;
  the step's rollouts only join the store after the step anyway).

The pick is deterministic (:func:`reference_rank`): the highest reward, then reference
solutions (``policy == "reference"``) before model rollouts, then the earliest ``created_at``,
then the smallest ``trajectory_id``. The store at a step is the same on a resumed run (rows of
unfinished steps are dropped on resume), so the pick is too. A row whose task has no candidate
gets no context: the method masks it (no loss) and counts it in ``no_context_frac``.

Rendering (:func:`demonstration_text`): the reference's actions in order, each followed by the
environment's answer when that is short (at most ``max_observation_chars`` characters; longer
ones are replaced by a one-line note), clipped to ``max_tokens`` tokens of the student's
tokenizer (a marker line says it was cut).

Teacher weights (:class:`TextTeacher`): ``frozen`` = the initial weights (a LoRA student's
backbone with every adapter disabled; for full fine-tuning the backbone loaded again), ``ema``
= an exponential moving average of the student (a LoRA ``teacher`` adapter initialised as a
copy of the student adapter, or a frozen full copy), updated after every optimizer step, and
``current`` = the student itself under no_grad. The EMA teacher is written into each
checkpoint (``teacher/``) and restored on resume, so a resumed run is bit-exact. Note: a LoRA
EMA averages the factors A and B separately, so the teacher's weight delta B_T A_T is close
to, but not exactly, the EMA of the student's deltas B_S A_S (the full-fine-tuning EMA is
exact); upstream SDFT fine-tunes all weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import torch
from torch import Tensor

from schemas import Trajectory
from stages.core.data.rows import TrainRow, pad_rows
from stages.core.latent.privileged import privileged_prefix
from stages.core.latent.teacher import context_teacher_logits
from stages.core.losses.chunking import upcast_dtype
from stages.core.losses.kd import generalized_jsd
from stages.core.models.assembly import copy_adapter_, ema_update_, ema_update_adapter_, frozen_teacher_copy
from stages.core.models.composer import adapter_parameters, add_lora_adapter, preserve_requires_grad
from stages.core.models.student import student_logits
from stages.core.run.checkpoint import readable
from stages.methods import Method, StepBatch, StepContext, Student
from stages.methods.options import ReferenceOptions, TeacherKind

REFERENCE_POLICY = "reference"  # the ``policy`` of rows written by ``lopd collect --reference``
TEACHER_ADAPTER = "teacher"
TEACHER_FOLDER = "teacher"


# ------------------------------------------------------------------------ reference pool --


def reference_rank(traj: Trajectory) -> tuple:
    """Sort key of a candidate reference: smaller is preferred (module docstring)."""
    return (-traj.reward, traj.policy != REFERENCE_POLICY, traj.created_at, traj.trajectory_id)


def verified_references(store, rows: list[TrainRow]) -> list[Trajectory | None]:
    """Per row, the verified reference of its task from ``store`` (None when there is none).

    One store query per step (all the rows' task ids); see the module docstring for the
    candidates and the deterministic pick.
    """
    if not rows:
        return []
    task_ids = {r.trajectory.task_id for r in rows}
    pool: dict[tuple[str, str], list[Trajectory]] = {}
    for traj in store.query(split="train", success=True, task_ids=task_ids):
        pool.setdefault((traj.env, traj.task_id), []).append(traj)
    for candidates in pool.values():
        candidates.sort(key=reference_rank)
    out: list[Trajectory | None] = []
    for row in rows:
        own = row.trajectory
        found = [t for t in pool.get((own.env, own.task_id), []) if t.trajectory_id != own.trajectory_id]
        out.append(found[0] if found else None)
    return out


# ----------------------------------------------------------------------------- rendering --


@dataclass(frozen=True)
class Demonstration:
    """A rendered reference: its text, size in tokens, whether it was clipped, its source id."""

    text: str
    tokens: int
    clipped: bool
    trajectory_id: str


def demonstration_text(traj: Trajectory, tokenizer, *, max_tokens: int,
                       max_observation_chars: int) -> Demonstration:
    """The reference ``traj`` as plain text for the teacher's prompt (module docstring).

    Example (a BFCL reference)::

        Step 1: [calculate_triangle_area(base=10, height=5)]
        Result: 25.0

    Raises:
        ValueError: max_tokens < 1, max_observation_chars < 0, or a reference without turns.
    """
    if max_tokens < 1 or max_observation_chars < 0:
        raise ValueError(f"max_tokens must be >= 1 and max_observation_chars >= 0, got "
                         f"{max_tokens} and {max_observation_chars}")
    if not traj.turns:
        raise ValueError(f"reference {traj.trajectory_id}: no actions")
    lines = []
    for k, turn in enumerate(traj.turns, 1):
        lines.append(f"Step {k}: {turn.action.strip()}")
        obs = turn.observation.strip()
        if obs and len(obs) <= max_observation_chars:
            lines.append(f"Result: {obs}")
        elif obs:
            lines.append(f"Result: ({len(obs)} characters, not shown)")
    text = "\n".join(lines)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return Demonstration(text, len(ids), False, traj.trajectory_id)
    cut = tokenizer.decode(ids[:max_tokens]).rstrip() + "\n[... the rest of the reference is cut ...]"
    return Demonstration(cut, max_tokens, True, traj.trajectory_id)


# ------------------------------------------------------------------------------- teacher --


class TextTeacher:
    """The teacher weights of a text-context method (``frozen`` / ``ema`` / ``current``).

    Args:
        student: the loop's student (LoRA adapter on a peft backbone, or a full model).
        kind: which weights score the tokens (module docstring).
        rate: EMA rate per optimizer step (``ema`` only): T <- (1 - rate) T + rate S.
        resume_from: checkpoint folder to restore the EMA teacher from (``teacher/``).
        device, dtype: where a separately loaded teacher lives (the student's; None: automatic).

    The teacher never gets a gradient: its adapter / copy has ``requires_grad=False`` and
    :meth:`logits` runs under no_grad.
    """

    def __init__(self, student: Student, kind: TeacherKind, rate: float = 0.0,
                 resume_from: Path | None = None, *, device: str | None = None, dtype: str | None = None) -> None:
        if kind not in ("frozen", "ema", "current"):
            raise ValueError(f"teacher must be 'frozen', 'ema' or 'current', got {kind!r}")
        self.student, self.kind, self.rate = student, kind, rate
        self.model, self.adapter = student.model, None
        lora = student.adapter is not None
        if kind == "current":
            self.adapter = student.adapter
        elif kind == "frozen" and not lora:
            from stages.core.models.backbone import load_policy
            initial = load_policy(student.model_name, dtype=dtype, device=device)[0]  # the initial weights
            self.model = initial.requires_grad_(False)
        elif kind == "ema" and lora:
            self._add_ema_adapter(resume_from)
            self.adapter = TEACHER_ADAPTER
        elif kind == "ema":
            if resume_from:
                from stages.core.models.backbone import load_policy, master_dtype, resolve_device_dtype
                device, dtype = resolve_device_dtype(device, dtype)
                # the EMA accumulates in float32 under a bf16 run (master_dtype), as saved
                saved = load_policy(str(resume_from / TEACHER_FOLDER), dtype=master_dtype(dtype), device=device)[0]
                self.model = saved.requires_grad_(False)
            else:
                self.model = frozen_teacher_copy(student.model)

    def _add_ema_adapter(self, resume_from: Path | None) -> None:
        """The ``teacher`` LoRA adapter: a copy of the student's, or restored from a checkpoint."""
        net, cfg = self.student.model, self.student.model.peft_config[self.student.adapter]
        if resume_from:
            with preserve_requires_grad(net), readable(resume_from / TEACHER_FOLDER, "the saved teacher adapter"):
                net.load_adapter(str(resume_from / TEACHER_FOLDER), adapter_name=TEACHER_ADAPTER,
                                 is_trainable=False)
        else:
            add_lora_adapter(net, TEACHER_ADAPTER, cfg.r, cfg.lora_alpha, sorted(cfg.target_modules))
            copy_adapter_(net, self.student.adapter, TEACHER_ADAPTER)
        for p in adapter_parameters(net, TEACHER_ADAPTER):
            p.requires_grad_(False)

    def logits(self, input_ids_BT: Tensor, attn_mask_BT: Tensor, insert_at_B: Tensor,
               prefix_ids: list[list[int]], hidden: bool = False) -> Tensor:
        """Teacher logits_BTV (B, T, V) of the rows' completions under ``prefix_ids``, or with
        ``hidden`` its last hidden states (B, T, d) (no grad;
        :func:`stages.core.latent.teacher.context_teacher_logits`)."""
        return context_teacher_logits(self.model, input_ids_BT, attn_mask_BT, insert_at_B, prefix_ids,
                                      adapter=self.adapter, hidden=hidden)

    @torch.no_grad()
    def update(self) -> None:
        """After an optimizer step: the EMA step (other kinds: nothing)."""
        if self.kind != "ema":
            return
        if self.student.adapter is not None:
            ema_update_adapter_(self.student.model, TEACHER_ADAPTER, self.student.adapter, self.rate)
        else:
            ema_update_(self.model, self.student.model, self.rate)

    def save(self, folder: Path) -> None:
        """Write the EMA teacher into a checkpoint folder as ``teacher/`` (other kinds: nothing)."""
        if self.kind != "ema":
            return
        if self.student.adapter is not None:  # peft writes a named adapter into <folder>/<name>/
            self.student.model.save_pretrained(str(folder), selected_adapters=[TEACHER_ADAPTER])
        else:
            self.model.save_pretrained(folder / TEACHER_FOLDER)
            self.student.tokenizer.save_pretrained(folder / TEACHER_FOLDER)


# -------------------------------------------------------------------------------- method --


@dataclass(frozen=True)
class RowContext:
    """A row's privileged context (what :meth:`ReferenceMethod.prepare` attaches).

    Attributes:
        prefix_ids: the teacher's prompt ids (the row's prompt re-rendered with the
            reference), or None: the task has no verified reference, the row gets no loss.
        demonstration: the rendered reference, or None.
        step_sequences, step_tokens: rows with a context in the whole step, and their
            supervised tokens (the denominators of the step's loss, so micro-batches sum to it).
    """

    prefix_ids: list[int] | None
    demonstration: Demonstration | None
    step_sequences: int
    step_tokens: int


class ReferenceMethod(Method):
    """A verified reference of the task in the teacher's prompt; a full-vocabulary divergence.

    Subclasses set the framing (:meth:`framing`: ``{"system": ...}`` or ``{"user": ...}`` for
    :func:`stages.core.latent.privileged.privileged_prefix`). Rows without a reference are masked and
    counted (``no_context_frac``); the loss of a step is normalised over the rows that have one
    (``reduction``), so the micro-batch losses sum to it exactly (the loop's ``weight`` is
    implied by those step-level denominators). ``context_tokens`` = mean tokens of the rendered
    references of the step's rows that have one.
    """

    Options = ReferenceOptions
    options: ReferenceOptions
    loss_metrics: tuple[str, ...] = ("forward_kl", "reverse_kl")

    def __init__(self, config, resume_from: Path | None, state: dict) -> None:
        super().__init__(config, resume_from, state)
        self.teacher = TextTeacher(self.student, self.options.teacher, self.options.ema_rate, resume_from,
                                   device=self.device, dtype=self.dtype)
        self._step_stats: dict[str, float] = {}

    def framing(self, demonstration: str) -> dict[str, str]:
        """Where and how the reference enters the teacher's prompt (``system=`` / ``user=``)."""
        raise NotImplementedError

    def prepare(self, batch: StepBatch, context: StepContext) -> list[RowContext]:
        o, tok = self.options, self.student.tokenizer
        refs = verified_references(context.store, batch.rows)
        demos: dict[str, Demonstration] = {}
        prefixes: list[list[int] | None] = []
        for row, ref in zip(batch.rows, refs):
            if ref is None:
                prefixes.append(None)
                continue
            if ref.trajectory_id not in demos:
                demos[ref.trajectory_id] = demonstration_text(ref, tok, max_tokens=o.demo_tokens,
                                                              max_observation_chars=o.max_observation_chars)
            prefixes.append(privileged_prefix(tok, row, **self.framing(demos[ref.trajectory_id].text)))
        with_ctx = [row for row, p in zip(batch.rows, prefixes) if p is not None]
        sequences, tokens = len(with_ctx), sum(int(r.mask_T.sum()) for r in with_ctx)
        shown = [demos[ref.trajectory_id].tokens for ref in refs if ref is not None]
        self._step_stats = {
            "no_context_frac": 1.0 - sequences / len(batch.rows) if batch.rows else 0.0,
            "context_tokens": float(sum(shown) / len(shown)) if shown else 0.0,
        }
        return [RowContext(p, None if ref is None else demos[ref.trajectory_id], sequences, tokens)
                for p, ref in zip(prefixes, refs)]

    def loss(self, rows: list[TrainRow], extras: list[RowContext], weight: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The divergence on the micro-batch's rows that have a reference (its share of the
        step's loss); rows without one run no forward at all."""
        o, s = self.options, self.student
        keep = [i for i, e in enumerate(extras) if e.prefix_ids is not None]
        if not keep:  # no gradient reaches the student; the optimizer skips params without one
            zero = torch.zeros((), dtype=upcast_dtype(getattr(torch, self.dtype)), device=self.device,
                               requires_grad=True)
            return zero, dict.fromkeys(self.loss_metrics, 0.0)
        ids_BT, attn_BT, mask_BT, _, insert_B = pad_rows(s.tokenizer, [rows[i] for i in keep], self.device)
        s_head = self.output_head(s.model)
        t_head = None if s_head is None else self.output_head(self.teacher.model)
        heads = None if t_head is None else (s_head, t_head)  # (B, T, d) hidden states, else logits
        s_out = student_logits(s.model, ids_BT, attn_BT, adapter=s.adapter, hidden=heads is not None)
        t_out = self.teacher.logits(ids_BT, attn_BT, insert_B, [extras[i].prefix_ids for i in keep],
                                    hidden=heads is not None)
        first = extras[keep[0]]
        loss, m = generalized_jsd(s_out[:, :-1], t_out[:, :-1], mask_BT[:, 1:], o.beta,
                                  temperature=o.loss_temperature, chunk_size=o.chunk_size,
                                  reduction=o.reduction, num_sequences=first.step_sequences,
                                  num_tokens=first.step_tokens, heads=heads)
        return loss, {k: m[k] for k in self.loss_metrics}

    def after_step(self, sums: dict[str, float]) -> dict[str, float]:
        """Maintain the teacher (EMA step); report the step's context statistics."""
        self.teacher.update()
        return dict(self._step_stats)

    def save(self, folder: Path) -> None:
        self.teacher.save(folder)


