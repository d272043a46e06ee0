"""Student and teacher forwards: the latent-context teacher of LOPD (Eq. 7-8 of the LOPD paper)
and the text-context / no-context teacher views of the baselines (:func:`context_teacher_logits`).

The teacher is the frozen initial backbone theta_bar fed through ``inputs_embeds`` with the
latent vectors c_phi spliced in as ordinary context positions. Its weights get no gradient,
but its activations stay in the graph, so a loss on its logits reaches the latents (and phi).

Alignment: both :func:`student_logits` and :func:`teacher_logits` return (B, T, V) logits over
the T input tokens with the Hugging Face convention ``logits[b, i]`` = distribution of token
``i + 1`` (callers shift, see ``losses.py``). For the teacher, ``logits[b, i]`` is read at the
last position before token ``i + 1`` in the spliced sequence: with latents inserted before
token p, ``logits[b, p - 1]`` is the output of the LAST latent position, i.e. the first token
after the latents is predicted from (state, c_phi) as Eq. 8 requires; positions i < p - 1
never see the latents and equal the plain backbone's logits.

Batches are right-padded (attention mask 1 then 0 in every row); position ids run 0..T+N-1
over the spliced sequence, so the latents take N consecutive positions like N tokens would.

Placements:
- ``"prefix"``: one block of N latents per row, inserted before token ``insert_at[b]`` (after
  the task prompt); one forward per batch.
- ``"per-turn"`` (exact Eq. 8): for every turn t of row b the latents sit right before the
  action start ``action_starts[b][t]`` and the state s_t contains no other latent block, so
  turn t's logits (positions ``s_t - 1`` up to ``s_{t+1} - 2``) come from a forward on
  ``[s_t ; c_phi ; rest]``. One forward per turn index (all rows batched), T_turns forwards.
- ``"framed"`` (A.4 of the LOPD paper): the latents sit inside the first user message between
  two framing texts (:mod:`stages.core.framing`); the teacher's prompt is that re-rendered
  prompt, the completion is the student's own ids. One forward per batch.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from stages.core.composer import adapter_scope, base_parameters

STUDENT_ADAPTER = "student"


def student_logits(
    backbone: nn.Module, input_ids_BT: Tensor, attn_mask_BT: Tensor, adapter: str | None = STUDENT_ADAPTER
) -> Tensor:
    """Student logits_BTV (B, T, V) of pi_theta^S on right-padded token ids.

    Args:
        backbone: shared peft backbone, or a plain model (full fine-tuning).
        input_ids_BT: LongTensor (B, T); attn_mask_BT: (B, T) bool or 0/1.
        adapter: LoRA adapter of the student; None runs the base weights with every adapter
            disabled (full fine-tuning, where the teacher must be a separate frozen copy).

    Raises:
        ValueError: ``adapter`` is not an adapter of ``backbone``.
    """
    with adapter_scope(backbone, adapter):
        return backbone(input_ids=input_ids_BT, attention_mask=attn_mask_BT.long(), use_cache=False).logits


def _check_right_padded(attn_mask_BT: Tensor) -> Tensor:
    """Row lengths (B,) of a right-padded mask; ValueError if some row is not right-padded."""
    mask = attn_mask_BT.bool()
    lengths_B = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, positions.unsqueeze(0) < lengths_B.unsqueeze(1)):
        raise ValueError("attention mask must be right-padded (1...1 0...0 in every row)")
    return lengths_B


def _frozen_teacher(backbone: nn.Module, teacher_model: nn.Module | None) -> nn.Module:
    """The model that plays theta_bar; ValueError if any of its base weights is trainable."""
    teacher = backbone if teacher_model is None else teacher_model
    trainable = [n for n, p in base_parameters(teacher) if p.requires_grad]
    if trainable:
        raise ValueError(
            f"teacher base weights must be frozen, but {trainable[0]} (and {len(trainable) - 1} "
            "more) require grad: for full fine-tuning pass a frozen copy as teacher_model="
        )
    return teacher


def _spliced_logits(
    teacher: nn.Module, input_ids_BT: Tensor, attn_mask_BT: Tensor, latents_BNd: Tensor, insert_at_B: Tensor
) -> Tensor:
    """Teacher logits_BTV with latents_BNd inserted before token insert_at_B[b], aligned."""
    B, T = input_ids_BT.shape
    N = latents_BNd.shape[1]
    lengths_B = _check_right_padded(attn_mask_BT)
    if latents_BNd.dim() != 3 or latents_BNd.shape[0] != B:
        raise ValueError(f"expected latents of shape (B={B}, N, d), got {tuple(latents_BNd.shape)}")
    insert_at_B = insert_at_B.to(device=input_ids_BT.device, dtype=torch.long)
    if insert_at_B.shape != (B,) or (insert_at_B < 0).any() or (insert_at_B > lengths_B).any():
        raise ValueError(
            f"insert_at must be (B,) with 0 <= insert_at[b] <= row length; got {insert_at_B.tolist()} "
            f"for lengths {lengths_B.tolist()}"
        )
    with adapter_scope(teacher, None):
        if N == 0:
            return teacher(input_ids=input_ids_BT, attention_mask=attn_mask_BT.long(), use_cache=False).logits
        embeds_BTd = teacher.get_input_embeddings()(input_ids_BT)
        d = embeds_BTd.shape[-1]
        S = T + N
        j_1S = torch.arange(S, device=input_ids_BT.device).unsqueeze(0)
        p_B1 = insert_at_B.unsqueeze(1)
        is_latent_BS = (j_1S >= p_B1) & (j_1S < p_B1 + N)
        real_idx_BS = torch.where(j_1S < p_B1, j_1S, j_1S - N).clamp(0, T - 1)
        latent_idx_BS = (j_1S - p_B1).clamp(0, N - 1)
        tokens_BSd = embeds_BTd.gather(1, real_idx_BS.unsqueeze(-1).expand(B, S, d))
        latents_BSd = latents_BNd.to(embeds_BTd.dtype).gather(1, latent_idx_BS.unsqueeze(-1).expand(B, S, d))
        spliced_BSd = torch.where(is_latent_BS.unsqueeze(-1), latents_BSd, tokens_BSd)
        mask_BS = is_latent_BS | attn_mask_BT.bool().gather(1, real_idx_BS)
        logits_BSV = teacher(
            inputs_embeds=spliced_BSd,
            attention_mask=mask_BS.long(),
            position_ids=j_1S.expand(B, S),
            use_cache=False,
        ).logits
    i_1T = torch.arange(T, device=input_ids_BT.device).unsqueeze(0)
    out_idx_BT = i_1T + N * (i_1T >= p_B1 - 1)  # last spliced position before token i + 1
    return logits_BSV[torch.arange(B, device=logits_BSV.device).unsqueeze(1), out_idx_BT]


def _framed_logits(
    teacher: nn.Module,
    input_ids_BT: Tensor,
    attn_mask_BT: Tensor,
    latents_BNd: Tensor,
    insert_at_B: Tensor,
    frame_ids: list[tuple[list[int], list[int]]],
) -> Tensor:
    """Teacher logits_BTV on ``head_b ; c_phi ; tail_b ; completion_b``, aligned with the student."""
    B, T = input_ids_BT.shape
    if len(frame_ids) != B:
        raise ValueError(f"frame_ids needs one (head, tail) pair per row: {len(frame_ids)} for {B} rows")
    ids_BS, mask_BS, shift_B = _reprefixed(input_ids_BT, attn_mask_BT, insert_at_B,
                                           [head + tail for head, tail in frame_ids])
    head_B = torch.tensor([len(head) for head, _ in frame_ids], device=input_ids_BT.device)
    return _aligned(_spliced_logits(teacher, ids_BS, mask_BS, latents_BNd, head_B), shift_B, T)


def _reprefixed(input_ids_BT: Tensor, attn_mask_BT: Tensor, insert_at_B: Tensor,
                prefixes: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Row b's completion (its tokens from ``insert_at_B[b]`` on) after ``prefixes[b]``.

    Returns ids_BS (right-padded with 0), mask_BS (bool, True on real tokens) and shift_B
    (LongTensor (B,): ``len(prefixes[b]) - insert_at_B[b]``, for :func:`_aligned`).

    Raises:
        ValueError: a mask that is not right-padded.
    """
    B, device = input_ids_BT.shape[0], input_ids_BT.device
    lengths = _check_right_padded(attn_mask_BT).tolist()
    starts, rows = insert_at_B.tolist(), input_ids_BT.tolist()  # one copy to the host each
    seqs = [prefixes[b] + rows[b][starts[b]:lengths[b]] for b in range(B)]
    S = max(len(seq) for seq in seqs)
    ids_BS = torch.tensor([seq + [0] * (S - len(seq)) for seq in seqs], dtype=input_ids_BT.dtype, device=device)
    lengths_B = torch.tensor([len(seq) for seq in seqs], device=device)
    mask_BS = torch.arange(S, device=device).unsqueeze(0) < lengths_B.unsqueeze(1)
    shift_B = torch.tensor([len(prefixes[b]) - starts[b] for b in range(B)], device=device)
    return ids_BS, mask_BS, shift_B


