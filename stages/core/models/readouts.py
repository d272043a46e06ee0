"""The composer compressor's registered parts: memory norms (what the QFormer blocks read) and
readouts (how the K updated queries become latents).

Each is one stateless object behind a :class:`stages.core.registry.Registry`
(:data:`MEMORY_NORMS`, :data:`READOUTS`; the names are the ``memory_norm`` / ``readout`` of a
composer checkpoint and of `lopd coldstart`). A readout adds its parameters to the compressor
(:meth:`Readout.add_parameters`, so checkpoints keep their parameter names), says which input
embeddings it reads (:meth:`Readout.embeddings`) and maps the updated queries to latents
(:meth:`Readout.latents`).

Adding one: subclass :class:`MemoryNorm` or :class:`Readout` here, add an instance to its
registry, and its name to the allowed values of ``ColdstartConfig``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from stages.core.registry import Registry

POINTER_INIT_SCALE = 3.0  # standard deviation of the pointer logits at init (random projections)


class MemoryNorm:
    """What the encoder's hidden states go through before the blocks' LayerNorm."""

    name: ClassVar[str]

    def __call__(self, h_NLd: Tensor, mask_NL: Tensor) -> Tensor:
        """h_NLd (N, L, d) with real-token mask mask_NL (N, L) bool -> (N, L, d)."""
        raise NotImplementedError


class LayerMemory(MemoryNorm):
    """The hidden states as they are."""

    name = "layer"

    def __call__(self, h_NLd: Tensor, mask_NL: Tensor) -> Tensor:
        return h_NLd


class TokenMemory(MemoryNorm):
    """Each experience's hidden states standardised per feature over its own real tokens
    (:func:`standardize_over_tokens`)."""

    name = "token"

    def __call__(self, h_NLd: Tensor, mask_NL: Tensor) -> Tensor:
        return standardize_over_tokens(h_NLd, mask_NL)


def standardize_over_tokens(h_NLd: Tensor, mask_NL: Tensor, eps: float = 1e-5) -> Tensor:
    """Each row's hidden states standardised per feature over its real tokens: (N, L, d).

    Feature f of row n becomes ``(h - mean) / sqrt(var + eps)`` with the mean and the (biased)
    variance of f over the positions where ``mask_NL`` (N, L) bool is True; padding positions
    come out as zeros. The backbone's hidden states share a large component across tokens and
    experiences (a few outlier features carry most of their norm, so the mean-pooled states of
    different experiences have cosine ~0.98): removing each row's own mean leaves what differs
    between its tokens, and an attention spread evenly over the tokens then reads exactly zero.
    """
    m_NL1 = mask_NL.unsqueeze(-1).to(h_NLd.dtype)
    count_N11 = m_NL1.sum(dim=1, keepdim=True).clamp_min(1.0)
    mean_N1d = (h_NLd * m_NL1).sum(dim=1, keepdim=True) / count_N11
    centred_NLd = (h_NLd - mean_N1d) * m_NL1
    var_N1d = centred_NLd.pow(2).sum(dim=1, keepdim=True) / count_N11
    return centred_NLd * torch.rsqrt(var_N1d + eps)


class Readout:
    """How the K updated queries of an experience become its latents (module docstring).

    Attributes:
        needs_span_marker: the composer must be given the tokenized action label (``span_marker``)
            where the readout's span starts.
    """

    name: ClassVar[str]
    needs_span_marker: ClassVar[bool] = False

    def add_parameters(self, module: nn.Module, d: int, K: int, target_norm: float) -> None:
        """Register the readout's parameters on the compressor ``module`` (hidden size ``d``, ``K``
        latents, ``target_norm`` the initial L2 norm of a latent row)."""

    def embeddings(self, embed: Callable[[Tensor], Tensor], ids_NL: Tensor, mask_NL: Tensor,
                   span_marker: Sequence[int], K: int) -> Tensor | None:
        """The input embeddings the readout reads (``embed`` maps ids to them), or None."""
        return None

    def latents(self, module: nn.Module, q_NKd: Tensor, h_NLd: Tensor, mask_NL: Tensor,
                emb: Tensor | None) -> Tensor:
        """Latents (N, K, d) from the updated queries q_NKd (N, K, d), the (normed) memory h_NLd
        (N, L, d), its mask (N, L) bool and :meth:`embeddings`' output."""
        raise NotImplementedError


class QFormerReadout(Readout):
    """A final LayerNorm whose gain starts at ``target_norm / sqrt(d)``."""

    name = "qformer"

    def add_parameters(self, module, d, K, target_norm):
        module.out_norm = nn.LayerNorm(d)
        nn.init.constant_(module.out_norm.weight, target_norm / math.sqrt(d))

    def latents(self, module, q_NKd, h_NLd, mask_NL, emb):
        return module.out_norm(q_NKd)


class CentredReadout(QFormerReadout):
    """The qformer readout plus a learned constant (K, d) (zeros at init); the gradient reaching the
    qformer readout is centred over the N experiences of the call (:func:`centre_gradient`): the
    part every experience shares (what a constant prompt would follow) trains the constant alone.
    The forward value does not depend on the other experiences of the call."""

    name = "centred"

    def add_parameters(self, module, d, K, target_norm):
        super().add_parameters(module, d, K, target_norm)
        module.latent_bias = nn.Parameter(torch.zeros(K, d))  # (K, d)

    def latents(self, module, q_NKd, h_NLd, mask_NL, emb):
        return centre_gradient(super().latents(module, q_NKd, h_NLd, mask_NL, emb)) + module.latent_bias


