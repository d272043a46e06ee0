"""Rung (h') of the composer ladder (:mod:`stages.coldstart.ladder.rungs`): the task-only composer,
a learned prompt that reads what the composer reads except the experiences.

Every composer input row is ``"Current task: <x>\\n\\nRelated experience:\\n<m_j>"``. The free
vectors (h) read none of it, so (c) - (h) mixes the composer reading the target's task text with
the experiences carrying content. (h') is a second composer built as the run built its own (the
same settings and seeded init) whose J input rows are the task text alone (``"Current task: <x>"``,
:meth:`stages.coldstart.data.ColdstartData.batch` with ``blank``: no experience token), trained with
the run's objective (its reconstruction steps too, on the blanked rows), steps, batches and
gradient clipping. It differs from (c) only in the experience tokens of its inputs, so
(c) - (h') is what the experiences add. A second composer rather than free vectors plus the task
rows through a composer: it has (c)'s architecture, capacity and init, and nothing else to tune.
The objective's teachers read the batch as the run's did (text-kl's text teacher reads the
experiences); only the composer's inputs are blanked.

Its learning rate is its own: each of :data:`LR_FACTORS` times the run's ``lr`` (the encoder LoRA
at the run's ``lr_encoder / lr`` ratio of it) trains a composer on the training targets of 1 -
:data:`VALIDATION_FRACTION` of the training tasks (split by seeded hash,
:func:`stages.coldstart.data.split_tasks`); the lr with the lowest pooled action NLL on the other
training tasks' targets (blanked rows) trains the control on all training targets. Held-out
targets are never read. Without 2 training tasks the run's lr is taken. Cost when not kept:
(len(LR_FACTORS) + 1) x ``steps`` composer steps.

Kept in ``out/task_only_composer.safetensors``: phi (order of ``trainable_parameters``), the
settings and targets that trained it (metadata ``trained_by``), the chosen lr and the sweep.
"""
from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from schemas import Trajectory
from stages.coldstart.composer import new_composer
from stages.coldstart.data import ColdstartData, split_tasks
from stages.coldstart.ladder.free_prompt import (
    TEXT_FIELDS, TRAINED_BY, TRAINING_FIELDS, advancer, key_in, settings_key,
)
from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.composer_teacher import composer_loss
from stages.core.latent.contexts import LatentBatch
from stages.core.latent.text_targets import TextTargets
from stages.core.models.composer import Composer, adapter_parameters, preserve_requires_grad
from stages.core.run.modes import share
from stages.core.run.runs import coldstart_stream

TASK_ONLY = "task_only_composer.safetensors"  # rung (h')'s trained composer, in the run folder
TASK_ONLY_ADAPTER = "task_only"  # its LoRA adapter on the shared backbone while the ladder runs
LR_FACTORS = (0.3, 1.0, 3.0)  # the lr sweep: these times the run's lr
VALIDATION_FRACTION = 0.2  # share of the training tasks whose targets score the sweep
# what trains it beyond the free vectors' settings: the composer's own and its objective's
_FIELDS = TRAINING_FIELDS + ("lr_encoder", "reconstruction_steps", "contrast_weight", "contrast_margin", "depth",
                              "memory_norm", "readout", "latent_scale", "lora_rank", "max_exp_tokens")


@dataclass
class TaskOnlyControl:
    """Rung (h'): the trained task-only composer, its lr and the sweep that chose it (lr as ``f"{lr:g}"``
    -> pooled validation action NLL, nats per token; empty without a sweep)."""

    composer: Composer
    lr: float
    sweep: dict[str, float]


class _Blanked:
    """``composer`` as the objectives call it, reading ``blanked``'s composer input rows whatever
    rows it is called with (the batch's own, which the objective's teachers read)."""

    def __init__(self, composer: Composer, blanked: LatentBatch) -> None:
        self.composer, self.backbone, self.blanked = composer, composer.backbone, blanked

    def __call__(self, exp_ids_BJL: Tensor, exp_mask_BJL: Tensor) -> Tensor:
        if exp_ids_BJL.shape[0] != self.blanked.exp_ids_BJL.shape[0]:
            raise ValueError(f"{exp_ids_BJL.shape[0]} rows asked, the blanked batch has "
                             f"{self.blanked.exp_ids_BJL.shape[0]}")
        return self.composer(self.blanked.exp_ids_BJL, self.blanked.exp_mask_BJL)


def trained_by(config: ColdstartConfig, train: list[Trajectory], qformer_shared: bool) -> str:
    """What the task-only composer of a run is trained from (:func:`settings_key`): its settings,
    the sweep and the training targets."""
    fields = _FIELDS + (TEXT_FIELDS if config.objective == "text-kl" else ())
    return settings_key(config, fields, train, qformer_shared=qformer_shared, lr_factors=list(LR_FACTORS),
                        validation_fraction=VALIDATION_FRACTION)


def kept(out: Path, config: ColdstartConfig, train: list[Trajectory], qformer_shared: bool) -> bool | None:
    """Whether ``out/task_only_composer.safetensors`` was trained from what this run trains from
    (:func:`trained_by`); None when there is no such file."""
    key = key_in(out / TASK_ONLY)
    return None if key is None else key == trained_by(config, train, qformer_shared)