def _aligned(logits_BSV: Tensor, shift_B: Tensor, T: int) -> Tensor:
    """(B, T, V) logits of the re-prefixed sequences at the student's positions: student position
    i >= insert_at - 1 scores token i + 1, which is the re-prefixed position i + shift."""
    S = logits_BSV.shape[1]
    idx_BT = (torch.arange(T, device=logits_BSV.device).unsqueeze(0) + shift_B.unsqueeze(1)).clamp(0, S - 1)
    return logits_BSV.gather(1, idx_BT.unsqueeze(-1).expand(-1, T, logits_BSV.shape[-1]))


def _per_turn_logits(
    teacher: nn.Module,
    input_ids_BT: Tensor,
    attn_mask_BT: Tensor,
    latents_BNd: Tensor,
    action_starts: list[list[int]],
) -> Tensor:
    """Exact Eq. 8: turn t of each row is scored with the latents right before its action."""
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
        logits_RSV = _spliced_logits(
            teacher, input_ids_BT[rows_R, :span], attn_mask_BT[rows_R, :span], latents_BNd[rows_R], starts_R
        )
        if out_BTV is None:
            out_BTV = logits_RSV.new_zeros(B, T, logits_RSV.shape[-1])
        for r, b in enumerate(rows):
            lo = 0 if t == 0 else action_starts[b][t] - 1
            hi = ends[r] - 1 if len(action_starts[b]) > t + 1 else T
            out_BTV[b, lo:hi] = logits_RSV[r, lo:hi]
    return out_BTV


