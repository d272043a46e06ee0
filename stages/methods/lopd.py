"""LOPD: latent on-policy self-distillation (Algorithm 1 and Eq. 9-13 of the LOPD paper).

Teacher view: the frozen initial backbone (every adapter disabled) re-scores the student's own
sampled tokens with the composer's latents c_phi spliced in (Eq. 7-8). Loss (Eq. 13) =
top-M + tail reverse KL (Eq. 9-10) + beta * (m - Delta) (Eq. 11-12) + lambda * ||c_phi -
sg[c_phi0]||^2; after each optimizer step the dual variable beta takes a projected step.
The student and the composer phi are trained jointly; phi_0 (the cold-start composer) stays
frozen as the anchor's target.

Model layout (one peft backbone): adapters "composer" (phi's encoder LoRA), "composer0"
(phi_0) and "student"; the teacher is that backbone with every adapter disabled. With
``student_lora_rank=0`` the student is a separate, fully trainable model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stages.core.data.rows import TrainRow, pad_id
from stages.core.latent.contexts import build_batch, encode_experiences, retrieve_experiences, shift_for_loss
from stages.core.models.assembly import load_models
from stages.core.models.composer import base_model, enable_activation_checkpointing, save_composer
from stages.core.models.composer_config import read_composer_config
from stages.core.losses import DEFAULT_CHUNK_SIZE
from stages.core.run.resources import check_step_memory, shape_of
from stages.core.losses.head import head_token_logprobs, head_topm_tail_reverse_kl
from stages.core.losses.lopd import (
    dual_update, latent_anchor, privileged_margin, sampled_token_logprobs, topm_tail_reverse_kl,
)
from stages.core.latent.placements import get_placement
from stages.core.latent.shared import SharedLatents
from stages.core.latent.teacher import latent_teacher_logits
from stages.core.models.student import student_logits
from stages.methods import Method, StepBatch, StepContext, Student, register
from stages.methods.options import LOPDOptions

ANCHOR_ADAPTER = "composer0"


@register("lopd")
class LOPD(Method):
    """LOPD in the distill loop; see the module docstring. ``beta`` is the dual variable."""

    Options = LOPDOptions
    options: LOPDOptions
    retrieves = True
    metrics = ("reverse_kl", "Delta", "beta", "anchor", "margin_term", "latent_norm", "grad_norm_composer",
               "experiences", "no_experience_frac")
    needs_composer = True

    def __init__(self, config: Any, resume_from: Path | None, state: dict) -> None:
        options: LOPDOptions = config.options
        if options.max_exp_tokens is None:
            raise ValueError("lopd: options not resolved against the composer (LOPDOptions.resolve; "
                             "stages.distill.settings.settings and DistillConfig.resolved do it)")
        self.composer_cfg = read_composer_config(options.composer)
        self.placement = get_placement(self.composer_cfg.get("placement", "prefix"))
        self.beta = state.get("beta", options.beta0)
        self.shared: SharedLatents | None = None  # the current update's latents (begin_update)
        super().__init__(config, resume_from, state)

    def build_student(self, resume_from: Path | None) -> Student:
        """Student, composer phi and frozen phi_0 on one backbone (:func:`stages.core.models.assembly.load_models`)."""
        o, c = self.options, self.config
        m = load_models(c.model, Path(o.composer), resume_from, lora_rank=c.student_lora_rank,
                        freeze_composer=o.freeze_composer, anchor_adapter=ANCHOR_ADAPTER,
                        device=self.device, dtype=self.dtype)
        self.composer, self.anchor, self.composer_params = m.composer, m.anchor, m.composer_params
        if c.activation_checkpointing:
            enable_activation_checkpointing(self.composer.backbone)
        return Student(m.student, m.student_adapter, m.tokenizer, m.student_params, c.model)

    def check_resources(self, store: Any) -> None:
        """A step's estimated memory against the memory available (:mod:`stages.core.run.resources`).

        Only with ``max_len`` set (the sequence length is unknown otherwise). J above the
        store's successes is no error here: the memory grows during training, and missing
        experiences are task-only composer rows.
        """
        c, o = self.config, self.options
        if c.max_len is None:
            return
        check_step_memory(shape_of(base_model(self.composer.backbone).config, batch=c.micro_batch, J=o.J, K=o.K,
                                   max_exp_tokens=o.max_exp_tokens, seq_len=c.max_len,
                                   activation_checkpointing=c.activation_checkpointing,
                                   full_student=c.student_lora_rank == 0,
                                   dtype_bytes=2 if self.dtype in ("bfloat16", "float16") else 4,
                                   loss_chunk=DEFAULT_CHUNK_SIZE),
                          stage="distill", knobs="micro_batch, --J, max_exp_tokens or max_len")

    def param_groups(self) -> dict[str, tuple[list, float]]:
        if not self.composer_params:
            return {}
        return {"composer": (self.composer_params, self.options.composer_lr or self.config.lr)}

    def train_mode(self) -> None:
        self.composer.backbone.train()  # engages activation checkpointing (no dropout here)

    def prepare(self, batch: StepBatch, context: StepContext) -> list[list]:
        """J retrieved successful training-split experiences per row ([] without an index)."""
        if context.retriever is None:
            return [[] for _ in batch.rows]
        # training experiences only: held-out (test split) rows never become privileged context
        return retrieve_experiences(context.retriever, [r.trajectory for r in batch.rows], self.options.J,
                                    split="train", exclude_same_task=self.options.exclude_same_task)

    def begin_update(self, rows: list[TrainRow], extras: list[list]) -> None:
        """Encode each distinct composer input of the update once (:class:`SharedLatents`): the G
        rollouts of a task retrieve the same experiences, so without this the composer would
        encode them G times."""
        o = self.options
        encoded = [encode_experiences(self.student.tokenizer, r.trajectory.prompt, exps, o.J, o.max_exp_tokens)
                   for r, exps in zip(rows, extras)]
        self.shared = SharedLatents(self.composer, self.anchor, rows, encoded, self.config.micro_batch,
                                    trainable=not o.freeze_composer, pad_token_id=pad_id(self.student.tokenizer),
                                    device=self.device)

    def end_update(self) -> None:
        """The composer's backward for the whole update (:meth:`SharedLatents.backward`)."""
        if self.shared is not None:
            self.shared.backward()
        self.shared = None

    def loss(self, rows: list[TrainRow], extras: list[list], weight: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Eq. 13 on one micro-batch times ``weight``.

        Every row holds action tokens, so the per-row means of Eq. 10 / Eq. 12 and the
        anchor's batch mean all accumulate exactly over micro-batches with this weight. The
        latents come from the update's :class:`SharedLatents` when :meth:`begin_update` ran, else
        the composer encodes this micro-batch's inputs (a sharded student).
        """
        o, s = self.options, self.student
        batch = build_batch(s.tokenizer, rows, extras, J=o.J, max_exp_tokens=o.max_exp_tokens,
                            framed=self.placement.needs_frame_ids).to(self.device)
        exp = (batch.exp_ids_BJL, batch.exp_mask_BJL)
        if self.shared is not None:
            c_phi, c_phi0 = self.shared.take(rows)
        else:
            with torch.set_grad_enabled(not o.freeze_composer):
                c_phi = self.composer(*exp)  # (B, J*K, d)
            with torch.no_grad():
                c_phi0 = c_phi.detach() if self.anchor is None else self.anchor(*exp)
        ids, attn = batch.input_ids_BT, batch.attn_mask_BT
        heads = self._heads()
        s_out = student_logits(s.model, ids, attn, adapter=s.adapter, hidden=heads is not None)
        t_out = latent_teacher_logits(self.composer.backbone, batch, c_phi, self.placement, hidden=heads is not None)
        s_out, targets, mask = shift_for_loss(s_out, batch)
        t_out = shift_for_loss(t_out, batch)[0]
        if heads is None:  # (B, T-1, V) logits
            kl, kl_m = topm_tail_reverse_kl(s_out, t_out, mask, M=o.M)
            with torch.no_grad():
                s_logp = sampled_token_logprobs(s_out, targets)  # sg[log p_S(a)] of Eq. 11
            t_logp = sampled_token_logprobs(t_out, targets)
        else:  # (B, T-1, d) hidden states: logits only at the action tokens
            kl, kl_m = head_topm_tail_reverse_kl(s_out, t_out, mask, *heads, M=o.M)
            with torch.no_grad():
                s_logp = head_token_logprobs(s_out, heads[0], targets, mask)
            t_logp = head_token_logprobs(t_out, heads[1], targets, mask)
        margin_term, margin_m = privileged_margin(t_logp, s_logp, mask, batch.rewards_B, o.margin, self.beta)
        anchor_term, anchor_m = latent_anchor(c_phi, c_phi0, o.lam)
        loss = weight * (kl + margin_term + anchor_term)
        metrics = {"reverse_kl": weight * kl_m["reverse_kl"], "Delta": weight * margin_m["Delta"],
                   "margin_term": weight * margin_m["margin_term"], "anchor": weight * anchor_m["anchor"],
                   "latent_norm": weight * float(c_phi.detach().norm(dim=-1).mean()),
                   # retrieved experiences per row (of J), and the rows that got none: a store that
                   # serves the tasks nothing shows here, not only as a flat score
                   "experiences": weight * sum(map(len, extras)) / len(extras),
                   "no_experience_frac": weight * sum(not e for e in extras) / len(extras)}
        return loss, metrics

    def _heads(self) -> tuple | None:
        """(student head, teacher head) for the hidden-state losses, or None for the logits path."""
        student = self.output_head(self.student.model)
        teacher = None if student is None else self.output_head(self.composer.backbone)
        return None if teacher is None else (student, teacher)

    def after_step(self, sums: dict[str, float]) -> dict[str, float]:
        """Projected dual step of Eq. 13 on the step's Delta; reports beta after the update."""
        self.beta = dual_update(self.beta, self.options.margin, sums["Delta"], self.options.eta_beta)
        return {"beta": self.beta}

    def state(self) -> dict[str, Any]:
        return {"beta": self.beta}

    def save(self, folder: Path) -> None:
        """Write phi as ``folder/composer`` (:func:`save_composer` format)."""
        save_composer(self.composer, folder / "composer", self.composer_cfg)

    export = save  # the final folder holds the trained composer too
