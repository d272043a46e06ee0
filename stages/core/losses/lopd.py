"""Loss functions of LOPD (Eq. 9-13 of the LOPD paper), as pure tensor functions.

Alignment convention: every function here takes ALREADY-ALIGNED tensors. ``logits[b, t]`` is
the distribution that scores ``token_ids[b, t]`` and ``mask[b, t]`` says whether that position
is supervised. With a Hugging Face causal LM, whose logits at position t predict token t+1, the
caller shifts first: ``logits[:, :-1]``, ``input_ids[:, 1:]``, ``mask[:, 1:]``.

Shapes: B = batch (one row per trajectory), T = positions, V = vocabulary, M = teacher top-M.
Masks are bool or 0/1 float, 1 on generated action tokens (the paper's omega_{t,n}).

Reductions: ``reduction="trajectory"`` (default) is the paper's (Eq. 10, 12: E_tau[ sum_n w_n x_n /
sum_n w_n ]): masked mean within each row, then the mean over rows with a masked token;
``reduction="token"`` pools all masked tokens of the batch. A batch with no masked token gives a
loss of 0 with an all-zero gradient, never NaN.

Memory: full-vocabulary work runs on chunks of at most ``chunk_size`` positions (one chunk's
[chunk_size x V] log-softmax alive at a time). :func:`topm_tail_reverse_kl` computes each chunk's
gradient right after its forward (:class:`~stages.core.losses.chunking.ChunkedRowsLoss`) into one
gradient buffer per input (benchmarks/bench_loss_memory.py); the other functions checkpoint each
chunk. Half-precision logits are upcast to float32 inside each chunk; float64 stays float64. Every
loss returns ``(loss, metrics)``: a scalar tensor and a dict of plain floats.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from stages.core.losses import DEFAULT_CHUNK_SIZE
from stages.core.losses.chunking import (
    ChunkedRowsLoss, Reduction, check_chunk_size, check_token_ids, mask_positions, reduction_weights, run_chunk,
    token_logprob_rows, upcast,
)


def _reduce(values_N: Tensor, rows_N: Tensor, num_rows: int, reduction: Reduction) -> Tensor:
    """Masked mean of per-token values: per trajectory then over trajectories, or pooled."""
    return (values_N * reduction_weights(rows_N, num_rows, reduction, values_N.dtype)).sum()


def kl_rows(p_logp_NB: Tensor, q_logp_NB: Tensor) -> Tensor:
    """KL(p || q) = sum_b p_b (log p_b - log q_b) per row (N,), in nats, finite for -inf log-probs.

    Exact wherever the log-probabilities are finite, however small (a log-prob of -191 counts as
    -191 although its probability underflows float32). Only -inf entries (a masked vocabulary)
    are raised to log of the dtype's smallest normal number (about -87.3 in float32, -708 in
    float64, :func:`finite_logprobs`): that keeps 0 log 0 = 0 (exp(-inf) * (-inf) would be NaN)
    and gives a finite, large term where q is -inf but p has mass (exactly +inf).

    Args:
        p_logp_NB, q_logp_NB: float log-probabilities of the same shape (..., B), normalised
            over the last dimension.

    Returns:
        (...,) tensor of the input dtype; differentiable w.r.t. both (zero gradient at -inf entries).
    """
    p_NB, q_NB = finite_logprobs(p_logp_NB), finite_logprobs(q_logp_NB)
    return (p_NB.exp() * (p_NB - q_NB)).sum(-1)


def finite_logprobs(logp: Tensor) -> Tensor:
    """``logp`` with its -inf entries raised to log(smallest normal number of its dtype).

    -inf log-probabilities (masked vocabulary) become finite, so products and mixtures built from
    them (e.g. JSD's log m = logaddexp(...)) have finite values and gradients; the gradient at a
    raised entry is 0. Finite entries are unchanged, even below that value.
    """
    return logp.masked_fill(logp == float("-inf"), math.log(torch.finfo(logp.dtype).tiny))


def tail_logsumexp(logp_NV: Tensor, ids_NK: Tensor) -> Tensor:
    """(N, 1) log of the probability mass outside ``ids_NK``: the logsumexp of the other log-probs.

    A row whose other entries are all -inf (a masked vocabulary) gives -inf with a zero gradient
    (torch's logsumexp would give NaN gradients there: softmax of -inf only).

    Args:
        logp_NV: float (N, V) log-probabilities.
        ids_NK: int64 (N, K) ids inside the support, distinct within a row, K < V.
    """
    rest_NV = logp_NV.scatter(-1, ids_NK, float("-inf"))
    empty_N1 = (rest_NV == float("-inf")).all(-1, keepdim=True)
    lse_N1 = rest_NV.masked_fill(empty_N1, 0.0).logsumexp(-1, keepdim=True)
    return lse_N1.masked_fill(empty_N1, float("-inf"))


def topm_tail_kl_rows(
    student_NV: Tensor, teacher_NV: Tensor, M: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row reverse KL over the (M+1)-bucket distributions, plus both tail masses.

    Args:
        student_NV, teacher_NV: float logits (N, V), one row per masked position.
        M: the teacher's top-M tokens are the buckets; the rest is the tail bucket.

    Returns:
        kl_N (N,) reverse KL in nats (differentiable), teacher and student tail masses (N,) (detached).
    """
    s_logp_NV = torch.log_softmax(upcast(student_NV), dim=-1)
    t_logp_NV = torch.log_softmax(upcast(teacher_NV), dim=-1)
    vocab_size = t_logp_NV.shape[-1]
    top_ids_NM = t_logp_NV.detach().topk(min(M, vocab_size), dim=-1).indices
    s_buckets = s_logp_NV.gather(-1, top_ids_NM)  # (N, M)
    t_buckets = t_logp_NV.gather(-1, top_ids_NM)  # (N, M)
    if M < vocab_size:
        # log of the tail mass = logsumexp of the log-probs outside the top-M (stable in log space)
        s_tail_N1 = tail_logsumexp(s_logp_NV, top_ids_NM)
        t_tail_N1 = tail_logsumexp(t_logp_NV, top_ids_NM)
        s_buckets = torch.cat([s_buckets, s_tail_N1], dim=-1)  # (N, M+1)
        t_buckets = torch.cat([t_buckets, t_tail_N1], dim=-1)  # (N, M+1)
        s_tail_mass = s_tail_N1.squeeze(-1).detach().exp()
        t_tail_mass = t_tail_N1.squeeze(-1).detach().exp()
    else:  # the top-M covers the vocabulary: no tail bucket, plain full reverse KL
        s_tail_mass = s_buckets.new_zeros(s_buckets.shape[0])
        t_tail_mass = s_tail_mass
    kl_N = kl_rows(s_buckets, t_buckets)
    return kl_N, t_tail_mass, s_tail_mass


def topm_tail_reverse_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    M: int = 20,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    reduction: Reduction = "trajectory",
) -> tuple[Tensor, dict[str, float]]:
    """Reverse KL between student and teacher on the teacher's top-M tokens plus a tail bucket.

    Eq. 9-10 of the LOPD paper. At each masked position, V^M = the M token ids with the highest
    teacher probability; both distributions are collapsed onto M+1 buckets (the probabilities of
    those ids, and the tail mass 1 - sum of them, computed in log space as the logsumexp of the
    log-probs outside V^M); the loss is KL(p~S || p~T) = sum_b p~S(b) (log p~S(b) - log p~T(b)),
    averaged over masked positions per ``reduction`` (module docstring; default = Eq. 10).
    With ``M >= V`` there is no tail bucket and this is the full-vocabulary reverse KL.

    Gradient flows into BOTH ``student_logits`` and ``teacher_logits``: in LOPD the teacher
    weights are frozen but its logits depend on the composer's latents, so the teacher-side
    gradient is what trains the composer. Pass ``teacher_logits.detach()`` for a fixed teacher.
    The top-M selection itself is piecewise constant (no gradient through the ids).

    Args:
        student_logits: student_logits_BTV, float (any float dtype), aligned with ``mask``.
        teacher_logits: teacher_logits_BTV, same shape as ``student_logits``.
        mask: mask_BT, bool or 0/1 float, 1 on supervised action tokens.
        M: size of the teacher top-M support (paper default 20), >= 1.
        chunk_size: masked positions per chunk of full-vocabulary work, >= 1.
        reduction: "trajectory" (Eq. 10: per-row masked mean, then mean over rows) or "token".

    Returns:
        loss: scalar float32 (float64 for float64 inputs) tensor, in nats.
        metrics: reverse_kl (loss value), teacher_tail_mass and student_tail_mass (means over
        masked tokens, probabilities), num_tokens (number of masked positions).

    Raises:
        ValueError: mismatched or non-3-D logits, wrong mask shape or non-0/1 mask values,
        M < 1, chunk_size < 1, unknown reduction.
    """
    if student_logits.dim() != 3 or student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student/teacher logits must both be (B, T, V), got {tuple(student_logits.shape)}"
            f" and {tuple(teacher_logits.shape)}"
        )
    if M < 1:
        raise ValueError(f"M must be >= 1, got {M}")
    check_chunk_size(chunk_size)
    B, T, _ = student_logits.shape
    b_idx, t_idx = mask_positions(mask, (B, T))
    weights_N = reduction_weights(b_idx, B, reduction,
                                  torch.float64 if student_logits.dtype == torch.float64 else torch.float32)
    needs_grad = (torch.is_grad_enabled() and student_logits.requires_grad,
                  torch.is_grad_enabled() and teacher_logits.requires_grad)

    def rows_fn(s: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return topm_tail_kl_rows(s, t, M)

    loss, *tails = ChunkedRowsLoss.apply(student_logits, teacher_logits, b_idx, t_idx, weights_N,
                                         rows_fn, chunk_size, needs_grad)
    num_tokens = b_idx.numel()
    t_tail_N, s_tail_N = tails if num_tokens else (None, None)  # (N,) each
    metrics = {
        "reverse_kl": float(loss.detach()),
        "teacher_tail_mass": float(t_tail_N.mean()) if num_tokens else 0.0,
        "student_tail_mass": float(s_tail_N.mean()) if num_tokens else 0.0,
        "num_tokens": float(num_tokens),
    }
    return loss, metrics


def sampled_token_logprobs(
    logits_BTV: Tensor, token_ids_BT: Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Tensor:
    """Log-probability of each given token under its aligned logits: log_softmax(logits)[id].

    The gather behind delta in Eq. 11 of the LOPD paper (teacher and student log-probs of the
    sampled action token) and behind the cold-start NLL. Computed as logit[id] - logsumexp over
    V, on chunks of at most ``chunk_size`` positions (B * ceil(chunk_size / B) rows per chunk
    along T), so no [B*T x V] log-softmax is ever materialised. Differentiable w.r.t. logits.

    Args:
        logits_BTV: float logits (B, T, V), aligned with ``token_ids_BT`` (no shift here).
        token_ids_BT: int64 token ids (B, T), every entry in [0, V).
        chunk_size: target positions per chunk, >= 1.

    Returns:
        logp_BT: (B, T) log-probabilities in nats, float32 (float64 for float64 logits).

    Raises:
        ValueError: shape mismatch, token id outside [0, V), chunk_size < 1.
    """
    check_chunk_size(chunk_size)
    if logits_BTV.dim() != 3 or tuple(token_ids_BT.shape) != tuple(logits_BTV.shape[:2]):
        raise ValueError(
            f"expected logits (B, T, V) and ids (B, T), got {tuple(logits_BTV.shape)} and"
            f" {tuple(token_ids_BT.shape)}"
        )
    check_token_ids(token_ids_BT, logits_BTV.shape[-1])
    steps = max(1, -(-chunk_size // max(logits_BTV.shape[0], 1)))  # time steps per chunk
    parts = [
        run_chunk(token_logprob_rows, lg, ids)
        for lg, ids in zip(logits_BTV.split(steps, dim=1), token_ids_BT.split(steps, dim=1))
    ]
    return torch.cat(parts, dim=1)


def masked_nll(
    logits_BTV: Tensor,
    token_ids_BT: Tensor,
    mask_BT: Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, dict[str, float]]:
    """Token-weighted mean negative log-likelihood over masked positions (composer cold start).

    The cold-start objective of the LOPD paper (Section 3.2): NLL of successful action tokens
    under the latent-conditioned teacher. Only masked rows are gathered, then processed in
    chunks of ``chunk_size`` positions; ids at unmasked positions are ignored (may be -100).
    Pooled over all masked tokens of the batch: sum of -log p / number of masked tokens.

    Args:
        logits_BTV: float logits (B, T, V), aligned with ``token_ids_BT`` (no shift here).
        token_ids_BT: int64 target ids (B, T); in [0, V) wherever ``mask_BT`` is 1.
        mask_BT: bool or 0/1 float (B, T), 1 on supervised tokens.
        chunk_size: masked positions per chunk, >= 1.

    Returns:
        loss: scalar tensor in nats (0 with zero gradient when nothing is masked).
        metrics: nll (loss value), num_tokens.

    Raises:
        ValueError: shape mismatch, non-0/1 mask, target id outside [0, V), chunk_size < 1.
    """
    check_chunk_size(chunk_size)
    if logits_BTV.dim() != 3 or tuple(token_ids_BT.shape) != tuple(logits_BTV.shape[:2]):
        raise ValueError(
            f"expected logits (B, T, V) and ids (B, T), got {tuple(logits_BTV.shape)} and"
            f" {tuple(token_ids_BT.shape)}"
        )
    b_idx, t_idx = mask_positions(mask_BT, tuple(token_ids_BT.shape))
    ids_N = token_ids_BT[b_idx, t_idx]
    check_token_ids(ids_N, logits_BTV.shape[-1])
    rows_NV = logits_BTV[b_idx, t_idx]
    logp_N = torch.cat(
        [
            run_chunk(token_logprob_rows, lg, ids)
            for lg, ids in zip(rows_NV.split(chunk_size), ids_N.split(chunk_size))
        ]
    )
    loss = -logp_N.sum() / max(logp_N.numel(), 1)
    return loss, {"nll": float(loss.detach()), "num_tokens": float(logp_N.numel())}


def privileged_margin(
    teacher_logp_BT: Tensor,
    student_logp_BT: Tensor,
    mask_BT: Tensor,
    rewards_B: Tensor,
    margin: float,
    beta: float,
    reduction: Reduction = "trajectory",
) -> tuple[Tensor, dict[str, float]]:
    """Privileged-margin penalty beta * (m - Delta) of the LOPD objective.

    Eq. 11-13 of the LOPD paper. Per-token privilege delta = log p_T(a) - sg[log p_S(a)] at the
    sampled token (the student path is detached, so no gradient reaches the student); advantage
    A(tau) = 2 r(tau) - 1 per trajectory; Delta = E_tau[ sum_n w_n A delta_n / sum_n w_n ], i.e.
    with the default ``reduction="trajectory"`` the masked mean of A*delta within each row, then
    the mean over rows that hold a masked token (``"token"`` pools all masked tokens instead).
    The returned term is beta * (m - Delta); beta is the dual variable, a plain float held
    constant here and updated outside by :func:`dual_update` from ``metrics["Delta"]``.

    Args:
        teacher_logp_BT: float (B, T) teacher log-probs of the sampled tokens (differentiable).
        student_logp_BT: float (B, T) student log-probs of the same tokens (detached here).
        mask_BT: bool or 0/1 float (B, T), 1 on supervised action tokens.
        rewards_B: float (B,) outcome rewards in [0, 1], one per trajectory (row).
        margin: minimum privilege level m (paper default 0.05), nats per token.
        beta: current dual variable, >= 0.
        reduction: "trajectory" (Eq. 12) or "token".

    Returns:
        loss_term: scalar tensor beta * (m - Delta).
        metrics: Delta (nats), delta_mean (masked mean of delta, without A, pooled over tokens),
        margin_term (loss_term value).

    Raises:
        ValueError: shape mismatch, rewards outside [0, 1], beta < 0, non-0/1 mask,
        unknown reduction.
    """
    if teacher_logp_BT.dim() != 2 or teacher_logp_BT.shape != student_logp_BT.shape:
        raise ValueError(
            f"teacher/student log-probs must both be (B, T), got {tuple(teacher_logp_BT.shape)}"
            f" and {tuple(student_logp_BT.shape)}"
        )
    B = teacher_logp_BT.shape[0]
    if tuple(rewards_B.shape) != (B,):
        raise ValueError(f"rewards must have shape ({B},), got {tuple(rewards_B.shape)}")
    if bool(((rewards_B < 0) | (rewards_B > 1)).any()):
        raise ValueError("rewards must lie in [0, 1] so that A = 2r - 1 lies in [-1, 1]")
    if beta < 0:
        raise ValueError(f"beta (dual variable) must be >= 0, got {beta}")
    b_idx, t_idx = mask_positions(mask_BT, tuple(teacher_logp_BT.shape))
    delta_N = teacher_logp_BT[b_idx, t_idx] - student_logp_BT.detach()[b_idx, t_idx]
    advantage_B = 2.0 * rewards_B.to(delta_N.dtype) - 1.0
    Delta = _reduce(advantage_B[b_idx] * delta_N, b_idx, B, reduction)
    loss_term = beta * (margin - Delta)
    metrics = {
        "Delta": float(Delta.detach()),
        "delta_mean": float(delta_N.detach().mean()) if delta_N.numel() else 0.0,
        "margin_term": float(loss_term.detach()),
    }
    return loss_term, metrics


def dual_update(beta: float, margin: float, Delta: float, eta_beta: float = 0.5) -> float:
    """Projected dual ascent step beta <- max(0, beta + eta_beta * (m - Delta)); returns it (>= 0).

    Eq. 13 of the LOPD paper (eta_beta default 0.5, the official code's value): beta grows while
    the privilege Delta is below the margin m and shrinks (never below 0) once it exceeds it.

    Args:
        beta: current dual variable, >= 0.
        margin: minimum privilege level m, nats per token.
        Delta: measured privilege (``metrics["Delta"]`` of :func:`privileged_margin`).
        eta_beta: dual step size, >= 0.

    Raises:
        ValueError: beta < 0 or eta_beta < 0.
    """
    if beta < 0 or eta_beta < 0:
        raise ValueError(f"beta and eta_beta must be >= 0, got {beta} and {eta_beta}")
    return max(0.0, float(beta) + float(eta_beta) * (float(margin) - float(Delta)))


def latent_anchor(
    c_phi: Tensor,
    c_phi0: Tensor,
    lam: float = 0.2,
    reduction: Literal["sum", "token_mean"] = "sum",
) -> tuple[Tensor, dict[str, float]]:
    """Latent anchor lambda * ||c_phi - sg[c_phi0]||_2^2 of the LOPD objective.

    Eq. 13 of the LOPD paper (lambda default 0.2, the official code's value). The paper writes
    the squared L2 norm of the whole latent context c_phi in R^{JK x d}; with the default
    ``reduction="sum"`` that is the sum of squares over all J*K*d entries of each example,
    averaged over the batch. ``"token_mean"`` divides it by J*K (the mean over latent tokens of
    each token's squared norm), which keeps the scale independent of J and K. The target is
    detached: the gradient reaches ``c_phi`` only.

    Args:
        c_phi: float latents (B, J*K, d) from the current composer.
        c_phi0: float latents (B, J*K, d) from the cold-start composer phi_0 (same inputs).
        lam: anchor weight lambda, >= 0.
        reduction: "sum" (paper's squared norm) or "token_mean".

    Returns:
        loss_term: scalar tensor lambda * anchor.
        metrics: anchor (unweighted squared distance), anchor_term (loss_term value).

    Raises:
        ValueError: shape mismatch or non-3-D latents, lam < 0, unknown reduction.
    """
    if c_phi.dim() != 3 or c_phi.shape != c_phi0.shape:
        raise ValueError(
            f"c_phi and c_phi0 must both be (B, J*K, d), got {tuple(c_phi.shape)} and"
            f" {tuple(c_phi0.shape)}"
        )
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    if reduction not in ("sum", "token_mean"):
        raise ValueError(f"reduction must be 'sum' or 'token_mean', got {reduction!r}")
    sq_B = (upcast(c_phi) - upcast(c_phi0).detach()).pow(2).sum(dim=(1, 2))
    if reduction == "token_mean":
        sq_B = sq_B / c_phi.shape[1]
    anchor = sq_B.mean()
    loss_term = lam * anchor
    return loss_term, {"anchor": float(anchor.detach()), "anchor_term": float(loss_term.detach())}
