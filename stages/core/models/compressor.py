"""The QFormer compressor chi of the composer (Eq. 6 of the LOPD paper) and its readouts.

K learned queries (K, d), initialised N(0, 1/d) (standard deviation d^-1/2, Appendix A of the
LOPD paper), pass ``depth`` applications of a pre-LayerNorm block [cross-attention queries ->
H_j (key padding mask), self-attention among queries, MLP], each with a residual; ONE block
applied ``depth`` times by default (the paper's QFormer), or ``depth`` separate blocks
(checkpoints written before that option existed are of that kind and load as such).

Output scale: the qformer readout is a final LayerNorm whose gain is initialised to
``mean_row_norm(input embeddings) / sqrt(d)``, so every latent row starts with the L2 norm of an
average input-embedding row (the teacher sees the latents where token embeddings go); the gain
stays learnable. What the blocks read (``memory_norm``) and how the updated queries become
latents (``readout``) are levers of the cold start; :class:`LatentCompressor` documents each.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

MEMORY_NORMS = ("layer", "token")  # LatentCompressor's memory_norm
READOUTS = ("qformer", "pointer", "span", "centred")  # LatentCompressor's readout
POINTER_INIT_SCALE = 3.0  # standard deviation of the pointer logits at init (random projections)


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
        memory_norm: what H goes through before the blocks' LayerNorm: ``"layer"`` nothing more;
            ``"token"`` each experience's hidden states are standardised per feature over its
            own real tokens (:func:`standardize_over_tokens`).
        readout: how the K updated queries become latents: ``"qformer"`` a final LayerNorm
            (gain at ``target_norm``); ``"pointer"`` each query points at the experience's tokens
            (one attention head from the queries to H) and its latent is the pointed-at tokens'
            input embeddings, weighted: every latent is a convex combination of the experience's
            own token embeddings, so a sharp pointer hands the teacher a token of the experience;
            ``"span"`` latent k is the input embedding of token k of a fixed span of the experience
            (:func:`span_positions`: from its first action on) plus a learned gate (0 at init)
            times the qformer readout: the latents start as that span of plain text and train
            from there; ``"centred"`` the qformer readout plus a learned constant (K, d) (zeros at
            init), where the gradient reaching the qformer readout is centred over the N
            experiences of the call (:func:`centre_gradient`): the part of the gradient that every
            experience shares (what a constant prompt would follow) trains the constant alone, and
            the blocks see only what differs between experiences. The forward value does not
            depend on the other experiences of the call.

    Raises:
        ValueError: ``heads`` does not divide ``d``, an unknown ``memory_norm`` or ``readout``.
    """

    def __init__(
        self, d: int, K: int, depth: int, heads: int, mlp_ratio: int, target_norm: float, shared: bool = True,
        memory_norm: str = "layer", readout: str = "qformer",
    ) -> None:
        super().__init__()
        if d % heads:
            raise ValueError(f"heads={heads} does not divide the hidden size {d}")
        if memory_norm not in MEMORY_NORMS:
            raise ValueError(f"memory_norm must be one of {MEMORY_NORMS}, got {memory_norm!r}")
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
        self.depth = depth
        self.memory_norm, self.readout = memory_norm, readout
        self.queries = nn.Parameter(torch.randn(K, d) * d ** -0.5)  # (K, d)
        self.blocks = nn.ModuleList(QFormerBlock(d, heads, mlp_ratio) for _ in range(1 if shared else depth))
        if readout in ("qformer", "span", "centred"):
            self.out_norm = nn.LayerNorm(d)
            nn.init.constant_(self.out_norm.weight, target_norm / math.sqrt(d))
        if readout == "centred":
            self.latent_bias = nn.Parameter(torch.zeros(K, d))  # (K, d)
        if readout == "span":
            self.span_gate = nn.Parameter(torch.zeros(()))
        if readout == "pointer":
            self.pointer_norm_q, self.pointer_norm_k = nn.LayerNorm(d), nn.LayerNorm(d)
            self.pointer_q, self.pointer_k = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
            # nn.Linear's default init: projected features of variance ~1/3, dot products of std sqrt(d) / 3
            self.pointer_log_scale = nn.Parameter(torch.tensor(math.log(3 * POINTER_INIT_SCALE)))

    def forward(self, h_NLd: Tensor, mask_NL: Tensor, emb_NLd: Tensor | None = None) -> Tensor:
        """Compress h_NLd (N, L, d) with valid-token mask mask_NL (N, L) bool -> (N, K, d).

        ``emb_NLd``: the input embeddings the readout needs: the ``"pointer"`` readout those of
        every experience token (N, L, d), the ``"span"`` readout those of its span (N, K, d).

        Raises:
            ValueError: a pointer or span readout without ``emb_NLd``.
        """
        q = self.queries.unsqueeze(0).expand(h_NLd.shape[0], -1, -1)  # (N, K, d)
        pad_NL = ~mask_NL
        if self.memory_norm == "token":
            h_NLd = standardize_over_tokens(h_NLd, mask_NL)
        for i in range(self.depth):
            q = self.blocks[i % len(self.blocks)](q, h_NLd, pad_NL)
        if self.readout == "qformer":
            return self.out_norm(q)
        if self.readout == "centred":
            return centre_gradient(self.out_norm(q)) + self.latent_bias
        if emb_NLd is None:
            raise ValueError(f"the {self.readout} readout needs the experience tokens' input embeddings (emb_NLd)")
        if self.readout == "span":
            return emb_NLd + self.span_gate * self.out_norm(q)
        return self.pointer_weights(q, h_NLd, mask_NL) @ emb_NLd

    def pointer_weights(self, q_NKd: Tensor, h_NLd: Tensor, mask_NL: Tensor) -> Tensor:
        """The pointer readout's attention (N, K, L) of the K queries over the real tokens (rows sum to 1)."""
        d = q_NKd.shape[-1]
        query_NKd = self.pointer_q(self.pointer_norm_q(q_NKd))
        key_NLd = self.pointer_k(self.pointer_norm_k(h_NLd))
        logits_NKL = query_NKd @ key_NLd.transpose(1, 2) * (self.pointer_log_scale.exp() / math.sqrt(d))
        logits_NKL = logits_NKL.masked_fill(~mask_NL.unsqueeze(1), float("-inf"))
        return torch.softmax(logits_NKL, dim=-1)


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
