"""The text teacher's top-M targets of each cold-start training target, computed once and reused.

The text teacher (:func:`stages.core.latent.teacher.text_teacher_logits`: the frozen backbone
reading a target's composer input rows as plain text where the latents go) is the same at every
step for a given target: its weights are frozen and the target's retrieved experiences are fixed.
So its top-M log-probs and tail mass at the target's action tokens
(:func:`stages.core.losses.topm_kl.teacher_top_m`) are computed the first time the target is
trained on and read back afterwards: a text-KL step then costs one text-teacher forward per new
target instead of one per target and step.

Key of a target: sha256 over everything the text teacher's forward reads (the target's token ids
and length, its composer input rows, its framed prompt ids, the placement) and M. The folder
holds one namespace per backbone (the sha256 of its base weights, given by the caller), so other
weights never read these targets. Each target is one safetensors file (``logp`` (N, M) float32,
``ids`` (N, M) int64, ``tail`` (N,) float32 at its N action tokens), written atomically; a file
that cannot be read is computed again.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from stages.core.latent.contexts import LatentBatch, shift_for_loss
from stages.core.latent.teacher import text_teacher_logits
from stages.core.losses.topm_kl import teacher_top_m

TopM = tuple[Tensor, Tensor, Tensor]  # (logp_NM float32, ids_NM int64, tail_logp_N float32)


def row_key(batch: LatentBatch, b: int, placement: str, M: int) -> str:
    """The sha256 hex key of row b's text-teacher targets (module docstring)."""
    h = hashlib.sha256(f"{placement}|{M}|".encode())
    length = int(batch.attn_mask_BT[b].sum())
    h.update(batch.input_ids_BT[b, :length].cpu().numpy().tobytes())
    h.update(b"|mask|" + batch.action_mask_BT[b, :length].cpu().numpy().tobytes())
    for ids_L, mask_L in zip(batch.exp_ids_BJL[b], batch.exp_mask_BJL[b]):
        h.update(b"|row|" + ids_L[mask_L.bool()].cpu().numpy().tobytes())
    if batch.frame_ids is not None:
        before, after = batch.frame_ids[b]
        h.update(f"|frame|{before}|{after}".encode())
    return h.hexdigest()


class TextTargets:
    """The text teacher's top-M targets, per training target, cached in ``folder / namespace``.

    Args:
        folder: where the targets are kept (a run's ``text_teacher/``); None keeps them in memory only.
        namespace: the backbone's identity (e.g. the sha256 of its base weights).
        M: the teacher's tokens kept per position (plus the tail bucket).
    """

    def __init__(self, folder: Path | None, namespace: str, M: int) -> None:
        if M < 1:
            raise ValueError(f"M must be at least 1, got {M}")
        self.folder = None if folder is None else Path(folder) / namespace
        self.M = M
        self.memory: dict[str, TopM] = {}
        self.computed = 0  # rows whose text-teacher forward ran (not read back)

    def _path(self, key: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{key}.safetensors"

    def _read(self, key: str, device: torch.device) -> TopM | None:
        if key in self.memory:
            return self.memory[key]
        path = self._path(key)
        if path is None or not path.is_file():
            return None
        try:
            t = load_file(str(path), device=str(device))
            got = (t["logp"], t["ids"], t["tail"])
        except (OSError, KeyError, RuntimeError, ValueError, SafetensorError):  # a torn or foreign file: compute it again
            return None
        self.memory[key] = got
        return got

    def _write(self, key: str, got: TopM) -> None:
        self.memory[key] = got
        path = self._path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        save_file({"logp": got[0].contiguous().cpu(), "ids": got[1].contiguous().cpu(),
                   "tail": got[2].contiguous().cpu()}, str(tmp))
        os.replace(tmp, path)

    @torch.no_grad()
    def of_batch(self, backbone: nn.Module, batch: LatentBatch, placement: str) -> TopM:
        """The targets at the batch's action tokens, rows in order and each row's tokens in order
        (the positions of ``shift_for_loss(...)[2]``, the mask, taken row-major): ``(logp (N, M),
        ids (N, M), tail (N,))``, N the batch's action tokens. Rows not kept yet run the text teacher."""
        device = batch.input_ids_BT.device
        parts: list[TopM] = []
        for b in range(batch.input_ids_BT.shape[0]):
            key = row_key(batch, b, placement, self.M)
            got = self._read(key, device)
            if got is None:
                row = batch.row(b)
                logits, _, mask = shift_for_loss(text_teacher_logits(backbone, row, placement), row)
                got = teacher_top_m(logits[mask.bool()], self.M)
                self._write(key, got)
                self.computed += 1
            parts.append(got)
        return tuple(torch.cat([p[i].to(device) for p in parts]) for i in range(3))  # type: ignore[return-value]
