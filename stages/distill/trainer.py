"""The trained state of a distill run: one optimizer update of a step (the method's loss on
micro-batches with gradients accumulated exactly, the gradient norms before clipping, clipping,
the optimizer step) and its checkpoints (write, restore).

One path for a plain, a data-parallel and a sharded student: the run layer's world-aware
functions (:mod:`stages.core.run.distributed`, :mod:`stages.core.run.sharding`) do what differs.
Each process runs its contiguous share of the rows, each micro-batch weighted by its share of
ALL the step's rows (the methods' own normalisers come from the global batch too); gradients and
loss metrics are summed over the processes, so the update is the single-process one.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from stages.core.models.assembly import save_student
from stages.core.models.backbone import compute_autocast
from stages.core.run import checkpoint as ckpt
from stages.core.run import distributed, resources, sharding
from stages.core.run.distributed import World
from stages.methods import Method, StepBatch


@dataclass
class Trainer:
    """What an update needs of a run: its method, trainable parameter groups (``{"student": ...,
    "composer": ...}``, in optimizer order), optimizer, processes and sharded student (None when
    the student is whole), the run folder (named in errors) and the seconds of each phase of the
    current step (``forward_s``, ``backward_s``, ``optimizer_s``; :meth:`update` adds to them)."""

    method: Method
    groups: dict[str, list[torch.nn.Parameter]]
    optimizer: torch.optim.Optimizer
    world: World
    shard: sharding.ShardedStudent | None
    out: Path
    phases: dict[str, float] = field(default_factory=dict)

    def params(self) -> list[torch.nn.Parameter]:
        return [p for params in self.groups.values() for p in params]

    def unsharded_params(self) -> list[torch.nn.Parameter]:
        """The trainable parameters outside the student (composer ...), in optimizer order."""
        return [p for name, params in self.groups.items() if name != "student" for p in params]

    def restore(self, checkpoint: Path) -> None:
        """The optimizer state (and a sharded student's weights) saved in ``checkpoint``."""
        if self.shard is not None:
            self.shard.load(checkpoint / sharding.DCP_FOLDER, self.optimizer, self.unsharded_params())
            return
        with ckpt.readable(checkpoint / ckpt.OPTIMIZER_FILE, "optimizer state"):
            saved = torch.load(checkpoint / ckpt.OPTIMIZER_FILE, map_location=self.method.device)
            self.optimizer.load_state_dict(saved)

    def save_checkpoint(self, step: int, state: dict, keep: int) -> Path:
        """Write ``out/checkpoints/step-<step>`` (student, method modules, optimizer, ``state``, RNG).

        Data-parallel: every process calls it; rank 0 writes the folder with every rank's RNG
        state (``rng-rank<r>.pt``); a sharded student is written by every rank (DCP) and moved
        in by rank 0. Returns the folder on every process.
        """
        staged = None
        if self.shard is not None:
            staged = self.shard.save(sharding.staging_folder(self.out / ckpt.CHECKPOINTS, step),
                                     self.optimizer, self.unsharded_params())
        student = self.method.student

        def fill(folder: Path) -> None:
            if staged is not None:
                sharding.place_checkpoint(staged, folder)
            else:
                save_student(folder, student=student.model, adapter=student.adapter,
                             tokenizer=student.tokenizer, optimizer=self.optimizer)
            self.method.save(folder)
        rngs = distributed.gather_to_main(ckpt.capture_rng(), self.world) if self.world.size > 1 else None
        folder = (ckpt.write_checkpoint(self.out, step, fill, state, keep, rank_rngs=rngs)
                  if self.world.is_main else None)
        return distributed.broadcast(folder, self.world)

    def _forwards(self):
        """The context of the update's forwards: a whole student keeps float32 weights under a
        bf16/fp16 run (:func:`stages.core.models.assembly.load_student`) and computes in the run
        dtype under autocast; a LoRA student's forwards run as they are."""
        if self.method.student.adapter is not None:
            return contextlib.nullcontext()
        return compute_autocast(self.method.device, self.method.dtype)

    def _timed(self, phase: str, t0: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - t0

    def update(self, step: int, batch: StepBatch, micro_batch: int, grad_clip: float
               ) -> tuple[dict[str, float], dict[str, float]]:
        """Run one update on ``batch.rows``; returns the summed loss metrics (with ``loss`` and
        ``action_tokens``) and the grad norms ``{"grad_norm_<group>": float}``.

        Raises:
            FloatingPointError: a non-finite loss or gradient on any process ("... last good
                checkpoint: DIR").
        """
        rows, method = batch.rows, self.method
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"loss": 0.0, "action_tokens": 0.0}
        finite = True
        # sharded: every rank runs as many forwards and backwards as the others (None = an idle pass)
        spans = sharding.micro_batches(self.world, len(rows), micro_batch, padded=self.shard is not None)
        mine = [span for span in spans if span is not None]
        begun = self.shard is None and bool(mine)  # a method's whole-share pass needs a whole student
        if begun:
            t0 = time.perf_counter()
            lo, hi = mine[0][0], mine[-1][1]  # this process's contiguous share
            with self._forwards():
                method.begin_update(rows[lo:hi], batch.extras[lo:hi])
            self._timed("forward_s", t0)
        for span in spans:
            if span is None or not finite:  # sharded only (a whole student stops at a non-finite loss)
                self.shard.idle_pass(method.student.tokenizer.pad_token_id)
                continue
            lo, hi = span
            part = rows[lo:hi]
            t0 = time.perf_counter()
            with self._forwards():
                loss, m = method.loss(part, batch.extras[lo:hi], len(part) / len(rows))
            self._timed("forward_s", t0)
            finite = bool(torch.isfinite(loss))
            if not finite and self.shard is None:
                break
            if not finite:  # a sharded backward is a collective: run it (the step then fails below)
                loss = loss * 0.0
            self._assert_requires_grad()
            t0 = time.perf_counter()
            with resources.transient_blocks():  # a backward's gradient temporaries die within it
                loss.backward()
            self._timed("backward_s", t0)
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            sums["loss"] += float(loss.detach())
            sums["action_tokens"] += sum(int(r.mask_T.sum()) for r in part)
        if begun and finite:
            self._assert_requires_grad()
            t0 = time.perf_counter()
            with resources.transient_blocks():
                method.end_update()
            self._timed("backward_s", t0)
        if distributed.any_rank(not finite, self.world):
            raise FloatingPointError(f"non-finite loss at step {step}; last good checkpoint: "
                                     f"{ckpt.latest_checkpoint(self.out) or 'none'}")
        t0 = time.perf_counter()
        sums = distributed.sum_floats(sums, self.world)
        distributed.all_reduce_grads(self.params(), self.world)
        self._timed("backward_s", t0)
        t0 = time.perf_counter()
        norms = {f"grad_norm_{name}": sharding.grad_norm(params, self.world) for name, params in self.groups.items()}
        if not all(math.isfinite(v) for v in norms.values()):
            raise FloatingPointError(f"non-finite gradient at step {step}; last good checkpoint: "
                                     f"{ckpt.latest_checkpoint(self.out) or 'none'}")
        if grad_clip > 0:
            sharding.clip_grad_norm_(self.params(), grad_clip, self.world)
        if rows:
            self.optimizer.step()
        self._timed("optimizer_s", t0)
        return sums, norms

    def _assert_requires_grad(self) -> None:
        """peft's set_adapter/disable_adapter flip requires_grad of the other adapters, and autograd
        reads the flag at backward: re-assert it, or an adapter silently gets no gradient."""
        for p in self.params():
            p.requires_grad_(True)
