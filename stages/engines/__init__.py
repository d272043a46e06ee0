"""Rollout engines: one protocol, one factory, used by every stage that samples from a policy.

* :class:`SamplingParams`: the decoding settings of one ``generate`` call.
* :class:`Generation`: one completion with the exact token ids that were sampled and their
  log-probs under the sampling distribution (training uses these ids, never a re-tokenization
  of the text, and the log-probs as the behaviour policy's).
* :class:`RolloutEngine`: the protocol: ``generate(prompt_ids, params)``,
  ``sync_weights(model, adapter)``, ``device`` and ``dtype``.
* :func:`make_engine`: an engine by name (``hf``: :class:`stages.engines.hf.HFRolloutEngine`,
  transformers ``generate`` with prefix caching; ``vllm``: :class:`stages.engines.vllm.VLLMRolloutEngine`,
  vLLM's offline ``LLM`` on a GPU, the extra ``pip install '.[vllm]'``); :func:`check_engine`
  refuses an unusable name, or a temperature vLLM would not sample as asked, before any model is
  loaded.
* :func:`row_seed` / :func:`row_seeds`: the seed each prompt of a call is sampled under (a
  rollout's seed is a function of its task, sample and turn), so a completion never depends on
  the prompts batched beside it or on the number of processes.
* :func:`finish_generation`: the one rule that turns sampled ids into a :class:`Generation`
  (eos, stop strings, length), so every engine records the same thing for the same ids.

Prompts are token ids: the caller renders the conversation with the chat template and tokenizes
it without adding special tokens (:mod:`stages.core.text.chat`); engines add nothing.

This module is light (no torch import), so the CLI can import it cheaply.
"""
from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from stages.core.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

VLLM_MIN_TEMPERATURE = 0.01  # vLLM samples any temperature in (0, 0.01) at 0.01
VLLM_MAX_TEMPERATURE = 2.0  # vLLM refuses a temperature above 2


