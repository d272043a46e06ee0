"""Privileged prompts: a training row's prompt re-rendered with text the student does not see.

The view of a text-context teacher (OPSD's reference in the system message, SDFT's
demonstration in the first user message, B.1 of the LOPD paper) and of the ``framed``
placement's opening.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from schemas import Message
from stages.core.data.rows import TrainRow, trajectory_tools
from stages.core.text.chat import render_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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
