"""A contrastive objective for the composer's cold start: the latents of a target's own
experiences must help the teacher more than another target's.

The teacher's NLL with latents can fall the same amount whatever the latents encode (they act
as a learned constant prompt). A hinge on the per-target gap between the NLL under another
target's latents and under its own cannot be met by such a prompt: it is met only when the
latents' content matters to the teacher.
"""
from __future__ import annotations

import torch
from torch import Tensor

from stages.core.losses.lopd import masked_nll


def row_nll(logits_BTV: Tensor, token_ids_BT: Tensor, mask_BT: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row mean NLL over the masked tokens: ``(nll_B, tokens_B)``.

    Args:
        logits_BTV: float logits (B, T, V), aligned with ``token_ids_BT`` (no shift here).
        token_ids_BT: int64 (B, T); mask_BT: bool or 0/1 (B, T), 1 on scored tokens.

    Returns:
        nll_B: float (B,) nats per token of each row (differentiable; 0 for a row without a
            masked token); tokens_B: float (B,) the rows' masked-token counts.

    Raises:
        ValueError: as :func:`stages.core.losses.lopd.masked_nll`.
    """
    nll, tokens = [], []
    for b in range(logits_BTV.shape[0]):
        loss, m = masked_nll(logits_BTV[b : b + 1], token_ids_BT[b : b + 1], mask_BT[b : b + 1])
        nll.append(loss)
        tokens.append(m["num_tokens"])
    return torch.stack(nll), torch.tensor(tokens, dtype=torch.float32, device=logits_BTV.device)


def latent_contrast_hinge(nll_own_B: Tensor, nll_other_B: Tensor, margin: float) -> tuple[Tensor, dict[str, float]]:
    """mean_b max(0, nll_own_b - nll_other_b + margin): own latents must beat another's by ``margin``.

    Args:
        nll_own_B: float (B,) each target's NLL (nats per token) with its own experiences' latents.
        nll_other_B: float (B,) the same targets with another target's experiences' latents.
        margin: the gap (nats per token) below which a target is penalised, >= 0.

    Returns:
        loss: scalar tensor (0 when every target's gap reaches the margin; the gradient then is 0).
        metrics: contrast_hinge (the loss), contrast_gap (mean of nll_other - nll_own),
        contrast_short (share of targets whose gap is below the margin).

    Raises:
        ValueError: shape mismatch, an empty batch or a negative margin.
    """
    if nll_own_B.dim() != 1 or nll_own_B.shape != nll_other_B.shape or nll_own_B.numel() == 0:
        raise ValueError(f"expected two equal (B,) NLL vectors, got {tuple(nll_own_B.shape)} and "
                         f"{tuple(nll_other_B.shape)}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    gap_B = nll_other_B - nll_own_B
    loss = torch.relu(margin - gap_B).mean()
    return loss, {"contrast_hinge": float(loss.detach()), "contrast_gap": float(gap_B.detach().mean()),
                  "contrast_short": float((gap_B.detach() < margin).float().mean())}
