"""Rung (h) of the composer ladder (:mod:`stages.coldstart.ladder.rungs`): the learned-prompt control.

J x K free vectors, the same for every input, trained with the cold start's own objective, steps,
learning rate and batches. The composer's latents beating them says the composer reads its
experiences; equal to them, it acts as a learned constant prompt.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from rich.progress import Progress
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from schemas import Trajectory
from stages.coldstart.data import ColdstartData
from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.composer_teacher import composer_loss
from stages.core.latent.contexts import LatentBatch
from stages.core.losses.composer_objectives import ObjectiveSettings
from stages.core.models.composer import Composer
from stages.core.run.modes import share
from stages.core.run.runs import coldstart_stream

FREE_PROMPT = "free_prompt.safetensors"  # rung (h)'s trained vectors, in the run folder
TRAINED_BY = "trained_by"  # the file's metadata key: what trained the vectors (:func:`trained_by`)
# the settings the free vectors' training reads; the experiences' settings only where the objective
# reads the experiences (the text teacher)
TRAINING_FIELDS = ("J", "K", "seed", "steps", "lr", "grad_clip", "placement", "batch_size", "objective",
                    "text_kl_weight", "text_kl_top_m", "activation_checkpointing", "max_len")
TEXT_FIELDS = ("self_retrieval", "max_exp_tokens", "exclude_same_task")


class FreePrompt(nn.Module):
    """J x K free vectors in place of a composer: the same latents for every input (rung (h)).

    Called like a :class:`Composer` (``(exp_ids_BJL, exp_mask_BJL) -> (B, J*K, d)``) and holds
    the shared backbone as ``backbone`` (not a sub-module), so the cold start's objectives
    (:func:`stages.core.latent.composer_teacher.composer_loss`) train it unchanged. Rows start N(0, 1) rescaled
    to ``row_norm`` (the composer's initial latent norm: the mean input-embedding row norm).
    """

    def __init__(self, backbone: nn.Module, J: int, K: int, seed: int = 0) -> None:
        super().__init__()
        object.__setattr__(self, "backbone", backbone)
        emb = backbone.get_input_embeddings().weight
        row_norm = emb.detach().float().norm(dim=-1).mean()
        g = torch.Generator().manual_seed(seed)
        v_Nd = torch.randn(J * K, emb.shape[1], generator=g)
        # float32 under a bf16/fp16 backbone (an AdamW step would round away), latents in its dtype
        self.vectors_Nd = nn.Parameter((v_Nd / v_Nd.norm(dim=-1, keepdim=True) * row_norm).to(
            emb.device, torch.promote_types(emb.dtype, torch.float32)))
        self.out_dtype = emb.dtype

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [self.vectors_Nd]

    def forward(self, exp_ids_BJL: Tensor, exp_mask_BJL: Tensor) -> Tensor:
        """c_BNd (B, J*K, d): the free vectors, whatever the experiences."""
        return self.vectors_Nd.to(self.out_dtype).unsqueeze(0).expand(exp_ids_BJL.shape[0], -1, -1)


def train_free_prompt(prompt: FreePrompt, batch_of_step: Callable[[int], LatentBatch], *, steps: int, lr: float,
                      grad_clip: float | None, placement: str, objective: str = "action-nll",
                      settings: ObjectiveSettings = ObjectiveSettings(),
                      advance: Callable[[], None] = lambda: None) -> list[float]:
    """Train ``prompt`` as the cold start trains the composer (AdamW, constant lr, no weight
    decay, the registered ``objective`` with ``settings``, gradient clipping); ``batch_of_step(i)``
    gives step i's batch. Returns the step losses. ``advance`` is called after each step (a
    progress bar)."""
    opt = torch.optim.AdamW(prompt.trainable_parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss, _ = composer_loss(objective, prompt, batch_of_step(step), placement, settings)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(prompt.trainable_parameters(), grad_clip or math.inf)
        opt.step()
        losses.append(float(loss.detach()))
        advance()
    return losses


def advancer(progress: Progress | None, description: str, total: int) -> Callable[[], None]:
    """A new task of ``progress`` (``total`` steps) and the function that advances it by one; a
    function that does nothing when ``progress`` is None."""
    if progress is None:
        return lambda: None
    task = progress.add_task(description, total=total)
    return lambda: progress.advance(task)


def settings_key(config: ColdstartConfig, fields: tuple[str, ...], train: list[Trajectory], **extra) -> str:
    """What a ladder control is trained from, as one JSON string: the ``fields`` of ``config``,
    ``extra`` and the sha256 of the training targets' ids, in order."""
    ids = hashlib.sha256("\n".join(t.trajectory_id for t in train).encode()).hexdigest()
    return json.dumps({**{f: getattr(config, f) for f in fields}, **extra, "train_ids_sha256": ids}, sort_keys=True)


def key_in(path: Path) -> str | None:
    """The :data:`TRAINED_BY` metadata of the safetensors file ``path`` ("" when it has none); None
    when there is no such file."""
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {}).get(TRAINED_BY, "")


def trained_by(config: ColdstartConfig, train: list[Trajectory]) -> str:
    """What the free vectors of a run are trained from (:func:`settings_key`): the settings their
    training reads and the training targets."""
    return settings_key(config, TRAINING_FIELDS + (TEXT_FIELDS if config.objective == "text-kl" else ()), train)


def kept(out: Path, config: ColdstartConfig, train: list[Trajectory]) -> bool | None:
    """Whether ``out/free_prompt.safetensors`` was trained from what this run trains from
    (:func:`trained_by`); None when there is no such file."""
    key = key_in(out / FREE_PROMPT)
    return None if key is None else key == trained_by(config, train)


def free_prompt_of(composer: Composer, data: ColdstartData, train: list[Trajectory], config: ColdstartConfig,
                   out: Path, progress: Progress | None = None) -> FreePrompt:
    """Rung (h) of a run: ``out/free_prompt.safetensors`` when there and trained from what this run
    trains from (:func:`trained_by`, kept in the file's metadata), else trained as the run trained its
    composer (``config.steps`` steps of the run's seeded batches, ``config.lr``, the run's objective;
    the contrast hinge is left out: free vectors give every target the same latents, so its gap is 0)
    and written there; the training is a task of ``progress`` when given."""
    prompt = FreePrompt(composer.backbone, config.J, config.K, seed=config.seed)
    path, key = out / FREE_PROMPT, trained_by(config, train)
    if key_in(path) == key:
        prompt.load_state_dict(load_file(str(path), device=str(prompt.vectors_Nd.device)))
        return prompt
    c = config

    def batch_of_step(step: int) -> LatentBatch:
        ids = coldstart_stream(len(train), c.seed, step * c.batch_size, c.batch_size)
        return data.batch([train[i] for i in ids], heldout=False, device=str(prompt.vectors_Nd.device))

    advance = advancer(progress, "ladder: training the free-vector control (h)", c.steps)
    composer.backbone.train(c.activation_checkpointing)  # as the composer's steps ran
    try:
        train_free_prompt(prompt, batch_of_step, steps=c.steps, lr=c.lr, grad_clip=c.grad_clip, placement=c.placement,
                          objective="action-nll" if c.objective == "contrast" else c.objective,
                          settings=c.objective_settings(), advance=advance)
    finally:
        composer.backbone.eval()
    save_file({k: v.detach().contiguous() for k, v in prompt.state_dict().items()}, str(path),
              metadata={TRAINED_BY: key})
    share(path)  # safetensors writes owner-only files
    return prompt
