"""The ``framed`` latent placement (A.4 of the LOPD paper): latents inside the first user message.

The official implementation puts a sentinel string in the FIRST USER MESSAGE between two framing
texts ("a reference example from a different task ..." before, "now complete your task ..."
after), renders the chat template, splits the rendered prompt on the sentinel and puts the J*K
latent positions in the gap. Here the teacher's prompt is the student's prompt re-rendered with
``before + SENTINEL + after`` appended to its first user message
(:func:`stages.core.latent.privileged.privileged_prompt`), split on the sentinel, each part tokenized; the
student's sampled completion follows unchanged (the placement: :class:`stages.core.latent.placements.Framed`).

The framing texts live here, one pair per domain (:data:`FRAMES`); the domain comes from the
trajectory's environment (:func:`frame_domain`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stages.core.latent.privileged import privileged_prompt, with_privileged_text
from stages.core.text.chat import render_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from schemas import Message
    from stages.core.data.rows import TrainRow

# (before, after) the latent span, per domain; in our own words after A.4 of the LOPD paper
FRAMES: dict[str, tuple[str, str]] = {
    "agentic": (
        "Below is a reference example from a different task, given as compressed memory:",
        "Now complete your own task above. Use the reference only as guidance: its tools, "
        "arguments and steps may differ from what your task needs.",
    ),
    "coding": (
        "Below is a reference solution process from a different programming problem, given as "
        "compressed memory:",
        "Now solve your own problem above. Use the reference only as guidance.",
    ),
}
# environments whose tasks are programming problems (every other one is agentic tool use)
CODING_ENVS = frozenset({"code", "livecodebench", "taco"})
# private-use code points: never produced by a tokenizer's decode of ordinary text
SENTINEL = "\ue000lopd-latents\ue001"


def frame_domain(env: str) -> str:
    """``"coding"`` for the programming environments (:data:`CODING_ENVS`), else ``"agentic"``."""
    return "coding" if env in CODING_ENVS else "agentic"


def framed_prompt_ids(tokenizer: PreTrainedTokenizerBase, row: TrainRow) -> tuple[list[int], list[int]]:
    """The teacher prompt of ``row`` around the latent span: (ids before it, ids after it).

    The prompt is the conversation before the row's first action, rendered with the framing of
    the row's domain appended to the first user message; the latents go between the two id
    lists, and the row's completion (from its first sampled id on) follows the second.

    Raises:
        ValueError: the rendered prompt holds the sentinel other than once (the trajectory's own
            text contains it), or the trajectory lacks the assistant turn the row starts at.
    """
    text = privileged_prompt(tokenizer, row, user=framing_text(row.trajectory.env))
    return _split(tokenizer, text, f"trajectory {row.trajectory.trajectory_id}")


def framed_opening_ids(tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict[str, Any]],
                       env: str) -> tuple[list[int], list[int]]:
    """:func:`framed_prompt_ids` for an episode's opening ``messages`` (generation with latents).

    Raises:
        ValueError: no user message, or the sentinel occurs in the messages' own text.
    """
    if not any(m.role == "user" for m in messages):
        raise ValueError("framed latents need a user message in the opening prompt")
    framed = with_privileged_text(messages, user=framing_text(env))
    return _split(tokenizer, render_prompt(tokenizer, framed, tools), "the opening prompt")


def framing_text(env: str) -> str:
    """The text appended to the first user message: before-frame, sentinel, after-frame."""
    before, after = FRAMES[frame_domain(env)]
    return f"{before}\n{SENTINEL}\n{after}"


def _split(tokenizer: PreTrainedTokenizerBase, text: str, what: str) -> tuple[list[int], list[int]]:
    parts = text.split(SENTINEL)
    if len(parts) != 2:
        raise ValueError(f"{what}: the prompt contains the latent sentinel {SENTINEL!r} "
                         f"({len(parts) - 1} times after framing)")
    head, tail = (tokenizer(part, add_special_tokens=False)["input_ids"] for part in parts)
    return head, tail
