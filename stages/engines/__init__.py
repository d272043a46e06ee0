"""Rollout engines: one protocol, one factory, used by every stage that samples from a policy.

* :class:`SamplingParams`: the decoding settings of one ``generate`` call.
* :class:`Generation`: one completion with the exact token ids that were sampled and their
  log-probs under the sampling distribution (training uses these ids, never a re-tokenization
  of the text, and the log-probs as the behaviour policy's).
* :class:`RolloutEngine`: the protocol: ``generate(prompt_ids, params)``,
  ``sync_weights(model, adapter)``, ``device`` and ``dtype``.
* :func:`make_engine`: an engine by name (``hf``: :class:`stages.engines.hf.HFRolloutEngine`,
  transformers ``generate`` with prefix caching; ``vllm``: not available yet).

Prompts are token ids: the caller renders the conversation with the chat template and tokenizes
it without adding special tokens (:mod:`stages.core.chat`); engines add nothing.

This module is light (no torch import), so the CLI can import it cheaply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import torch
    from torch import nn

ENGINES = ("hf", "vllm")


class SamplingParams(BaseModel):
    """Decoding settings of one rollout call.

    Attributes:
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus mass kept when sampling (1 = off).
        top_k: keep only the k most likely tokens when sampling (0 = off); applied before top_p.
        max_new_tokens: cap on generated tokens per completion.
        stop: strings that end a completion; the text is cut before the first one.
        seed: seed for sampling; same seed + same prompts -> same completions (None: unseeded).
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(256, ge=1)
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One completion.

    Attributes:
        text: decoded completion, special tokens stripped, cut before the first stop string.
        token_ids: exactly the sampled ids, never re-tokenized: including the eos id if one was
            sampled, and the ids that completed a stop string (nothing after them).
        logprobs: one per token id: its log-probability under the sampling distribution
            ``log_softmax(raw_logits / temperature)`` (temperature 0: ``log_softmax(raw_logits)``),
            taken before top-p / top-k truncation.
        num_tokens: ``len(token_ids)``.
        finish_reason: ``"eos"`` (an eos id was sampled), ``"stop"`` (a stop string appeared) or
            ``"length"`` (``max_new_tokens`` reached).
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    num_tokens: int
    finish_reason: Literal["eos", "stop", "length"]


class RolloutEngine(Protocol):
    """Anything that turns tokenized prompts into completions (``hf`` here; ``vllm`` later)."""

    device: torch.device
    dtype: torch.dtype

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt (token ids, chat template applied, no special tokens added
        by the engine), in prompt order."""

    def sync_weights(self, model: nn.Module, adapter: str | None = None) -> None:
        """Generate with ``model`` (and its peft adapter ``adapter``) from now on.

        Called after every optimizer step; cached state derived from older weights is dropped.
        """


def make_engine(name: str, model, tokenizer, *, adapter: str | None = None, batch_size: int = 8,
                prefix_cache_tokens: int = 0) -> RolloutEngine:
    """The rollout engine called ``name`` for ``model`` / ``tokenizer``.

    Args:
        name: ``"hf"`` (:class:`stages.engines.hf.HFRolloutEngine`) or ``"vllm"`` (not yet).
        model, tokenizer: the policy (e.g. from :func:`stages.core.policy.load_policy`).
        adapter: peft adapter to generate with (None: whatever the model has active).
        batch_size: prompts per batched forward.
        prefix_cache_tokens: KV prefix-cache budget in tokens (0 = off).

    Raises:
        ValueError: ``vllm`` (not available yet) or an unknown name (the message lists the known ones).
    """
    if name == "hf":
        from stages.engines.hf import HFRolloutEngine

        return HFRolloutEngine(model, tokenizer, adapter=adapter, batch_size=batch_size,
                               prefix_cache_tokens=prefix_cache_tokens)
    if name == "vllm":
        raise ValueError("engine 'vllm' is not available yet; use --engine hf")
    raise ValueError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