class SamplingParams(BaseModel):
    """Decoding settings of one rollout call.

    Attributes:
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus mass kept when sampling (1 = off).
        top_k: keep only the k most likely tokens when sampling (0 = off); applied before top_p.
        max_new_tokens: cap on generated tokens per completion.
        stop: strings that end a completion; the text is cut before the first one.
        seed: seed for sampling: prompt i of the call is sampled under the row seed ``seed + i``
            (None: unseeded, unless ``seeds`` is set).
        seeds: one row seed per prompt of the call (overrides ``seed``). Each prompt is sampled
            from its own random stream seeded by its row seed, so its completion depends on its
            row seed, its prompt and the weights only: not on the other prompts of the call nor on
            how the engine batches them (up to the float noise of batched logits).
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(256, ge=1)
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    seed: int | None = None
    seeds: list[int] | None = None


def row_seed(seed: int, task: int, sample: int, turn: int) -> int:
    """The row seed of turn ``turn`` of sample ``sample`` of the task at position ``task`` of a
    run's task list, under the run's sampling seed ``seed``: a 63-bit non-negative int hashed from
    the four (so distinct rows get unrelated random streams)."""
    key = f"{seed}/{task}/{sample}/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


def row_seeds(params: SamplingParams, n: int) -> list[int] | None:
    """The row seeds of a call with ``n`` prompts: ``params.seeds``, else ``seed + i`` for prompt i,
    else None (unseeded).

    Raises:
        ValueError: ``params.seeds`` does not hold one seed per prompt.
    """
    if params.seeds is not None:
        if len(params.seeds) != n:
            raise ValueError(f"SamplingParams.seeds holds {len(params.seeds)} seeds for {n} prompts")
        return list(params.seeds)
    return None if params.seed is None else [params.seed + i for i in range(n)]


@dataclass(frozen=True)
class Generation:
    """One completion.

    Attributes:
        text: the decoded completion, cut before the first stop string, without the eos that
            ended it; every other token is decoded as it is, special tokens included: a
            tokenizer may mark tool-call tags (``<tool_call>``) or reasoning tags special, and
            stripping them would merge or lose calls.
        token_ids: exactly the sampled ids, never re-tokenized: including the eos id if one was
            sampled, and the ids that completed a stop string (nothing after them).
        logprobs: one per token id: its log-probability under the sampling distribution
            ``log_softmax(raw_logits / temperature)`` (temperature 0: ``log_softmax(raw_logits)``),
            taken before top-p / top-k truncation (every engine that trains keeps this; the
            ``vllm`` engine serving a model folder, as ``lopd evaluate`` uses it, reports vLLM's
            values after truncation: see :mod:`stages.engines.vllm`).
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
    """Anything that turns tokenized prompts into completions (``hf``, ``vllm``).

    An engine that holds GPU memory of its own may also offer ``sleep()``: free that memory
    while the trainer runs (the next ``generate`` takes it back); the distill loop calls it
    before every update when the engine has it.
    """

    device: torch.device
    dtype: torch.dtype

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt (token ids, chat template applied, no special tokens added
        by the engine), in prompt order."""

    def sync_weights(self, model: nn.Module, adapter: str | None = None) -> None:
        """Generate with ``model`` (and its peft adapter ``adapter``) from now on.

        Called after every optimizer step; cached state derived from older weights is dropped.
        """


def eos_token_ids(generation_eos: int | list[int] | None, tokenizer) -> list[int]:
    """Sorted ids that end a completion: the model's ``generation_config.eos_token_id`` (an id,
    a list of ids or None) and ``tokenizer.eos_token_id``."""
    ids = set(generation_eos if isinstance(generation_eos, list) else [generation_eos] if generation_eos is not None
              else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def finish_generation(ids: list[int], logprobs: list[float], eos_ids: list[int], stop: list[str],
                      decode: Callable[[list[int]], str]) -> Generation:
    """The :class:`Generation` of the ids an engine sampled after one prompt.

    Everything after the first eos id is dropped (padding of a batch). Then, if the decoded
    text before that eos holds a stop string, the text is cut before the earliest one and the
    ids are the fewest that already decode to a text holding a stop string (``"stop"``);
    otherwise an eos ends the ids (kept, ``"eos"``), else ``"length"``. ``logprobs`` (one per
    id) is cut to the kept ids.

    Args:
        ids: the sampled ids, in order.
        logprobs: their sampling log-probs (at least as many as the kept ids).
        eos_ids: ids that end a completion (:func:`eos_token_ids`).
        stop: stop strings (empty: none).
        decode: ids -> text, special tokens kept (``partial(tokenizer.decode, skip_special_tokens=False)``).
    """
    eos_at = next((i for i, t in enumerate(ids) if t in eos_ids), None)
    body = ids if eos_at is None else ids[:eos_at]
    text = decode(body)
    cut = min((i for s in stop if (i := text.find(s)) >= 0), default=None)
    if cut is not None:
        # fewest tokens whose text already contains a stop string (containment grows with k)
        lo, hi = 1, len(body)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in decode(body[:mid]) for s in stop):
                hi = mid
            else:
                lo = mid + 1
        ids, text, reason = body[:lo], text[:cut], "stop"
    elif eos_at is not None:
        ids, reason = ids[: eos_at + 1], "eos"
    else:
        reason = "length"
    return Generation(text=text, token_ids=ids, logprobs=logprobs[: len(ids)], num_tokens=len(ids),
                      finish_reason=reason)


def check_engine(name: str, temperature: float | None = None) -> None:
    """Refuse an engine that cannot run here, or cannot sample at ``temperature``, before anything
    is loaded.

    vLLM's ``SamplingParams`` raises for a temperature above 2 and samples a temperature in
    (0, 0.01) at 0.01 (with a logged warning only), so the ``vllm`` engine takes 0 (greedy) or a
    temperature in [:data:`VLLM_MIN_TEMPERATURE`, :data:`VLLM_MAX_TEMPERATURE`]; ``hf`` takes any
    temperature >= 0.

    Raises:
        ValueError: an unknown name (the message lists the known ones), ``vllm`` without the
            vllm package installed, or ``vllm`` with a temperature outside its range.
    """
    ENGINES.get_or_raise(name)  # an unknown name raises, listing the known ones
    if name == "vllm" and temperature is not None:
        check_vllm_temperature(temperature)
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("engine 'vllm' needs the vllm package (a CUDA GPU): install with pip install '.[vllm]'")


def check_vllm_temperature(temperature: float) -> None:
    """Refuse a temperature the ``vllm`` engine would not sample as asked (see :func:`check_engine`).

    Raises:
        ValueError: ``temperature`` is neither 0 nor in [0.01, 2].
    """
    if temperature != 0 and not VLLM_MIN_TEMPERATURE <= temperature <= VLLM_MAX_TEMPERATURE:
        raise ValueError(f"engine 'vllm' samples temperature 0 (greedy) or {VLLM_MIN_TEMPERATURE} to "
                         f"{VLLM_MAX_TEMPERATURE}, got {temperature}: use --engine hf for it")


def make_engine(name: str, model, tokenizer, *, adapter: str | None = None, batch_size: int = 8,
                prefix_cache_tokens: int = 0, compile_decode: bool = False) -> RolloutEngine:
    """The rollout engine called ``name`` for ``model`` / ``tokenizer``.

    Args:
        name: ``"hf"`` (:class:`stages.engines.hf.HFRolloutEngine`) or ``"vllm"``
            (:class:`stages.engines.vllm.VLLMRolloutEngine`).
        model, tokenizer: the policy (e.g. from :func:`stages.core.models.backbone.load_policy`); for
            ``vllm`` ``model`` may also be a model folder or hub id (served as it is, no sync).
        adapter: peft adapter to generate with (``hf``: None = whatever the model has active;
            ``vllm``: None = the model's full weights).
        batch_size: prompts per batched forward (``hf``; vLLM schedules its own batches).
        prefix_cache_tokens: KV prefix-cache budget in tokens, 0 = off (``hf``; vLLM caches
            prefixes itself).
        compile_decode: ``hf`` on a GPU: compile the decoding forward (see
            :class:`stages.engines.hf.HFRolloutEngine`); vLLM compiles on its own.

    Raises:
        ValueError: see :func:`check_engine`.
    """
    check_engine(name)
    return ENGINES[name](model, tokenizer, adapter=adapter, batch_size=batch_size,
                         prefix_cache_tokens=prefix_cache_tokens, compile_decode=compile_decode)


def _hf_engine(model, tokenizer, *, adapter: str | None, batch_size: int, prefix_cache_tokens: int,
               compile_decode: bool) -> RolloutEngine:
    from stages.engines.hf import HFRolloutEngine

    return HFRolloutEngine(model, tokenizer, adapter=adapter, batch_size=batch_size,
                           prefix_cache_tokens=prefix_cache_tokens, compile_decode=compile_decode)


def _vllm_engine(model, tokenizer, *, adapter: str | None, batch_size: int, prefix_cache_tokens: int,
                 compile_decode: bool) -> RolloutEngine:
    from stages.engines.vllm import VLLMRolloutEngine

    return VLLMRolloutEngine(model, tokenizer, adapter=adapter)


# Engine name -> factory (model, tokenizer, *, adapter, batch_size, prefix_cache_tokens,
# compile_decode); the engine modules are imported only when an engine is built.
ENGINES: Registry[Callable[..., RolloutEngine]] = Registry("engine", sort=False,
                                                           unknown="unknown engine {name}; known engines: {known}")
ENGINES.add("hf", _hf_engine)
ENGINES.add("vllm", _vllm_engine)
