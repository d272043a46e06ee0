"""Held-out evaluation of a cold-start composer (`lopd coldstart`, :mod:`stages.coldstart.recipe`).

Held-out targets are scored with experiences retrieved from the whole store (minus the target,
and its task with ``exclude_same_task``), as at deployment: the masked NLL of their action
tokens under the latent-conditioned teacher with (a) no latents, (b) the untrained composer
(same seeded init, loaded with :func:`swapped_phi`), (c) the trained composer, (d) the trained
composer given the experiences retrieved for a held-out target of ANOTHER task (each target's
list moved by the smallest shift that gives every target another task's, none of them of the
target's own task): (d) above (c) says the
latents carry the content of the experiences they encode; (d) equal to (c) says they act as a
prompt common to all inputs. The NLL is the ``action-nll`` objective
(:mod:`stages.core.losses.composer_objectives`). The full ladder of controls:
:mod:`stages.coldstart.ladder.rungs`.
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
from stages.core.latent.composer_teacher import composer_loss
from stages.core.latent.contexts import LatentBatch, build_batch
from stages.core.latent.placements import get_placement
from stages.core.models.composer import Composer
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
        _, m = composer_loss("action-nll", composer, batch, placement, latents=latents)
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