def teacher_logits(
    backbone: nn.Module,
    input_ids_BT: Tensor,
    attn_mask_BT: Tensor,
    latents_BNd: Tensor,
    insert_at_B: Tensor | None = None,
    *,
    placement: str = "prefix",
    action_starts: list[list[int]] | None = None,
    frame_ids: list[tuple[list[int], list[int]]] | None = None,
    teacher_model: nn.Module | None = None,
) -> Tensor:
    """Teacher logits_BTV (B, T, V) of pi_{theta_bar, phi}^T (Eq. 7-8), aligned with the student.

    Runs the frozen backbone (every adapter disabled) on the token embeddings with the latents
    spliced in; latent positions are removed from the output (module docstring: alignment).
    Gradients reach ``latents_BNd``; no teacher weight gets one. With N = 0 latents the result
    is the plain backbone's logits.

    Args:
        backbone: shared peft backbone (teacher = adapters disabled), or a frozen plain model.
        input_ids_BT: LongTensor (B, T), right-padded; attn_mask_BT: (B, T) bool or 0/1.
        latents_BNd: c_phi (B, N, d) in the backbone's embedding space, e.g. N = J*K.
        insert_at_B: LongTensor (B,), "prefix" placement: index of the token the latents go
            before (typically the prompt length), 0 <= insert_at[b] <= row length; "framed":
            each row's first action index.
        placement: "prefix", "per-turn" or "framed".
        action_starts: "per-turn" placement: per row, the strictly increasing token indices
            where each action span starts.
        frame_ids: "framed" placement: per row, the teacher prompt's ids before and after the
            latent span (:func:`stages.core.framing.framed_prompt_ids`); the row's tokens from
            ``insert_at_B[b]`` on follow them. Positions before ``insert_at_B[b] - 1`` are
            never supervised and hold teacher-prompt logits.
        teacher_model: frozen teacher copy for full fine-tuning of ``backbone`` (used instead
            of ``backbone``, with any adapters of its own disabled).

    Raises:
        ValueError: unknown placement or missing placement argument, a mask that is not
            right-padded, out-of-range insertion points, or trainable teacher base weights.
    """
    teacher = _frozen_teacher(backbone, teacher_model)
    if placement == "prefix":
        if insert_at_B is None:
            raise ValueError("placement 'prefix' needs insert_at_B")
        return _spliced_logits(teacher, input_ids_BT, attn_mask_BT, latents_BNd, insert_at_B)
    if placement == "per-turn":
        if action_starts is None:
            raise ValueError("placement 'per-turn' needs action_starts")
        return _per_turn_logits(teacher, input_ids_BT, attn_mask_BT, latents_BNd, action_starts)
    if placement == "framed":
        if frame_ids is None or insert_at_B is None:
            raise ValueError("placement 'framed' needs frame_ids and insert_at_B")
        return _framed_logits(teacher, input_ids_BT, attn_mask_BT, latents_BNd, insert_at_B, frame_ids)
    raise ValueError(f"placement must be 'prefix', 'per-turn' or 'framed', got {placement!r}")


