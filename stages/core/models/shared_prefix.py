"""A training forward that encodes once the prefix several rows share (the G rollouts of a task).

The G rollouts of one task start with the same prompt (system message, tool docs, the task),
often most of each row's tokens, and a teacher view puts the same privileged prompt (LOPD's: the
same latent tokens, spliced into the same prompt) in front of each of them. In a causal LM a row's outputs at its first P positions depend on those P tokens
only, so rows that start with the same P tokens have the same outputs there.
:func:`prefix_groups` finds such rows in a right-padded batch; :func:`shared_prefix_outputs`
runs each group's prefix once (batch 1, KV cache on), lets the group's rows attend to its keys
and values (expanded, not copied) while their remaining tokens run, and puts the prefix's
outputs in front of theirs. Rows in no group run together in one plain forward.

The rows are token ids or input embeddings (B, T, d); for embeddings, :func:`position_keys`
turns each position's vector into an id first (equal vectors, equal ids).

Values equal the plain batched forward's up to float rounding (the matmuls have other shapes);
position ids are the same (the suffix continues at P). Gradients reach the prefix's
activations once per group, summed over its rows, as autograd sums any tensor used twice: the
same gradients as G separate copies of the prefix (for embeddings: the gradient of the group's
prefix embeddings reaches the first row's copy only, which is the same total wherever the rows'
copies come from one computation, as a task's latents do, or from identical ones). Memory: the prefix's activations are kept
once per group instead of once per row.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

# a row joins a group when it shares at least this many leading tokens with the group's first row
MIN_SHARED_TOKENS = 32
# a group is encoded apart only when it saves at least this many positions: (rows - 1) x prefix
MIN_SAVED_POSITIONS = 128


def prefix_groups(input_ids_BT: Tensor, lengths_B: list[int], min_shared: int = MIN_SHARED_TOKENS,
                  min_saved: int = MIN_SAVED_POSITIONS) -> list[tuple[list[int], int]]:
    """Rows of a right-padded batch grouped by a shared prefix: ``[(rows, P), ...]``.

    Greedy, in row order: a row joins the group (first row = leader) with which it shares the
    longest prefix, if that prefix has at least ``min_shared`` tokens and, for a group of two or
    more rows, is not shorter than the group's prefix P (a join never shrinks what the group
    shares); a leader's first follower sets P. P never includes a row's last token, so every row
    keeps at least one position of its own. Groups saving fewer than ``min_saved`` positions
    ((rows - 1) x P) are dropped; their rows, and rows in no group, are not returned.

    Args:
        input_ids_BT: LongTensor (B, T).
        lengths_B: each row's number of real tokens (right padding after them).

    Returns:
        Groups as (row indices in increasing order, P), in the order of their first rows.
    """
    ids = input_ids_BT.cpu()
    groups: list[tuple[list[int], int]] = []  # (rows, P); P = 0 while the leader is alone
    for b in range(len(lengths_B)):
        best, best_common = None, 0
        for g, (rows, size) in enumerate(groups):
            lead = rows[0]
            n = min(lengths_B[b], lengths_B[lead]) - 1
            if n < min_shared:
                continue
            common = int((ids[b, :n] == ids[lead, :n]).to(torch.int64).cumprod(0).sum())
            if common >= min_shared and (len(rows) == 1 or common >= size) and common > best_common:
                best, best_common = g, common
        if best is None:
            groups.append(([b], 0))
        else:
            rows, size = groups[best]
            groups[best] = (rows + [b], best_common if len(rows) == 1 else size)
    return [(rows, size) for rows, size in groups if (len(rows) - 1) * size >= min_saved]


def position_keys(seq_BT: Tensor) -> Tensor:
    """(B, T) int64 keys, equal where the rows' entries are equal: token ids (B, T) as they are;
    for input embeddings (B, T, d), each position's index among the batch's distinct vectors,
    compared bit for bit (as integers of the same width: any float dtype, on any device)."""
    if seq_BT.dim() == 2:
        return seq_BT
    B, T, d = seq_BT.shape
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[seq_BT.element_size()]
    flat = seq_BT.detach().reshape(B * T, d).contiguous().view(bits)
    return torch.unique(flat, dim=0, return_inverse=True)[1].reshape(B, T)


def right_padded_lengths(attn_mask_BT: Tensor) -> list[int] | None:
    """Row lengths of a right-padded (B, T) mask, or None when some row is not right-padded."""
    mask = attn_mask_BT.bool()
    lengths_B = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, positions.unsqueeze(0) < lengths_B.unsqueeze(1)):
        return None
    return lengths_B.tolist()


def shared_prefix_outputs(run: nn.Module, pick: Callable[[Any], Tensor], key: str, seq_BT: Tensor,
                          attn_mask_BT: Tensor, groups: list[tuple[list[int], int]]) -> Tensor:
    """Outputs (B, T, ...) of ``run`` on a right-padded batch, each group's prefix encoded once.

    Args:
        run: a transformers causal LM or its decoder (takes ``key``, ``attention_mask``,
            ``cache``, ``use_cache``; returns an output with ``.cache``).
        pick: the tensor of ``run``'s output to return (logits, or the last hidden states).
        key: ``"input_ids"`` (``seq_BT`` LongTensor (B, T)) or ``"inputs_embeds"`` (float (B, T, d)).
        attn_mask_BT: (B, T) 0/1, right-padded.
        groups: :func:`prefix_groups` of the batch (rows in no group run in one plain forward).

    Returns:
        (B, T, ...) in row order, as ``pick(run(**{key: seq_BT}, attention_mask=...))`` would give.

    Raises:
        RuntimeError: ``run`` returned no cache for a prefix (a model that ignores ``use_cache``).
    """
    B, device = seq_BT.shape[0], seq_BT.device
    mask_BT = attn_mask_BT.long()
    pieces: list[Tensor] = []
    order: list[int] = []
    for rows, size in groups:
        lead = rows[0]
        prefix = run(**{key: seq_BT[lead:lead + 1, :size]}, attention_mask=mask_BT[lead:lead + 1, :size], use_cache=True)
        cache = getattr(prefix, "cache", None)
        if cache is None:
            raise RuntimeError(f"{type(run).__name__} returned no KV cache for a shared prefix")
        for layer in cache.layers:  # one set of prefix keys/values, seen by every row of the group
            layer.keys = layer.keys.expand(len(rows), -1, -1, -1)
            layer.values = layer.values.expand(len(rows), -1, -1, -1)
        index = torch.tensor(rows, device=device)
        rest = run(**{key: seq_BT[index, size:]}, attention_mask=mask_BT[index], cache=cache, use_cache=True)
        head = pick(prefix)
        pieces.append(torch.cat([head.expand(len(rows), *head.shape[1:]), pick(rest)], dim=1))
        order += rows
    grouped = set(order)
    alone = [b for b in range(B) if b not in grouped]
    if alone:
        index = torch.tensor(alone, device=device)
        pieces.append(pick(run(**{key: seq_BT[index]}, attention_mask=mask_BT[index], use_cache=False)))
        order += alone
    out = torch.cat(pieces, dim=0)
    if order == list(range(B)):
        return out
    inverse = torch.empty(B, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(B)
    return out[inverse.to(out.device)]
