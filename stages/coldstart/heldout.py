"""Held-out evaluation of a cold-start composer (`lopd coldstart`, :mod:`stages.coldstart.recipe`).

Held-out targets are scored with experiences retrieved from the whole store (minus the target,
and its task with ``exclude_same_task``), as at deployment: the masked NLL of their action
tokens under the latent-conditioned teacher with (a) no latents, (b) the untrained composer
(same seeded init, loaded with :func:`swapped_phi`), (c) the trained composer, (d) the trained
composer given the experiences retrieved for a held-out target of ANOTHER task (each target's
list moved by the smallest shift that gives every target another task's, none of them of the
target's own task): (d) above (c) says the
latents carry the content of the experiences they encode; (d) equal to (c) says they act as a
prompt common to all inputs. The training loss is the same NLL (:func:`action_nll`), after
optional autoencoding steps (:func:`reconstruction_nll`), optionally with the contrast hinge
(:func:`contrastive_action_nll`) or the text teacher's KL (:func:`text_distilled_nll`). The full
ladder of controls: :mod:`stages.coldstart.ladder`.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import torch
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from schemas import Trajectory
from stages.core.latent.contexts import LatentBatch, build_batch, shift_for_loss
from stages.core.latent.placements import get_placement
from stages.core.latent.teacher import latent_teacher_logits, teacher_logits, text_teacher_logits
from stages.core.losses.contrast import latent_contrast_hinge, row_nll
from stages.core.losses.kd import forward_kl
from stages.core.losses.lopd import masked_nll
from stages.core.models.composer import Composer, unique_rows
from stages.core.run.progress import StageProgress


class HeldoutResult(BaseModel):
    """Masked NLL (nats per action token, pooled over held-out tokens) of held-out actions.

    Attributes:
        nll_no_latents: the teacher without any latent context (the plain backbone).
        nll_untrained: latents of the untrained composer (same seeded init); None if not run.
        nll_trained: latents of the trained composer.
        nll_other_experiences: latents of the trained composer from another task's retrieved
            experiences (module docstring, (d)); None if not run (no baselines, or every held-out
            target of one task).
        trajectories, tokens: how many held-out targets / action tokens were scored.
    """

    nll_no_latents: float
    nll_untrained: float | None
    nll_trained: float
    nll_other_experiences: float | None = None
    trajectories: int
    tokens: int



def action_nll(composer: Composer, batch: LatentBatch, placement: str, latents: bool = True
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked NLL of the batch's action tokens under the teacher, with c_phi or without latents.

    The teacher forward is :func:`stages.core.latent.teacher.latent_teacher_logits` (LOPD's); without
    latents no vector is spliced in (the plain backbone, every adapter disabled).

    Returns:
        ``(loss, metrics)`` of :func:`stages.core.losses.lopd.masked_nll` (``nll``, ``num_tokens``).
    """
    if latents:
        c_phi = composer(batch.exp_ids_BJL, batch.exp_mask_BJL)
    else:
        embeds = composer.backbone.get_input_embeddings().weight
        c_phi = embeds.new_zeros(batch.input_ids_BT.shape[0], 0, embeds.shape[1])  # no latent
    logits = latent_teacher_logits(composer.backbone, batch, c_phi, placement if latents else "prefix")
    lg, tgt, mask = shift_for_loss(logits, batch)
    return masked_nll(lg, tgt, mask)


def contrastive_action_nll(composer: Composer, batch: LatentBatch, placement: str, weight: float, margin: float
                           ) -> tuple[torch.Tensor, dict[str, float]]:
    """The action NLL plus ``weight`` x the latent contrast hinge (:mod:`stages.core.losses.contrast`).

    Each target is scored twice by the teacher: with the latents of its own experiences and with
    those of the next target's in the batch (rows rolled by one; the composer encodes once). The
    loss is the pooled NLL with its own latents (as :func:`action_nll`) plus ``weight`` x
    mean_b max(0, margin - (NLL_other_b - NLL_own_b)).

    Returns:
        ``(loss, metrics)``: ``nll``, ``num_tokens`` and the hinge's metrics.

    Raises:
        ValueError: a batch of one target (there is no other target's latents).
    """
    if batch.input_ids_BT.shape[0] < 2:
        raise ValueError("the contrastive objective needs at least 2 targets per batch")
    c_phi = composer(batch.exp_ids_BJL, batch.exp_mask_BJL)
    nll, tokens_B = {}, None
    for name, latents in (("own", c_phi), ("other", c_phi.roll(1, dims=0))):
        lg, tgt, mask = shift_for_loss(latent_teacher_logits(composer.backbone, batch, latents, placement), batch)
        nll[name], tokens_B = row_nll(lg, tgt, mask)
    pooled = (nll["own"] * tokens_B).sum() / tokens_B.sum().clamp_min(1.0)
    hinge, metrics = latent_contrast_hinge(nll["own"], nll["other"], margin)
    return pooled + weight * hinge, {"nll": float(pooled.detach()), "num_tokens": float(tokens_B.sum()), **metrics}


