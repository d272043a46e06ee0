"""Splicing latent vectors into a frozen model's input, and re-prefixing completions.

The primitives of the latent-context teacher (:mod:`stages.core.latent.teacher`) and its
placements (:mod:`stages.core.latent.placements`).

Alignment: every function here returns (B, T, V) logits over the T input tokens with the
Hugging Face convention ``logits[b, i]`` = distribution of token ``i + 1``. With latents
inserted before token p, ``logits[b, p - 1]`` is the output of the LAST latent position, i.e.
the first token after the latents is predicted from (state, c_phi) as Eq. 8 of the LOPD paper
requires; positions i < p - 1 never see the latents and equal the plain model's logits.

Batches are right-padded (attention mask 1 then 0 in every row); position ids run 0..T+N-1
over the spliced sequence, so the latents take N consecutive positions like N tokens would.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from stages.core.models.composer import adapter_scope
from stages.core.models.head import forward_outputs
from stages.core.models.shared_prefix import right_padded_lengths


def check_right_padded(attn_mask_BT: Tensor) -> list[int]:
    """Row lengths of a right-padded (B, T) mask (bool or 0/1).

    Raises:
        ValueError: some row is not right-padded (1...1 0...0).
    """
    lengths = right_padded_lengths(attn_mask_BT)
    if lengths is None:
        raise ValueError("attention mask must be right-padded (1...1 0...0 in every row)")
    return lengths


def spliced_logits(
    teacher: nn.Module, input_ids_BT: Tensor, attn_mask_BT: Tensor, latents_BNd: Tensor, insert_at_B: Tensor,
    *, hidden: bool = False,
) -> Tensor:
    """Teacher logits_BTV (B, T, V) with latents_BNd (B, N, d) inserted before token insert_at_B[b].

    Runs ``teacher`` with every adapter disabled on the token embeddings with the N latents
    spliced in; the output is aligned with the student (module docstring). N = 0 gives the
    plain model's logits. With ``hidden``: the decoder's last hidden states (B, T, d) at the same
    positions instead (:func:`stages.core.models.head.forward_outputs`).

    Raises:
        ValueError: a mask that is not right-padded, latents not (B, N, d), or an insertion
            point outside 0..row length.
    """
    B, T = input_ids_BT.shape
    N = latents_BNd.shape[1]
    lengths_B = torch.tensor(check_right_padded(attn_mask_BT), device=input_ids_BT.device)
    if latents_BNd.dim() != 3 or latents_BNd.shape[0] != B:
        raise ValueError(f"expected latents of shape (B={B}, N, d), got {tuple(latents_BNd.shape)}")
    insert_at_B = insert_at_B.to(device=input_ids_BT.device, dtype=torch.long)
    if insert_at_B.shape != (B,) or (insert_at_B < 0).any() or (insert_at_B > lengths_B).any():
        raise ValueError(
            f"insert_at must be (B,) with 0 <= insert_at[b] <= row length; got {insert_at_B.tolist()} "
            f"for lengths {lengths_B.tolist()}"
        )
    with adapter_scope(teacher, None):
        if N == 0:
            return forward_outputs(teacher, hidden, input_ids=input_ids_BT, attention_mask=attn_mask_BT.long(),
                                   use_cache=False)
        embeds_BTd = teacher.get_input_embeddings()(input_ids_BT)
        d = embeds_BTd.shape[-1]
        S = T + N
        j_1S = torch.arange(S, device=input_ids_BT.device).unsqueeze(0)
        p_B1 = insert_at_B.unsqueeze(1)
        is_latent_BS = (j_1S >= p_B1) & (j_1S < p_B1 + N)
        real_idx_BS = torch.where(j_1S < p_B1, j_1S, j_1S - N).clamp(0, T - 1)
        latent_idx_BS = (j_1S - p_B1).clamp(0, N - 1)
        tokens_BSd = embeds_BTd.gather(1, real_idx_BS.unsqueeze(-1).expand(B, S, d))
        latents_BSd = latents_BNd.to(embeds_BTd.dtype).gather(1, latent_idx_BS.unsqueeze(-1).expand(B, S, d))
        spliced_BSd = torch.where(is_latent_BS.unsqueeze(-1), latents_BSd, tokens_BSd)
        mask_BS = is_latent_BS | attn_mask_BT.bool().gather(1, real_idx_BS)
        logits_BSV = forward_outputs(teacher, hidden, inputs_embeds=spliced_BSd, attention_mask=mask_BS.long(),
                                     position_ids=j_1S.expand(B, S), use_cache=False)
    i_1T = torch.arange(T, device=input_ids_BT.device).unsqueeze(0)
    out_idx_BT = i_1T + N * (i_1T >= p_B1 - 1)  # last spliced position before token i + 1
    return logits_BSV[torch.arange(B, device=logits_BSV.device).unsqueeze(1), out_idx_BT]


def reprefixed(input_ids_BT: Tensor, attn_mask_BT: Tensor, insert_at_B: Tensor,
                prefixes: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Row b's completion (its tokens from ``insert_at_B[b]`` on) after ``prefixes[b]``.

    Returns ids_BS (right-padded with 0), mask_BS (bool, True on real tokens) and shift_B
    (LongTensor (B,): ``len(prefixes[b]) - insert_at_B[b]``, for :func:`aligned`).

    Raises:
        ValueError: a mask that is not right-padded.
    """
    B, device = input_ids_BT.shape[0], input_ids_BT.device
    lengths = check_right_padded(attn_mask_BT)
    starts, rows = insert_at_B.tolist(), input_ids_BT.tolist()  # one copy to the host each
    seqs = [prefixes[b] + rows[b][starts[b]:lengths[b]] for b in range(B)]
    S = max(len(seq) for seq in seqs)
    ids_BS = torch.tensor([seq + [0] * (S - len(seq)) for seq in seqs], dtype=input_ids_BT.dtype, device=device)
    lengths_B = torch.tensor([len(seq) for seq in seqs], device=device)
    mask_BS = torch.arange(S, device=device).unsqueeze(0) < lengths_B.unsqueeze(1)
    shift_B = torch.tensor([len(prefixes[b]) - starts[b] for b in range(B)], device=device)
    return ids_BS, mask_BS, shift_B


def aligned(logits_BSV: Tensor, shift_B: Tensor, T: int) -> Tensor:
    """(B, T, V) logits of the re-prefixed sequences at the student's positions: student position
    i >= insert_at - 1 scores token i + 1, which is the re-prefixed position i + shift."""
    S = logits_BSV.shape[1]
    idx_BT = (torch.arange(T, device=logits_BSV.device).unsqueeze(0) + shift_B.unsqueeze(1)).clamp(0, S - 1)
    return logits_BSV.gather(1, idx_BT.unsqueeze(-1).expand(-1, T, logits_BSV.shape[-1]))
