"""LOPD's losses on hidden states: the LM head applied per chunk of supervised positions.

The functions of :mod:`stages.core.losses.lopd` take (B, T, V) logits, which a model's LM head
computes at every position before the loss sees them (and their gradient is as large again).
These take the decoder's last hidden states (B, T, d) and the head's tensors instead: only the
masked positions are gathered, and each chunk of at most ``chunk_size`` of them computes its
logits ``h @ W.T + b`` and its loss terms, so neither the forward nor the backward ever holds
more than one chunk's (chunk_size x V) logits. With frozen heads (a LoRA student, LOPD's teacher)
the reverse KL takes each chunk's gradient w.r.t. both hidden states right in the forward, in
closed form (``_topm_tail_rows`` through :class:`GradInForward`), and every chunk works in the
same three (chunk_size x V) buffers (:class:`Workspace`); otherwise, and for the log-probs, each
chunk runs under activation checkpointing and the backward recomputes its logits once (one more
head matmul per supervised position).
Values and gradients equal the logits functions on ``head(h)`` (tests/test_head_losses.py).
The baselines' losses take the same route through their ``heads=`` argument
(:func:`stages.core.losses.kd.generalized_jsd`, :func:`stages.core.losses.sdpo.sdpo_topk_loss`).
Liger-Kernel's fused linear losses do this on CUDA only (Triton kernels); these run on any device.

Alignment as in :mod:`stages.core.losses.lopd`: ``h[b, t]`` is the hidden state whose logits
score ``token_ids[b, t]`` and ``mask[b, t]`` says whether that position is supervised (callers
shift HF outputs first). Every loss returns ``(loss, metrics)``.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor
from torch.nn.functional import linear
from torch.utils.checkpoint import checkpoint

from stages.core.losses import DEFAULT_CHUNK_SIZE
from stages.core.losses.chunking import (
    ChunkedRowsLoss, Reduction, check_chunk_size, check_token_ids, mask_positions, reduction_weights,
    token_logprob_rows, upcast_dtype,
)
from stages.core.losses.lopd import finite_logprobs, topm_tail_kl_rows


class LMHead(NamedTuple):
    """An output embedding as tensors: ``logits = h @ weight_Vd.T + bias_V``."""

    weight_Vd: Tensor  # (V, d), the model's dtype; requires grad when the head is trained
    bias_V: Tensor | None  # (V,) or None

    @property
    def trained(self) -> bool:
        """Whether a tensor of the head requires grad (a fully fine-tuned model's head)."""
        return any(x is not None and x.requires_grad for x in self)

    def detached(self) -> LMHead:
        """The same head cut from the graph (a fixed teacher's)."""
        return LMHead(self.weight_Vd.detach(), None if self.bias_V is None else self.bias_V.detach())


class Workspace:
    """Three float (c, V) buffers and ``masks`` bool (c, V) buffers, reused by every chunk of one
    loss call: a chunk then allocates no (c, V) tensor, and a CPU allocator that maps large blocks
    fresh (``stages.core.run.resources.map_large_blocks``) zeroes no new pages per chunk."""

    def __init__(self, masks: int = 0) -> None:
        self.masks = masks
        self.buffers: tuple[Tensor, ...] | None = None

    def take(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
        """(rows, vocab) views of the buffers, floats first; (re)allocated when too small or of
        another dtype/device."""
        buf = self.buffers
        if buf is None or buf[0].shape[0] < rows or buf[0].dtype != dtype or buf[0].device != device:
            shape = (rows, vocab)
            buf = self.buffers = (*(torch.empty(shape, dtype=dtype, device=device) for _ in range(3)),
                                  *(torch.empty(shape, dtype=torch.bool, device=device) for _ in range(self.masks)))
        return tuple(b[:rows] for b in buf)


def head_logits_(out_cV: Tensor, h_cd: Tensor, head: LMHead) -> Tensor:
    """``head(h_cd)`` (c, V) written into ``out_cV`` (float32, or float64), no gradient. A head of
    another dtype (half precision) makes its logits in its own dtype first, then they are upcast:
    the values the logits functions get from ``linear(h, w, b)``."""
    (w, b), h = head.detached(), h_cd.detach()
    if w.dtype == out_cV.dtype:
        torch.mm(h, w.t(), out=out_cV)
        return out_cV if b is None else out_cV.add_(b)
    return out_cV.copy_(h @ w.t() if b is None else torch.addmm(b, h, w.t()))


def log_softmax_(logits_cV: Tensor, scratch_cV: Tensor) -> Tensor:
    """log_softmax over the last dimension of (c, V) ``logits_cV``, in place (``scratch_cV``, of
    the same shape, is overwritten)."""
    logits_cV.sub_(logits_cV.amax(dim=-1, keepdim=True))
    torch.exp(logits_cV, out=scratch_cV)
    return logits_cV.sub_(scratch_cV.sum(dim=-1, keepdim=True).log_())


def _tail_logsumexp_(logp_cV: Tensor, top_cM: Tensor, top_logp_cM: Tensor, scratch_cV: Tensor) -> Tensor:
    """(c, 1) logsumexp of the log-probs outside the top-M ids, stable; ``logp_cV`` is left as it
    was (its top-M entries set to -inf for the sum, then written back)."""
    logp_cV.scatter_(1, top_cM, float("-inf"))
    peak_c1 = logp_cV.amax(dim=-1, keepdim=True)
    peak_c1 = torch.where(peak_c1.isfinite(), peak_c1, 0.0)  # an all -inf tail: log 0 = -inf below
    torch.sub(logp_cV, peak_c1, out=scratch_cV).exp_()
    lse_c1 = scratch_cV.sum(dim=-1, keepdim=True).log_().add_(peak_c1)
    logp_cV.scatter_(1, top_cM, top_logp_cM)
    return lse_c1


def _bucket_gradient_(logp_cV: Tensor, top_cM: Tensor, top_logp_cM: Tensor, coef_cB: Tensor, head: LMHead) -> Tensor:
    """d/dh (c, d) from d/dlogits = p(v) * coef[bucket of v] (c, V), made in ``logp_cV`` (which
    it overwrites): the tail coefficient everywhere, the top-M ones written over it."""
    grad_cV = logp_cV.exp_().mul_(coef_cB[:, -1:])
    grad_cV.scatter_(1, top_cM, top_logp_cM.exp() * coef_cB[:, :-1])
    w = head.weight_Vd.detach()
    return grad_cV.to(w.dtype) @ w


def _teacher_gradient_(logp_cV: Tensor, top_cM: Tensor, top_logp_cM: Tensor, log_tail_c1: Tensor, e_cB: Tensor,
                       scratch_cV: Tensor, head: LMHead) -> Tensor:
    """d KL / dh (c, d) of the teacher: per token v, p_T(v) sum_b e_b - e_b(v) p_T(v) / p_b(v)
    (a top-M token is its own bucket: p_T(v) / p_b(v) = 1; a tail token's ratio is taken as
    exp(log p_T(v) - log p_tail) <= 1, which never overflows where the tail's mass underflows),
    then through the head. ``logp_cV`` and ``scratch_cV`` are overwritten."""
    total_c1 = e_cB.sum(-1, keepdim=True)
    shift_c1 = torch.where(log_tail_c1 > float("-inf"), log_tail_c1, 0.0)  # e_tail is 0 where it is -inf
    ratio_cV = torch.sub(logp_cV, shift_c1, out=scratch_cV).exp_().mul_(e_cB[:, -1:])
    grad_cV = logp_cV.exp_().mul_(total_c1).sub_(ratio_cV)
    grad_cV.scatter_(1, top_cM, top_logp_cM.exp() * total_c1 - e_cB[:, :-1])
    w = head.weight_Vd.detach()
    return grad_cV.to(w.dtype) @ w


def _topm_tail_rows(student_cd: Tensor, teacher_cd: Tensor, student_head: LMHead, teacher_head: LMHead, M: int,
                    workspace: Workspace, need_grad: tuple[bool, bool]) -> tuple[Tensor, ...]:
    """Eq. 9-10 of the LOPD paper per row of one chunk of hidden states (c, d) under frozen heads,
    with M < V, and its gradients in closed form.

    Returns (kl_c, teacher_tail_c, student_tail_c, grad_student_cd or None, grad_teacher_cd or
    None); the values equal ``topm_tail_kl_rows`` of :mod:`stages.core.losses.lopd` on the heads'
    logits (the -inf handling of ``kl_rows`` included). With q, p the student's and teacher's
    (M + 1) bucket probabilities, fq, fp their log-probs with -inf raised to log(tiny)
    (:func:`~stages.core.losses.lopd.finite_logprobs`), b(v) the bucket of token v and
    KL = sum_b exp(fq_b) (fq_b - fp_b):

    - student logits: d KL / dz_v = p_S(v) (a_b(v) - sum_b q_b a_b), a_b = fq_b - fp_b + 1
      (a -inf bucket gets no gradient from autograd; its q_b and every p_S(v) in it are 0);
    - teacher logits: d KL / dt_v = p_T(v) sum_b e_b - e_b(v) p_T(v) / p_b(v), e_b = exp(fq_b)
      where log p_b is finite, else 0 (:func:`_teacher_gradient_`);

    each then (c, V) @ (V, d) through its head. Every (c, V) tensor lives in ``workspace``.
    """
    dtype = upcast_dtype(student_cd.dtype)
    s_cV, t_cV, x_cV = workspace.take(student_cd.shape[0], student_head.weight_Vd.shape[0], dtype, student_cd.device)
    for out, h_cd, head in ((s_cV, student_cd, student_head), (t_cV, teacher_cd, teacher_head)):
        log_softmax_(head_logits_(out, h_cd, head), x_cV)
    top_cM = t_cV.topk(M, dim=-1).indices
    s_top_cM, t_top_cM = s_cV.gather(1, top_cM), t_cV.gather(1, top_cM)
    log_q_cB = torch.cat([s_top_cM, _tail_logsumexp_(s_cV, top_cM, s_top_cM, x_cV)], dim=1)
    log_p_cB = torch.cat([t_top_cM, _tail_logsumexp_(t_cV, top_cM, t_top_cM, x_cV)], dim=1)
    fq_cB, fp_cB = finite_logprobs(log_q_cB), finite_logprobs(log_p_cB)
    kl_c = (fq_cB.exp() * (fq_cB - fp_cB)).sum(-1)
    grads: list[Tensor | None] = [None, None]
    if need_grad[0]:
        a_cB = fq_cB - fp_cB + 1.0
        coef_cB = a_cB - (log_q_cB.exp() * a_cB).sum(-1, keepdim=True)
        grads[0] = _bucket_gradient_(s_cV, top_cM, s_top_cM, coef_cB, student_head)
    if need_grad[1]:
        e_cB = torch.where(log_p_cB > float("-inf"), fq_cB.exp(), 0.0)
        grads[1] = _teacher_gradient_(t_cV, top_cM, t_top_cM, log_p_cB[:, -1:], e_cB, x_cV, teacher_head)
    return kl_c, log_p_cB[:, -1].exp(), log_q_cB[:, -1].exp(), *grads


class GradInForward(torch.autograd.Function):
    """One chunk's loss of two hidden states whose gradients ``rows`` computes in closed form in
    the forward: ``rows(student_cd, teacher_cd, need_grad)``, with ``need_grad`` (bool, bool) the
    inputs that want one, returns (values_c, *diagnostics_c, grad_student_cd or None,
    grad_teacher_cd or None). The backward only scales those (c, d) gradients by the values'
    incoming gradient; the diagnostics get none."""

    @staticmethod
    def forward(ctx, student_cd: Tensor, teacher_cd: Tensor,  # type: ignore[override]
                rows: Callable[..., tuple[Tensor | None, ...]]) -> tuple[Tensor, ...]:
        values_c, *diagnostics, grad_s, grad_t = rows(student_cd, teacher_cd, ctx.needs_input_grad[:2])
        ctx.grads = (grad_s, grad_t)
        ctx.mark_non_differentiable(*diagnostics)
        return (values_c, *diagnostics)

    @staticmethod
    def backward(ctx, grad_c: Tensor, *_: Tensor):  # type: ignore[override]
        grads, ctx.grads = ctx.grads, None
        return (*(None if g is None else grad_c.unsqueeze(-1) * g for g in grads), None)


def check_head(h_BTd: Tensor, head: LMHead, name: str) -> None:
    """ValueError unless ``h_BTd`` is (B, T, d) and ``head`` a (V, d) weight with a (V,) bias or none."""
    if h_BTd.dim() != 3:
        raise ValueError(f"{name} hidden states must be (B, T, d), got {tuple(h_BTd.shape)}")
    w = head.weight_Vd
    if w.dim() != 2 or w.shape[1] != h_BTd.shape[-1]:
        raise ValueError(f"{name} head weight must be (V, d={h_BTd.shape[-1]}), got {tuple(w.shape)}")
    if head.bias_V is not None and tuple(head.bias_V.shape) != (w.shape[0],):
        raise ValueError(f"{name} head bias must be (V={w.shape[0]},), got {tuple(head.bias_V.shape)}")


def _chunks(fn: Callable[..., tuple[Tensor, ...]], chunk_size: int, rows: tuple[Tensor, ...],
            shared: tuple[Tensor | None, ...]) -> list[tuple[Tensor, ...]]:
    """``fn(*row_chunk, *shared)`` per chunk of ``chunk_size`` rows, under activation checkpointing
    when a gradient is needed (the chunk's logits are recomputed in the backward, never kept)."""
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*rows, *shared))
    out = []
    for parts in zip(*(r.split(chunk_size) for r in rows)):
        out.append(checkpoint(fn, *parts, *shared, use_reentrant=False) if grad else fn(*parts, *shared))
    return out


