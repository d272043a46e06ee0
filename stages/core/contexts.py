"""Batches for the latent-context teacher: trajectories + retrieved experiences -> tensors.

Shared by ``coldstart`` and ``distill``. One :class:`LatentBatch` holds everything a
teacher/student forward pair needs:

- the target trajectories' token sequences (:func:`training_rows`: the ids the policy was
  conditioned on and sampled, as rollout recorded them; right-padded, with the action mask
  w_{t,n} True exactly on sampled ids),
  the index where "prefix" latents go (``insert_at``: the first action token, i.e. right after
  the task prompt / initial state) and every action start (``per-turn`` placement);
- for each row, J retrieved experiences m_j encoded as "task x + experience m_j" token
  sequences (the composer's input, Eq. 5 of the LOPD paper: ``Enc_psi(x, m_j)``).

Rows of earlier releases carry no token ids; they are re-tokenized from their text with
:func:`stages.core.chat.tokenize_for_training` (a warning once per process). Their tool
schemas are read from ``json.loads(traj.info)["tools"]`` (written by rollout), or passed
explicitly to :func:`build_batch`.

Devices: rows and batches are collated on the host (CPU; recorded log-probs and rewards in
float64, the values as recorded) and moved to the model's device in one copy per tensor:
``build_batch(...).to(device)`` (:meth:`LatentBatch.to`) and ``pad_rows(..., device=)``.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from schemas import Message, Trajectory
from stages.core.chat import action_spans, tokenize_for_training, tokenizer_fingerprint
from stages.core.framing import framed_prompt_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stages.core.retrieval import Retriever

# Cap on the characters of one action / observation in an experience text (the token budget
# max_exp_tokens cuts the whole text anyway; this only keeps one huge observation from
# crowding out the rest before tokenization).
_MAX_FIELD_CHARS = 2000


def _clip(text: str, limit: int = _MAX_FIELD_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def experience_text(traj: Trajectory) -> str:
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
        lines.append(f"Action: {_clip(turn.action)}")
        if turn.observation.strip():
            lines.append(f"Observation: {_clip(turn.observation)}")
    lines.append(f"Outcome: reward={traj.reward:.2f}")
    return "\n".join(lines)


def _pair_text(task_prompt: str, experience: Trajectory | None) -> str:
    """The text of one composer input row: the current task x and (optionally) experience m_j."""
    head = f"Current task: {task_prompt.strip()}"
    if experience is None:
        return head
    return f"{head}\n\nRelated experience:\n{experience_text(experience)}"


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    return int(pad) if pad is not None else 0


def encode_experiences(
    tokenizer: PreTrainedTokenizerBase,
    task_prompt: str,
    experiences: list[Trajectory],
    J: int,
    max_exp_tokens: int,
) -> tuple[Tensor, Tensor]:
    """Token ids of the J composer inputs ``Enc(x, m_j)`` of one task (Eq. 5).

    Row j is ``"Current task: <x>\\n\\nRelated experience:\\n" + experience_text(m_j)``,
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
    ids = torch.full((J, L), _pad_id(tokenizer), dtype=torch.long, device="cpu")  # host side
    mask = torch.zeros((J, L), dtype=torch.bool, device="cpu")
    for j, row in enumerate(rows):
        ids[j, : len(row)] = torch.tensor(row, dtype=torch.long, device="cpu")
        mask[j, : len(row)] = True
    return ids, mask


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
    ids_BT = torch.full((B, T), _pad_id(tokenizer), dtype=torch.long, device="cpu")
    attn_BT = torch.zeros((B, T), dtype=torch.bool, device="cpu")
    mask_BT = torch.zeros((B, T), dtype=torch.bool, device="cpu")
    logprobs_BT = torch.full((B, T), float("nan"), dtype=torch.float64, device="cpu")
    for b, r in enumerate(rows):
        n = len(r.ids_T)
        ids_BT[b, :n], attn_BT[b, :n], mask_BT[b, :n], logprobs_BT[b, :n] = r.ids_T, True, r.mask_T, r.logprobs_T
    insert_at_B = torch.tensor([action_spans(r.mask_T)[0][0] for r in rows], dtype=torch.long, device="cpu")
    return tuple(t.to(device) for t in (ids_BT, attn_BT, mask_BT, logprobs_BT, insert_at_B))


def privileged_prefix(tokenizer: PreTrainedTokenizerBase, row: TrainRow, *, system: str | None = None,
                      user: str | None = None) -> list[int]:
    """Prompt ids of :func:`privileged_prompt` (the text tokenized without special tokens)."""
    return tokenizer(privileged_prompt(tokenizer, row, system=system, user=user), add_special_tokens=False)["input_ids"]


