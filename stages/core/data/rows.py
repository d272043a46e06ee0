"""Training rows: the token sequences a trajectory trains on, and their padded batch tensors.

A :class:`TrainRow` holds the ids the policy was conditioned on and sampled, as rollout recorded
them (:func:`training_rows`), with the action mask True exactly on sampled ids; :func:`pad_rows`
collates rows on the host (CPU; recorded log-probs in float64) and moves them to the model's
device in one copy per tensor. Rows of earlier releases carry no token ids; they are
re-tokenized from their text with :func:`stages.core.text.chat.tokenize_for_training` (a warning once
per process).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from schemas import Trajectory
from stages.core.text.chat import action_spans, tokenize_for_training, tokenizer_fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that pads a batch: the tokenizer's pad id, else its eos id, else 0."""
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    return int(pad) if pad is not None else 0


def trajectory_tools(traj: Trajectory) -> list[dict[str, Any]]:
    """The tool schemas recorded for ``traj`` by rollout (``info["tools"]``), else ``[]``."""
    tools = json.loads(traj.info).get("tools", []) if traj.info else []
    return tools if isinstance(tools, list) else []


@dataclass(frozen=True)
class TrainRow:
    """One training sequence of a trajectory (most trajectories have exactly one).

    Attributes:
        trajectory: the trajectory it comes from.
        ids_T: LongTensor (T,), context and sampled ids in order.
        mask_T: BoolTensor (T,), True exactly on the sampled action ids.
        logprobs_T: float64 (T,), the sampling log-prob of each sampled id (nats, as the
            rollout engine recorded it), NaN where none was recorded (context, older rows,
            replayed references).
        first_turn: index of the trajectory's turn whose action this sequence starts with.
    """

    trajectory: Trajectory
    ids_T: Tensor
    mask_T: Tensor
    logprobs_T: Tensor
    first_turn: int = 0


_warned_retokenize = False


def trajectory_sequences(tokenizer: PreTrainedTokenizerBase, traj: Trajectory,
                         tools: list[dict[str, Any]] | None = None) -> list[tuple[Tensor, Tensor, Tensor, int]]:
    """The token sequences ``(ids_T, mask_T, logprobs_T, first_turn)`` a trajectory trains on.

    From the recorded ids (:class:`schemas.Turn`): ``context_ids`` then ``token_ids`` of each
    turn, in order; a turn with ``context_restart`` starts a new sequence. The mask is True on
    exactly the sampled ids: no template token is supervised that the policy did not sample (a
    truncated action has no end-of-turn token). ``logprobs_T`` holds the recorded sampling
    log-probs on sampled ids, NaN elsewhere. A trajectory of an earlier release (no ids) is
    re-tokenized from its messages (one sequence, no log-probs; warns once per process), and so
    is one whose ids come from another tokenizer (``traj.tokenizer`` differs: e.g. reference
    rows collected with another model).

    Raises:
        ValueError: no turn (nothing to train on).
    """
    global _warned_retokenize
    if not traj.turns:
        raise ValueError(f"trajectory {traj.trajectory_id}: no action tokens (no turn)")
    nan = float("nan")
    if not all(t.has_tokens for t in traj.turns) or traj.tokenizer != tokenizer_fingerprint(tokenizer):
        if not _warned_retokenize:
            warnings.warn("some trajectories hold no token ids of this tokenizer (an earlier "
                          "release, or another model's rollouts): they are re-tokenized from "
                          "their text", stacklevel=2)
            _warned_retokenize = True
        ids_T, mask_T = tokenize_for_training(tokenizer, traj.messages,
                                              trajectory_tools(traj) if tools is None else tools)
        return [(ids_T, mask_T, torch.full(ids_T.shape, nan, dtype=torch.float64, device="cpu"), 0)]
    seqs: list[tuple[list[int], list[bool], list[float], int]] = []
    for k, turn in enumerate(traj.turns):
        if k == 0 or turn.context_restart:
            seqs.append(([], [], [], k))
        ids, mask, logp, _ = seqs[-1]
        ids += turn.context_ids + turn.token_ids
        mask += [False] * len(turn.context_ids) + [True] * len(turn.token_ids)
        logp += [nan] * len(turn.context_ids) + (turn.logprobs or [nan] * len(turn.token_ids))
    return [(torch.tensor(i, dtype=torch.long, device="cpu"), torch.tensor(m, dtype=torch.bool, device="cpu"),
             torch.tensor(lp, dtype=torch.float64, device="cpu"), k) for i, m, lp, k in seqs]


