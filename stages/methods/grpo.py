"""GRPO: group-normalised outcome advantages and a PPO-clip surrogate, no teacher.

B.1 of the LOPD paper (G = 4 rollouts per task = the loop's
``group_size``, PPO-clip eps 0.2/0.2, group-normalised advantages, no teacher, no composer).
Per step: every rollout i of a task gets A_i = (r_i - mean_G) / (std_G + eps) (std on by
default; ``scale_std=false`` for Dr.GRPO / the SDPO repo's GRPO), shared by all its action
tokens; the loss is -min(rho A, clip(rho, 1 - eps_lo, 1 + eps_hi) A) per token with
rho = pi_theta / pi_old, plus optionally ``kl_coef`` x k3 KL to the initial policy. pi_old is
the training forward before the step's first update (as verl and TRL): the first epoch's own
log-probs, detached and kept per row for the later epochs, so rho is exactly 1 in the first
epoch in any dtype. The log-probs the engine recorded while sampling (``TrainRow.logprobs_T``,
another kernel with a KV cache: in bf16 they differ from the training forward by 0.05 nats per
token on average) are the behaviour policy of the optional rollout correction
(``rollout_correction="token-tis"``: each token's loss times min(pi_old / pi_engine, cap), as
verl's token-level truncated importance sampling); off by default, their gap is reported
(``rollout_logp_abs_diff``).

Choices B.1 leaves open (KL weight, std scaling, aggregation...), defaults first:
* aggregation ``token-mean`` (DAPO: sum over the step's action tokens / their number);
  ``seq-mean`` (original GRPO: per-row token-mean, then the mean over rows); ``constant``
  (Dr.GRPO: token sum / (rows x ``loss_constant``), default constant = ``max_new_tokens``).
* ``kl_coef`` 0 (no reference forward at all); > 0 scores the tokens with the initial policy:
  the student backbone with adapters disabled (LoRA) or a frozen copy of ``--model`` (full
  fine-tuning).
* ``ppo_epochs`` 1: optimizer updates per step on the same rollouts (the loop's
  ``update_epochs``); with more than one the ratio leaves 1 and the clip can bite.
* ``drop_zero_var`` off: DAPO drops groups whose rewards are all equal (they have A = 0 and
  only dilute the token mean); on, their rows leave the loss and its normaliser.

Log-probs are taken at the sampling temperature (``log_softmax(logits / T)``, as the engine
records them). A row whose action tokens lack a recorded sampling log-prob (older stores,
re-tokenized rows) gets weight 1 from the rollout correction; such rows are counted in
``no_logprob_rows``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from stages.core.data.rows import TrainRow, pad_rows
from stages.core.losses.head import head_token_logprobs
from stages.core.losses.pg import (
    group_advantages, k3_kl, ppo_clip_loss, token_logprobs, truncated_is_weights,
)
from stages.core.models.student import student_logits
from stages.methods import Method, StepBatch, StepContext, register
from stages.methods.options import GRPOOptions


@dataclass
class PGExtra:
    """What :meth:`GRPO.prepare` attaches to one training row.

    Attributes:
        advantage: the row's trajectory's group-normalised advantage.
        keep: False when the row leaves the loss (``drop_zero_var`` and a zero-variance group).
        prefix_ids: the teacher's prompt ids (Skill-SD), None without a teacher view.
        skill_id: the skill in that prompt (Skill-SD), "" for none.
        old_logp_T: float (T-1,) pi_old of the row's tokens 1.. (shifted; the first epoch's
            training forward, detached), None until the first epoch's loss set it.
    """

    advantage: float
    keep: bool = True
    prefix_ids: list[int] | None = None
    skill_id: str = ""
    old_logp_T: torch.Tensor | None = None


def pi_old(rows: list[TrainRow], extras: list[PGExtra], logp_BT: torch.Tensor) -> torch.Tensor:
    """(B, T-1) pi_old of a micro-batch: the policy before the step's first update.

    In the first epoch (the rows' ``old_logp_T`` unset) that is the training forward itself:
    ``logp_BT`` detached (ratio exactly 1), kept per row in its extra for the later epochs, which
    read it back (0 past a row's length). A micro-batch's rows are in the same epoch.

    Args:
        rows: the micro-batch's rows (row b fills ``logp_BT[b, :len(ids_T) - 1]``).
        extras: their :class:`PGExtra`, updated in place in the first epoch.
        logp_BT: float (B, T-1) current log-probs of ``ids[:, 1:]`` (the shifted tokens).
    """
    if extras[0].old_logp_T is None:
        fresh_BT = logp_BT.detach()
        for b, (row, extra) in enumerate(zip(rows, extras)):
            extra.old_logp_T = fresh_BT[b, :len(row.ids_T) - 1].clone()
        return fresh_BT
    old_BT = torch.zeros_like(logp_BT)
    for b, extra in enumerate(extras):
        old_BT[b, :extra.old_logp_T.shape[0]] = extra.old_logp_T
    return old_BT


@register("grpo")
class GRPO(Method):
    """GRPO in the distill loop; see the module docstring."""

    Options = GRPOOptions
    options: GRPOOptions
    metrics = ("pg_loss", "clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean", "adv_abs_mean",
               "kl_ref", "zero_var_groups", "no_logprob_rows", "rollout_logp_abs_diff", "rollout_is_mean")

    def __init__(self, config: Any, resume_from: Path | None, state: dict) -> None:
        super().__init__(config, resume_from, state)
        self.update_epochs = self.options.ppo_epochs
        self.temperature = config.temperature if config.temperature > 0 else 1.0  # greedy: T=1 log-probs
        self.reference_policy = None  # full fine-tuning with a KL: a frozen copy of the initial weights
        if self.options.kl_coef > 0 and self.student.adapter is None:
            from stages.core.models.assembly import frozen_teacher_copy
            from stages.core.models.backbone import load_policy
            initial = load_policy(config.model, dtype=self.dtype, device=self.device)[0]
            self.reference_policy = frozen_teacher_copy(initial)
        self.step_tokens, self.step_rows, self.step_metrics = 0, 0, {}

    # ----------------------------------------------------------------------------- prepare --

    def prepare(self, batch: StepBatch, context: StepContext) -> list[PGExtra]:
        """Group-normalised advantage per row (groups = the step's rollouts of one task) and the
        step's loss normaliser (kept rows' action tokens / rows)."""
        o = self.options
        trajs = batch.trajectories
        groups: dict[str, int] = {}
        # host-side bookkeeping: a handful of rewards per step, the advantages leave as floats
        group_N = torch.tensor([groups.setdefault(t.task_id, len(groups)) for t in trajs], dtype=torch.long,
                               device="cpu")
        rewards_N = torch.tensor([float(t.reward) for t in trajs], dtype=torch.float64, device="cpu")
        adv_N, zero_var_G = group_advantages(rewards_N, group_N, scale_std=o.scale_std, eps=o.adv_eps)
        by_id = {t.trajectory_id: (float(adv_N[i]), bool(zero_var_G[group_N[i]])) for i, t in enumerate(trajs)}
        extras = []
        for row in batch.rows:
            adv, zero_var = by_id[row.trajectory.trajectory_id]
            extras.append(PGExtra(advantage=adv, keep=not (o.drop_zero_var and zero_var)))
        kept = [r for r, e in zip(batch.rows, extras) if e.keep]
        self.step_tokens = sum(int(r.mask_T[1:].sum()) for r in kept)
        self.step_rows = len(kept)
        missing = sum(bool(torch.isnan(r.logprobs_T[r.mask_T]).any()) for r in batch.rows)
        self.step_metrics = {"zero_var_groups": float(zero_var_G.sum()), "no_logprob_rows": float(missing),
                             "adv_abs_mean": float(adv_N.abs().mean()) if len(trajs) else 0.0}
        return extras

    def denominator(self) -> float:
        """The step's normaliser of :func:`stages.core.losses.pg.aggregate` for ``aggregation``."""
        o = self.options
        if o.aggregation == "token-mean":
            return float(max(self.step_tokens, 1))
        if o.aggregation == "seq-mean":
            return float(max(self.step_rows, 1))
        return float(max(self.step_rows, 1) * (o.loss_constant or self.config.max_new_tokens))

    # -------------------------------------------------------------------------------- loss --

    def loss(self, rows: list[TrainRow], extras: list[PGExtra], weight: float) -> tuple[torch.Tensor, dict[str, float]]:
        """PPO-clip (+ kl_coef x k3 KL, + the subclass's terms) on one micro-batch.

        Each term is a sum over this micro-batch divided by the STEP's normaliser, so the sum
        over micro-batches is the step's loss exactly (``weight`` is not needed); token-mean
        metrics are scaled by this micro-batch's share of the step's kept tokens.
        """
        o, s = self.options, self.student
        ids, attn, mask, behaviour, insert_at = pad_rows(s.tokenizer, rows, self.device)
        keep_B1 = torch.tensor([e.keep for e in extras], dtype=torch.bool, device=self.device).unsqueeze(1)
        mask = (mask & keep_B1)[:, 1:]
        logp = self.sampled_logprobs(s.model, lambda hidden: student_logits(s.model, ids, attn, adapter=s.adapter,
                                                                            hidden=hidden), ids, mask)
        old = pi_old(rows, extras, logp)
        weights, rollout_m = truncated_is_weights(old, behaviour[:, 1:], mask, cap=o.rollout_correction_cap)
        adv = torch.tensor([e.advantage for e in extras], dtype=logp.dtype, device=logp.device)
        denom = self.denominator()
        loss, m = ppo_clip_loss(logp, old, adv, mask, eps_lo=o.eps_lo, eps_hi=o.eps_hi, aggregation=o.aggregation,
                                denominator=denom, weights_BT=weights if o.rollout_correction == "token-tis" else None)
        share = float(mask.sum()) / max(self.step_tokens, 1)
        metrics = {"pg_loss": m["pg_loss"], **{k: share * m[k] for k in
                                               ("clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean")},
                   **{k: share * rollout_m[k] for k in ("rollout_logp_abs_diff", "rollout_is_mean")}}
        if o.kl_coef > 0:
            with torch.no_grad():
                ref = s.model if self.reference_policy is None else self.reference_policy
                ref_logp = self.sampled_logprobs(ref, lambda hidden: student_logits(ref, ids, attn, adapter=None,
                                                                                    hidden=hidden), ids, mask)
            kl, km = k3_kl(logp, ref_logp, mask, aggregation=o.aggregation, denominator=denom)
            loss = loss + o.kl_coef * kl
            metrics["kl_ref"] = km["kl_ref"]
        extra, extra_m = self.extra_terms(rows, extras, ids, attn, insert_at, mask, logp, old, denom)
        if extra is not None:
            loss = loss + extra
        metrics.update(extra_m)
        return loss, metrics

    def sampled_logprobs(self, model: torch.nn.Module, forward: Callable[[bool], torch.Tensor], ids: torch.Tensor,
                         mask: torch.Tensor) -> torch.Tensor:
        """(B, T-1) log-probs of ``ids[:, 1:]`` at the sampling temperature under ``model``.

        ``forward(hidden)`` runs the model on the batch: (B, T, V) logits, or with ``hidden`` its
        last hidden states (B, T, d); where :meth:`output_head` gives the head, it is applied at the
        supervised positions ``mask`` (B, T-1) only and other positions hold 0.
        """
        head = self.output_head(model)
        out = forward(head is not None)[:, :-1]
        if head is None:
            return token_logprobs(out, ids[:, 1:], self.temperature)
        return head_token_logprobs(out, head, ids[:, 1:], mask, temperature=self.temperature)

    def extra_terms(self, rows: list[TrainRow], extras: list[PGExtra], ids: torch.Tensor, attn: torch.Tensor,
                    insert_at: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor, old: torch.Tensor,
                    denom: float) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Further loss terms of a subclass (Skill-SD's distillation term); GRPO has none.

        Tensors: ids/attn (B, T) unshifted; mask, logp (differentiable), old (B, T-1) shifted.
        """
        return None, {}

    def after_step(self, sums: dict[str, float]) -> dict[str, float]:
        """The step's counts (zero-variance groups, rows without sampling log-probs, |A|)."""
        return dict(self.step_metrics)
