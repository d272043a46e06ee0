"""SDPO: self-distillation from the policy's own successes or environment feedback (a baseline of
the LOPD paper, configured as in its B.1; upstream code: lasgroup/SDPO).

Teacher: an EMA of the student, ``T <- (1 - ema_rate) T + ema_rate S`` after every optimizer
step (B.1 and upstream: 0.05), no gradient. LoRA student: a second adapter ``teacher`` on the
student's peft backbone, initialised as a copy of the student's adapter (= the initial weights)
and moved with :func:`stages.core.models.assembly.ema_update_adapter_`; full fine-tuning: a frozen copy
of the initial model moved with :func:`stages.core.models.assembly.ema_update_`. It is written to every
checkpoint (``teacher/``) and restored from it on resume. With LoRA the EMA runs over the
adapter's factors A and B (the base weights are shared and frozen), so the teacher's weight
delta B_T A_T is not exactly the EMA of the student's deltas B_S A_S (upstream SDPO fine-tunes
all weights, where the two coincide); use ``--student-lora-rank 0`` for the exact form.

Teacher context (per training row, appended to the teacher's first user message with
:func:`stages.core.latent.privileged.privileged_prefix`; the student sees the plain task):
1. a successful sibling: another rollout of the same task in this step (the task's group) with
   reward >= ``success_threshold``, itself excluded, the first qualifier by trajectory id (a
   deterministic order), shown as a solution that worked (``<think>`` blocks removed);
2. else, for a failed attempt only (reward below the threshold), the environment's feedback on
   it (``feedback``: "env", the default = the last non-empty observation text of the
   trajectory, else the error details the environment recorded in its info (BFCL single-turn
   has no observation; its checker's error is the feedback); "observation" = the observation
   text only (upstream's environment-feedback text); "none" = siblings only, as B.1 describes);
3. else no context: the row is masked out of the loss (never distilled on an empty context)
   and counted in ``no_context_frac``.
Texts are clipped to ``max_context_chars``.

Loss: :func:`stages.core.losses.sdpo.sdpo_topk_loss`, the student's top-k + tail reverse KL
(k = 20), token-mean over the step's distilled tokens (micro-batches accumulate exactly). Its
importance ratio exp(logp - logp_old) compares with pi_old, the training forward before the
step's single update (as upstream's verl computes it): exactly 1, so no weight by default. With
``rollout_correction="token-tis"`` logp_old is the engine's recorded log-prob instead (the
behaviour policy: another kernel with a KV cache, 0.05 nats per token off in bf16) and each
token is weighted by min(exp(logp - logp_old), is_clip), verl's token-level truncated importance
sampling; the recorded log-probs are taken at the sampling temperature, so logp is read from
the student's logits divided by ``--temperature`` (weight 1 where nothing was recorded). The top-k and the
divergence are taken on student and teacher logits divided by ``loss_temperature``: by default
the sampling temperature ``--temperature`` (1 for greedy rollouts), as upstream SDPO and TRL's
SDPO do; ``-o loss_temperature=1`` takes them on the raw logits, as LOPD's loss does. No
composer is needed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from schemas import Trajectory
from stages.core.data.rows import TrainRow, pad_rows
from stages.core.latent.privileged import privileged_prefix
from stages.core.latent.teacher import context_teacher_logits
from stages.core.losses.sdpo import sdpo_topk_loss
from stages.core.models.assembly import copy_adapter_, ema_update_, ema_update_adapter_, frozen_teacher_copy
from stages.core.models.backbone import master_dtype
from stages.core.models.composer import add_lora_adapter, adapter_parameters, preserve_requires_grad
from stages.core.models.student import student_logits
from stages.core.run.checkpoint import readable
from stages.methods import Method, StepBatch, StepContext, register
from stages.methods.options import SDPOOptions

TEACHER = "teacher"  # the EMA teacher's adapter name, and its checkpoint sub-folder
SOLUTION_HEAD = "Here is a solution to this task that succeeded:"
FEEDBACK_HEAD = "Here is the environment's feedback on an earlier, unsuccessful attempt at this task:"
CLOSING = "Now solve the original task correctly."
# the checkers' error fields: BFCL's error_type and error, the coding judges' first_failure (taco,
# livecodebench) ...
_INFO_KEYS = ("error_type", "error", "error_message", "reason", "failures", "first_failure")


@dataclass(frozen=True)
class SDPOContext:
    """What :meth:`SDPO.prepare` attaches to one row.

    Attributes:
        source: "sibling", "feedback" or None (no context: the row is masked).
        text: the privileged text appended to the first user message ("" when none).
        prefix_ids: the teacher's prompt ids (the row's prompt re-rendered with ``text``), or None.
        sibling_id: the trajectory id of the sibling shown, else "".
        tokens: the step's distilled tokens (denominator of the token mean).
        rows: the step's rows with a context (denominator of the trajectory mean).
    """

    source: str | None
    text: str
    prefix_ids: list[int] | None
    sibling_id: str
    tokens: int
    rows: int


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def _strip_think(text: str) -> str:
    return re.sub(r"<think>.*?</think>\s*", "", text, flags=re.DOTALL).strip()


def solution_text(traj: Trajectory, limit: int) -> str:
    """A successful sibling as shown to the teacher: its action (one turn), or numbered actions
    with the environment's results (several turns); ``<think>`` removed, clipped to ``limit`` chars."""
    if len(traj.turns) == 1:
        return _clip(_strip_think(traj.turns[0].action), limit)
    lines = []
    for i, turn in enumerate(traj.turns, 1):
        lines.append(f"Step {i}: {_strip_think(turn.action)}")
        if turn.observation.strip():
            lines.append(f"Result: {turn.observation.strip()}")
    return _clip("\n".join(lines), limit)


