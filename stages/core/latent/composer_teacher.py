"""The frozen teacher of one cold-start batch as the composer objectives read it
(:class:`stages.core.losses.composer_objectives.ComposerTeacher`), and :func:`composer_loss`, the
loss of a registered objective on a batch.

``composer`` is anything called like a :class:`stages.core.models.composer.Composer`
(``(exp_ids_BJL, exp_mask_BJL) -> (B, J*K, d)``) that holds the shared backbone as ``backbone``
(the composer, or the ladder's free vectors); the teacher is that backbone with every adapter
disabled (:func:`stages.core.latent.teacher.latent_teacher_logits`).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from stages.core.latent.contexts import LatentBatch, shift_for_loss
from stages.core.latent.teacher import latent_teacher_logits, teacher_logits, text_teacher_logits
from stages.core.latent.text_targets import TextTargets
from stages.core.losses.composer_objectives import OBJECTIVES, ObjectiveSettings, Scored
from stages.core.models.composer import unique_rows


class BatchTeacher:
    """The teacher's views of ``batch`` for the objectives.

    Args:
        composer: the latents' source (module docstring).
        batch: the step's targets and their composer inputs.
        placement: where the latents go (:mod:`stages.core.latent.placements`).
        latents: False: no latents at all (:meth:`latents` is (B, 0, d), placed as ``"prefix"``):
            the plain frozen backbone.
        text_targets: where the text teacher's top-M targets are kept between steps (None: computed
            for this batch and dropped).
    """

    def __init__(self, composer: nn.Module, batch: LatentBatch, placement: str, latents: bool = True,
                 text_targets: TextTargets | None = None) -> None:
        self.composer, self.batch, self.with_latents = composer, batch, latents
        self.placement = placement if latents else "prefix"
        self.text_targets = text_targets

    def latents(self) -> Tensor:
        """c_phi (B, J*K, d), or (B, 0, d) without latents."""
        if self.with_latents:
            return self.composer(self.batch.exp_ids_BJL, self.batch.exp_mask_BJL)
        embeds = self.composer.backbone.get_input_embeddings().weight
        return embeds.new_zeros(self.batch.input_ids_BT.shape[0], 0, embeds.shape[1])

    def scored(self, latents_BNd: Tensor) -> Scored:
        return shift_for_loss(latent_teacher_logits(self.composer.backbone, self.batch, latents_BNd, self.placement),
                              self.batch)

    def text_scored(self) -> Tensor:
        return shift_for_loss(text_teacher_logits(self.composer.backbone, self.batch, self.placement), self.batch)[0]

    def text_top_m(self, M: int) -> tuple[Tensor, Tensor, Tensor]:
        kept = self.text_targets or TextTargets(None, "", M)
        if kept.M != M:
            raise ValueError(f"the kept text-teacher targets hold the top {kept.M}, the objective asks for {M}")
        return kept.of_batch(self.composer.backbone, self.batch, self.placement)

    def reconstruction_scored(self) -> Scored:
        """Each distinct composer input row (:func:`stages.core.models.composer.unique_rows`), cut to
        the composer's ``max_exp_tokens``, after its K latents: logits of tokens 1..L-1."""
        ids_NL, mask_NL = self.batch.exp_ids_BJL.flatten(0, 1), self.batch.exp_mask_BJL.flatten(0, 1)
        first_U, _ = unique_rows(ids_NL, mask_NL)
        ids_UL, mask_UL = ids_NL[first_U], mask_NL[first_U].bool()
        if self.composer.max_exp_tokens is not None:
            ids_UL, mask_UL = ids_UL[:, : self.composer.max_exp_tokens], mask_UL[:, : self.composer.max_exp_tokens]
        latents_UKd = self.composer.encode(ids_UL, mask_UL)
        logits = teacher_logits(self.composer.backbone, ids_UL, mask_UL, latents_UKd,
                                torch.zeros(ids_UL.shape[0], dtype=torch.long, device=ids_UL.device))
        return logits[:, :-1], ids_UL[:, 1:], mask_UL[:, 1:]


def composer_loss(objective: str, composer: nn.Module, batch: LatentBatch, placement: str,
                  settings: ObjectiveSettings = ObjectiveSettings(), latents: bool = True,
                  text_targets: TextTargets | None = None) -> tuple[Tensor, dict[str, float]]:
    """The registered ``objective`` (:data:`stages.core.losses.composer_objectives.OBJECTIVES`) on
    ``batch``: ``(loss, metrics)``, the loss a scalar in nats; ``text_targets`` keeps the text
    teacher's top-M targets between steps (:class:`BatchTeacher`).

    Raises:
        ValueError: an unknown objective (the known ones named), or the objective's own errors.
    """
    return OBJECTIVES[objective](BatchTeacher(composer, batch, placement, latents, text_targets), settings)
