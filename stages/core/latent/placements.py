"""Latent placements: where the J*K latents c_phi go, in the teacher's forward and at generation.

A placement is one object behind :func:`get_placement` (name -> :class:`Placement`; the names
are the ``placement`` of a composer checkpoint and of `lopd coldstart`):

- ``"prefix"`` (:class:`Prefix`): one block of N latents per row right after the task prompt
  (before the first action token ``insert_at[b]``); one teacher forward per batch.
- ``"per-turn"`` (:class:`PerTurn`, exact Eq. 8 of the LOPD paper): for every turn t of row b
  the latents sit right before the action start ``action_starts[b][t]`` and the state s_t
  contains no other latent block, so turn t's logits (positions ``s_t - 1`` up to
  ``s_{t+1} - 2``) come from a forward on ``[s_t ; c_phi ; rest]``. One forward per turn
  index (all rows batched), T_turns forwards. At generation: at the end of every prompt.
- ``"framed"`` (:class:`Framed`, A.4 of the LOPD paper): the latents sit inside the first user
  message between two framing texts (:mod:`stages.core.latent.framing`); the teacher's prompt is that
  re-rendered prompt, the completion is the student's own ids. One forward per batch.

Each placement names the :class:`stages.core.latent.contexts.LatentBatch` fields its teacher forward
reads (:attr:`Placement.batch_fields`), splices the latents into the frozen teacher's input
(:meth:`Placement.teacher_logits`, aligned with the student as in :mod:`stages.core.latent.splice`),
and splits a prompt at generation into the ids before and after the latents
(:meth:`Placement.opening`, :meth:`Placement.prompt_parts`; used by
:class:`stages.engines.latent.LatentEngine`).

Adding a placement: subclass :class:`Placement` here and add an instance to the registry :data:`PLACEMENTS`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from stages.core.latent.framing import framed_opening_ids
from stages.core.latent.splice import aligned, reprefixed, spliced_logits
from stages.core.registry import Registry

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from schemas import Message


class Placement:
    """One latent placement (module docstring); stateless, one shared instance per name.

    Attributes:
        name: the registry name (``"prefix"``, ``"per-turn"``, ``"framed"``).
        batch_fields: the :class:`stages.core.latent.contexts.LatentBatch` fields (keyword arguments
            of :meth:`teacher_logits`) the teacher forward needs, in the order errors name them.
    """

    name: ClassVar[str]
    batch_fields: ClassVar[tuple[str, ...]]

    @property
    def needs_frame_ids(self) -> bool:
        """Whether batches must carry the framed teacher prompts (``build_batch(framed=...)``)."""
        return "frame_ids" in self.batch_fields

    def teacher_logits(self, teacher: nn.Module, input_ids_BT: Tensor, attn_mask_BT: Tensor, latents_BNd: Tensor,
                       *, hidden: bool = False, **fields: Any) -> Tensor:
        """Teacher logits_BTV (B, T, V) with the latents (B, N, d) placed, aligned with the student.

        Args:
            teacher: the frozen model (run with every adapter disabled).
            input_ids_BT: LongTensor (B, T), right-padded; attn_mask_BT: (B, T) bool or 0/1.
            hidden: return the decoder's last hidden states (B, T, d) at the same positions
                instead of logits (the LM head not applied).
            fields: the batch fields, by name (:attr:`batch_fields` must be given and not None;
                others are ignored).

        Raises:
            ValueError: a field of :attr:`batch_fields` is missing (all of them are named), or
                see the placement's forward (:func:`stages.core.latent.splice.spliced_logits`).
        """
        if any(fields.get(f) is None for f in self.batch_fields):
            raise ValueError(f"placement {self.name!r} needs {' and '.join(self.batch_fields)}")
        return self._logits(teacher, input_ids_BT, attn_mask_BT, latents_BNd, hidden,
                            *(fields[f] for f in self.batch_fields))

    def _logits(self, teacher: nn.Module, input_ids_BT: Tensor, attn_mask_BT: Tensor, latents_BNd: Tensor,
                hidden: bool, *batch_fields: Any) -> Tensor:
        raise NotImplementedError

    def opening(self, tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict],
                env: str, prompt_ids: list[int]) -> tuple[list[int], list[int]]:
        """An episode's opening prompt split at the latents: (ids before, ids after).

        Default: the latents follow the whole opening prompt (where the first action starts).
        """
        return list(prompt_ids), []

    def prompt_parts(self, prompt: list[int], opening_len: int, head: list[int],
                     tail: list[int]) -> tuple[list[int], list[int]]:
        """A prompt of the episode (it starts with the ``opening_len`` opening ids) split at the
        latents, given the opening's split ``(head, tail)``: (ids before, ids after).

        Default: the latents stay where the opening put them; the prompt's later ids follow.
        """
        return head, tail + prompt[opening_len:]


class Prefix(Placement):
    """Latents before each row's first action token (``insert_at_B``)."""

    name = "prefix"
    batch_fields = ("insert_at_B",)

    def _logits(self, teacher, input_ids_BT, attn_mask_BT, latents_BNd, hidden, insert_at_B):
        return spliced_logits(teacher, input_ids_BT, attn_mask_BT, latents_BNd, insert_at_B, hidden=hidden)


