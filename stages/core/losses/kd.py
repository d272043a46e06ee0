"""Full-vocabulary distillation losses of the text-context baselines, as pure tensor functions.

- :func:`forward_kl`: KL(T || S) = sum_v p_T(v) (log p_T(v) - log p_S(v)) at every supervised
  position, over the WHOLE vocabulary (B.1 of the LOPD paper: SDFT and OPSD; SDFT's
  official code with alpha=0).
- :func:`generalized_jsd`: the generalised Jensen-Shannon divergence of OPSD's code
  (``generalized_jsd_loss``): with the mixture m = beta * p_T + (1 - beta) * p_S,
  ``beta * KL(T || m) + (1 - beta) * KL(S || m)``; by convention (as upstream) ``beta = 0`` is
  the forward KL(T || S) and ``beta = 1`` the reverse KL(S || T) (the interior formula tends to
  0 at both ends, so the endpoints are special cases, not limits).

Conventions shared with :mod:`stages.core.losses.lopd`: tensors are ALREADY ALIGNED (``logits[b, t]``
scores the token at ``[b, t]``; a causal LM's caller shifts first), masks are bool or 0/1 and
1 on the student's sampled action tokens, every function returns ``(loss, metrics)`` with a
scalar tensor and plain floats, and losses are in nats.

Gradient: only ``student_logits`` receives one. The teacher's logits are detached inside
(the teacher is a fixed target: frozen, EMA or the current weights under no_grad).

Memory: the masked student rows (N x V, the tensor the gradient flows through) are gathered
once; everything else runs on chunks of at most ``chunk_size`` positions under activation
checkpointing (the teacher rows of a chunk are gathered inside it), so beyond the inputs and
that gather never more than one chunk's [chunk_size x V] working set is alive, in the forward
and in the backward pass. Half-precision logits are upcast to float32 per chunk; float64
stays float64. With ``heads`` that are both frozen (a LoRA student), :func:`generalized_jsd`
instead takes each chunk's gradient w.r.t. the student's hidden states in the forward
(``ChunkedRowsLoss``): the backward recomputes nothing, which saves both heads' matmuls a
second time (the teacher's needs no gradient at all). For ``beta = 0`` (the forward KL) that
gradient is in closed form (``_forward_kl_rows``) and every chunk works in the same three
(chunk_size x V) buffers (``benchmarks/bench_loss_memory.py --impls fkl-head``: at 1024 x 49,152
on 2 CPU threads, forward + backward 1.3 s and 171 MiB above the inputs, against 2.1 s and 491 MiB
through autograd).

Reductions (``reduction``):
- ``"sequence"``: token-mean within each sequence (row), then the mean over sequences
  (SDFT's official code);
- ``"token"``: the sum over all supervised tokens divided by their number (OPSD's code:
  summed, divided by the batch's completion-token count).
``num_sequences`` / ``num_tokens`` replace the denominators of the means (default: this
batch's rows with a supervised token / its supervised tokens). Pass a whole optimizer step's
counts when the batch is one micro-batch of that step: the micro-batch losses then sum to the
step's loss exactly. A batch with no supervised token gives 0 with an all-zero gradient.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn.functional import linear

from stages.core.losses import KDReduction
from stages.core.losses.head import GradInForward, LMHead, Workspace, check_head, head_logits_, log_softmax_
from stages.core.losses import DEFAULT_CHUNK_SIZE
from stages.core.losses.chunking import (
    ChunkedRowsLoss, check_chunk_size, mask_positions, reduction_weights, run_chunk, upcast, upcast_dtype,
)
from stages.core.losses.lopd import finite_logprobs, kl_rows


def _divergence_rows(student_cV: Tensor, teacher_cV: Tensor, beta: float,
                     temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per position of one chunk: the beta-divergence, and (no grad) forward and reverse KL."""
    s_logp = torch.log_softmax(upcast(student_cV) / temperature, dim=-1)
    t_logp = torch.log_softmax(upcast(teacher_cV).to(s_logp.dtype) / temperature, dim=-1)
    fwd_c = kl_rows(t_logp, s_logp)  # KL(T || S)
    if beta == 0.0:
        loss_c = fwd_c
    elif beta == 1.0:
        loss_c = kl_rows(s_logp, t_logp)  # KL(S || T)
    else:  # log m = logsumexp(log beta + log p_T, log(1 - beta) + log p_S), in log space
        m_logp = torch.logaddexp(finite_logprobs(t_logp) + math.log(beta),
                                 finite_logprobs(s_logp) + math.log(1.0 - beta))
        kl_t_m = kl_rows(t_logp, m_logp)
        kl_s_m = kl_rows(s_logp, m_logp)
        loss_c = beta * kl_t_m + (1.0 - beta) * kl_s_m
    with torch.no_grad():
        rev_c = kl_rows(s_logp, t_logp)
    return loss_c, fwd_c.detach(), rev_c


