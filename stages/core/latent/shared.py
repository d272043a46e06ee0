"""Each distinct composer input of one optimizer update encoded once (LOPD's distill step).

The composer's input for a row, ``Enc(x, m_j)`` for its J retrieved experiences (Eq. 5 of the
LOPD paper), depends on the task text and the experiences only, and the G rollouts of a task
retrieve the same experiences: an update of T tasks x G rollouts has about T distinct inputs,
not T x G. :class:`SharedLatents` encodes each distinct input once; the micro-batches take their
rows' latents from one leaf tensor ``c_NQd`` (N distinct inputs, Q = J x K latents, d the hidden
size), their backward passes accumulate dLoss/dc there, and :meth:`SharedLatents.backward` then
runs one backward through the composer. By linearity that is the gradient of a composer backward
per micro-batch (the gradient-caching trick), at 1/G of the composer's forward and backward work.

Memory: with at most ``chunk`` distinct inputs (the micro-batch size) their graph is kept from
the forward to the backward, as one micro-batch's would be; with more, the forward runs without a
graph and the backward recomputes it ``chunk`` inputs at a time, so the composer's activations
never exceed one micro-batch's (dropout is 0: the recomputed forward is the same).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn


class SharedLatents:
    """The latents of one update's rows, one composer forward per distinct input.

    Args:
        composer: the trained composer c_phi (a module ``(ids_NJL, mask_NJL) -> (N, J*K, d)``).
        anchor: the frozen cold-start composer c_phi0, or None (then the anchor latents are the
            latents themselves, detached).
        rows: the update's rows (any objects; :meth:`take` finds a row by identity).
        encoded: per row, its composer input ``(ids_JL, mask_JL)`` (LongTensor, BoolTensor) as
            :func:`stages.core.latent.contexts.encode_experiences` gives it.
        chunk: distinct inputs per composer forward (the micro-batch size).
        trainable: whether the composer gets a gradient (False: a frozen composer, no graph).
        pad_token_id: the id that pads inputs to a chunk's longest row (the batch builder's).
        device: where the inputs go.
    """

    def __init__(self, composer: nn.Module, anchor: nn.Module | None, rows: Sequence[Any],
                 encoded: Sequence[tuple[Tensor, Tensor]], chunk: int, *, trainable: bool, pad_token_id: int,
                 device: str | torch.device) -> None:
        index: dict[tuple, int] = {}
        distinct: list[tuple[Tensor, Tensor]] = []
        self._row_index: dict[int, int] = {}
        for row, (ids, mask) in zip(rows, encoded):
            key = (tuple(ids.shape), ids.numpy().tobytes(), mask.numpy().tobytes())
            if key not in index:
                index[key] = len(distinct)
                distinct.append((ids, mask))
            self._row_index[id(row)] = index[key]
        self.composer, self.trainable = composer, trainable
        self.chunks = [_stack(distinct[lo:lo + chunk], pad_token_id, device) for lo in range(0, len(distinct), chunk)]
        keep_graph = trainable and len(self.chunks) == 1
        with torch.set_grad_enabled(keep_graph):
            values = [composer(ids, mask) for ids, mask in self.chunks]
        with torch.no_grad():
            anchors = [v.detach() if anchor is None else anchor(ids, mask) for v, (ids, mask) in zip(values, self.chunks)]
        self._graph = values[0] if keep_graph else None
        self.c_NQd = torch.cat([v.detach() for v in values]).requires_grad_(trainable)
        self.c0_NQd = torch.cat(anchors)

    @property
    def distinct(self) -> int:
        """How many distinct composer inputs the update has (composer forwards saved: rows - this)."""
        return self.c_NQd.shape[0]

    def take(self, rows: Sequence[Any]) -> tuple[Tensor, Tensor]:
        """``(c_phi, c_phi0)`` of ``rows`` (B, J*K, d): the latents (gradient into the shared leaf
        when trainable) and the anchor latents (no gradient).

        Raises:
            KeyError: a row that was not given to the constructor.
        """
        idx = torch.tensor([self._row_index[id(r)] for r in rows], device=self.c_NQd.device)
        return self.c_NQd[idx], self.c0_NQd[idx]

    def backward(self) -> None:
        """Backpropagate the gradient the micro-batches left on the latents through the composer
        (nothing for a frozen composer or when no loss reached the latents)."""
        if not self.trainable or self.c_NQd.grad is None:
            return
        grad = self.c_NQd.grad
        if self._graph is not None:
            self._graph.backward(grad)
            self._graph = None
            return
        lo = 0
        for ids, mask in self.chunks:  # the forward again, with its graph, a chunk at a time
            n = ids.shape[0]
            self.composer(ids, mask).backward(grad[lo:lo + n])
            lo += n


def _stack(inputs: list[tuple[Tensor, Tensor]], pad_token_id: int, device: str | torch.device) -> tuple[Tensor, Tensor]:
    """``(ids_NJL, mask_NJL)`` of ``inputs`` right-padded to their longest row."""
    J = inputs[0][0].shape[0]
    L = max(ids.shape[1] for ids, _ in inputs)
    ids_NJL = torch.full((len(inputs), J, L), pad_token_id, dtype=torch.long, device=device)
    mask_NJL = torch.zeros((len(inputs), J, L), dtype=torch.bool, device=device)
    for n, (ids, mask) in enumerate(inputs):
        ids_NJL[n, :, :ids.shape[1]] = ids.to(device)
        mask_NJL[n, :, :mask.shape[1]] = mask.to(device)
    return ids_NJL, mask_NJL
