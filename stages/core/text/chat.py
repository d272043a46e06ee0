"""Chat rendering with tools, and token-level action masks for training.

Tool-call text format (Hermes / Qwen style, what templates with native tool support produce)::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

one call per line. Templates without tool support (SmolLM2's ChatML) get the tool schemas and
this instruction appended to the system message; assistant ``tool_calls`` are rendered as such
lines and ``role="tool"`` messages as ``<tool_response>...</tool_response>`` inside a user turn.
Templates that reference ``tools`` (Qwen3, Llama 3.1 ...) receive ``tools=`` and OpenAI-format
``tool_calls`` natively.

An assistant message with non-empty ``content`` (the raw action text as the policy generated it, in
whatever call format) is rendered verbatim; its ``tool_calls`` are then only parsed metadata. This
keeps re-rendered actions identical to what was sampled.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from schemas import Message, ToolCall

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
# End-of-turn markers of common chat templates, tried after the tokenizer's eos token.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>")


def tools_instruction(tools: list[dict[str, Any]]) -> str:
    """System-prompt block describing ``tools`` and the ``<tool_call>`` answer format."""
    schemas = "\n".join(json.dumps(_openai_tool(t), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, answer with one line holding a JSON object with the function name "
        f"and arguments within {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n"
        f'{TOOL_CALL_OPEN}{{"name": <function-name>, "arguments": <args-json-object>}}{TOOL_CALL_CLOSE}'
    )


def format_tool_calls(calls: list[ToolCall]) -> str:
    """``calls`` as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` lines."""
    return "\n".join(
        f'{TOOL_CALL_OPEN}{json.dumps({"name": c.name, "arguments": c.args}, ensure_ascii=False)}{TOOL_CALL_CLOSE}'
        for c in calls
    )


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """Wrap a bare function schema ``{name, description, parameters}`` as ``{type, function}``."""
    return tool if tool.get("type") == "function" and "function" in tool else {"type": "function", "function": tool}


def _template_text(tokenizer: PreTrainedTokenizerBase) -> str:
    template = tokenizer.chat_template
    if template is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r}: chat_template is missing")
    return " ".join(template.values()) if isinstance(template, dict) else template


def _assistant_text(m: Message) -> str:
    # A non-empty content is the raw action as sampled (whatever call format it used): render it
    # verbatim so training sees exactly the sampled text; only call-only messages are formatted.
    if m.content or not m.tool_calls:
        return m.content
    return format_tool_calls(m.tool_calls)


def _plain_messages(messages: list[Message], tools: list[dict[str, Any]], tool_role: bool) -> list[dict]:
    """Messages for a template without tool support, tools described in the system prompt."""
    out: list[dict] = []
    for m in messages:
        if m.role == "assistant":
            out.append({"role": "assistant", "content": _assistant_text(m)})
        elif m.role == "tool" and not tool_role:
            block = f"{TOOL_RESPONSE_OPEN}\n{m.content}\n{TOOL_RESPONSE_CLOSE}"
            if out and out[-1].get("_tool"):  # consecutive tool results share one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({"role": m.role, "content": m.content})
    for d in out:
        d.pop("_tool", None)
    if tools:
        block = tools_instruction(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _native_messages(messages: list[Message]) -> list[dict]:
    """OpenAI-format messages for templates with native tool support."""
    out: list[dict] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.role == "assistant" and m.tool_calls and TOOL_CALL_OPEN not in m.content:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.args}} for c in m.tool_calls
            ]
        if m.role == "tool" and m.name:
            d["name"] = m.name
        out.append(d)
    return out


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> str:
    """The chat-template text of ``messages`` (see the module docstring for the tool handling).

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    template = _template_text(tokenizer)
    if "tools" in template:
        return tokenizer.apply_chat_template(
            _native_messages(messages),
            tools=[_openai_tool(t) for t in tools] or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
    tool_role = "'tool'" in template or '"tool"' in template
    return tokenizer.apply_chat_template(
        _plain_messages(messages, tools, tool_role), add_generation_prompt=add_generation_prompt, tokenize=False
    )


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict[str, Any]]) -> str:
    """The prompt text for the next assistant turn (chat template + generation prompt)."""
    return render(tokenizer, messages, tools, add_generation_prompt=True)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A short hash of ``tokenizer``'s vocabulary and special tokens (16 hex characters).

    Two tokenizers with the same fingerprint map text to the same ids, so stored token ids are
    only used for training under the tokenizer that produced them. Cached on the tokenizer.
    """
    cached = getattr(tokenizer, "_lopd_fingerprint", None)
    if cached:
        return cached
    import hashlib

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha1(json.dumps([vocab, tokenizer.eos_token, tokenizer.pad_token]).encode()).hexdigest()[:16]
    try:
        tokenizer._lopd_fingerprint = digest
    except AttributeError:
        pass
    return digest


# Stands in for an action's text when rendering what follows it (private-use code points: never
# produced by a tokenizer's decode of real text, never rewritten by a template).
_ACTION_SENTINEL = "\ue000lopd-action\ue001"


def context_after_action(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict[str, Any]],
    sampled_end: str = "",
) -> str:
    """The prompt text that follows an action's sampled tokens, up to the next generation prompt.

    ``messages`` is the conversation whose LAST assistant message is the action just taken,
    followed by the environment's answer (zero or more messages). The conversation is rendered
    with that action's content replaced by a sentinel and the generation prompt added; the text
    after the sentinel is returned: the template's end-of-turn marker, the observation turns and
    the next assistant header. When the policy itself sampled the end-of-turn token
    (``sampled_end`` = its decoded text, e.g. ``"<|im_end|>"``) and the text starts with it, it
    is left out: those ids are already among the sampled ones. A truncated action (no end token
    sampled) keeps the marker here, as unsupervised context.

    Rendering only what follows the action keeps earlier turns exactly as sampled, also with
    templates that rewrite earlier assistant turns (Qwen3 drops old ``<think>`` blocks).

    Raises:
        ValueError: no assistant message, no chat template, or a template that does not render
            assistant content verbatim.
    """
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
    if last is None:
        raise ValueError("context_after_action: the conversation has no assistant message")
    stand_in = [*messages[:last], Message(role="assistant", content=_ACTION_SENTINEL), *messages[last + 1:]]
    text = render(tokenizer, stand_in, tools, add_generation_prompt=True)
    at = text.rfind(_ACTION_SENTINEL)
    if at < 0:
        raise ValueError(f"chat template of {tokenizer.name_or_path!r} does not render assistant "
                         "content verbatim; cannot place the sampled tokens")
    after = text[at + len(_ACTION_SENTINEL):]
    return after[len(sampled_end):] if sampled_end and after.startswith(sampled_end) else after


def _end_of_turn(tokenizer: PreTrainedTokenizerBase, segment: str) -> int:
    """Character index just past the end-of-turn marker in an assistant segment (len if none)."""
    for marker in (tokenizer.eos_token, *_END_OF_TURN):
        if marker and (i := segment.rfind(marker)) >= 0:
            return i + len(marker)
    return len(segment)


def _segments(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict[str, Any]]
) -> list[tuple[str, bool]]:
    """The whole conversation's text cut into ``(text, is_action)`` pieces, in order."""
    full = render(tokenizer, messages, tools, add_generation_prompt=False)
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        prefix = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
        upto = render(tokenizer, messages[: i + 1], tools, add_generation_prompt=False)
        if not (upto.startswith(prefix) and full.startswith(upto) and len(prefix) >= pos):
            raise ValueError(
                f"chat template of {tokenizer.name_or_path!r}: rendering is not prefix-stable at "
                f"messages[{i}] (assistant), cannot cut action segments"
            )
        end = len(prefix) + _end_of_turn(tokenizer, upto[len(prefix) :])
        pieces += [(full[pos : len(prefix)], False), (full[len(prefix) : end], True)]
        pos = end
    pieces.append((full[pos:], False))
    return [p for p in pieces if p[0]]


def tokenize_for_training(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict[str, Any]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of a whole conversation and the action mask w_{t,n} of the LOPD paper (Eq. 9-10).

    Built by segments: for each assistant message i, ``render(messages[:i])`` with the generation
    prompt is the context and ``render(messages[:i+1])`` minus that prefix is the action; each piece
    is tokenized separately (no special tokens added) and concatenated. For ChatML templates the
    result equals the tokenization of the whole rendered conversation.

    Returns:
        input_ids_T: LongTensor (T,).
        action_mask_T: BoolTensor (T,), True exactly on assistant-generated tokens (content and
            the end-of-turn token), False on system/user/tool text and template scaffolding.

    Raises:
        ValueError: no chat template, or the template is not prefix-stable (see :func:`render`).
    """
    import torch

    ids: list[int] = []
    mask: list[bool] = []
    for text, is_action in _segments(tokenizer, messages, tools):
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [is_action] * len(piece)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)


def action_spans(action_mask_T: torch.Tensor) -> list[tuple[int, int]]:
    """Half-open ``(start, end)`` token ranges of the True runs of ``action_mask_T`` (T,) bool.

    With :func:`tokenize_for_training` there is one span per assistant message, in order (used to
    place latents right before each action, the ``per-turn`` placement of Eq. 8).
    """
    import torch

    edge = action_mask_T.new_zeros(1, dtype=torch.int8)  # on the mask's device
    edges = torch.diff(torch.cat([edge, action_mask_T.to(torch.int8), edge]))
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    return list(zip(starts, ends))