def _row_dot(a_cV: Tensor, b_cV: Tensor) -> Tensor:
    """sum_v a[c, v] * b[c, v] per row (c,), as a batched matmul (no (c, V) product is made)."""
    return (a_cV.unsqueeze(1) @ b_cV.unsqueeze(2)).view(-1)


def _forward_kl_rows(student_cd: Tensor, teacher_cd: Tensor, student_head: LMHead, teacher_head: LMHead,
                     temperature: float, workspace: Workspace,
                     need_grad: tuple[bool, bool]) -> tuple[Tensor, Tensor, Tensor | None, None]:
    """Forward KL(T || S) and reverse KL(S || T) per row (c,) of one chunk of hidden states (c, d)
    under frozen heads, and with ``need_grad[0]`` d KL(T || S) / d student_cd (c, d), in closed
    form (the teacher gets no gradient: the last item is None, as :class:`GradInForward` reads it).

    Values equal :func:`_divergence_rows` with ``beta=0`` on the heads' logits (the -inf handling
    of :func:`stages.core.losses.lopd.kl_rows` included). With z = student logits / temperature,
    p_S = softmax(z) and a_v = p_T(v) where log p_S(v) is finite (0 where kl_rows raises a -inf
    one, as autograd through that gives): d KL(T || S) / dz = p_S * sum(a) - a, then
    (c, V) @ (V, d) through the head, cast to the head's dtype first as autograd's cast would.
    Every (c, V) tensor lives in ``workspace``: three head matmuls, no (c, V) allocation.
    """
    dtype = upcast_dtype(student_cd.dtype)
    s_cV, t_cV, x_cV, low_cV = workspace.take(student_cd.shape[0], student_head.weight_Vd.shape[0], dtype,
                                              student_cd.device)
    for out, h_cd, head in ((s_cV, student_cd, student_head), (t_cV, teacher_cd, teacher_head)):
        head_logits_(out, h_cd, head)
        if temperature != 1.0:
            out.div_(temperature)
        log_softmax_(out, x_cV)
    floor = math.log(torch.finfo(dtype).tiny)  # -inf log-probs are raised to it, as kl_rows does
    torch.eq(s_cV, float("-inf"), out=low_cV)
    for logp_cV in (s_cV, t_cV):
        logp_cV.nan_to_num_(nan=float("nan"), posinf=float("inf"), neginf=floor)
    torch.sub(t_cV, s_cV, out=x_cV)  # log p_T - log p_S
    p_t_cV, p_s_cV = t_cV.exp_(), s_cV.exp_()
    forward_c, reverse_c = _row_dot(p_t_cV, x_cV), -_row_dot(p_s_cV, x_cV)
    if not need_grad[0]:
        return forward_c, reverse_c, None, None
    a_cV = p_t_cV.masked_fill_(low_cV, 0.0)
    g_cV = p_s_cV.mul_(a_cV.sum(dim=-1, keepdim=True)).sub_(a_cV)  # d KL / d z
    if temperature != 1.0:
        g_cV.div_(temperature)
    w = student_head.weight_Vd.detach()
    return forward_c, reverse_c, g_cV.to(w.dtype) @ w, None