def text_distilled_nll(composer: Composer, batch: LatentBatch, placement: str, weight: float
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """The action NLL plus ``weight`` x the forward KL(text teacher || latent teacher) on the action tokens.

    The text teacher is the same frozen backbone with the batch's composer inputs as plain token
    embeddings in the latents' place (:func:`text_teacher_logits`); the latent teacher reads
    c_phi there. KL over the full vocabulary at every action token, summed over tokens and
    divided by their number (:func:`stages.core.losses.kd.forward_kl`, ``reduction="token"``):
    the latents are asked to make the teacher predict what it predicts from the experiences' text
    (xRAG's second stage: NLL plus KL to the text-context teacher).

    Returns:
        ``(loss, metrics)``: ``nll``, ``num_tokens`` and ``text_kl`` (nats per token).
    """
    c_phi = composer(batch.exp_ids_BJL, batch.exp_mask_BJL)
    lg, tgt, mask = shift_for_loss(latent_teacher_logits(composer.backbone, batch, c_phi, placement), batch)
    nll, m = masked_nll(lg, tgt, mask)
    text_lg, _, _ = shift_for_loss(text_teacher_logits(composer.backbone, batch, placement), batch)
    kl, km = forward_kl(lg, text_lg, mask, reduction="token")
    return nll + weight * kl, {**m, "text_kl": km["forward_kl"]}


def reconstruction_nll(composer: Composer, exp_ids_NL: torch.Tensor, exp_mask_NL: torch.Tensor
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """Autoencoding objective of the composer (ICAE's pre-training): the frozen teacher reads the
    K latents of a composer input row, then the row's own tokens, and is scored on them.

    Each distinct row (:func:`stages.core.models.composer.unique_rows`) counts once, cut to the
    composer's ``max_exp_tokens``; token 0 of a row follows the last latent and is not scored
    (the teacher's aligned logits start at token 1), tokens 1..L-1 are. Pooled over all scored
    tokens (nats per token).

    Args:
        exp_ids_NL: LongTensor (N, L), right-padded composer input rows; exp_mask_NL: (N, L) bool.

    Returns:
        ``(loss, metrics)`` of :func:`stages.core.losses.lopd.masked_nll` (``nll``, ``num_tokens``).
    """
    first_U, _ = unique_rows(exp_ids_NL, exp_mask_NL)
    ids_UL, mask_UL = exp_ids_NL[first_U], exp_mask_NL[first_U].bool()
    if composer.max_exp_tokens is not None:
        ids_UL, mask_UL = ids_UL[:, : composer.max_exp_tokens], mask_UL[:, : composer.max_exp_tokens]
    latents_UKd = composer.encode(ids_UL, mask_UL)
    logits = teacher_logits(composer.backbone, ids_UL, mask_UL, latents_UKd,
                            torch.zeros(ids_UL.shape[0], dtype=torch.long, device=ids_UL.device))
    return masked_nll(logits[:, :-1], ids_UL[:, 1:], mask_UL[:, 1:])


@contextlib.contextmanager
def swapped_phi(composer: Composer, phi: list[torch.Tensor]) -> Iterator[None]:
    """Temporarily load the parameter values ``phi`` (order of ``trainable_parameters``)."""
    params = composer.trainable_parameters()
    if len(params) != len(phi):
        raise ValueError(f"phi has {len(phi)} tensors, the composer {len(params)}")
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, phi):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)


