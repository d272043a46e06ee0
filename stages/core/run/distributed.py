"""Data-parallel training of `lopd distill` over N processes (``torchrun`` or ``--nproc N``).

A :class:`World` is this process's place in the group. Without ``torchrun`` (or with one
process) it is rank 0 of 1 and every function here is the identity: no process group, no
communication, exactly the single-process run.

With N processes (the process group is set up from torchrun's environment variables ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``; backend gloo on the CPU,
nccl on CUDA), one step of the distill loop is:

1. each rank rolls out its contiguous share of the step's tasks (:func:`share`);
2. the trajectories are gathered in rank order on every rank (:func:`gather_lists`), so every
   rank holds the same global batch, the one a single process would have built from the same
   rollouts; every rank builds the training rows and runs the method's ``prepare`` on all of
   them, so the step-level normalisers of every method (rows, tokens, rows with a context, GRPO
   groups) are the global ones;
3. each rank runs the forward/backward of its contiguous share of the rows (:meth:`World.span`)
   with those global normalisers, so its loss is its exact share of the global loss, and the
   gradients are summed over ranks (:func:`all_reduce_grads`): every rank then holds the
   gradient of the single-process loss on the global batch (up to float summation order), takes
   the same optimizer step and keeps identical weights, optimizer state and method scalars
   (LOPD's beta, EMA teachers);
4. rank 0 alone writes the store, metrics and checkpoints; each rank's RNG state goes into the
   checkpoint as a file of its own.

Why the gradients are summed after the backward passes rather than by wrapping the modules in
DDP: one micro-batch runs several forwards of the same backbone under different adapters
(student, composer, teacher), the ranks run different numbers of micro-batches (a rank may have
none), and a DDP reducer expects one forward/backward per iteration and the same number on
every rank. The cost: ``prepare`` (retrieval, references) runs on every rank over the whole
batch, and the gradients travel once per update, not overlapped with the backward pass.
Equality with one process also needs the loss to be deterministic per row (no dropout: the
LoRA adapters here use none).

Communication is torch.distributed only (all_gather_object, gather_object, broadcast,
all_reduce, barrier). A failing rank stops the whole group through torchrun.
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

T = TypeVar("T")
BUCKET_NUMEL = 1 << 24  # gradient elements per all_reduce call (64 MiB of float32)


@dataclass(frozen=True)
class World:
    """This process's place in the data-parallel group.

    Attributes:
        rank: 0..size-1 (0 writes the run's files).
        size: number of processes (1 = no process group).
        local_rank: rank on this node (the CUDA device index under nccl).
        device: where collective tensors live (cpu for gloo, the local CUDA device for nccl).
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the store, metrics and checkpoints."""
        return self.rank == 0

    def span(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share ``[lo, hi)`` of ``n`` items (sizes differ by at most 1,
        lower ranks take the extra items); ``(0, n)`` with one process."""
        base, extra = divmod(n, self.size)
        lo = self.rank * base + min(self.rank, extra)
        return lo, lo + base + (self.rank < extra)


def world(device_type: str | None = None) -> World:
    """This process's :class:`World`, setting up the process group on first use under torchrun
    (torn down when the process exits, so several runs in one process share it).

    Args:
        device_type: "cuda" (nccl) or "cpu" (gloo); None = cuda when available.

    Returns:
        ``World()`` (rank 0 of 1) when ``WORLD_SIZE`` is unset or 1; else the group's world.

    Raises:
        RuntimeError: torchrun's rendezvous variables are incomplete, or nccl without CUDA.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        atexit.register(shutdown)
    return World(rank=rank, size=size, local_rank=local_rank, device=device)


def check_split(w: World, method_cls: Any, tasks_per_step: int) -> None:
    """Refuse a data-parallel run that the method (``data_parallel`` False: its step writes the
    store) or the batch (fewer tasks per step than processes) cannot split.

    Raises:
        ValueError: one line naming the method or the --tasks-per-step flag.
    """
    if w.size == 1:
        return
    if not method_cls.data_parallel:
        raise ValueError(f"method {method_cls.name!r} cannot train data-parallel (its step writes the "
                         "store): run it in one process")
    if tasks_per_step < w.size:
        raise ValueError(f"--tasks-per-step {tasks_per_step} < {w.size} processes: every process needs "
                         "at least one task per step")


def check_resume(w: World, checkpoint: Path | None, state: dict) -> None:
    """Refuse to resume ``checkpoint`` (its ``state.json`` ``state``; ``world_size`` absent = 1)
    with another number of processes than wrote it.

    Raises:
        ValueError: the numbers differ (the file, field and the --nproc to use named).
    """
    saved = state.get("world_size", 1)
    if checkpoint is not None and saved != w.size:
        raise ValueError(f"{Path(checkpoint) / 'state.json'}: field 'world_size' is {saved}, but this run has "
                         f"{w.size} process(es): resume with the same number (--nproc {saved})")


def shutdown() -> None:
    """Tear the process group down (no-op without one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def share(items: Sequence[T], w: World) -> list[T]:
    """This rank's contiguous share of ``items`` (:meth:`World.span`); all of them with one process."""
    lo, hi = w.span(len(items))
    return list(items[lo:hi])


def gather_lists(items: list[T], w: World) -> list[T]:
    """Every rank's ``items`` concatenated in rank order, on every rank (all_gather_object)."""
    if w.size == 1:
        return items
    parts: list[Any] = [None] * w.size
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def gather_to_main(obj: T, w: World) -> list[T] | None:
    """Every rank's ``obj`` in rank order on rank 0 (gather_object); None on the other ranks."""
    if w.size == 1:
        return [obj]
    parts: list[Any] | None = [None] * w.size if w.is_main else None
    dist.gather_object(obj, parts, dst=0)
    return parts


def broadcast(obj: T, w: World) -> T:
    """Rank 0's ``obj`` on every rank (broadcast_object_list)."""
    if w.size == 1:
        return obj
    box = [obj if w.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(w: World) -> None:
    """Wait until every rank got here (e.g. until rank 0 wrote the store)."""
    if w.size > 1:
        dist.barrier()


def sum_floats(values: dict[str, float], w: World) -> dict[str, float]:
    """Per key, the sum over ranks of ``values`` (a key missing on a rank counts 0); every rank
    adds the same numbers in rank order, so every rank gets the same result."""
    if w.size == 1:
        return values
    parts: list[Any] = [None] * w.size
    dist.all_gather_object(parts, values)
    keys = list(dict.fromkeys(k for part in parts for k in part))
    return {k: sum(float(part.get(k, 0.0)) for part in parts) for k in keys}


def any_rank(flag: bool, w: World) -> bool:
    """True when ``flag`` is True on any rank (all_reduce MAX)."""
    if w.size == 1:
        return flag
    t = torch.tensor([float(flag)], device=w.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def broadcast_params(params: Sequence[torch.nn.Parameter], w: World) -> None:
    """Overwrite ``params`` with rank 0's values (as DDP does at construction), in place.
    Sharded (DTensor) parameters are left alone: each rank holds its own shard
    (:mod:`stages.core.run.sharding` broadcasts before sharding)."""
    if w.size == 1:
        return
    with torch.no_grad():
        for p in _whole(params):
            data = p.data.to(w.device)
            dist.broadcast(data, src=0)
            if data is not p.data:
                p.data.copy_(data)


def all_reduce_grads(params: Sequence[torch.nn.Parameter], w: World) -> None:
    """Sum the gradients of ``params`` over ranks, in place (all_reduce SUM, bucketed).

    A parameter without a gradient on some ranks counts as zero there; one without a gradient
    on every rank keeps ``grad=None`` (the optimizer then skips it, as in a single process).
    Each rank's loss must already be its share of the global loss (global normalisers), so the
    sum is the global gradient. Sharded (DTensor) parameters are skipped: their backward
    reduce-scattered them already (:mod:`stages.core.run.sharding`).
    """
    params = _whole(params)
    if w.size == 1 or not params:
        return
    has = torch.tensor([float(p.grad is not None) for p in params], device=w.device)
    dist.all_reduce(has)
    for p, n in zip(params, has.tolist()):
        if n > 0 and p.grad is None:
            p.grad = torch.zeros_like(p)
    live = [p for p in params if p.grad is not None]
    groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
    for p in live:
        groups.setdefault((p.grad.device, p.grad.dtype), []).append(p)
    for group in groups.values():
        bucket: list[torch.nn.Parameter] = []
        numel = 0
        for p in group:
            if bucket and numel + p.numel() > BUCKET_NUMEL:
                _reduce_bucket(bucket, w)
                bucket, numel = [], 0
            bucket.append(p)
            numel += p.numel()
        if bucket:
            _reduce_bucket(bucket, w)


def _whole(params: Sequence[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """``params`` without the sharded (DTensor) ones."""
    return [p for p in params if not isinstance(p, DTensor)]


def _reduce_bucket(bucket: list[torch.nn.Parameter], w: World) -> None:
    flat = torch.cat([p.grad.reshape(-1) for p in bucket]).to(w.device)  # (sum numel,)
    dist.all_reduce(flat)
    offset = 0
    for p in bucket:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


# ----------------------------------------------------------------------------- launcher --


def torchrun_command(nproc: int, argv: Sequence[str], module: str | None = None) -> list[str]:
    """The command that runs ``python -m MODULE ARGV`` in ``nproc`` processes on this node.

    ``module`` None = the module this process was started as (``python -m X`` -> X, so a
    wrapper module that sets things up keeps doing so in the workers), else ``lopd_cli``.
    Uses ``torch.distributed.run`` (= ``torchrun``) with a standalone rendezvous on a free port.
    """
    if module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None and spec.name else "lopd_cli"
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", module, *argv]


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Run ``lopd ARGV`` in ``nproc`` data-parallel processes (:func:`torchrun_command`);
    returns torchrun's exit status.

    Raises:
        ValueError: ``nproc`` < 1, or this process already runs under torchrun.
    """
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("--nproc inside torchrun: give the processes to torchrun (--nproc_per_node) only")
    return subprocess.call(torchrun_command(nproc, argv))
