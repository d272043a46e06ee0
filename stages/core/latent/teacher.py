"""The latent-context teacher of LOPD (Eq. 7-8 of the LOPD paper) and the text-context /
no-context teacher views of the baselines (:func:`context_teacher_logits`).

The teacher is the frozen initial backbone theta_bar fed through ``inputs_embeds`` with the
latent vectors c_phi spliced in as ordinary context positions. Its weights get no gradient,
but its activations stay in the graph, so a loss on its logits reaches the latents (and phi).
Where the latents go is the placement's (:mod:`stages.core.latent.placements`); the splicing and the
alignment with the student's logits (``logits[b, i]`` = distribution of token ``i + 1``):
:mod:`stages.core.latent.splice`. The student's own forward: :mod:`stages.core.models.student`.

:func:`latent_teacher_logits` is the one latent-teacher forward on a
:class:`stages.core.latent.contexts.LatentBatch`, shared by `lopd coldstart` and the LOPD method.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from stages.core.latent.placements import Placement, get_placement
from stages.core.latent.splice import aligned, reprefixed
from stages.core.models.composer import adapter_scope, base_parameters
from stages.core.models.head import forward_outputs

if TYPE_CHECKING:
    from stages.core.latent.contexts import LatentBatch


def _frozen_teacher(backbone: nn.Module, teacher_model: nn.Module | None) -> nn.Module:
    """The model that plays theta_bar; ValueError if any of its base weights is trainable."""
    teacher = backbone if teacher_model is None else teacher_model
    trainable = [n for n, p in base_parameters(teacher) if p.requires_grad]
    if trainable:
        raise ValueError(
            f"teacher base weights must be frozen, but {trainable[0]} (and {len(trainable) - 1} "
            "more) require grad: for full fine-tuning pass a frozen copy as teacher_model="
        )
    return teacher


def teacher_logits(
    backbone: nn.Module,
    input_ids_BT: Tensor,
    attn_mask_BT: Tensor,
    latents_BNd: Tensor,
    insert_at_B: Tensor | None = None,
    *,
    placement: str = "prefix",
    action_starts: list[list[int]] | None = None,
    frame_ids: list[tuple[list[int], list[int]]] | None = None,
    teacher_model: nn.Module | None = None,
) -> Tensor:
    """Teacher logits_BTV (B, T, V) of pi_{theta_bar, phi}^T (Eq. 7-8), aligned with the student.

    Runs the frozen backbone (every adapter disabled) on the token embeddings with the latents
    spliced in where ``placement`` puts them; latent positions are removed from the output
    (:mod:`stages.core.latent.splice`). Gradients reach ``latents_BNd``; no teacher weight gets one.
    With N = 0 latents the result is the plain backbone's logits.

    Args:
        backbone: shared peft backbone (teacher = adapters disabled), or a frozen plain model.
        input_ids_BT: LongTensor (B, T), right-padded; attn_mask_BT: (B, T) bool or 0/1.
        latents_BNd: c_phi (B, N, d) in the backbone's embedding space, e.g. N = J*K.
        insert_at_B: LongTensor (B,), "prefix" placement: index of the token the latents go
            before (typically the prompt length), 0 <= insert_at[b] <= row length; "framed":
            each row's first action index.
        placement: a name of :data:`stages.core.latent.placements.PLACEMENTS`.
        action_starts: "per-turn" placement: per row, the strictly increasing token indices
            where each action span starts.
        frame_ids: "framed" placement: per row, the teacher prompt's ids before and after the
            latent span (:class:`stages.core.latent.placements.Framed`).
        teacher_model: frozen teacher copy for full fine-tuning of ``backbone`` (used instead
            of ``backbone``, with any adapters of its own disabled).

    Raises:
        ValueError: unknown placement or missing placement argument, a mask that is not
            right-padded, out-of-range insertion points, or trainable teacher base weights.
    """
    teacher = _frozen_teacher(backbone, teacher_model)
    return get_placement(placement).teacher_logits(teacher, input_ids_BT, attn_mask_BT, latents_BNd,
                                                   insert_at_B=insert_at_B, action_starts=action_starts,
                                                   frame_ids=frame_ids)


def latent_teacher_logits(backbone: nn.Module, batch: LatentBatch, latents_BNd: Tensor, placement: str | Placement,
                          *, teacher_model: nn.Module | None = None, hidden: bool = False) -> Tensor:
    """:func:`teacher_logits` on a :class:`stages.core.latent.contexts.LatentBatch`: the placement reads
    its own batch fields (:attr:`stages.core.latent.placements.Placement.batch_fields`).

    Returns:
        (B, T, V) logits aligned with the student (shift with
        :func:`stages.core.latent.contexts.shift_for_loss`); with ``hidden`` the teacher
        decoder's last hidden states (B, T, d) at the same positions (the LM head not applied).

    Raises:
        ValueError: see :func:`teacher_logits` (a framed placement needs a batch built with
            ``framed=True``).
    """
    chosen = get_placement(placement) if isinstance(placement, str) else placement
    teacher = _frozen_teacher(backbone, teacher_model)
    return chosen.teacher_logits(teacher, batch.input_ids_BT, batch.attn_mask_BT, latents_BNd, hidden=hidden,
                                 **{f: getattr(batch, f) for f in chosen.batch_fields})


def text_latents(backbone: nn.Module, batch: LatentBatch, b: int) -> Tensor:
    """Row b's composer input rows as token embeddings, concatenated over j: (1, N, d), N their
    unpadded tokens. Placed where the latents go, they are the text teacher (the composer
    ladder's rung (g), LOPD-text's teacher)."""
    ids_N = batch.exp_ids_BJL[b][batch.exp_mask_BJL[b].bool()]
    return backbone.get_input_embeddings()(ids_N).unsqueeze(0)


@torch.no_grad()
def text_teacher_logits(backbone: nn.Module, batch: LatentBatch, placement: str | Placement, *,
                        hidden: bool = False) -> Tensor:
    """The text teacher's logits (B, T, V) on ``batch``, aligned as :func:`latent_teacher_logits`':
    each row's composer input rows (its experiences, as text) as plain token embeddings
    (:func:`text_latents`) where the latents go; with ``hidden`` the last hidden states (B, T, d).
    One forward per row (rows hold different numbers of text tokens). No gradient.

    Raises:
        ValueError: see :func:`latent_teacher_logits`.
    """
    return torch.cat([latent_teacher_logits(backbone, batch.row(b), text_latents(backbone, batch, b), placement,
                                            hidden=hidden)
                      for b in range(batch.input_ids_BT.shape[0])])


def context_teacher_logits(
    model: nn.Module,
    input_ids_BT: Tensor,
    attn_mask_BT: Tensor,
    insert_at_B: Tensor,
    prefix_ids: list[list[int]] | None = None,
    *,
    adapter: str | None = None,
    hidden: bool = False,
) -> Tensor:
    """Teacher logits_BTV (B, T, V) under a privileged TEXT context, aligned with the student's
    (with ``hidden``: the decoder's last hidden states (B, T, d) at the same positions).

    The teacher views used by the text-context baselines (B.1 of the LOPD paper: OPSD's
    reference in the system message, SDFT's demonstration, SDPO's sibling or feedback): row b's
    prompt (its first ``insert_at_B[b]`` tokens, everything before the first sampled action)
    is replaced by ``prefix_ids[b]`` (that prompt re-rendered with the privileged context) and
    the same completion tokens follow; ``prefix_ids=None`` keeps the student's own prompt (the
    no-extra-context view). Logits are gathered back so that ``logits[b, i]`` scores token
    ``i + 1`` for every ``i >= insert_at_B[b] - 1`` (earlier positions are never supervised and
    hold the first prefix logits).

    Teacher weights: ``model`` with ``adapter`` active: ``None`` = every adapter disabled (the
    frozen initial weights), an EMA adapter, or the student's own adapter (the current
    student). Runs under ``torch.no_grad``: no parameter gets a gradient from the teacher.

    Raises:
        ValueError: a mask that is not right-padded, or a prefix list of the wrong length.
    """
    B, T = input_ids_BT.shape
    starts = insert_at_B.tolist()
    prefixes = prefix_ids if prefix_ids is not None else [input_ids_BT[b, :starts[b]].tolist() for b in range(B)]
    if len(prefixes) != B:
        raise ValueError(f"expected {B} prefixes, got {len(prefixes)}")
    ids_BS, mask_BS, shift_B = reprefixed(input_ids_BT, attn_mask_BT, insert_at_B, prefixes)
    with torch.no_grad(), adapter_scope(model, adapter):
        out_BS = forward_outputs(model, hidden, input_ids=ids_BS, attention_mask=mask_BS.long(), use_cache=False)
    return aligned(out_BS, shift_B, T)