def other_task_shift(task_ids: list[str], experience_tasks: list[set[str]]) -> int | None:
    """The smallest ``s`` > 0 such that, for every target ``i``, target ``j = (i + s) % n`` is of
    another task and none of ``j``'s experiences (``experience_tasks[j]``, their task ids) is of
    ``i``'s task (None: no such shift, e.g. a single task)."""
    n = len(task_ids)
    for s in range(1, n):
        if all(task_ids[i] != task_ids[(i + s) % n] and task_ids[i] not in experience_tasks[(i + s) % n]
               for i in range(n)):
            return s
    return None


@torch.no_grad()
def _pooled_nll(composer: Composer, batches: list[LatentBatch], placement: str, latents: bool,
                advance: Callable[[], None] = lambda: None) -> tuple[float, int]:
    """Action-token NLL pooled over ``batches`` (nats per token) and the number of tokens;
    ``advance`` is called after each batch (a progress bar)."""
    total, tokens = 0.0, 0
    for batch in batches:
        _, m = action_nll(composer, batch, placement, latents)
        advance()
        total += m["nll"] * m["num_tokens"]
        tokens += int(m["num_tokens"])
    return total / max(tokens, 1), tokens


def evaluate_heldout(
    composer: Composer,
    tokenizer,
    trajectories: list[Trajectory],
    experiences: list[list[Trajectory]],
    *,
    J: int,
    max_exp_tokens: int,
    max_len: int | None,
    placement: str = "prefix",
    batch_size: int = 2,
    tools: list[list[dict]] | None = None,
    untrained_phi: list[torch.Tensor] | None = None,
    baselines: bool = True,
    console: Console | None = None,
) -> HeldoutResult:
    """Masked NLL of held-out trajectories' actions under the teacher, four ways.

    (a) no latent context (adapters disabled, nothing spliced in), (b) latents of the composer
    with ``untrained_phi`` loaded (its initial parameters; skipped when None), (c) latents of
    ``composer`` as it is, (d) the same from another task's experiences (target ``i`` gets the
    experiences of target ``(i + s) % n``, :func:`other_task_shift`; skipped when no shift
    exists). Pooled over all held-out action tokens (nats per token). With ``baselines=False``
    only (c) is computed and (a) is reported as NaN.

    Args:
        experiences: per trajectory, the retrieved experiences (the target itself excluded).
        tools: per trajectory, its tool schemas (default: ``info["tools"]``).
        console: where a progress bar of the batches goes (None: no bar).
    """
    if not trajectories:
        raise ValueError("evaluate_heldout: no trajectories")
    device = composer.backbone.get_input_embeddings().weight.device
    was_training = composer.backbone.training
    composer.backbone.eval()
    try:
        def batches_of(exps: list[list[Trajectory]]) -> list[LatentBatch]:
            return [build_batch(tokenizer, trajectories[lo:lo + batch_size], exps[lo:lo + batch_size], J=J,
                                max_exp_tokens=max_exp_tokens, max_len=max_len,
                                tools=None if tools is None else tools[lo:lo + batch_size],
                                framed=get_placement(placement).needs_frame_ids).to(device)
                    for lo in range(0, len(trajectories), batch_size)]

        batches = batches_of(experiences)
        shift = other_task_shift([t.task_id for t in trajectories],
                                 [{e.task_id for e in exps} for exps in experiences]) if baselines else None
        passes = 1 + int(baselines) + int(baselines and untrained_phi is not None) + int(shift is not None)
        with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=console is None) as bar:
            task = bar.add_task("held-out NLL", total=passes * len(batches))
            advance = lambda: bar.advance(task)  # noqa: E731
            trained, tokens = _pooled_nll(composer, batches, placement, True, advance)
            none = _pooled_nll(composer, batches, placement, False, advance)[0] if baselines else math.nan
            untrained = other = None
            if untrained_phi is not None and baselines:
                with swapped_phi(composer, untrained_phi):
                    untrained = _pooled_nll(composer, batches, placement, True, advance)[0]
            if shift is not None:
                moved = experiences[shift:] + experiences[:shift]
                other = _pooled_nll(composer, batches_of(moved), placement, True, advance)[0]
    finally:
        composer.backbone.train(was_training)
    return HeldoutResult(nll_no_latents=none, nll_untrained=untrained, nll_trained=trained,
                         nll_other_experiences=other, trajectories=len(trajectories), tokens=tokens)