def head_topm_tail_reverse_kl(
    student_h_BTd: Tensor,
    teacher_h_BTd: Tensor,
    mask_BT: Tensor,
    student_head: LMHead,
    teacher_head: LMHead,
    M: int = 20,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    reduction: Reduction = "trajectory",
) -> tuple[Tensor, dict[str, float]]:
    """Eq. 9-10 of the LOPD paper (top-M + tail reverse KL) from hidden states and LM heads.

    Equal to :func:`stages.core.losses.lopd.topm_tail_reverse_kl` on the logits
    ``student_head(student_h)`` and ``teacher_head(teacher_h)``, in value, metrics and gradient,
    without computing logits at unsupervised positions or holding more than one chunk of them.
    Gradient reaches both hidden states and any head tensor that requires grad (a fully
    fine-tuned student's head; LOPD's teacher head is frozen, its hidden states carry the
    composer's gradient).

    Args:
        student_h_BTd, teacher_h_BTd: float hidden states (B, T, d), aligned with ``mask_BT``.
        mask_BT: bool or 0/1 float (B, T), 1 on supervised action tokens.
        student_head, teacher_head: :class:`LMHead` of each model, weights (V, d) of one V.
        M: teacher top-M support size (paper default 20), >= 1.
        chunk_size: supervised positions per chunk, >= 1.
        reduction: "trajectory" (Eq. 10) or "token".

    Returns:
        loss: scalar float32 (float64 for float64 inputs) tensor, in nats.
        metrics: reverse_kl, teacher_tail_mass, student_tail_mass, num_tokens (as the logits function).

    Raises:
        ValueError: hidden states not (B, T, d) of one shape, head shapes that do not fit, wrong
            mask shape or values, M < 1, chunk_size < 1, unknown reduction.
    """
    check_head(student_h_BTd, student_head, "student")
    check_head(teacher_h_BTd, teacher_head, "teacher")
    if student_h_BTd.shape != teacher_h_BTd.shape or student_head.weight_Vd.shape[0] != teacher_head.weight_Vd.shape[0]:
        raise ValueError(f"student/teacher shapes differ: hidden {tuple(student_h_BTd.shape)} vs "
                         f"{tuple(teacher_h_BTd.shape)}, vocabulary {student_head.weight_Vd.shape[0]} vs "
                         f"{teacher_head.weight_Vd.shape[0]}")
    if M < 1:
        raise ValueError(f"M must be >= 1, got {M}")
    check_chunk_size(chunk_size)
    B, T, _ = student_h_BTd.shape
    b_idx, t_idx = mask_positions(mask_BT, (B, T))
    dtype = torch.float64 if student_h_BTd.dtype == torch.float64 else torch.float32
    weights_N = reduction_weights(b_idx, B, reduction, dtype)

    def rows_fn(s_cd: Tensor, t_cd: Tensor, ws: Tensor, bs: Tensor | None, wt: Tensor, bt: Tensor | None):
        return topm_tail_kl_rows(linear(s_cd, ws, bs), linear(t_cd, wt, bt), M)

    num_tokens = b_idx.numel()
    if not num_tokens:  # 0 with a defined, all-zero gradient
        zero = (student_h_BTd.sum() + teacher_h_BTd.sum()).to(dtype) * 0.0
        return zero, {"reverse_kl": 0.0, "teacher_tail_mass": 0.0, "student_tail_mass": 0.0, "num_tokens": 0.0}
    if student_head.trained or teacher_head.trained:
        parts = _chunks(rows_fn, chunk_size, (student_h_BTd[b_idx, t_idx], teacher_h_BTd[b_idx, t_idx]),
                        (*student_head, *teacher_head))
        kl_N, t_tail_N, s_tail_N = (torch.cat(p) for p in zip(*parts))
        loss = (kl_N * weights_N).sum()
    else:  # frozen heads: each chunk's gradient w.r.t. its hidden states taken in the forward, no recompute
        needs_grad = (torch.is_grad_enabled() and student_h_BTd.requires_grad,
                      torch.is_grad_enabled() and teacher_h_BTd.requires_grad)
        if M < student_head.weight_Vd.shape[0]:  # in closed form, every chunk in one workspace
            workspace = Workspace()

            def closed_form(s_cd: Tensor, t_cd: Tensor, need_grad: tuple[bool, bool]) -> tuple[Tensor | None, ...]:
                return _topm_tail_rows(s_cd, t_cd, student_head, teacher_head, M, workspace, need_grad)
            chunk_rows = lambda s_cd, t_cd: GradInForward.apply(s_cd, t_cd, closed_form)  # noqa: E731
        else:  # no tail bucket: the full reverse KL through autograd
            chunk_rows = lambda s_cd, t_cd: rows_fn(s_cd, t_cd, *student_head, *teacher_head)  # noqa: E731
        loss, t_tail_N, s_tail_N = ChunkedRowsLoss.apply(
            student_h_BTd, teacher_h_BTd, b_idx, t_idx, weights_N, chunk_rows, chunk_size, needs_grad)
    return loss, {"reverse_kl": float(loss.detach()), "teacher_tail_mass": float(t_tail_N.mean()),
                  "student_tail_mass": float(s_tail_N.mean()), "num_tokens": float(num_tokens)}