def _kd_reduce(values_N: Tensor, rows_N: Tensor, num_rows: int, reduction: KDReduction,
               num_sequences: int | None, num_tokens: int | None) -> Tensor:
    """Sum of per-token values divided per ``reduction`` (module docstring)."""
    if reduction == "token":
        return values_N.sum() / max(num_tokens if num_tokens is not None else values_N.numel(), 1)
    if reduction != "sequence":
        raise ValueError(f"reduction must be 'sequence' or 'token', got {reduction!r}")
    row_sum_B = values_N.new_zeros(num_rows).index_add(0, rows_N, values_N)
    count_B = torch.bincount(rows_N, minlength=num_rows)
    has_B = count_B > 0
    per_row = row_sum_B[has_B] / count_B[has_B].to(values_N.dtype)
    denominator = num_sequences if num_sequences is not None else int(has_B.sum())
    return per_row.sum() / max(denominator, 1)


def generalized_jsd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    beta: float = 0.5,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    reduction: KDReduction = "sequence",
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    heads: tuple[LMHead, LMHead] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Generalised JSD_beta between teacher and student over the full vocabulary.

    Source: OPSD's ``generalized_jsd_loss`` (siyan-zhao/OPSD; upstream beta 0.5, logits
    divided by the sampling temperature). Per supervised position, with p = softmax(logits /
    temperature) and m = beta * p_T + (1 - beta) * p_S::

        beta = 0:      KL(T || S)                                   (forward KL, B.1's choice)
        0 < beta < 1:  beta * KL(T || m) + (1 - beta) * KL(S || m)
        beta = 1:      KL(S || T)                                   (reverse KL)

    Args:
        student_logits: student_logits_BTV, any float dtype, aligned with ``mask``; the only
            input that gets a gradient.
        teacher_logits: teacher_logits_BTV, same shape (detached here).
        mask: mask_BT, bool or 0/1, 1 on supervised action tokens.
        beta: in [0, 1].
        temperature: > 0, divides both logits before the softmax.
        chunk_size: positions per chunk of full-vocabulary work, >= 1.
        reduction, num_sequences, num_tokens: see the module docstring.
        heads: (student head, teacher head): the two inputs are then last hidden states (B, T, d)
            and each chunk of supervised positions computes its logits ``h @ W.T + b`` itself, so
            no (B, T, V) logits exist; same values and gradient (w.r.t. the student's hidden
            states and a trained student head) as on the logits. A trained student head: each
            chunk is recomputed in the backward; frozen heads: its gradient is taken in the
            forward (a second backward through the same graph is then refused).

    Returns:
        loss: scalar (float32, float64 for float64 inputs), nats.
        metrics: ``kd_loss`` (the loss), ``forward_kl`` and ``reverse_kl`` (diagnostics, same
        reduction and denominators), ``num_tokens`` (supervised positions of this batch).

    Raises:
        ValueError: logits not both (B, T, V) of one shape, wrong mask shape or non-0/1 mask,
            beta outside [0, 1], temperature <= 0, chunk_size < 1, unknown reduction.
    """
    if student_logits.dim() != 3 or student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student/teacher logits must both be (B, T, V), got {tuple(student_logits.shape)}"
                         f" and {tuple(teacher_logits.shape)}")
    if heads is not None:
        check_head(student_logits, heads[0], "student")
        check_head(teacher_logits, heads[1], "teacher")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if reduction not in ("sequence", "token"):
        raise ValueError(f"reduction must be 'sequence' or 'token', got {reduction!r}")
    check_chunk_size(chunk_size)
    B, T, _ = student_logits.shape
    b_idx, t_idx = mask_positions(mask, (B, T))
    teacher_BTV = teacher_logits.detach()
    reduce = lambda v: _kd_reduce(v, b_idx, B, reduction, num_sequences, num_tokens)  # noqa: E731
    if heads is not None and b_idx.numel() and not heads[0].trained:
        # frozen heads: each chunk's gradient w.r.t. the student's hidden states taken in the forward
        given = num_tokens if reduction == "token" else num_sequences  # weights with _kd_reduce's denominators
        weights_N = reduction_weights(b_idx, B, "token" if reduction == "token" else "trajectory",
                                       upcast_dtype(student_logits.dtype), None if given is None else max(given, 1))
        student_head, teacher_head = heads[0], heads[1].detached()
        if beta == 0.0:  # the forward KL in closed form, its (c, V) tensors in one workspace
            workspace = Workspace(masks=1)

            def closed_form(s_cd: Tensor, t_cd: Tensor, need_grad: tuple[bool, bool]) -> tuple[Tensor | None, ...]:
                return _forward_kl_rows(s_cd, t_cd, student_head, teacher_head, temperature, workspace, need_grad)

            def rows_fn(s_cd: Tensor, t_cd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
                fwd_c, rev_c = GradInForward.apply(s_cd, t_cd, closed_form)
                return fwd_c, fwd_c.detach(), rev_c
        else:
            def rows_fn(s_cd: Tensor, t_cd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
                return _divergence_rows(linear(s_cd, *student_head), linear(t_cd, *teacher_head), beta, temperature)
        loss, fwd_N, rev_N = ChunkedRowsLoss.apply(
            student_logits, teacher_BTV, b_idx, t_idx, weights_N, rows_fn, chunk_size,
            (torch.is_grad_enabled() and student_logits.requires_grad, False))
        return loss, {"kd_loss": float(loss.detach()), "forward_kl": float(reduce(fwd_N)),
                      "reverse_kl": float(reduce(rev_N)), "num_tokens": float(b_idx.numel())}
    student_NV = student_logits[b_idx, t_idx]  # (N, V) or (N, d): the rows the gradient flows through

    def chunk_fn(s_cV: Tensor, b_c: Tensor, t_c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        t_cV = teacher_BTV[b_c, t_c]
        if heads is not None:
            s_cV, t_cV = linear(s_cV, *heads[0]), linear(t_cV, *heads[1].detached())
        return _divergence_rows(s_cV, t_cV, beta, temperature)

    parts = [run_chunk(chunk_fn, s, b, t) for s, b, t in
             zip(student_NV.split(chunk_size), b_idx.split(chunk_size), t_idx.split(chunk_size))]
    if not parts:  # nothing supervised: 0 with a defined, all-zero gradient
        zero = 0.0 * upcast(student_logits).sum()
        return zero, {"kd_loss": 0.0, "forward_kl": 0.0, "reverse_kl": 0.0, "num_tokens": 0.0}
    loss_N, fwd_N, rev_N = (torch.cat([p[i] for p in parts]) for i in range(3))
    loss = reduce(loss_N)
    metrics = {"kd_loss": float(loss.detach()), "forward_kl": float(reduce(fwd_N)),
               "reverse_kl": float(reduce(rev_N)), "num_tokens": float(b_idx.numel())}
    return loss, metrics


def forward_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    reduction: KDReduction = "sequence",
    num_sequences: int | None = None,
    num_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Forward KL(T || S) over the full vocabulary at every supervised position.

    B.1 of the LOPD paper (SDFT and OPSD: forward KL, full vocabulary); SDFT's official code
    (per-token forward KL, token-mean per sequence, then the batch mean = the default
    ``reduction="sequence"``). Equal to :func:`generalized_jsd` with ``beta=0``.

    Args, returns and errors: as :func:`generalized_jsd` (metrics ``forward_kl``,
    ``reverse_kl``, ``num_tokens``; ``forward_kl`` is the loss value).
    """
    loss, m = generalized_jsd(student_logits, teacher_logits, mask, 0.0, temperature=temperature,
                              chunk_size=chunk_size, reduction=reduction, num_sequences=num_sequences,
                              num_tokens=num_tokens)
    m.pop("kd_loss")
    return loss, m