def privileged_prompt(tokenizer: PreTrainedTokenizerBase, row: TrainRow, *, system: str | None = None,
                      user: str | None = None) -> str:
    """Prompt text of ``row`` re-rendered with privileged text: a text-context teacher's view.

    The conversation before the row's first action (every message before the trajectory's
    ``row.first_turn``-th assistant message) is rendered with the chat template and the
    generation prompt, with ``system`` appended to the system message (one is added first when
    there is none) and ``user`` appended to the first user message (B.1 of the LOPD paper: OPSD's
    reference in the system message, SDFT's demonstration in the first user message). With
    neither, the result is the student's own prompt as the rollout rendered it. Tools: the
    trajectory's recorded ones (:func:`trajectory_tools`).

    Raises:
        ValueError: the trajectory has fewer assistant messages than ``first_turn + 1``.
    """
    from stages.core.chat import render_prompt

    traj = row.trajectory
    starts = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    if len(starts) <= row.first_turn:
        raise ValueError(f"trajectory {traj.trajectory_id}: no assistant message for turn {row.first_turn}")
    messages = with_privileged_text(traj.messages[:starts[row.first_turn]], system=system, user=user)
    return render_prompt(tokenizer, messages, trajectory_tools(traj))


def with_privileged_text(messages: list[Message], *, system: str | None = None,
                         user: str | None = None) -> list[Message]:
    """A copy of ``messages`` with ``system`` appended to the system message (one is added first
    when there is none) and ``user`` appended to the first user message (one is added when there
    is none), each after a blank line."""
    messages = list(messages)
    if system:
        if messages and messages[0].role == "system":
            head = messages[0]
            messages[0] = head.model_copy(update={"content": f"{head.content}\n\n{system}" if head.content else system})
        else:
            messages.insert(0, Message(role="system", content=system))
    if user:
        at = next((i for i, m in enumerate(messages) if m.role == "user"), None)
        if at is None:
            messages.append(Message(role="user", content=user))
        else:
            messages[at] = messages[at].model_copy(update={"content": f"{messages[at].content}\n\n{user}"})
    return messages


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
            before and after the latent span (:func:`stages.core.framing.framed_prompt_ids`).
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


def trajectory_tools(traj: Trajectory) -> list[dict[str, Any]]:
    """The tool schemas recorded for ``traj`` by rollout (``info["tools"]``), else ``[]``."""
    tools = json.loads(traj.info).get("tools", []) if traj.info else []
    return tools if isinstance(tools, list) else []


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
            :func:`trajectory_sequences`), or B :class:`TrainRow` from :func:`training_rows`
            (then ``max_len`` and ``tools`` are ignored: the rows are final).
        experiences: B lists of retrieved experiences (first J used; fewer are padded with
            task-only rows, see :func:`encode_experiences`).
        J, max_exp_tokens: composer inputs per row and their token cap.
        max_len: keep the first ``max_len`` tokens of each sequence (None = all). The cut
            never falls at or before ``insert_at``: at least one action token always remains.
        tools: per trajectory, the tool schemas rendered into its prompt (only used to
            re-tokenize rows without recorded ids); default :func:`trajectory_tools`.
        framed: also build the "framed" placement's teacher prompts (``frame_ids``).

    Raises:
        ValueError: empty batch, length mismatches, a trajectory without action tokens, one
            with several sequences, or one whose prompt alone fills ``max_len`` (the
            trajectory id is named); with ``framed``, see
            :func:`stages.core.framing.framed_prompt_ids`.
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
    exp_ids = torch.full((B, J, L), _pad_id(tokenizer), dtype=torch.long, device="cpu")  # host side
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


def lookup_tools(trajectories: list[Trajectory], data_dir: str | None = None) -> list[list[dict[str, Any]]]:
    """Tool schemas per trajectory: ``info["tools"]`` when rollout recorded them, else the
    ``Task.tools`` of the same task id listed by the trajectory's environment, else ``[]``.

    The environment lookup is a stop-gap for stores written before rollout recorded the tools;
    it loads each (env, split) task list once. It cannot recover tools that an environment
    changed mid-episode (BFCL multi-turn ``miss_func``): the initial task tools are used.
    An environment that cannot list its tasks yields ``[]`` for its trajectories.
    """
    from stages.core.envs import make_env

    out: list[list[dict[str, Any]]] = []
    for traj in trajectories:
        info = json.loads(traj.info) if traj.info else {}
        if isinstance(info.get("tools"), list):
            out.append(info["tools"])
            continue
        key = (traj.env, traj.split, data_dir)
        if key not in _TASK_TOOLS:
            try:
                env = make_env(traj.env, data_dir=Path(data_dir) if data_dir else None)
                try:
                    _TASK_TOOLS[key] = {t.task_id: t.tool_schemas for t in env.tasks(traj.split)}
                finally:
                    env.close()
            except Exception:  # noqa: BLE001 - unknown env / missing data: render without tools
                _TASK_TOOLS[key] = {}
        out.append(_TASK_TOOLS[key].get(traj.task_id, []))
    return out


_TASK_TOOLS: dict[tuple, dict[str, list[dict[str, Any]]]] = {}


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