def training_rows(tokenizer: PreTrainedTokenizerBase, trajectories: list[Trajectory], *,
                  max_len: int | None = None, tools: list[list[dict]] | None = None,
                  skip_too_long: bool = True) -> tuple[list[TrainRow], list[str]]:
    """All training sequences of ``trajectories``, each cut to ``max_len`` tokens.

    A sequence whose prompt alone (everything before its first sampled id) fills ``max_len``
    has no action token left: with ``skip_too_long`` it is skipped and its trajectory id
    returned in the second list (callers count it in their metrics), else ValueError. Longer
    sequences keep their first ``max_len`` tokens.

    Raises:
        ValueError: a trajectory without action tokens, or (``skip_too_long=False``) one whose
            prompt fills ``max_len`` (the trajectory id is named).
    """
    if max_len is not None and max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    rows: list[TrainRow] = []
    skipped: list[str] = []
    for b, traj in enumerate(trajectories):
        for ids_T, mask_T, logp_T, first in trajectory_sequences(tokenizer, traj, None if tools is None else tools[b]):
            spans = action_spans(mask_T)
            if not spans:
                raise ValueError(f"trajectory {traj.trajectory_id}: no action tokens (no assistant message)")
            if max_len is not None and spans[0][0] >= max_len:
                if skip_too_long:
                    skipped.append(traj.trajectory_id)
                    continue
                raise ValueError(f"trajectory {traj.trajectory_id}: the prompt alone is {spans[0][0]} "
                                 f"tokens, max_len={max_len} leaves no action token; raise max_len")
            rows.append(TrainRow(traj, ids_T[:max_len], mask_T[:max_len], logp_T[:max_len], first))
    return rows, skipped


def pad_rows(tokenizer: PreTrainedTokenizerBase, rows: list[TrainRow],
             device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Training rows as right-padded batch tensors on ``device`` (the model's).

    Collated on the host, then moved with one copy per tensor.

    Returns:
        ids_BT: LongTensor (B, T), padded with the tokenizer's pad id (else eos, else 0).
        attn_BT: BoolTensor (B, T), True on real tokens.
        mask_BT: BoolTensor (B, T), True on sampled action ids.
        logprobs_BT: float64 (B, T), recorded sampling log-probs, NaN elsewhere.
        insert_at_B: LongTensor (B,), each row's first action index (where a prefix context ends).

    Raises:
        ValueError: no rows.
    """
    if not rows:
        raise ValueError("pad_rows: no rows")
    B, T = len(rows), max(len(r.ids_T) for r in rows)
    ids_BT = torch.full((B, T), pad_id(tokenizer), dtype=torch.long, device="cpu")
    attn_BT = torch.zeros((B, T), dtype=torch.bool, device="cpu")
    mask_BT = torch.zeros((B, T), dtype=torch.bool, device="cpu")
    logprobs_BT = torch.full((B, T), float("nan"), dtype=torch.float64, device="cpu")
    for b, r in enumerate(rows):
        n = len(r.ids_T)
        ids_BT[b, :n], attn_BT[b, :n], mask_BT[b, :n], logprobs_BT[b, :n] = r.ids_T, True, r.mask_T, r.logprobs_T
    insert_at_B = torch.tensor([action_spans(r.mask_T)[0][0] for r in rows], dtype=torch.long, device="cpu")
    return tuple(t.to(device) for t in (ids_BT, attn_BT, mask_BT, logprobs_BT, insert_at_B))