def feedback_text(traj: Trajectory, mode: str, limit: int) -> str:
    """The environment's feedback on a failed attempt ("" when none; see the module docstring)."""
    if mode == "none":
        return ""
    last = next((t.observation.strip() for t in reversed(traj.turns) if t.observation.strip()), "")
    if last or mode == "observation":
        return _clip(last, limit)
    info = json.loads(traj.info) if traj.info else {}
    parts = [f"{key}: {info[key] if isinstance(info[key], str) else json.dumps(info[key], default=str)}"
             for key in _INFO_KEYS if info.get(key) not in (None, "", [], {})]
    return _clip("\n".join(parts), limit)


def choose_context(traj: Trajectory, group: list[Trajectory], options: SDPOOptions) -> tuple[str | None, str, str]:
    """(source, privileged text, sibling id) for ``traj`` given its group (see the module docstring)."""
    threshold = options.success_threshold
    siblings = sorted((t for t in group if t.trajectory_id != traj.trajectory_id and t.turns
                       and t.reward >= threshold), key=lambda t: t.trajectory_id)
    if siblings:
        body = solution_text(siblings[0], options.max_context_chars)
        return "sibling", f"{SOLUTION_HEAD}\n{body}\n\n{CLOSING}", siblings[0].trajectory_id
    if traj.reward < threshold:
        body = feedback_text(traj, options.feedback, options.max_context_chars)
        if body:
            return "feedback", f"{FEEDBACK_HEAD}\n{body}\n\n{CLOSING}", ""
    return None, "", ""