class PerTurn(Placement):
    """Latents before every action start (exact Eq. 8); at generation, at the end of every prompt."""

    name = "per-turn"
    batch_fields = ("action_starts",)

    def _logits(self, teacher, input_ids_BT, attn_mask_BT, latents_BNd, hidden, action_starts):
        """Turn t of each row is scored with the latents right before its action."""
        B, T = input_ids_BT.shape
        if len(action_starts) != B or any(not s for s in action_starts):
            raise ValueError("action_starts needs one non-empty list of action start indices per row")
        if any(later <= earlier for s in action_starts for earlier, later in zip(s, s[1:])):
            raise ValueError(f"action starts must be strictly increasing, got {action_starts}")
        out_BTV: Tensor | None = None
        for t in range(max(len(s) for s in action_starts)):
            rows = [b for b in range(B) if len(action_starts[b]) > t]
            ends = [action_starts[b][t + 1] if len(action_starts[b]) > t + 1 else T for b in rows]
            span = max(ends)  # tokens at or after a row's end do not affect its turn-t positions
            rows_R = torch.tensor(rows, device=input_ids_BT.device)
            starts_R = torch.tensor([action_starts[b][t] for b in rows], device=input_ids_BT.device)
            logits_RSV = spliced_logits(
                teacher, input_ids_BT[rows_R, :span], attn_mask_BT[rows_R, :span], latents_BNd[rows_R], starts_R,
                hidden=hidden)
            if out_BTV is None:
                out_BTV = logits_RSV.new_zeros(B, T, logits_RSV.shape[-1])
            for r, b in enumerate(rows):
                lo = 0 if t == 0 else action_starts[b][t] - 1
                hi = ends[r] - 1 if len(action_starts[b]) > t + 1 else T
                out_BTV[b, lo:hi] = logits_RSV[r, lo:hi]
        return out_BTV

    def prompt_parts(self, prompt, opening_len, head, tail):
        """The latents follow the whole prompt (right before the action it asks for)."""
        return prompt, []


class Framed(Placement):
    """Latents inside the first user message, between the framing texts (:mod:`stages.core.latent.framing`).

    ``frame_ids``: per row, the teacher prompt's ids before and after the latent span
    (:func:`stages.core.latent.framing.framed_prompt_ids`); the row's tokens from ``insert_at_B[b]``
    (its first action) on follow them. Positions before ``insert_at_B[b] - 1`` are never
    supervised and hold teacher-prompt logits.
    """

    name = "framed"
    batch_fields = ("frame_ids", "insert_at_B")

    def _logits(self, teacher, input_ids_BT, attn_mask_BT, latents_BNd, hidden, frame_ids, insert_at_B):
        """Teacher logits on ``head_b ; c_phi ; tail_b ; completion_b``, aligned with the student."""
        B, T = input_ids_BT.shape
        if len(frame_ids) != B:
            raise ValueError(f"frame_ids needs one (head, tail) pair per row: {len(frame_ids)} for {B} rows")
        ids_BS, mask_BS, shift_B = reprefixed(input_ids_BT, attn_mask_BT, insert_at_B,
                                              [head + tail for head, tail in frame_ids])
        head_B = torch.tensor([len(head) for head, _ in frame_ids], device=input_ids_BT.device)
        return aligned(spliced_logits(teacher, ids_BS, mask_BS, latents_BNd, head_B, hidden=hidden), shift_B, T)

    def opening(self, tokenizer, messages, tools, env, prompt_ids):
        """The opening prompt re-rendered with the framing (:func:`stages.core.latent.framing.framed_opening_ids`)."""
        return framed_opening_ids(tokenizer, messages, tools, env)


PLACEMENTS: Registry[Placement] = Registry("placement", sort=False)
for _placement in (Prefix(), PerTurn(), Framed()):
    PLACEMENTS.add(_placement.name, _placement)


def get_placement(name: str) -> Placement:
    """The placement registered as ``name``.

    Raises:
        ValueError: an unknown name (the known ones are listed).
    """
    return PLACEMENTS[name]
