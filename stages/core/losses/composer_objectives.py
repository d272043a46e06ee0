"""The cold start's objectives (`lopd coldstart`): what one composer step minimises.

Each objective is a pure function ``(teacher, settings) -> (loss, metrics)`` registered by name
in :data:`OBJECTIVES`. ``teacher`` (:class:`ComposerTeacher`) hands it the composer's latents
and the frozen teacher's action-token logits (the latent layer implements it:
:class:`stages.core.latent.composer_teacher.BatchTeacher`); ``settings`` (:class:`ObjectiveSettings`)
holds the weights. The objectives:

- ``action-nll``: the masked NLL of the target's action tokens under the latent-conditioned
  teacher (Eq. 7-8 of the LOPD paper), pooled over the batch's action tokens.
- ``reconstruction``: the autoencoding objective (ICAE's pre-training): the teacher reads the K
  latents of each distinct composer input row, then the row's own tokens, and is scored on them
  (token 0 follows the last latent and is not scored); pooled over the scored tokens.
- ``contrast``: the action NLL plus ``contrast_weight`` x the latent contrast hinge
  (:func:`stages.core.losses.contrast.latent_contrast_hinge`): each target is scored with the
  latents of its own experiences and with those of the next target in the batch (rows rolled
  by one); needs 2+ targets per batch.
- ``text-kl``: the action NLL plus ``text_kl_weight`` x the forward KL(text teacher || latent
  teacher) over the full vocabulary (or, with ``text_kl_top_m``, over the text teacher's top-M
  tokens plus a tail bucket) at every action token, summed over tokens and divided by
  their number (the text teacher: the same frozen backbone with the composer inputs as plain
  token embeddings where the latents go; xRAG's second stage).

Adding an objective: a function here registered in :data:`OBJECTIVES`, and its name among the
allowed values of ``ColdstartConfig.objective``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from stages.core.losses.contrast import latent_contrast_hinge, row_nll
from stages.core.losses.kd import forward_kl
from stages.core.losses.lopd import masked_nll
from stages.core.losses.topm_kl import top_m_forward_kl
from stages.core.registry import Registry

Scored = tuple[Tensor, Tensor, Tensor]  # (logits_BTV, targets_BT, mask_BT), aligned: logits[b, t] predicts targets[b, t]


class ComposerTeacher(Protocol):
    """What an objective reads of one batch: the composer's latents and the frozen teacher's logits."""

    def latents(self) -> Tensor:
        """c_phi (B, N, d) of the batch's targets (one composer forward)."""

    def scored(self, latents_BNd: Tensor) -> Scored:
        """The latent teacher's logits on the action tokens with ``latents_BNd`` (B, N, d) placed."""

    def text_scored(self) -> Tensor:
        """The text teacher's logits (B, T, V), aligned as :meth:`scored`'s; no gradient."""

    def text_top_m(self, M: int) -> tuple[Tensor, Tensor, Tensor]:
        """The text teacher's top-M log-probs, their ids and its tail log-mass at the batch's action
        tokens, row-major (:func:`stages.core.losses.topm_kl.teacher_top_m`); no gradient."""

    def reconstruction_scored(self) -> Scored:
        """The teacher's logits on each distinct composer input row after that row's latents."""


@dataclass(frozen=True)
class ObjectiveSettings:
    """The weights the objectives read (``contrast_margin`` in nats per token)."""

    contrast_weight: float = 0.0
    contrast_margin: float = 0.05
    text_kl_weight: float = 0.0
    text_kl_top_m: int | None = None


Objective = Callable[[ComposerTeacher, ObjectiveSettings], tuple[Tensor, dict[str, float]]]
OBJECTIVES: Registry[Objective] = Registry("objective", sort=False)


@OBJECTIVES.register("action-nll")
def action_nll(teacher: ComposerTeacher, settings: ObjectiveSettings) -> tuple[Tensor, dict[str, float]]:
    """Masked action NLL; metrics ``nll``, ``num_tokens`` (:func:`stages.core.losses.lopd.masked_nll`)."""
    return masked_nll(*teacher.scored(teacher.latents()))


@OBJECTIVES.register("reconstruction")
def reconstruction_nll(teacher: ComposerTeacher, settings: ObjectiveSettings) -> tuple[Tensor, dict[str, float]]:
    """Autoencoding NLL of the composer input rows; metrics ``nll``, ``num_tokens``."""
    return masked_nll(*teacher.reconstruction_scored())


@OBJECTIVES.register("contrast")
def contrastive_action_nll(teacher: ComposerTeacher, settings: ObjectiveSettings
                           ) -> tuple[Tensor, dict[str, float]]:
    """Pooled NLL with the own latents plus ``contrast_weight`` x mean_b max(0, margin - (NLL_other_b -
    NLL_own_b)); metrics ``nll``, ``num_tokens`` and the hinge's.

    Raises:
        ValueError: a batch of one target (there is no other target's latents).
    """
    c_phi = teacher.latents()
    if c_phi.shape[0] < 2:
        raise ValueError("the contrastive objective needs at least 2 targets per batch")
    nll, tokens_B = {}, None
    for name, latents in (("own", c_phi), ("other", c_phi.roll(1, dims=0))):
        nll[name], tokens_B = row_nll(*teacher.scored(latents))
    pooled = (nll["own"] * tokens_B).sum() / tokens_B.sum().clamp_min(1.0)
    hinge, metrics = latent_contrast_hinge(nll["own"], nll["other"], settings.contrast_margin)
    return (pooled + settings.contrast_weight * hinge,
            {"nll": float(pooled.detach()), "num_tokens": float(tokens_B.sum()), **metrics})


@OBJECTIVES.register("text-kl")
def text_distilled_nll(teacher: ComposerTeacher, settings: ObjectiveSettings) -> tuple[Tensor, dict[str, float]]:
    """Action NLL plus ``text_kl_weight`` x the forward KL(text teacher || latent teacher) per action
    token: over the full vocabulary, or with ``text_kl_top_m`` = M over the text teacher's top-M
    tokens plus a tail bucket (:func:`stages.core.losses.topm_kl.top_m_forward_kl`, whose targets
    the teacher may keep from an earlier step); metrics ``nll``, ``num_tokens``, ``text_kl`` (nats
    per token)."""
    lg, tgt, mask = teacher.scored(teacher.latents())
    nll, m = masked_nll(lg, tgt, mask)
    if settings.text_kl_top_m is None:
        kl, km = forward_kl(lg, teacher.text_scored(), mask, reduction="token")
        return nll + settings.text_kl_weight * kl, {**m, "text_kl": km["forward_kl"]}
    kl_N = top_m_forward_kl(lg[mask.bool()], *teacher.text_top_m(settings.text_kl_top_m))
    kl = kl_N.sum() / max(kl_N.shape[0], 1)
    return nll + settings.text_kl_weight * kl, {**m, "text_kl": float(kl.detach())}