@register("sdpo")
class SDPO(Method):
    """SDPO in the distill loop; see the module docstring."""

    Options = SDPOOptions
    options: SDPOOptions
    metrics = ("reverse_kl", "distill_loss", "is_ratio", "is_clip_frac", "student_tail_mass",
               "teacher_tail_mass", "distill_tokens", "no_context_frac", "sibling_frac", "feedback_frac")

    def __init__(self, config: Any, resume_from: Path | None, state: dict) -> None:
        super().__init__(config, resume_from, state)
        s = self.student
        saved = resume_from / TEACHER if resume_from else None
        if s.adapter is None:  # full fine-tuning: a separate frozen module
            if saved is not None:
                from transformers import AutoModelForCausalLM
                with readable(saved, "the saved teacher"):
                    self.teacher_model = AutoModelForCausalLM.from_pretrained(
                        str(saved), dtype=getattr(torch, master_dtype(self.dtype)), use_kernels=False)  # no Hub kernels
                self.teacher_model.to(self.device).requires_grad_(False).eval()
            else:
                self.teacher_model = frozen_teacher_copy(s.model)
            self.teacher_adapter = None
        else:
            with preserve_requires_grad(s.model):
                if saved is not None:
                    with readable(saved, "the saved teacher adapter"):
                        s.model.load_adapter(str(saved), adapter_name=TEACHER, is_trainable=False)
                else:
                    add_lora_adapter(s.model, TEACHER, config.student_lora_rank, 2 * config.student_lora_rank)
            for p in adapter_parameters(s.model, TEACHER):
                p.requires_grad_(False)
            if saved is None:
                copy_adapter_(s.model, s.adapter, TEACHER)
            self.teacher_model, self.teacher_adapter = s.model, TEACHER
        self.step_stats: dict[str, float] = {}

    # ---------------------------------------------------------------------------- context --

    def prepare(self, batch: StepBatch, context: StepContext) -> list[SDPOContext]:
        """Per row its teacher context (a sibling, feedback or none) and the step's denominators."""
        groups: dict[str, list[Trajectory]] = {}
        for traj in batch.trajectories:
            groups.setdefault(traj.task_id, []).append(traj)
        tok = self.student.tokenizer
        chosen = []
        for row in batch.rows:
            source, text, sibling = choose_context(row.trajectory, groups[row.trajectory.task_id], self.options)
            prefix = privileged_prefix(tok, row, user=text) if source else None
            chosen.append((source, text, prefix, sibling))
        tokens = sum(int(r.mask_T.sum()) for r, c in zip(batch.rows, chosen) if c[0])
        rows = sum(1 for r, c in zip(batch.rows, chosen) if c[0] and bool(r.mask_T.any()))
        n = max(len(batch.rows), 1)
        self.step_stats = {"no_context_frac": sum(c[0] is None for c in chosen) / n,
                           "sibling_frac": sum(c[0] == "sibling" for c in chosen) / n,
                           "feedback_frac": sum(c[0] == "feedback" for c in chosen) / n,
                           "distill_tokens": float(tokens)}
        return [SDPOContext(source, text, prefix, sibling, tokens, rows) for source, text, prefix, sibling in chosen]

    # ------------------------------------------------------------------------------- loss --

    def loss(self, rows: list[TrainRow], extras: list[SDPOContext], weight: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the step's SDPO loss (``weight`` is not used: the loss is
        normalised by the step's distilled tokens, or rows, from :meth:`prepare`, so the
        micro-batches add up to the step's token mean exactly). Rows without context are left
        out of the forward passes; a micro-batch with none gives 0 with a zero gradient."""
        o, s = self.options, self.student
        keep = [i for i, e in enumerate(extras) if e.prefix_ids is not None and bool(rows[i].mask_T.any())]
        zero_metrics = {k: 0.0 for k in ("reverse_kl", "distill_loss", "is_ratio", "is_clip_frac",
                                         "student_tail_mass", "teacher_tail_mass")}
        if not keep:
            return sum(p.sum() for p in s.params) * 0.0, zero_metrics
        part = [rows[i] for i in keep]
        ctx = [extras[i] for i in keep]
        ids, attn, mask, old, insert_at = pad_rows(s.tokenizer, part, self.device)
        s_head = self.output_head(s.model)
        t_head = None if s_head is None else self.output_head(self.teacher_model)
        heads = None if t_head is None else (s_head, t_head)  # (B, T, d) hidden states, else logits
        s_logits = student_logits(s.model, ids, attn, adapter=s.adapter, hidden=heads is not None)
        t_logits = context_teacher_logits(self.teacher_model, ids, attn, insert_at, [c.prefix_ids for c in ctx],
                                          adapter=self.teacher_adapter, hidden=heads is not None)
        denominator = ctx[0].tokens if o.reduction == "token" else ctx[0].rows
        temperature = self.config.temperature if self.config.temperature > 0 else 1.0
        behaviour = old[:, 1:] if o.rollout_correction == "token-tis" else None  # None: ratio 1 (pi_old)
        loss, m = sdpo_topk_loss(s_logits[:, :-1], t_logits[:, :-1], ids[:, 1:], mask[:, 1:], behaviour,
                                 k=o.k, alpha=o.alpha, add_tail=o.add_tail, is_clip=o.is_clip,
                                 temperature=temperature, loss_temperature=o.loss_temperature or temperature,
                                 reduction=o.reduction, denominator=denominator, heads=heads)
        share = m["num_tokens"] / ctx[0].tokens  # token means of the whole step add up over micro-batches
        metrics = {"distill_loss": m["loss"], "reverse_kl": share * m["divergence"],
                   "is_ratio": share * m["is_ratio"], "is_clip_frac": share * m["is_clip_frac"],
                   "student_tail_mass": share * m["student_tail_mass"],
                   "teacher_tail_mass": share * m["teacher_tail_mass"]}
        return loss, metrics

    # ---------------------------------------------------------------------------- teacher --

    def after_step(self, sums: dict[str, float]) -> dict[str, float]:
        """Move the EMA teacher toward the updated student; report the step's context shares."""
        s, rate = self.student, self.options.ema_rate
        if self.teacher_adapter is None:
            ema_update_(self.teacher_model, s.model, rate)
        else:
            ema_update_adapter_(s.model, TEACHER, s.adapter, rate)
        return dict(self.step_stats)

    def save(self, folder: Path) -> None:
        """Write the EMA teacher as ``folder/teacher`` (a peft adapter folder, or a whole model)."""
        if self.teacher_adapter is None:
            self.teacher_model.save_pretrained(folder / TEACHER)
        else:  # peft writes a named adapter into <folder>/<adapter>/
            self.student.model.save_pretrained(str(folder), selected_adapters=[TEACHER])