def context_teacher_logits(
    model: nn.Module,
    input_ids_BT: Tensor,
    attn_mask_BT: Tensor,
    insert_at_B: Tensor,
    prefix_ids: list[list[int]] | None = None,
    *,
    adapter: str | None = None,
) -> Tensor:
    """Teacher logits_BTV (B, T, V) under a privileged TEXT context, aligned with the student's.

    The teacher views used by the text-context baselines (B.1 of the LOPD paper: OPSD's
    reference in the system message, SDFT's demonstration, SDPO's sibling or feedback): row b's
    prompt (its first ``insert_at_B[b]`` tokens, everything before the first sampled action)
    is replaced by ``prefix_ids[b]`` (that prompt re-rendered with the privileged context) and
    the same completion tokens follow; ``prefix_ids=None`` keeps the student's own prompt (the
    no-extra-context view). Logits are gathered back so that ``logits[b, i]`` scores token
    ``i + 1`` for every ``i >= insert_at_B[b] - 1`` (earlier positions are never supervised and
    hold the first prefix logits).

    Teacher weights: ``model`` with ``adapter`` active: ``None`` = every adapter disabled (the
    frozen initial weights), an EMA adapter, or the student's own adapter (the current
    student). Runs under ``torch.no_grad``: no parameter gets a gradient from the teacher.

    Raises:
        ValueError: a mask that is not right-padded, or a prefix list of the wrong length.
    """
    B, T = input_ids_BT.shape
    starts = insert_at_B.tolist()
    prefixes = prefix_ids if prefix_ids is not None else [input_ids_BT[b, :starts[b]].tolist() for b in range(B)]
    if len(prefixes) != B:
        raise ValueError(f"expected {B} prefixes, got {len(prefixes)}")
    ids_BS, mask_BS, shift_B = _reprefixed(input_ids_BT, attn_mask_BT, insert_at_B, prefixes)
    with torch.no_grad(), adapter_scope(model, adapter):
        logits_BSV = model(input_ids=ids_BS, attention_mask=mask_BS.long(), use_cache=False).logits
    return _aligned(logits_BSV, shift_B, T)