def train_task_only(composer: Composer, data: ColdstartData, targets: list[Trajectory], config: ColdstartConfig,
                    lr: float, text_targets: TextTargets | None, advance: Callable[[], None] = lambda: None
                    ) -> list[float]:
    """Train ``composer`` for ``config.steps`` steps of the run's seeded batches of ``targets`` on
    their blanked rows (module docstring), AdamW at ``lr`` as the recipe does; returns the step losses.
    ``advance`` is called after each step."""
    c, device = config, str(composer.backbone.get_input_embeddings().weight.device)
    params = composer.trainable_parameters()
    groups = [{"params": params}]
    if c.lr_encoder is not None:
        encoder = adapter_parameters(composer.backbone, composer.adapter_name)
        groups = [{"params": encoder, "lr": lr * c.lr_encoder / c.lr},
                  {"params": list(composer.compressor.parameters())}]
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)
    settings, losses = c.objective_settings(), []
    for step in range(c.steps):
        trajs = [targets[i] for i in coldstart_stream(len(targets), c.seed, step * c.batch_size, c.batch_size)]
        blanked = data.batch(trajs, heldout=False, device=device, blank=True)
        opt.zero_grad(set_to_none=True)
        if step < c.reconstruction_steps:
            loss, _ = composer_loss("reconstruction", composer, blanked, c.placement)
        else:
            batch = data.batch(trajs, heldout=False, device=device)  # the objective's teachers read it
            loss, _ = composer_loss(c.objective, _Blanked(composer, blanked), batch, c.placement, settings,
                                    text_targets=text_targets)
        for p in params:  # adapter switching may clear the requires_grad flags
            p.requires_grad_(True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, c.grad_clip or math.inf)
        opt.step()
        losses.append(float(loss.detach()))
        advance()
    return losses


@torch.no_grad()
def blanked_nll(composer: Composer, data: ColdstartData, targets: list[Trajectory], config: ColdstartConfig) -> float:
    """The action NLL (nats per token) of ``targets`` pooled over their action tokens, ``composer``
    reading their blanked rows."""
    device, total, tokens = str(composer.backbone.get_input_embeddings().weight.device), 0.0, 0
    for lo in range(0, len(targets), config.batch_size):
        batch = data.batch(targets[lo:lo + config.batch_size], heldout=False, device=device, blank=True)
        _, m = composer_loss("action-nll", composer, batch, config.placement)
        total, tokens = total + m["nll"] * m["num_tokens"], tokens + int(m["num_tokens"])
    return total / max(tokens, 1)


def _load(composer: Composer, values: list[Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(composer.trainable_parameters(), values, strict=True):
            p.copy_(v)


def _trained(composer: Composer, data: ColdstartData, train: list[Trajectory], config: ColdstartConfig,
             progress: Progress | None) -> tuple[float, dict[str, float]]:
    """Sweep the lr on the training tasks, then train ``composer`` (at its init) on all of ``train``
    at the chosen one (module docstring); returns the lr and the sweep."""
    c, init = config, [p.detach().clone() for p in composer.trainable_parameters()]
    text_targets = None if c.text_kl_top_m is None else TextTargets(None, "", c.text_kl_top_m)  # in memory
    fit_tasks, val_tasks = split_tasks({t.task_id for t in train}, VALIDATION_FRACTION, c.seed)
    fit, val = [t for t in train if t.task_id in fit_tasks], [t for t in train if t.task_id in val_tasks]

    sweep = {}
    if val:
        advance = advancer(progress, "ladder: choosing the task-only composer's lr (h')", len(LR_FACTORS) * c.steps)
        for factor in LR_FACTORS:
            _load(composer, init)
            composer.backbone.train(c.activation_checkpointing)  # as the composer's steps ran
            train_task_only(composer, data, fit, c, factor * c.lr, text_targets, advance)
            composer.backbone.eval()
            sweep[f"{factor * c.lr:g}"] = blanked_nll(composer, data, val, c)
    lr = float(min(sweep, key=sweep.__getitem__)) if sweep else c.lr
    _load(composer, init)
    composer.backbone.train(c.activation_checkpointing)
    advance = advancer(progress, "ladder: training the task-only composer (h')", c.steps)
    train_task_only(composer, data, train, c, lr, text_targets, advance)
    return lr, sweep


@contextlib.contextmanager
def task_only_of(composer: Composer, data: ColdstartData, train: list[Trajectory], config: ColdstartConfig, out: Path,
                 progress: Progress | None = None) -> Iterator[TaskOnlyControl]:
    """Rung (h') of a run, on adapter :data:`TASK_ONLY_ADAPTER` of ``composer``'s backbone (deleted
    on exit): read from ``out/task_only_composer.safetensors`` when that was trained from what this
    run trains from (:func:`trained_by`), else trained (module docstring) and written there; the
    training is a task of ``progress`` when given."""
    backbone, shared = composer.backbone, composer.hparams["qformer_shared"]
    control = new_composer(backbone, config, data.tokenizer, adapter_name=TASK_ONLY_ADAPTER, shared=shared)
    path, key = out / TASK_ONLY, trained_by(config, train, shared)
    try:
        if key_in(path) == key:
            values = load_file(str(path), device=str(backbone.get_input_embeddings().weight.device))
            _load(control, [values[f"phi.{i}"] for i in range(len(values))])
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata()
            lr, sweep = float(meta["lr"]), json.loads(meta["sweep"])
        else:
            try:
                lr, sweep = _trained(control, data, train, config, progress)
            finally:
                backbone.eval()
            save_file({f"phi.{i}": p.detach().contiguous() for i, p in enumerate(control.trainable_parameters())},
                      str(path), metadata={TRAINED_BY: key, "lr": repr(lr), "sweep": json.dumps(sweep)})
            share(path)  # safetensors writes owner-only files
        yield TaskOnlyControl(control, lr, sweep)
    finally:
        with preserve_requires_grad(backbone):
            backbone.delete_adapter(TASK_ONLY_ADAPTER)