def head_token_logprobs(
    h_BTd: Tensor, head: LMHead, token_ids_BT: Tensor, mask_BT: Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> Tensor:
    """log_softmax(head(h) / temperature)[id] at the masked positions, 0 elsewhere: the gather
    behind delta in Eq. 11 of the LOPD paper and behind the policy-gradient ratio, with the head
    applied only where ``mask_BT`` is set.

    Equal at masked positions to :func:`stages.core.losses.lopd.sampled_token_logprobs` (and, with
    a temperature, :func:`stages.core.losses.pg.token_logprobs`) on ``head(h)``; differentiable
    w.r.t. ``h_BTd`` and the head tensors; one chunk of (chunk_size x V) logits at a time
    (recomputed in the backward).

    Args:
        h_BTd: float hidden states (B, T, d), aligned with ``token_ids_BT``.
        head: :class:`LMHead`, weight (V, d).
        token_ids_BT: int64 ids (B, T); in [0, V) where ``mask_BT`` is set (others are ignored).
        mask_BT: bool or 0/1 float (B, T).
        chunk_size: positions per chunk, >= 1.
        temperature: > 0, divides the logits (the sampling temperature of a policy's log-prob).

    Returns:
        logp_BT: (B, T) log-probabilities in nats, float32 (float64 for float64 inputs); 0 where
        the mask is 0.

    Raises:
        ValueError: shapes that do not fit, a non-0/1 mask, an id outside [0, V) at a masked
            position, chunk_size < 1, temperature <= 0.
    """
    check_head(h_BTd, head, "")
    check_chunk_size(chunk_size)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if tuple(token_ids_BT.shape) != tuple(h_BTd.shape[:2]):
        raise ValueError(f"expected ids (B, T) = {tuple(h_BTd.shape[:2])}, got {tuple(token_ids_BT.shape)}")
    b_idx, t_idx = mask_positions(mask_BT, tuple(token_ids_BT.shape))
    ids_N = token_ids_BT[b_idx, t_idx]
    check_token_ids(ids_N, head.weight_Vd.shape[0])
    dtype = torch.float64 if h_BTd.dtype == torch.float64 else torch.float32

    def rows_fn(h_cd: Tensor, ids_c: Tensor, w: Tensor, b: Tensor | None) -> tuple[Tensor]:
        logits_cV = linear(h_cd, w, b)
        return (token_logprob_rows(logits_cV / temperature if temperature != 1.0 else logits_cV, ids_c),)

    parts = _chunks(rows_fn, chunk_size, (h_BTd[b_idx, t_idx], ids_N), tuple(head))
    logp_N = torch.cat([p[0] for p in parts]) if parts else h_BTd.new_zeros(0, dtype=dtype)
    return h_BTd.new_zeros(token_ids_BT.shape, dtype=dtype).index_put((b_idx, t_idx), logp_N)
