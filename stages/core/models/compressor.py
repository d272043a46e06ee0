"""The QFormer compressor chi of the composer (Eq. 6 of the LOPD paper).

K learned queries (K, d), initialised N(0, 1/d) (standard deviation d^-1/2, Appendix A of the
LOPD paper), pass ``depth`` applications of a pre-LayerNorm block [cross-attention queries ->
H_j (key padding mask), self-attention among queries, MLP], each with a residual; ONE block
applied ``depth`` times by default (the paper's QFormer), or ``depth`` separate blocks
(checkpoints written before that option existed are of that kind and load as such).

Output scale: the qformer readout is a final LayerNorm whose gain is initialised to
``mean_row_norm(input embeddings) / sqrt(d)``, so every latent row starts with the L2 norm of an
average input-embedding row (the teacher sees the latents where token embeddings go); the gain
stays learnable. What the blocks read (``memory_norm``) and how the updated queries become
latents (``readout``) are levers of the cold start, registered parts of
:mod:`stages.core.models.readouts`.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from stages.core.models.readouts import MEMORY_NORMS, READOUTS, Readout


def default_heads(d: int, max_heads: int = 8) -> int:
    """Largest number of attention heads <= ``max_heads`` that divides the hidden size ``d``."""
    return max(h for h in range(1, max_heads + 1) if d % h == 0)


class QFormerBlock(nn.Module):
    """Pre-LayerNorm block: cross-attention to H, self-attention among queries, MLP; residuals.

    Attention projections carry no bias (a key bias only shifts every score of a query by
    the same amount, so it would be a parameter without gradient).
    """

    def __init__(self, d: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(d)
        self.norm_kv = nn.LayerNorm(d)
        self.cross_attn = nn.MultiheadAttention(d, heads, bias=False, batch_first=True)
        self.norm_self = nn.LayerNorm(d)
        self.self_attn = nn.MultiheadAttention(d, heads, bias=False, batch_first=True)
        self.norm_mlp = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, mlp_ratio * d), nn.GELU(), nn.Linear(mlp_ratio * d, d))

    def forward(self, q_NKd: Tensor, h_NLd: Tensor, pad_NL: Tensor) -> Tensor:
        """Update queries q_NKd (N, K, d) from hidden states h_NLd (N, L, d).

        ``pad_NL`` (N, L) bool is True on padding positions, which get zero attention.
        """
        x = self.norm_q(q_NKd)
        kv = self.norm_kv(h_NLd)
        q_NKd = q_NKd + self.cross_attn(x, kv, kv, key_padding_mask=pad_NL, need_weights=False)[0]
        x = self.norm_self(q_NKd)
        q_NKd = q_NKd + self.self_attn(x, x, x, need_weights=False)[0]
        return q_NKd + self.mlp(self.norm_mlp(q_NKd))


class LatentCompressor(nn.Module):
    """Comp_chi(H; Q_chi) of Eq. 6: K learned queries read a variable-length H into K x d.

    Args:
        d: hidden size of the backbone.
        K: number of latent tokens per experience.
        depth: applications of a :class:`QFormerBlock`.
        heads: attention heads, must divide ``d``.
        mlp_ratio: MLP hidden size / d.
        target_norm: initial L2 norm of every output row (module docstring: output scale).
        shared: one block applied ``depth`` times (True) or ``depth`` separate blocks.
        memory_norm: the name of what H goes through before the blocks' LayerNorm
            (:data:`stages.core.models.readouts.MEMORY_NORMS`: ``"layer"``, ``"token"``).
        readout: the name of how the K updated queries become latents
            (:data:`stages.core.models.readouts.READOUTS`: ``"qformer"``, ``"pointer"``, ``"span"``,
            ``"centred"``); its parameters are registered on the compressor itself (checkpoints
            keep their parameter names).

    Raises:
        ValueError: ``heads`` does not divide ``d``, an unknown ``memory_norm`` or ``readout``
            (the known ones named).
    """

    def __init__(
        self, d: int, K: int, depth: int, heads: int, mlp_ratio: int, target_norm: float, shared: bool = True,
        memory_norm: str = "layer", readout: str = "qformer",
    ) -> None:
        super().__init__()
        if d % heads:
            raise ValueError(f"heads={heads} does not divide the hidden size {d}")
        MEMORY_NORMS.get_or_raise(memory_norm)
        READOUTS.get_or_raise(readout)
        self.depth = depth
        self.memory_norm, self.readout = memory_norm, readout
        self.queries = nn.Parameter(torch.randn(K, d) * d ** -0.5)  # (K, d)
        self.blocks = nn.ModuleList(QFormerBlock(d, heads, mlp_ratio) for _ in range(1 if shared else depth))
        self.read.add_parameters(self, d, K, target_norm)

    @property
    def read(self) -> Readout:
        """The registered readout named ``readout``."""
        return READOUTS[self.readout]

    def forward(self, h_NLd: Tensor, mask_NL: Tensor, emb_NLd: Tensor | None = None) -> Tensor:
        """Compress h_NLd (N, L, d) with valid-token mask mask_NL (N, L) bool -> (N, K, d).

        ``emb_NLd``: the input embeddings the readout reads
        (:meth:`stages.core.models.readouts.Readout.embeddings`; None for those that read none).

        Raises:
            ValueError: a pointer or span readout without ``emb_NLd``.
        """
        q = self.queries.unsqueeze(0).expand(h_NLd.shape[0], -1, -1)  # (N, K, d)
        pad_NL = ~mask_NL
        h_NLd = MEMORY_NORMS[self.memory_norm](h_NLd, mask_NL)
        for i in range(self.depth):
            q = self.blocks[i % len(self.blocks)](q, h_NLd, pad_NL)
        return self.read.latents(self, q, h_NLd, mask_NL, emb_NLd)