class SpanReadout(QFormerReadout):
    """Latent k is the input embedding of token k of a fixed span of the experience
    (:func:`span_positions`: from its first action on) plus a learned gate (0 at init) times the
    qformer readout: the latents start as that span of plain text and train from there."""

    name = "span"
    needs_span_marker = True

    def add_parameters(self, module, d, K, target_norm):
        super().add_parameters(module, d, K, target_norm)
        module.span_gate = nn.Parameter(torch.zeros(()))

    def embeddings(self, embed, ids_NL, mask_NL, span_marker, K):
        return embed(ids_NL.gather(1, span_positions(ids_NL, mask_NL, list(span_marker), K)))

    def latents(self, module, q_NKd, h_NLd, mask_NL, emb):
        return _needed(emb, self.name) + module.span_gate * super().latents(module, q_NKd, h_NLd, mask_NL, emb)


class PointerReadout(Readout):
    """Each query points at the experience's tokens (one attention head from the queries to H) and
    its latent is the pointed-at tokens' input embeddings, weighted: a convex combination of the
    experience's own token embeddings, so a sharp pointer hands the teacher a token of it."""

    name = "pointer"

    def add_parameters(self, module, d, K, target_norm):
        module.pointer_norm_q, module.pointer_norm_k = nn.LayerNorm(d), nn.LayerNorm(d)
        module.pointer_q, module.pointer_k = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        # nn.Linear's default init: projected features of variance ~1/3, dot products of std sqrt(d) / 3
        module.pointer_log_scale = nn.Parameter(torch.tensor(math.log(3 * POINTER_INIT_SCALE)))

    def embeddings(self, embed, ids_NL, mask_NL, span_marker, K):
        return embed(ids_NL)

    def latents(self, module, q_NKd, h_NLd, mask_NL, emb):
        return self.weights(module, q_NKd, h_NLd, mask_NL) @ _needed(emb, self.name)

    @staticmethod
    def weights(module: nn.Module, q_NKd: Tensor, h_NLd: Tensor, mask_NL: Tensor) -> Tensor:
        """The attention (N, K, L) of the K queries over the real tokens (rows sum to 1)."""
        d = q_NKd.shape[-1]
        query_NKd = module.pointer_q(module.pointer_norm_q(q_NKd))
        key_NLd = module.pointer_k(module.pointer_norm_k(h_NLd))
        logits_NKL = query_NKd @ key_NLd.transpose(1, 2) * (module.pointer_log_scale.exp() / math.sqrt(d))
        logits_NKL = logits_NKL.masked_fill(~mask_NL.unsqueeze(1), float("-inf"))
        return torch.softmax(logits_NKL, dim=-1)


def _needed(emb: Tensor | None, readout: str) -> Tensor:
    if emb is None:
        raise ValueError(f"the {readout} readout needs the experience tokens' input embeddings (emb_NLd)")
    return emb


def centre_gradient(x_NKd: Tensor) -> Tensor:
    """``x_NKd`` (N, K, d) unchanged in value; in backward each row's gradient minus the rows' mean.

    ``x - mean + mean.detach()`` over dim 0: the forward value is ``x`` exactly (to rounding), and
    the gradient reaching ``x``'s graph is ``g_n - mean_m g_m``, so what every row's gradient shares
    does not reach the parameters behind ``x``. One row (N = 1) has nothing to centre against and
    passes as it is (its whole gradient would be the shared part).
    """
    if x_NKd.shape[0] < 2:
        return x_NKd
    mean_1Kd = x_NKd.mean(dim=0, keepdim=True)
    return x_NKd - mean_1Kd + mean_1Kd.detach()


def span_positions(ids_NL: Tensor, mask_NL: Tensor, marker: list[int], K: int) -> Tensor:
    """Positions (N, K) long of each row's span for the ``"span"`` readout.

    The span is K consecutive real tokens from the first occurrence of the token ids ``marker``
    (the experience's first action label) on, moved left as far as needed to end at the row's
    last real token; a row without the marker starts at 0; a row of fewer than K real tokens
    repeats its last one. Rows are right-padded (``mask_NL`` (N, L) bool, True on real tokens).
    """
    lengths_N = mask_NL.sum(dim=1)
    m = len(marker)
    starts = []
    for row, n in zip(ids_NL.tolist(), lengths_N.tolist()):
        at = next((i for i in range(n - m + 1) if m and row[i : i + m] == marker), 0)
        starts.append(max(0, min(at, n - K)))
    pos_NK = torch.tensor(starts, dtype=torch.long, device=ids_NL.device).unsqueeze(1) \
        + torch.arange(K, device=ids_NL.device)
    return torch.minimum(pos_NK, (lengths_N - 1).unsqueeze(1))


MEMORY_NORMS: Registry[MemoryNorm] = Registry("memory_norm", sort=False)
for _norm in (LayerMemory(), TokenMemory()):
    MEMORY_NORMS.add(_norm.name, _norm)
READOUTS: Registry[Readout] = Registry("readout", sort=False)
for _readout in (QFormerReadout(), PointerReadout(), SpanReadout(), CentredReadout()):
    READOUTS.add(_readout.name, _readout)
