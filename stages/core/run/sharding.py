"""Full fine-tuning with the student sharded over the ranks (``lopd distill --shard fsdp``).

With ``--shard fsdp`` and N > 1 processes (torchrun, :mod:`stages.core.run.distributed`), every
decoder layer of a fully fine-tuned student (``student_lora_rank=0``) and then the model's root
are wrapped with torch's ``fully_shard`` (FSDP2): each rank keeps 1/N of every parameter, of its
gradient and of its AdamW state (parameters become DTensors, sharded on dim 0). A forward
all-gathers a layer's parameters just before it runs and frees them after; a backward gathers
them again and reduce-scatters the gradients. The rest of the data-parallel step is the one of
:mod:`stages.core.run.distributed`: every rank holds the global batch, runs its share of the rows
with the global normalisers, and the reduce-scatter SUMS the shares (not the FSDP default
mean), so each rank's gradient shard is its shard of the single-process gradient. Modules other
than the student (LOPD's composer and anchor with their frozen backbone copy, GRPO's reference)
stay whole on every rank, their gradients all-reduced as before.

Precision: on the CPU the student is float32 throughout. With a lower run dtype (bfloat16 on
CUDA) the sharded parameters, gradients and optimizer state are float32 (the master weights)
and each layer computes in the run dtype (``MixedPrecisionPolicy(param_dtype=<run dtype>,
reduce_dtype=float32)``).

What a sharded step does differently (all of it here, used by :mod:`stages.distill.trainer` and
:mod:`stages.distill.recipe`; the functions serve a whole student too):

- every rank must run the same number of sharded forwards and backwards (each is a collective):
  :func:`micro_batches` pads the ranks with fewer rows with idle passes (:meth:`ShardedStudent.
  idle_pass`: a one-token forward whose loss is multiplied by 0);
- the rollout generates from the full parameters: :meth:`ShardedStudent.gathered` all-gathers
  every layer once and keeps it whole until the rollout ends (the ranks then generate
  independently, any number of forwards each), then frees it again; its seconds are the
  step's ``gather_s``;
- gradient norms and clipping reduce the shards' squared norms over the ranks
  (:func:`grad_norm`, :func:`clip_grad_norm_`);
- checkpoints hold the student and the optimizer as a ``torch.distributed.checkpoint`` (DCP)
  folder ``sharded/`` written by every rank in parallel (:meth:`ShardedStudent.save`,
  :meth:`ShardedStudent.load`); the final student is gathered on rank 0 and saved as a plain
  ``save_pretrained`` folder (:meth:`ShardedStudent.exported`);
- a sharded checkpoint resumes with another number of processes (> 1, sharded too): DCP
  reshards the student and the optimizer state on load (:func:`check_resume`); a rank without
  an RNG file of its own keeps its freshly seeded state (:func:`restore_rng`). The ranks then
  roll out other shares of the tasks, each rollout under the seed of its place in the step's
  whole task list (:func:`stages.engines.rollout.play`), so the sampled rollouts do not
  depend on N.

With one process ``--shard fsdp`` shards nothing: the run is the plain single-process run.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from stages.core.run import checkpoint as ckpt
from stages.core.run import distributed
from stages.core.run.distributed import World, broadcast_params

SHARD_CHOICES = ("none", "fsdp")
SHARDED_METHODS = ("lopd", "grpo")  # methods whose teacher / reference copies need no student shard
DCP_FOLDER = "sharded"  # a sharded checkpoint's DCP folder: student weights + optimizer state


def check_shard(config: Any, world_size: int) -> None:
    """Refuse ``--shard fsdp`` settings that cannot run (``config`` a DistillConfig).

    Raises:
        ValueError: one line naming the setting: a LoRA student (``--student-lora-rank 0``
            needed), an engine other than hf, a method outside :data:`SHARDED_METHODS`.
    """
    if config.shard == "none" or world_size == 1:
        return
    if config.student_lora_rank != 0:
        raise ValueError(f"--shard fsdp shards a fully fine-tuned student: add --student-lora-rank 0 "
                         f"(got {config.student_lora_rank}; a LoRA student is small enough to stay whole)")
    if config.engine != "hf":
        raise ValueError(f"--shard fsdp generates with the hf engine only (got --engine {config.engine})")
    if config.method not in SHARDED_METHODS:
        raise ValueError(f"--shard fsdp supports --method {', '.join(SHARDED_METHODS)} (got {config.method!r}: "
                         "its teacher copies of the student are not sharded yet)")


def check_resume(config: Any, w: World, checkpoint: Path | None, state: dict) -> None:
    """:func:`stages.core.run.distributed.check_resume` (refuse another number of processes than
    the checkpoint's), except for a sharded run (``--shard fsdp``, N > 1) resuming a sharded
    checkpoint: DCP reshards it on load.

    Raises:
        ValueError: see :func:`stages.core.run.distributed.check_resume`.
    """
    if config.shard == "fsdp" and w.size > 1 and checkpoint is not None and (Path(checkpoint) / DCP_FOLDER).is_dir():
        return
    distributed.check_resume(w, checkpoint, state)


def restore_rng(checkpoint: Path, w: World) -> None:
    """Restore this rank's RNG states from ``checkpoint`` (:func:`stages.core.run.checkpoint.restore_rng`;
    ``rng.pt`` with one process, ``rng-rank<r>.pt`` with several); a rank the checkpoint has no
    file for (a sharded run resumed with more processes) keeps its current state."""
    own = Path(checkpoint) / ckpt.RANK_RNG_FILE.format(rank=w.rank)
    if w.size == 1:
        ckpt.restore_rng(checkpoint)
    elif own.is_file() or not (Path(checkpoint) / DCP_FOLDER).is_dir():  # else: a new rank of a resharded run
        ckpt.restore_rng(checkpoint, rank=w.rank)


def shard_student(config: Any, w: World, student: Any, dtype: str) -> ShardedStudent | None:
    """Shard ``student`` (a :class:`stages.methods.Student`, full fine-tuning) over the ranks of
    ``w`` when ``config.shard == "fsdp"`` and ``w.size > 1``; None otherwise (nothing changes).

    Rank 0's weights are broadcast first (as DDP does), then every rank keeps its shard.
    ``student.params`` is replaced by the sharded parameters (build the optimizer after this).
    """
    if config.shard == "none" or w.size == 1:
        return None
    return ShardedStudent(student, w, getattr(torch, dtype))


def _layer_classes(model: nn.Module) -> tuple[type, ...]:
    """The decoder-layer classes of a Hugging Face model (its ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
    if not found:
        raise ValueError(f"{type(model).__name__}: no decoder layers to shard (no _no_split_modules)")
    return found


class ShardedStudent:
    """A fully fine-tuned student wrapped with ``fully_shard`` (module docstring).

    Args:
        student: the method's :class:`stages.methods.Student` (its model a plain HF model).
        w: this rank's world (size > 1, process group initialised).
        dtype: the run's compute dtype; float32 master weights when it is lower.

    Attributes:
        model: the student module (its class becomes ``FSDP<class>``; parameters DTensors).
        gather_s: seconds spent all-gathering / freeing the full weights for rollouts since
            the last :meth:`take_gather_seconds`.
    """

    def __init__(self, student: Any, w: World, dtype: torch.dtype) -> None:
        model = student.model
        if student.adapter is not None:
            raise ValueError("--shard fsdp shards a fully fine-tuned student (student_lora_rank=0)")
        broadcast_params(list(model.parameters()), w)
        policy = MixedPrecisionPolicy()
        if dtype != torch.float32:  # float32 master weights, the run dtype for compute
            model.float()
            policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        classes = _layer_classes(model)
        for layer in [m for m in model.modules() if isinstance(m, classes)]:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        self.units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for unit in self.units:  # each rank's loss is its share of the global loss: SUM the shares
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        student.params = list(model.parameters())
        self.model, self.world, self.dtype = model, w, dtype
        self.gather_s = 0.0

    # ------------------------------------------------------------------------- rollout --

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Inside: every layer holds its full parameters (all-gathered once, on every rank), so
        the ranks can run any number of forwards each (generation); freed again on exit."""
        t0 = time.perf_counter()
        for unit in self.units:
            unit.set_reshard_after_forward(False)
            unit.unshard()
        self.gather_s += time.perf_counter() - t0
        try:
            yield
        finally:
            t0 = time.perf_counter()
            for unit in self.units:
                unit.reshard()
                unit.set_reshard_after_forward(True)
            self.gather_s += time.perf_counter() - t0

    def take_gather_seconds(self) -> float:
        """Seconds spent in :meth:`gathered`'s gather / free since the last call (then 0)."""
        seconds, self.gather_s = self.gather_s, 0.0
        return seconds

    # --------------------------------------------------------------------------- update --

    def idle_pass(self, pad_token_id: int) -> None:
        """A forward and backward of one token whose loss is multiplied by 0: the collectives
        of one micro-batch on a rank that has no rows left (its gradient contribution is 0)."""
        device = next(self.model.parameters()).device
        ids = torch.tensor([[pad_token_id]], device=device)
        logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
        (logits.float().sum() * 0.0).backward()

    # ---------------------------------------------------------------------- checkpoints --

    def _holder(self, others: Sequence[nn.Parameter]) -> nn.Module:
        """The student and the optimizer's other parameters (composer ...) under one module, so
        that every optimizer parameter has a name in the DCP state (``student.*``, ``others.<i>``)."""
        holder = nn.Module()
        holder.student = self.model
        holder.others = nn.ParameterList(list(others))
        return holder

    def save(self, folder: Path, optimizer: torch.optim.Optimizer, others: Sequence[nn.Parameter]) -> Path:
        """Write the student's and the optimizer's sharded state to ``folder`` (DCP; every rank
        writes its shards, so ``folder`` must be on a file system all nodes share). Collective:
        call it on every rank."""
        model_sd, optim_sd = get_state_dict(self._holder(others), optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
        return Path(folder)

    def load(self, folder: Path, optimizer: torch.optim.Optimizer, others: Sequence[nn.Parameter]) -> None:
        """Restore what :meth:`save` wrote in ``folder`` into the student and ``optimizer``
        (DCP reshards on load). Collective."""
        holder = self._holder(others)
        model_sd, optim_sd = get_state_dict(holder, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(holder, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def exported(self) -> Any:
        """The student to export, gathered on rank 0 (collective; None on the other ranks):
        an object whose ``save_pretrained(folder)`` writes a plain HF model in the run dtype."""
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.world.is_main:
            return None
        return _Exported(self.model, {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in full.items()})


class _Exported:
    """A gathered student: ``save_pretrained`` writes ``state`` with ``model``'s config."""

    def __init__(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        self.model, self.state = model, state

    def save_pretrained(self, folder: Path) -> None:
        self.model.save_pretrained(folder, state_dict=self.state)


def place_checkpoint(staged: Path, folder: Path) -> None:
    """Move a staged DCP folder (:meth:`ShardedStudent.save`) into a checkpoint folder as
    :data:`DCP_FOLDER` (rank 0, inside :func:`stages.core.run.checkpoint.write_checkpoint`'s fill)."""
    os.rename(staged, Path(folder) / DCP_FOLDER)


def staging_folder(checkpoints: Path, step: int) -> Path:
    """Where every rank writes step ``step``'s DCP state before rank 0 moves it into the
    checkpoint (named like a checkpoint's temporary folder: a killed write is cleaned the same
    way, :func:`stages.core.run.checkpoint.clean_partial`)."""
    return Path(checkpoints) / f".step-{step}.tmp-{DCP_FOLDER}"


# ----------------------------------------------------------------------------- helpers --


def micro_batches(w: World, n_rows: int, micro_batch: int, padded: bool) -> list[tuple[int, int] | None]:
    """This rank's micro-batches ``(lo, hi)`` of its contiguous share of ``n_rows`` rows.

    ``padded`` (a sharded run): None entries pad the list to the largest count of any rank,
    so that every rank runs the same number of forwards and backwards.
    """
    lo, hi = w.span(n_rows)
    spans: list[tuple[int, int] | None] = [(a, min(a + micro_batch, hi)) for a in range(lo, hi, micro_batch)]
    if padded:
        most = max(math.ceil((b - a) / micro_batch)
                   for a, b in (World(rank=r, size=w.size).span(n_rows) for r in range(w.size)))
        spans += [None] * (most - len(spans))
    return spans


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def grad_norm(params: Sequence[nn.Parameter], w: World) -> float:
    """L2 norm of the gradients of ``params`` (missing gradients count as zero), in float64:
    the squared norms of sharded (DTensor) gradients are summed over the ranks, whole ones
    (already the same on every rank) are counted once."""
    if not any(isinstance(p.grad, DTensor) for p in params):  # a whole student: no collective
        grads = [p.grad.detach().double().pow(2).sum() for p in params if p.grad is not None]
        return float(torch.stack(grads).sum().sqrt()) if grads else 0.0
    sharded = torch.zeros((), dtype=torch.float64, device=w.device)
    whole = 0.0
    for p in params:
        if p.grad is None:
            continue
        sq = _local(p.grad).detach().double().pow(2).sum()
        if isinstance(p.grad, DTensor):
            sharded += sq.to(w.device)
        else:
            whole += float(sq)
    if w.size > 1:
        dist.all_reduce(sharded)
    return math.sqrt(float(sharded) + whole)


def clip_grad_norm_(params: Sequence[nn.Parameter], max_norm: float, w: World) -> float:
    """Scale the gradients of ``params`` in place so their joint L2 norm is at most
    ``max_norm`` (the rule of ``torch.nn.utils.clip_grad_norm_``: factor
    ``min(1, max_norm / (norm + 1e-6))``), for sharded and whole gradients; returns the norm."""
    if not any(isinstance(p.grad, DTensor) for p in params):  # a whole student: torch's own clipping
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    total = grad_norm(params, w)
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                _local(p.grad).mul_(coef)
    return total
