"""LOPD-text: LOPD's loop with the retrieved experiences given to the teacher as TEXT (no composer).

The control that the LOPD paper argues against ("designer-fixed privileged context such as raw
trajectories"): the same J retrieved experiences of other tasks as LOPD, rendered as the same
composer input rows (``"Current task: ...\\n\\nRelated experience:\\n..."``,
:func:`stages.core.latent.contexts.encode_experiences`, each cut to ``max_exp_tokens``), are put
as plain token embeddings where LOPD's latents go (``placement``, default ``framed``: inside the
first user message between the framing texts). This is the composer ladder's rung (g)
(:func:`stages.core.latent.teacher.text_teacher_logits`). The teacher is the frozen initial
backbone (a LoRA student's backbone with every adapter disabled; for full fine-tuning the
initial weights loaded again).

Loss: LOPD's student objective, the top-M + tail reverse KL (Eq. 9-10 of the LOPD paper) on the
student's sampled action tokens. LOPD's other two terms act only on the composer phi (the margin
term's Delta reads sg[log p_S], the anchor reads c_phi): with a fixed text context there is
nothing for them to train, so they are absent. ``Delta`` (Eq. 12, the advantage-weighted gap
log p_T(a) - log p_S(a) at the sampled tokens) is still reported: how much the text teacher
prefers the student's successful actions over its failed ones.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stages.core.data.rows import TrainRow
from stages.core.latent.contexts import build_batch, shift_for_loss
from stages.core.latent.placements import get_placement
from stages.core.latent.teacher import text_teacher_logits
from stages.core.losses.head import head_token_logprobs, head_topm_tail_reverse_kl
from stages.core.losses.lopd import privileged_margin, sampled_token_logprobs, topm_tail_reverse_kl
from stages.core.models.student import student_logits
from stages.methods import Method, register
from stages.methods._text_context import TextTeacher
from stages.methods.lopd import LOPD
from stages.methods.options import LOPDTextOptions


@register("lopd-text")
class LOPDText(Method):
    """LOPD with its experiences as text in the teacher's context (module docstring)."""

    Options = LOPDTextOptions
    options: LOPDTextOptions
    retrieves = True
    metrics = ("reverse_kl", "Delta", "context_tokens", "experiences", "no_experience_frac")

    def __init__(self, config: Any, resume_from: Path | None, state: dict) -> None:
        super().__init__(config, resume_from, state)
        self.placement = get_placement(self.options.placement)
        self.teacher = TextTeacher(self.student, "frozen", device=self.device, dtype=self.dtype)

    prepare = LOPD.prepare  # the same J retrieved training-split experiences per row as LOPD's

    def loss(self, rows: list[TrainRow], extras: list[list], weight: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The top-M + tail reverse KL to the text teacher on one micro-batch, times ``weight``
        (every row holds action tokens, so per-row means accumulate exactly, as in LOPD)."""
        o, s = self.options, self.student
        batch = build_batch(s.tokenizer, rows, extras, J=o.J, max_exp_tokens=o.max_exp_tokens,
                            framed=self.placement.needs_frame_ids).to(self.device)
        s_head = self.output_head(s.model)
        t_head = None if s_head is None else self.output_head(self.teacher.model)
        heads = None if t_head is None else (s_head, t_head)
        s_out = student_logits(s.model, batch.input_ids_BT, batch.attn_mask_BT, adapter=s.adapter,
                               hidden=heads is not None)
        t_out = text_teacher_logits(self.teacher.model, batch, self.placement, hidden=heads is not None)
        s_out, targets, mask = shift_for_loss(s_out, batch)
        t_out = shift_for_loss(t_out, batch)[0]
        with torch.no_grad():
            if heads is None:  # (B, T-1, V) logits
                s_logp, t_logp = sampled_token_logprobs(s_out, targets), sampled_token_logprobs(t_out, targets)
            else:  # (B, T-1, d) hidden states: logits only at the action tokens
                s_logp = head_token_logprobs(s_out, heads[0], targets, mask)
                t_logp = head_token_logprobs(t_out, heads[1], targets, mask)
            delta = privileged_margin(t_logp, s_logp, mask, batch.rewards_B, 0.0, 0.0)[1]["Delta"]
        if heads is None:
            kl, kl_m = topm_tail_reverse_kl(s_out, t_out, mask, M=o.M)
        else:
            kl, kl_m = head_topm_tail_reverse_kl(s_out, t_out, mask, *heads, M=o.M)
        context_tokens = batch.exp_mask_BJL.sum(dim=(1, 2)).float().mean().item()
        metrics = {"reverse_kl": weight * kl_m["reverse_kl"], "Delta": weight * delta,
                   "context_tokens": weight * context_tokens,
                   "experiences": weight * sum(map(len, extras)) / len(extras),
                   "no_experience_frac": weight * sum(not e for e in extras) / len(extras)}
        return weight * kl, metrics
