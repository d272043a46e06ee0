"""SDPO's distillation loss: a divergence on the STUDENT's top-k tokens plus a tail bucket, each
token weighted by a clipped importance ratio. Pure tensor functions.

Sources: B.1 of the LOPD paper (SDPO: reverse KL with top-K + tail bucket) and SDPO's
official code (lasgroup/SDPO, ``compute_self_distillation_loss``: the student's top-k ids,
teacher and student full-softmax log-probs gathered at those ids plus a tail bucket
log(1 - sum p), no renormalisation; every
token multiplied by min(exp(logp - logp_old), is_clip), the ratio detached; token-mean).
Contrast with :func:`stages.core.losses.lopd.topm_tail_reverse_kl` (LOPD), whose support is the
TEACHER's top-M.

Alignment convention (as in :mod:`stages.core.losses.lopd`): tensors are already aligned,
``logits[b, t]`` scores ``token_ids[b, t]`` and ``mask[b, t]`` says whether it is supervised.

Memory: only masked positions are gathered, and the full-vocabulary work runs on chunks of at
most ``chunk_size`` positions under activation checkpointing (one [chunk x V] log-softmax alive
at a time). Half-precision logits are upcast to float32; float64 stays float64. On hidden states
with frozen heads (a LoRA student) each chunk's gradient is taken in the forward instead
(``ChunkedRowsLoss``), so the backward recomputes no logits.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor
from torch.nn.functional import linear

from stages.core.losses.head import LMHead, check_head
from stages.core.losses import DEFAULT_CHUNK_SIZE
from stages.core.losses.chunking import (
    ChunkedRowsLoss, check_chunk_size, mask_positions, reduction_weights, run_chunk, upcast, upcast_dtype,
)
from stages.core.losses.lopd import finite_logprobs, kl_rows, tail_logsumexp

Reduction = Literal["token", "trajectory"]
LOG_RATIO_CLAMP = 20.0  # |logp - logp_old| is clamped before exp (as upstream), so exp never overflows


def topk_buckets(logp_NV: Tensor, ids_NK: Tensor, add_tail: bool = True) -> Tensor:
    """Log-probabilities of the buckets ``ids_NK`` (+ a tail bucket) of full log-softmaxes.

    Args:
        logp_NV: float (N, V) log-probabilities (a full log-softmax per row).
        ids_NK: int64 (N, K) token ids, distinct within a row.
        add_tail: append log(1 - sum of the K probabilities), computed as the logsumexp of the
            log-probs outside ``ids_NK`` (exact and stable); only when K < V. False:
            renormalise the K log-probs to sum to one instead (upstream option).

    Returns:
        (N, K+1) float log-probabilities with the tail (K < V and ``add_tail``), else (N, K).
    """
    buckets_NK = logp_NV.gather(-1, ids_NK)
    if ids_NK.shape[-1] >= logp_NV.shape[-1]:
        return buckets_NK
    if not add_tail:
        return buckets_NK - buckets_NK.logsumexp(-1, keepdim=True)
    return torch.cat([buckets_NK, tail_logsumexp(logp_NV, ids_NK)], dim=-1)


def bucket_divergence(s_NB: Tensor, t_NB: Tensor, alpha: float) -> Tensor:
    """Per-row divergence (N,) between bucket log-probabilities ``s_NB`` (student), ``t_NB`` (teacher).

    ``alpha=1``: reverse KL(S || T) = sum_b S_b (log S_b - log T_b) (B.1 of the LOPD paper).
    ``alpha=0``: forward KL(T || S). ``0 < alpha < 1``: the generalised Jensen-Shannon divergence
    of the official SDPO code, (1 - alpha) KL(S || M) + alpha KL(T || M) with the mixture
    M = (1 - alpha) S + alpha T (upstream default 0.5). In nats.
    """
    if alpha == 1.0:
        return kl_rows(s_NB, t_NB)
    if alpha == 0.0:
        return kl_rows(t_NB, s_NB)
    s_NB, t_NB = finite_logprobs(s_NB), finite_logprobs(t_NB)
    m_NB = torch.logsumexp(torch.stack([s_NB + math.log(1.0 - alpha), t_NB + math.log(alpha)]), dim=0)
    kl_s = kl_rows(s_NB, m_NB)
    kl_t = kl_rows(t_NB, m_NB)
    return (1.0 - alpha) * kl_s + alpha * kl_t


def _rows(s_NV: Tensor, t_NV: Tensor, ids_N: Tensor, old_N: Tensor, k: int, alpha: float, add_tail: bool,
          is_clip: float | None, temperature: float, loss_temperature: float) -> tuple[Tensor, ...]:
    """One chunk: (weighted divergence, divergence, raw ratio, student tail, teacher tail), each (N,)."""
    s_NV = upcast(s_NV)
    s_logp_NV = torch.log_softmax(s_NV / loss_temperature, dim=-1)
    t_logp_NV = torch.log_softmax(upcast(t_NV) / loss_temperature, dim=-1)
    ids_NK = s_logp_NV.detach().topk(min(k, s_NV.shape[-1]), dim=-1).indices  # the STUDENT's top-k
    s_NB = topk_buckets(s_logp_NV, ids_NK, add_tail)
    t_NB = topk_buckets(t_logp_NV, ids_NK, add_tail)
    div_N = bucket_divergence(s_NB, t_NB, alpha)
    with torch.no_grad():
        s_tail_N = 1.0 - s_logp_NV.gather(-1, ids_NK).exp().sum(-1)
        t_tail_N = 1.0 - t_logp_NV.gather(-1, ids_NK).exp().sum(-1)
        scaled_NV = s_NV.detach() / temperature
        logp_N = scaled_NV.gather(-1, ids_N.unsqueeze(-1)).squeeze(-1) - scaled_NV.logsumexp(-1)
        log_ratio_N = (logp_N - old_N.to(logp_N.dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        raw_N = torch.where(torch.isnan(old_N), torch.ones_like(logp_N), log_ratio_N.exp())
        if is_clip is None:
            weight_N = torch.ones_like(raw_N)
        else:
            weight_N = raw_N.clamp(max=is_clip)
    return weight_N * div_N, div_N, raw_N, s_tail_N, t_tail_N


def sdpo_topk_loss(
    student_logits_BTV: Tensor,
    teacher_logits_BTV: Tensor,
    token_ids_BT: Tensor,
    mask_BT: Tensor,
    old_logprobs_BT: Tensor | None = None,
    *,
    k: int = 20,
    alpha: float = 1.0,
    add_tail: bool = True,
    is_clip: float | None = 2.0,
    temperature: float = 1.0,
    loss_temperature: float = 1.0,
    reduction: Reduction = "token",
    denominator: float | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    heads: tuple[LMHead, LMHead] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """SDPO's self-distillation loss on the student's top-k + tail, importance-weighted.

    B.1 of the LOPD paper; SDPO's official code. Student and teacher logits are divided by
    ``loss_temperature`` first (upstream SDPO divides both by the sampling temperature before the
    top-k and the divergence). At each masked position n: V^k = the k ids of highest STUDENT
    probability (no gradient through the choice); student and teacher full log-softmaxes are
    gathered there, plus a tail bucket log(1 - sum p) (``add_tail``; no
    renormalisation); d_n = the bucket divergence (:func:`bucket_divergence`, reverse KL at the
    default ``alpha=1``); w_n = min(exp(logp_n - logp_old_n), is_clip), detached, with logp_n
    the student's log-prob of the sampled token under its logits divided by ``temperature`` (the
    sampling temperature the recorded log-probs were taken at) and the log-ratio clamped to
    +-20; w_n = 1 where ``logp_old`` is NaN (not recorded) or ``is_clip`` is None. The loss is
    ``sum_n w_n d_n / denominator`` (``reduction="token"``, default denominator: the number of
    masked positions; upstream's token-mean) or the per-row masked mean of w_n d_n summed over
    rows and divided by ``denominator`` (``"trajectory"``, default: rows with a masked token).
    Pass the whole step's count as ``denominator`` to accumulate micro-batches exactly.

    The teacher is detached: the gradient reaches ``student_logits_BTV`` only. A batch with no
    masked position gives a loss of 0 whose gradient is defined (all zeros).

    Args:
        student_logits_BTV: float (B, T, V) student logits, aligned with ``token_ids_BT``.
        teacher_logits_BTV: float (B, T, V) teacher logits under the privileged context.
        token_ids_BT: int64 (B, T) the sampled ids (read at masked positions only).
        mask_BT: bool or 0/1 (B, T), 1 on distilled tokens (action tokens of rows with a context).
        old_logprobs_BT: float (B, T) sampling log-probs in nats (NaN = not recorded), or None.
        k: size of the student top-k support (>= 1; k >= V means the full vocabulary, no tail).
        alpha: 1 reverse KL, 0 forward KL, in between the generalised JSD.
        add_tail: tail bucket (True) or renormalised top-k (False).
        is_clip: upper clip of the importance ratio (> 0), None = no importance weight.
        temperature: sampling temperature of ``old_logprobs_BT`` (> 0; use 1 for greedy rollouts).
        loss_temperature: divisor of both logits for the top-k and the divergence (> 0; 1 = raw
            logits).
        reduction: "token" or "trajectory" (see above).
        denominator: normaliser of the sum (> 0), default from this batch (see above).
        chunk_size: masked positions per chunk of full-vocabulary work (>= 1).
        heads: (student head, teacher head): the two inputs are then last hidden states (B, T, d)
            and each chunk of masked positions computes its logits ``h @ W.T + b``: no (B, T, V)
            logits exist; same values and gradient as on the logits. A trained student head: each
            chunk is recomputed in the backward; frozen heads: its gradient is taken in the
            forward (a second backward through the same graph is then refused).

    Returns:
        loss: scalar float32 (float64 for float64 logits) tensor, nats.
        metrics: ``loss``; ``divergence``, ``is_ratio`` (raw, unclipped), ``is_clip_frac``
        (share of tokens whose ratio exceeded ``is_clip``), ``student_tail_mass`` and
        ``teacher_tail_mass`` (probability outside the student's top-k): means over masked
        tokens (0 when none); ``num_tokens``.

    Raises:
        ValueError: logits not both (B, T, V), ids / mask / old log-probs not (B, T), a mask
            that is not 0/1, k < 1, alpha outside [0, 1], is_clip <= 0, temperature <= 0,
            loss_temperature <= 0, denominator <= 0, unknown reduction, chunk_size < 1, a token id outside [0, V).
    """
    if student_logits_BTV.dim() != 3 or student_logits_BTV.shape != teacher_logits_BTV.shape:
        raise ValueError(f"student/teacher logits must both be (B, T, V), got {tuple(student_logits_BTV.shape)}"
                         f" and {tuple(teacher_logits_BTV.shape)}")
    if heads is not None:
        check_head(student_logits_BTV, heads[0], "student")
        check_head(teacher_logits_BTV, heads[1], "teacher")
    B, T = student_logits_BTV.shape[:2]
    V = student_logits_BTV.shape[-1] if heads is None else heads[0].weight_Vd.shape[0]
    for name, tensor in (("token_ids", token_ids_BT), ("old_logprobs", old_logprobs_BT)):
        if tensor is not None and tuple(tensor.shape) != (B, T):
            raise ValueError(f"{name} must be ({B}, {T}), got {tuple(tensor.shape)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if is_clip is not None and is_clip <= 0:
        raise ValueError(f"is_clip must be > 0 (or None), got {is_clip}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if loss_temperature <= 0:
        raise ValueError(f"loss_temperature must be > 0, got {loss_temperature}")
    if denominator is not None and denominator <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    if reduction not in ("token", "trajectory"):
        raise ValueError(f"reduction must be 'token' or 'trajectory', got {reduction!r}")
    check_chunk_size(chunk_size)
    b_idx, t_idx = mask_positions(mask_BT, (B, T))
    ids_N = token_ids_BT[b_idx, t_idx].long()
    if ids_N.numel() and (int(ids_N.min()) < 0 or int(ids_N.max()) >= V):
        raise ValueError(f"token ids must lie in [0, {V}) at the masked positions")
    old_N = (old_logprobs_BT[b_idx, t_idx] if old_logprobs_BT is not None
             else torch.full(ids_N.shape, float("nan"), dtype=torch.float64, device=ids_N.device))
    N = ids_N.numel()
    if N and heads is not None and not heads[0].trained:
        # frozen heads: each chunk's gradient w.r.t. the student's hidden states taken in the forward
        weights_N = reduction_weights(b_idx, B, reduction, upcast_dtype(student_logits_BTV.dtype), denominator)
        student_head, teacher_head = heads[0], heads[1].detached()
        loss, div_N, raw_N, s_tail_N, t_tail_N = ChunkedRowsLoss.apply(
            student_logits_BTV, teacher_logits_BTV.detach(), b_idx, t_idx, weights_N,
            lambda s, t, ids, old: _rows(linear(s, *student_head), linear(t, *teacher_head), ids, old, k, alpha,
                                         add_tail, is_clip, temperature, loss_temperature),
            chunk_size, (torch.is_grad_enabled() and student_logits_BTV.requires_grad, False), (ids_N, old_N))
        return loss, _metrics(loss, div_N, raw_N, s_tail_N, t_tail_N, is_clip, N)
    student_NV = student_logits_BTV[b_idx, t_idx]
    teacher_NV = teacher_logits_BTV.detach()[b_idx, t_idx]
    if N == 0:
        zero = student_NV.sum() * 0.0  # connected to the student's graph: a defined zero gradient
        return zero, {"loss": 0.0, "divergence": 0.0, "is_ratio": 0.0, "is_clip_frac": 0.0,
                      "student_tail_mass": 0.0, "teacher_tail_mass": 0.0, "num_tokens": 0.0}

    def rows_fn(s: Tensor, t: Tensor, ids: Tensor, old: Tensor) -> tuple[Tensor, ...]:
        if heads is not None:
            s, t = linear(s, *heads[0]), linear(t, *heads[1].detached())
        return _rows(s, t, ids, old, k, alpha, add_tail, is_clip, temperature, loss_temperature)

    parts = [run_chunk(rows_fn, *chunk) for chunk in zip(
        student_NV.split(chunk_size), teacher_NV.split(chunk_size), ids_N.split(chunk_size),
        old_N.split(chunk_size))]
    weighted_N, div_N, raw_N, s_tail_N, t_tail_N = (torch.cat([p[i] for p in parts]) for i in range(5))
    if reduction == "token":
        loss = weighted_N.sum() / (denominator if denominator is not None else N)
    else:
        row_sum_B = weighted_N.new_zeros(B).index_add(0, b_idx, weighted_N)
        count_B = torch.bincount(b_idx, minlength=B)
        has_B = count_B > 0
        per_row = row_sum_B[has_B] / count_B[has_B].to(weighted_N.dtype)
        loss = per_row.sum() / (denominator if denominator is not None else int(has_B.sum()))
    return loss, _metrics(loss, div_N, raw_N, s_tail_N, t_tail_N, is_clip, N)


def _metrics(loss: Tensor, div_N: Tensor, raw_N: Tensor, s_tail_N: Tensor, t_tail_N: Tensor, is_clip: float | None,
             N: int) -> dict[str, float]:
    clipped = float((raw_N > is_clip).double().mean()) if is_clip is not None else 0.0
    return {"loss": float(loss.detach()), "divergence": float(div_N.detach().mean()),
            "is_ratio": float(raw_N.mean()), "is_clip_frac": clipped,
            "student_tail_mass": float(s_tail_N.mean()), "teacher_tail_mass": float(t_tail_N.mean()),
            "num_tokens": float(N)}
