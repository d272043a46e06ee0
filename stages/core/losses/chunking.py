"""The chunking the loss functions share: masked positions, chunked rows, reduction weights.

The loss modules (:mod:`~stages.core.losses.lopd`, :mod:`~stages.core.losses.kd`,
:mod:`~stages.core.losses.sdpo`, :mod:`~stages.core.losses.pg`, :mod:`~stages.core.losses.head`)
run full-vocabulary work on chunks of at most ``chunk_size`` positions: :func:`mask_positions`
picks the masked positions, :func:`reduction_weights` gives each one its weight in the masked mean,
and a chunk runs either under activation checkpointing (:func:`run_chunk`) or with its gradient
taken in the forward (:class:`ChunkedRowsLoss`). Half-precision logits are upcast to float32
inside each chunk (:func:`upcast`); float64 stays float64.
"""
from __future__ import annotations

import itertools
from typing import Callable, Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Reduction = Literal["trajectory", "token"]


def upcast_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype loss math runs in for inputs of ``dtype``: float32, or float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def upcast(x: Tensor) -> Tensor:
    """``x`` in the dtype of :func:`upcast_dtype` (a copy unless it already has it)."""
    return x.to(upcast_dtype(x.dtype))


def check_chunk_size(chunk_size: int) -> None:
    """Raises ValueError unless ``chunk_size`` (positions per chunk) is at least 1."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def mask_positions(mask_BT: Tensor, shape_BT: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(row ids, column ids) of the masked positions; validates shape and 0/1 values."""
    if tuple(mask_BT.shape) != tuple(shape_BT):
        raise ValueError(f"mask shape {tuple(mask_BT.shape)} != expected {tuple(shape_BT)}")
    if mask_BT.dtype != torch.bool:
        if not bool(((mask_BT == 0) | (mask_BT == 1)).all()):
            raise ValueError("mask must be bool or hold only 0/1 values")
        mask_BT = mask_BT != 0
    b_idx, t_idx = mask_BT.nonzero(as_tuple=True)
    return b_idx, t_idx


def check_token_ids(ids: Tensor, vocab_size: int) -> None:
    """Raises ValueError unless every id of ``ids`` (int, any shape) lies in [0, vocab_size)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}) at the scored positions")


def run_chunk(fn: Callable[..., Tensor | tuple[Tensor, ...]], *tensors: Tensor):
    """Call ``fn(*tensors)``, under activation checkpointing when a gradient is needed."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return checkpoint(fn, *tensors, use_reentrant=False)
    return fn(*tensors)


class ChunkedRowsLoss(torch.autograd.Function):
    """sum_n w_n f(s_n, t_n) over the masked rows n, each chunk's gradient taken in the forward.

    ``rows_fn(student_cV, teacher_cV, *extras_c)`` returns (values_c, *diagnostics_c) for a chunk
    of rows; ``extras_N`` (a tuple of (N, ...) tensors, default none) are per-row inputs without
    a gradient (e.g. sampled token ids), split into the same chunks.
    The forward gathers one chunk of rows at a time, runs ``rows_fn`` under autograd, takes the
    gradient of sum_c w_c values_c w.r.t. the chunk's rows at once and writes it into a
    (B, T, V) buffer per input that needs one; the backward hands those buffers on, scaled in
    place by the incoming gradient (so a second backward through the same graph is refused).
    Unlike activation checkpointing, nothing is recomputed and no per-chunk gradients wait to
    be concatenated: peak memory beyond the inputs is the gradient buffers plus one chunk.
    """

    @staticmethod
    def forward(ctx, student_BTV: Tensor, teacher_BTV: Tensor, b_idx: Tensor, t_idx: Tensor,  # type: ignore[override]
                weights_N: Tensor, rows_fn: Callable[..., tuple[Tensor, ...]], chunk_size: int,
                needs_grad: tuple[bool, bool], extras_N: tuple[Tensor, ...] = ()) -> tuple[Tensor, ...]:
        inputs = (student_BTV, teacher_BTV)
        grads = [torch.zeros_like(x) if need else None for x, need in zip(inputs, needs_grad)]
        loss = weights_N.new_zeros(())
        diagnostics: list[tuple[Tensor, ...]] = []
        chunks = zip(b_idx.split(chunk_size), t_idx.split(chunk_size), weights_N.split(chunk_size),
                     zip(*(e.split(chunk_size) for e in extras_N)) if extras_N else itertools.repeat(()))
        for b_c, t_c, w_c, extras_c in chunks:
            rows = [x[b_c, t_c].requires_grad_(need) for x, need in zip(inputs, needs_grad)]  # 2 x (c, V)
            with torch.enable_grad():
                values_c, *diag_c = rows_fn(*rows, *extras_c)
                chunk_loss = (values_c * w_c).sum()
            wanted = [(g, r) for g, r in zip(grads, rows) if g is not None]
            if wanted:
                row_grads = torch.autograd.grad(chunk_loss, [r for _, r in wanted])
                for (g, _), rg in zip(wanted, row_grads):
                    g[b_c, t_c] = rg
            loss = loss + chunk_loss.detach()
            diagnostics.append(tuple(d.detach() for d in diag_c))
        ctx.grads = grads
        diag_N = [torch.cat(parts) for parts in zip(*diagnostics)] if diagnostics else []
        ctx.mark_non_differentiable(*diag_N)
        return (loss, *diag_N)

    @staticmethod
    def backward(ctx, grad_loss: Tensor, *_: Tensor):  # type: ignore[override]
        if ctx.grads is None:
            raise RuntimeError("the chunked top-M loss supports one backward pass per forward")
        grads, ctx.grads = ctx.grads, None
        scaled = [g.mul_(grad_loss.to(g.dtype)) if g is not None else None for g in grads]
        return (*scaled, None, None, None, None, None, None, None)


def reduction_weights(rows_N: Tensor, num_rows: int, reduction: Reduction, dtype: torch.dtype,
                      denominator: float | None = None) -> Tensor:
    """w_N (N,) such that sum_n w_n x_n is the masked mean of x: per row then over the rows that
    have tokens (``trajectory``), or pooled over all tokens (``token``). ``denominator`` replaces
    the count the mean divides by last (the rows with tokens, or the tokens): a whole step's
    count when the batch is one micro-batch of it."""
    if reduction == "token":
        n = denominator if denominator is not None else max(rows_N.numel(), 1)
        return torch.full(rows_N.shape, 1.0 / n, dtype=dtype, device=rows_N.device)
    if reduction != "trajectory":
        raise ValueError(f"reduction must be 'trajectory' or 'token', got {reduction!r}")
    count_B = torch.bincount(rows_N, minlength=num_rows)
    rows_with_tokens = denominator if denominator is not None else max(int((count_B > 0).sum()), 1)
    return 1.0 / (count_B[rows_N].to(dtype) * rows_with_tokens)


def token_logprob_rows(logits_XV: Tensor, ids_X: Tensor) -> Tensor:
    """log softmax(logits_XV)[x, ids_X[x]] per row (X,), upcast (:func:`upcast`); ids int, in range."""
    logits_XV = upcast(logits_XV)
    picked_X = logits_XV.gather(-1, ids_X.long().unsqueeze(-1)).squeeze(-1)
    return picked_X - torch.logsumexp(logits_XV, dim=-1)
