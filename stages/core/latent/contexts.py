"""Batches for the latent-context teacher: trajectories + retrieved experiences -> tensors.

Shared by ``coldstart`` and ``distill``. One :class:`LatentBatch` holds everything a
teacher/student forward pair needs:

- the target trajectories' token sequences (:func:`stages.core.data.rows.training_rows`: the ids the policy was
  conditioned on and sampled, as rollout recorded them; right-padded, with the action mask
  w_{t,n} True exactly on sampled ids),
  the index where "prefix" latents go (``insert_at``: the first action token, i.e. right after
  the task prompt / initial state) and every action start (``per-turn`` placement);
- for each row, J retrieved experiences m_j encoded as "task x + experience m_j" token
  sequences (the composer's input, Eq. 5 of the LOPD paper: ``Enc_psi(x, m_j)``).

Rows of earlier releases carry no token ids; they are re-tokenized from their text
(:mod:`stages.core.data.rows`). Their tool schemas are read from ``json.loads(traj.info)["tools"]``
(written by rollout), or passed explicitly to :func:`build_batch`.

Devices: rows and batches are collated on the host (CPU; recorded log-probs and rewards in
float64, the values as recorded) and moved to the model's device in one copy per tensor:
``build_batch(...).to(device)`` (:meth:`LatentBatch.to`) and ``pad_rows(..., device=)``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from schemas import Trajectory
from stages.core.data.rows import TrainRow, pad_id, pad_rows, training_rows
from stages.core.latent.framing import framed_prompt_ids
from stages.core.text.chat import action_spans

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stages.core.data.retrieval import Retriever

# Cap on the characters of one action / observation in an experience text (the token budget
# max_exp_tokens cuts the whole text anyway; this only keeps one huge observation from
# crowding out the rest before tokenization).
_MAX_FIELD_CHARS = 2000


ACTION_LABEL = "Action:"  # starts each action line of composer_text (the span readout looks for it)


def _clip(text: str, limit: int = _MAX_FIELD_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def composer_text(traj: Trajectory) -> str:
    """How a retrieved experience m_j is shown to the composer encoder (compact plain text).

    Example::

        Task: What is the weather in Paris?
        Action: <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>
        Observation: sunny, 21 degrees
        Outcome: reward=1.00

    One ``Action:`` line per turn (the exact generated text), followed by its
    ``Observation:`` when the environment answered; long fields are clipped to 2000 chars.
    """
    lines = [f"Task: {traj.prompt.strip()}"]
    for turn in traj.turns:
        lines.append(f"{ACTION_LABEL} {_clip(turn.action)}")
        if turn.observation.strip():
            lines.append(f"Observation: {_clip(turn.observation)}")
    lines.append(f"Outcome: reward={traj.reward:.2f}")
    return "\n".join(lines)


def _pair_text(task_prompt: str, experience: Trajectory | None) -> str:
    """The text of one composer input row: the current task x and (optionally) experience m_j."""
    head = f"Current task: {task_prompt.strip()}"
    if experience is None:
        return head
    return f"{head}\n\nRelated experience:\n{composer_text(experience)}"


def encode_experiences(
    tokenizer: PreTrainedTokenizerBase,
    task_prompt: str,
    experiences: list[Trajectory],
    J: int,
    max_exp_tokens: int,
) -> tuple[Tensor, Tensor]:
    """Token ids of the J composer inputs ``Enc(x, m_j)`` of one task (Eq. 5).

    Row j is ``"Current task: <x>\\n\\nRelated experience:\\n" + composer_text(m_j)``,
    tokenized with the tokenizer's own special tokens and truncated to its first
    ``max_exp_tokens`` tokens. With fewer than J experiences the remaining rows hold the task
    text alone (``"Current task: <x>"``): a row is never all padding (the composer refuses
    those), and the task-only rows carry no experience information. Experiences beyond the
    first J are ignored.

    Returns:
        exp_ids_JL: LongTensor (J, L), right-padded with the pad token (L = longest row).
        exp_mask_JL: BoolTensor (J, L), True on real tokens.

    Raises:
        ValueError: J < 0, max_exp_tokens < 1, or an empty task prompt.
    """
    if J < 0:
        raise ValueError(f"J must be >= 0, got {J}")
    if max_exp_tokens < 1:
        raise ValueError(f"max_exp_tokens must be >= 1, got {max_exp_tokens}")
    if not task_prompt.strip():
        raise ValueError("encode_experiences: the task prompt is empty")
    chosen: list[Trajectory | None] = list(experiences[:J]) + [None] * max(0, J - len(experiences))
    rows = [tokenizer(_pair_text(task_prompt, m))["input_ids"][:max_exp_tokens] for m in chosen]
    L = max((len(r) for r in rows), default=0)
    ids = torch.full((J, L), pad_id(tokenizer), dtype=torch.long, device="cpu")  # host side
    mask = torch.zeros((J, L), dtype=torch.bool, device="cpu")
    for j, row in enumerate(rows):
        ids[j, : len(row)] = torch.tensor(row, dtype=torch.long, device="cpu")
        mask[j, : len(row)] = True
    return ids, mask


@dataclass
class LatentBatch:
    """Everything one teacher/student forward pair needs; all (B, T) tensors right-padded.

    Attributes:
        input_ids_BT: LongTensor (B, T), the whole conversations.
        attn_mask_BT: BoolTensor (B, T), True on real tokens.
        action_mask_BT: BoolTensor (B, T), unshifted, True on assistant-generated tokens.
        insert_at_B: LongTensor (B,), index of each row's first action token: where the
            "prefix" latents go (right after the task prompt / initial state).
        action_starts: per row, the start index of every action span (strictly increasing;
            for the "per-turn" placement). Spans cut off by ``max_len`` are dropped.
        rewards_B: float64 (B,), the trajectories' rewards (exact; cast where used).
        exp_ids_BJL: LongTensor (B, J, L), composer inputs (see :func:`encode_experiences`).
        exp_mask_BJL: BoolTensor (B, J, L).
        trajectory_ids: the rows' trajectory ids, in order.
        frame_ids: "framed" placement only (else None): per row, the teacher prompt's ids
            before and after the latent span (:func:`stages.core.latent.framing.framed_prompt_ids`).
    """

    input_ids_BT: Tensor
    attn_mask_BT: Tensor
    action_mask_BT: Tensor
    insert_at_B: Tensor
    action_starts: list[list[int]]
    rewards_B: Tensor
    exp_ids_BJL: Tensor
    exp_mask_BJL: Tensor
    trajectory_ids: list[str]
    frame_ids: list[tuple[list[int], list[int]]] | None = None

    @property
    def num_action_tokens(self) -> int:
        """Number of supervised (action) tokens in the batch."""
        return int((self.action_mask_BT & self.attn_mask_BT).sum())

    def to(self, device: torch.device | str) -> LatentBatch:
        """A copy with every tensor moved to ``device`` (dtypes kept; a no-op copy when already there)."""
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), Tensor)}
        return replace(self, **moved)

    def row(self, b: int) -> LatentBatch:
        """Row b as a batch of one (its padding kept: masks still right-padded)."""
        picked = {f.name: getattr(self, f.name)[b:b + 1] for f in fields(self) if getattr(self, f.name) is not None}
        return replace(self, **picked)


def build_batch(
    tokenizer: PreTrainedTokenizerBase,
    trajectories: list[Trajectory] | list[TrainRow],
    experiences: list[list[Trajectory]],
    *,
    J: int,
    max_exp_tokens: int,
    max_len: int | None = None,
    tools: list[list[dict]] | None = None,
    framed: bool = False,
) -> LatentBatch:
    """Tokenize target trajectories and their retrieved experiences into a :class:`LatentBatch`.

    Args:
        tokenizer: the backbone's tokenizer (encodes the composer inputs; re-tokenizes rows of
            earlier releases).
        trajectories: B target trajectories (each must give exactly one training sequence, see
            :func:`stages.core.data.rows.trajectory_sequences`), or B :class:`TrainRow` from :func:`training_rows`
            (then ``max_len`` and ``tools`` are ignored: the rows are final).
        experiences: B lists of retrieved experiences (first J used; fewer are padded with
            task-only rows, see :func:`encode_experiences`).
        J, max_exp_tokens: composer inputs per row and their token cap.
        max_len: keep the first ``max_len`` tokens of each sequence (None = all). The cut
            never falls at or before ``insert_at``: at least one action token always remains.
        tools: per trajectory, the tool schemas rendered into its prompt (only used to
            re-tokenize rows without recorded ids); default :func:`stages.core.data.rows.trajectory_tools`.
        framed: also build the "framed" placement's teacher prompts (``frame_ids``).

    Raises:
        ValueError: empty batch, length mismatches, a trajectory without action tokens, one
            with several sequences, or one whose prompt alone fills ``max_len`` (the
            trajectory id is named); with ``framed``, see
            :func:`stages.core.latent.framing.framed_prompt_ids`.
    """
    B = len(trajectories)
    if B == 0:
        raise ValueError("build_batch: no trajectories")
    if len(experiences) != B:
        raise ValueError(f"build_batch: {B} trajectories but {len(experiences)} experience lists")
    if tools is not None and len(tools) != B:
        raise ValueError(f"build_batch: {B} trajectories but {len(tools)} tool lists")
    rows = trajectories
    if not isinstance(trajectories[0], TrainRow):
        rows = training_rows(tokenizer, trajectories, max_len=max_len, tools=tools, skip_too_long=False)[0]
        if len(rows) != B:
            raise ValueError("build_batch: a trajectory restarts its context (several sequences); "
                             "pass training_rows(...) instead")
    starts_all = [[start for start, _ in action_spans(row.mask_T)] for row in rows]
    input_ids, attn, action, _, insert_at_B = pad_rows(tokenizer, rows)
    targets = [row.trajectory for row in rows]
    encoded = [encode_experiences(tokenizer, t.prompt, exps, J, max_exp_tokens)
               for t, exps in zip(targets, experiences)]
    L = max((ids.shape[1] for ids, _ in encoded), default=0)
    exp_ids = torch.full((B, J, L), pad_id(tokenizer), dtype=torch.long, device="cpu")  # host side
    exp_mask = torch.zeros((B, J, L), dtype=torch.bool, device="cpu")
    for b, (ids_JL, mask_JL) in enumerate(encoded):
        exp_ids[b, :, : ids_JL.shape[1]] = ids_JL
        exp_mask[b, :, : mask_JL.shape[1]] = mask_JL
    return LatentBatch(
        input_ids_BT=input_ids,
        attn_mask_BT=attn,
        action_mask_BT=action,
        insert_at_B=insert_at_B,
        action_starts=starts_all,
        rewards_B=torch.tensor([float(t.reward) for t in targets], dtype=torch.float64, device="cpu"),
        exp_ids_BJL=exp_ids,
        exp_mask_BJL=exp_mask,
        trajectory_ids=[t.trajectory_id for t in targets],
        frame_ids=[framed_prompt_ids(tokenizer, row) for row in rows] if framed else None,
    )


def retrieve_experiences(
    retriever: Retriever,
    trajectories: list[Trajectory],
    J: int,
    *,
    exclude_same_task: bool = False,
    exclude_task_ids: Iterable[str] = (),
    split: str | None = None,
) -> list[list[Trajectory]]:
    """For each trajectory, up to J successful experiences of its env nearest to its prompt.

    The trajectory itself is always excluded; with ``exclude_same_task`` every trajectory of
    its task is excluded too (no other sample of the same task can leak the answer).
    ``exclude_task_ids`` removes further tasks from the pool (e.g. held-out tasks) and
    ``split`` restricts it to one split (None = any).

    Raises:
        RuntimeError: the retriever returned the trajectory itself (never expected).
    """
    extra = set(exclude_task_ids)
    out: list[list[Trajectory]] = []
    for traj in trajectories:
        tasks = extra | ({traj.task_id} if exclude_same_task else set())
        found = retriever.retrieve(
            traj.prompt, J, success_only=True, env=traj.env, split=split,
            exclude_ids={traj.trajectory_id}, exclude_task_ids=tasks,
        )
        if any(e.trajectory.trajectory_id == traj.trajectory_id for e in found):
            raise RuntimeError(f"retriever returned trajectory {traj.trajectory_id} as its own experience")
        out.append([e.trajectory for e in found])
    return out


def shift_for_loss(logits_BTV: Tensor, batch: LatentBatch) -> tuple[Tensor, Tensor, Tensor]:
    """Align HF causal-LM logits with their targets: ``logits[:, :-1]`` score ``ids[:, 1:]``.

    Returns:
        logits (B, T-1, V), targets_B(T-1) (LongTensor), mask_B(T-1) (bool: action & attention).
    """
    if logits_BTV.shape[:2] != batch.input_ids_BT.shape:
        raise ValueError(f"logits {tuple(logits_BTV.shape)} do not match input ids "
                         f"{tuple(batch.input_ids_BT.shape)}")
    mask = batch.action_mask_BT[:, 1:] & batch.attn_mask_BT[:, 1:].bool()
    return logits_BTV[:, :-1], batch.input_ids_BT[:, 1:], mask
