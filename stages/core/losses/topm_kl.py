"""The forward KL(T || S) restricted to the teacher's top-M tokens plus one tail bucket, as pure
tensor functions: the teacher side (:func:`teacher_top_m`) is computed once and stored, the
student side (:func:`top_m_forward_kl`) at every step.

The M + 1 buckets: each of the teacher's M most likely tokens at a position, and the tail (every
other token together). With p the teacher's and q the student's probabilities,

    KL_M = sum_{m <= M} p_m (log p_m - log q_m) + p_tail (log p_tail - log q_tail),

where p_tail = 1 - sum_m p_m and q_tail = 1 - sum_m q_m (the student's mass outside the teacher's
top M). How it differs from the full-vocabulary KL: inside the top M it is the same sum; the
tail's V - M tokens are merged into one bucket, so the student is asked to put the right total
mass there but not how to spread it, and KL_M <= KL (the log-sum inequality); with M = V the
tail is empty and KL_M is the full KL. Losses are in nats; only the student logits get a gradient.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _outside_logsumexp(logits_NV: Tensor, ids_NM: Tensor) -> Tensor:
    """log sum_{v not in ids_NM[n]} exp(logits_NV[n, v]): (N,), -inf where nothing is left."""
    return logits_NV.scatter(-1, ids_NM, float("-inf")).logsumexp(-1)


@torch.no_grad()
def teacher_top_m(teacher_logits_NV: Tensor, M: int) -> tuple[Tensor, Tensor, Tensor]:
    """The teacher's top-M log-probs at N positions and the log of its remaining mass.

    Args:
        teacher_logits_NV: (N, V) logits (any float dtype; computed in float32).
        M: tokens kept per position, 1 <= M (more than V keeps V).

    Returns:
        ``(logp_NM float32, ids_NM long, tail_logp_N float32)``: the M largest log-probs in
        descending order, their token ids, and log(1 - their total) (-inf with M >= V).

    Raises:
        ValueError: M < 1.
    """
    if M < 1:
        raise ValueError(f"M must be at least 1, got {M}")
    logits_NV = teacher_logits_NV.float()
    lse_N = logits_NV.logsumexp(-1)
    top_NM, ids_NM = logits_NV.topk(min(M, logits_NV.shape[-1]), dim=-1)
    return top_NM - lse_N.unsqueeze(-1), ids_NM, _outside_logsumexp(logits_NV, ids_NM) - lse_N


def top_m_forward_kl(student_logits_NV: Tensor, logp_NM: Tensor, ids_NM: Tensor, tail_logp_N: Tensor) -> Tensor:
    """KL_M(T || S) (module docstring) per position: (N,) float32 nats.

    Args:
        student_logits_NV: (N, V) student logits (the gradient flows into them).
        logp_NM, ids_NM, tail_logp_N: the teacher's :func:`teacher_top_m` at the same positions.

    Raises:
        ValueError: the teacher's rows do not match the student's positions.
    """
    if not (logp_NM.shape == ids_NM.shape and logp_NM.shape[0] == student_logits_NV.shape[0] == tail_logp_N.shape[0]):
        raise ValueError(f"teacher top-M {tuple(logp_NM.shape)} / {tuple(ids_NM.shape)} / {tuple(tail_logp_N.shape)} "
                         f"does not match the student's {tuple(student_logits_NV.shape)} positions")
    logits_NV = student_logits_NV.float()
    lse_N = logits_NV.logsumexp(-1)
    logq_NM = logits_NV.gather(-1, ids_NM) - lse_N.unsqueeze(-1)
    logq_tail_N = _outside_logsumexp(logits_NV, ids_NM) - lse_N
    top_N = (logp_NM.exp() * (logp_NM - logq_NM)).sum(-1)
    p_tail_N = tail_logp_N.exp()
    tail_N = torch.where(p_tail_N > 0, p_tail_N * (tail_logp_N - logq_tail_N), torch.zeros_like(p_tail_N))
    return top_N + tail_N
