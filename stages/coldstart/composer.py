"""The cold start's composer at its seeded init: a fresh run's (:func:`new_composer`) and, for a
composer restored from a folder, the init it started from (:func:`initial_phi`, the ladder's
untrained rung (b))."""
from __future__ import annotations

import torch
from torch import nn

from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.contexts import ACTION_LABEL
from stages.core.models.composer import Composer, preserve_requires_grad
from stages.core.models.readouts import READOUTS

FINAL = "final"  # the run folder's trained composer (written last by `lopd coldstart`)
_SCRATCH_ADAPTER = "composer_init"  # briefly holds the seeded init next to a restored composer


def new_composer(backbone: nn.Module, config: ColdstartConfig, tokenizer, adapter_name: str = "composer",
                 shared: bool | None = None) -> Composer:
    """The composer of a fresh run at its seeded init (seeds torch's global RNG); ``shared``
    overrides ``config.qformer_shared`` (a restored composer keeps its own kind); a readout that
    reads a span gets the tokenized action label as its marker."""
    marker = (tokenizer(ACTION_LABEL, add_special_tokens=False)["input_ids"]
              if READOUTS[config.readout].needs_span_marker else [])
    torch.manual_seed(config.seed)
    shared = config.qformer_shared if shared is None else shared
    return Composer(backbone, J=config.J, K=config.K, depth=config.depth, qformer_shared=shared,
                    memory_norm=config.memory_norm, readout=config.readout, latent_scale=config.latent_scale,
                    span_marker=marker, lora_rank=config.lora_rank,
                    lora_alpha=2 * config.lora_rank, max_exp_tokens=config.max_exp_tokens,
                    adapter_name=adapter_name)


def initial_phi(composer: Composer, config: ColdstartConfig, tokenizer) -> list[torch.Tensor]:
    """phi of a fresh run's seeded init (the untrained baseline) for a restored ``composer``.

    Built on a scratch adapter of the same backbone (same init as a fresh run's composer),
    copied, and the scratch adapter deleted again.
    """
    scratch = new_composer(composer.backbone, config, tokenizer, adapter_name=_SCRATCH_ADAPTER,
                           shared=composer.hparams["qformer_shared"])
    phi = [p.detach().clone() for p in scratch.trainable_parameters()]
    with preserve_requires_grad(composer.backbone):
        composer.backbone.delete_adapter(_SCRATCH_ADAPTER)
    return phi
