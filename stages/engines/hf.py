"""The ``hf`` rollout engine: transformers ``generate``, batched, left padding, KV cache.

Optional prefix caching (:mod:`stages.engines.prefix_cache`) encodes only the part of each prompt
that no earlier call already encoded, and a prefix that rows of one call share (the G rollouts of
one task: their whole prompt) once.

Sampling: ``generate`` runs greedy (``do_sample=False``) and :class:`_RowSampler`, the last
logits processor, draws each row's token itself: the temperature / top-k / top-p warpers as
transformers builds them, then Gumbel-max with noise from the row's own ``torch.Generator``
seeded by its row seed (:func:`stages.engines.row_seeds`). A row's tokens therefore depend on its
seed and its own logits only, never on the rows batched beside it or on ``batch_size``.

Log-probs of the sampled tokens come from the raw logits ``generate`` computes at each step:
:class:`_SampledLogprobs` is the first logits processor, keeps ``log_softmax(raw / T)`` of the
current step only (one [batch x vocab] tensor), and gathers it at the token the next step shows
was sampled. So no [steps x vocab] tensor is ever held (``output_logits=True`` would keep all of
them until ``generate`` returns), and both the plain and the prefix-cached path share the code.

On the CPU, decode steps of at most ``FEW_ROWS`` rows compute each float32 linear layer as
``(W @ x.T).T`` (:func:`_few_row_linears`): the same product, which MKL computes faster there;
a peft LoRA layer with one plain adapter active skips peft's per-call dispatch there too.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn
from transformers import (
    GenerationConfig, LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

from stages.core.losses.chunking import upcast_dtype
from stages.core.run.resources import transient_blocks
from stages.engines import Generation, SamplingParams, eos_token_ids, finish_generation, row_seeds
from stages.engines.prefix_cache import PrefixCache, generate_cached


class _SampledLogprobs(LogitsProcessor):
    """Records ``log_softmax(raw_logits / T)`` at every sampled token (T = 1 when greedy).

    Must see the raw logits, i.e. run before :class:`_RowSampler` (the engine passes it first in
    ``generate(logits_processor=...)``; greedy ``generate`` builds no processor of its own from
    the neutral config). Scores are returned unchanged.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature > 0 else 1.0
        self.pending: torch.Tensor | None = None  # (B, V) log-probs of the step being sampled
        self.steps: list[torch.Tensor] = []  # (B,) log-prob of each earlier step's sampled token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.pending is not None:  # input_ids now ends with the previous step's token
            self.steps.append(self.pending.gather(1, input_ids[:, -1:]).squeeze(1))
        # float32 for half-precision scores, float64 stays (as the training losses read them)
        self.pending = torch.log_softmax(scores.to(upcast_dtype(scores.dtype)) / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(B, n) log-probs of the n generated tokens ``new_tokens`` (B, n); frees the last step."""
        n = new_tokens.shape[1]
        if len(self.steps) == n - 1 and self.pending is not None:
            last = new_tokens[:, -1:].to(self.pending.device)
            self.steps.append(self.pending.gather(1, last).squeeze(1))
        self.pending = None
        if len(self.steps) < n:
            raise RuntimeError(f"log-probs of {len(self.steps)} steps recorded for {n} generated tokens")
        return torch.stack(self.steps[:n], dim=1).cpu()


class _RowSampler(LogitsProcessor):
    """Samples every row's next token from the row's own random stream (Gumbel-max).

    The (B, V) scores are warped as transformers' sampling would warp them (temperature, then
    top-k, then top-p, at least one token kept); each row draws V uniforms u in [0, 1) in float64
    from its ``torch.Generator`` (seeded by its row seed, on the scores' device; one draw of V per
    generated token) and takes the argmax of ``warped - log(-log(u))``: an exact sample of
    ``softmax(warped)``. The returned scores are 0 at that token and -inf elsewhere, so
    ``generate``'s greedy choice takes it.

    Args:
        params: the call's sampling settings (``temperature`` > 0).
        seeds: one row seed per row of the batch, in row order.
    """

    def __init__(self, params: SamplingParams, seeds: list[int]):
        self.warpers = LogitsProcessorList()
        if params.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            self.warpers.append(TopKLogitsWarper(params.top_k, min_tokens_to_keep=1))
        if params.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(params.top_p, min_tokens_to_keep=1))
        self.seeds = seeds
        self.generators: list[torch.Generator] = []  # made on the first call, on the scores' device

    def __call__(self, input_ids: torch.LongTensor, scores_BV: torch.FloatTensor) -> torch.FloatTensor:
        device, V = scores_BV.device, scores_BV.shape[1]
        if not self.generators:
            self.generators = [torch.Generator(device=device).manual_seed(s) for s in self.seeds]
        warped_BV = self.warpers(input_ids, scores_BV.to(torch.float64))
        uniform_BV = torch.stack([torch.rand(V, generator=g, dtype=torch.float64, device=device)
                                  for g in self.generators])
        choice_B1 = (warped_BV - torch.log(-torch.log(uniform_BV))).argmax(dim=1, keepdim=True)
        return torch.full_like(scores_BV, float("-inf")).scatter_(1, choice_B1, 0.0)


# Every GenerationConfig field that adds a logits processor / warper, at the value that adds none.
# ``generate`` fills each field left None from the model's generation_config (the checkpoint's
# generation_config.json), so the engine also hides that config for the call (_clean_defaults).
_NEUTRAL = dict(
    num_beams=1, num_return_sequences=1, min_length=0, min_new_tokens=None, max_length=None,
    repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
    encoder_no_repeat_ngram_size=0, bad_words_ids=None, sequence_bias=None, suppress_tokens=None,
    begin_suppress_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None,
    exponential_decay_length_penalty=None, guidance_scale=None, min_p=None, typical_p=1.0, top_h=None,
    epsilon_cutoff=0.0, eta_cutoff=0.0, remove_invalid_values=False, renormalize_logits=False,
    watermarking_config=None, penalty_alpha=None,
)


@contextlib.contextmanager
def _clean_defaults(model: nn.Module):
    """Within the block, ``model``'s Hugging Face generation_config is an empty one (restored after).

    ``generate`` takes every field its ``generation_config`` argument leaves None from the
    model's own config; some fields (``min_p``, ``suppress_tokens`` ...) add a processor for any
    value but None, so no explicit value can switch them off: hiding the model's config is the
    only way to sample from exactly the distribution asked for.
    """
    from stages.core.models.composer import base_model

    hf = base_model(model)
    saved = hf.generation_config
    hf.generation_config = GenerationConfig()
    try:
        yield
    finally:
        hf.generation_config = saved


# A decode step feeds each linear layer one row per sequence. On a 2-core AMD EPYC (MKL, AVX-512)
# float32 x @ W.T at 2-4 rows was slower than the same product written (W @ x.T).T and gained
# little from a second thread; from 8 rows on F.linear was as fast. One row (MKL's matrix-vector
# product) is faster computed as 2 equal rows. CPU rollouts of 64 tokens at SmolLM2-135M's shape,
# 2 threads: 1 row 3.18 -> 2.36 s, 2 rows 4.80 -> 2.34 s, 4 rows 4.81 -> 2.91 s
# (benchmarks/bench_rollout.py, modes plain-linear and eager).
FEW_ROWS = 4


def _linear_few_rows(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for ``x`` (..., in): at most FEW_ROWS rows as ``(W @ x.T).T`` (one row as two
    equal rows), more by ``F.linear``. The same product, shape (..., out), contiguous."""
    rows = x.numel() // layer.in_features
    if rows > FEW_ROWS:
        return torch.nn.functional.linear(x, layer.weight, layer.bias)
    x_RI = x.reshape(rows, layer.in_features)
    if rows == 1:  # as two equal rows: the matrix-vector product ran at half their speed
        return _linear_few_rows(layer, x_RI.repeat(2, 1))[:1].reshape(*x.shape[:-1], layer.out_features)
    y_OR = (torch.mm(layer.weight, x_RI.T) if layer.bias is None
            else torch.addmm(layer.bias[:, None], layer.weight, x_RI.T))
    return y_OR.T.contiguous().reshape(*x.shape[:-1], layer.out_features)


def _lora_few_rows(layer: nn.Module, adapter: str, x: torch.Tensor) -> torch.Tensor:
    """A peft LoRA linear ``layer(x)`` with the one plain ``adapter`` active (:func:`_plain_lora`)
    for ``x`` (..., in): at most FEW_ROWS rows as base(x) + scaling * (B (A x.T)).T, the base
    product by :func:`_linear_few_rows`, without peft's per-call dispatch; more rows by peft's
    forward. Same shape, contiguous."""
    base = layer.base_layer
    rows = x.numel() // base.in_features
    if rows > FEW_ROWS:
        return type(layer).forward(layer, x)
    x_RI = x.reshape(rows, base.in_features)
    delta_OR = layer.lora_B[adapter].weight @ (layer.lora_A[adapter].weight @ x_RI.T)
    y_RO = _linear_few_rows(base, x_RI).add_(delta_OR.T, alpha=layer.scaling[adapter])
    return y_RO.reshape(*x.shape[:-1], base.out_features)


def _plain_lora(layer: nn.Module) -> str | None:
    """The adapter of a peft LoRA ``Linear`` whose forward is base(x) + scaling * B(A(x)): one
    active adapter, plain LoRA (no variant such as DoRA), no bias on B, no dropout at work,
    not merged, adapters on, float32 on the CPU. None for any other layer."""
    if type(layer) is not LoraLinear or layer.disable_adapters or layer.merged:
        return None
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if len(active) != 1 or active[0] in layer.lora_variant:
        return None
    name, base = active[0], layer.base_layer
    dropout, a, b = layer.lora_dropout[name], layer.lora_A[name], layer.lora_B[name]
    plain = (isinstance(dropout, nn.Identity) or not dropout.training) and b.bias is None and a.bias is None
    cpu32 = all(w.device.type == "cpu" and w.dtype == torch.float32 for w in (base.weight, a.weight, b.weight))
    return name if plain and cpu32 and type(base) is nn.Linear else None


@contextlib.contextmanager
def _few_row_linears(model: nn.Module):
    """Within the block every plain float32 ``nn.Linear`` of a CPU ``model`` runs
    :func:`_linear_few_rows`, and every peft LoRA linear with one plain adapter active
    :func:`_lora_few_rows` (instance attributes ``forward``, removed on exit). Subclasses
    (quantized layers), layers whose ``forward`` is already replaced on the instance (accelerate's
    hooks) and models on other devices are left as they are."""
    patched = []
    for m in model.modules():
        if "forward" in m.__dict__:
            continue
        adapter = _plain_lora(m)
        if adapter is not None:
            m.forward = functools.partial(_lora_few_rows, m, adapter)
        elif type(m) is nn.Linear and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32:
            m.forward = functools.partial(_linear_few_rows, m)
        else:
            continue
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


def generation_config(params: SamplingParams, pad_token_id: int | None, eos_ids: list[int], *,
                      compile_decode: bool = False) -> GenerationConfig:
    """The ``GenerationConfig`` of one ``generate`` call: greedy, every field set so that
    ``generate`` builds no logits processor (nothing from the checkpoint). Sampling is done by
    :class:`_RowSampler`, passed as a logits processor; no top_k is set: transformers warns, on
    every call, of a flag it will not use.

    ``compile_decode`` False sets ``disable_compile``: on a GPU, ``generate`` would otherwise
    compile the decoding forward with ``torch.compile`` whenever it is handed a ``StaticCache``
    (the prefix-cached path), once per new cache shape.
    """
    config = GenerationConfig()
    config.update(**_NEUTRAL, max_new_tokens=params.max_new_tokens, do_sample=False, temperature=1.0, top_p=1.0,
                  top_k=None, pad_token_id=pad_token_id, eos_token_id=eos_ids, stop_strings=params.stop or None,
                  disable_compile=not compile_decode)
    return config


class HFRolloutEngine:
    """Rollouts with transformers ``generate``: mini-batches, left padding, KV cache.

    Args:
        model: a causal LM (eval mode), e.g. from :func:`stages.core.models.backbone.load_policy`; may be
            a peft model.
        tokenizer: its tokenizer; must have a pad token (``load_policy`` sets one). Used for eos
            ids, stop strings and decoding; prompts arrive tokenized.
        adapter: the peft adapter to generate with: every ``generate`` call runs under
            :func:`stages.core.models.composer.adapter_scope` ``(model, adapter)`` and restores the
            previous adapter state afterwards. None: the model as it is (on a peft model,
            whichever adapter is active, or none if adapters are disabled, at call time).
        batch_size: prompts per ``generate`` call.
        prefix_cache_tokens: when > 0, keep the KV cache of up to this many tokens of earlier
            sequences and encode only the uncached part of each prompt
            (:mod:`stages.engines.prefix_cache`). Call :meth:`sync_weights` after the weights
            change (it clears the cache). 0 disables it.
        compile_decode: let transformers compile the decoding forward on a GPU (prefix-cached
            path only; the static cache's length is then rounded up to a multiple of
            :data:`stages.engines.prefix_cache.COMPILED_CACHE_MULTIPLE` so that calls share
            shapes). False: eager decoding.

    Raises:
        ValueError: no pad token, ``batch_size`` < 1, or ``adapter`` is not an adapter of ``model``.
    """

    def __init__(self, model: nn.Module, tokenizer, *, adapter: str | None = None, batch_size: int = 8,
                 prefix_cache_tokens: int = 0, compile_decode: bool = False):
        if tokenizer.pad_token_id is None:
            raise ValueError("HFRolloutEngine: tokenizer.pad_token is not set (use load_policy)")
        if batch_size < 1:
            raise ValueError(f"HFRolloutEngine: batch_size must be >= 1, got {batch_size}")
        self.tokenizer, self.batch_size, self.compile_decode = tokenizer, batch_size, compile_decode
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        self._use(model, adapter)

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters (where prompts are sent)."""
        return next(self.model.parameters()).device

    @property
    def context_window(self) -> int | None:
        """The most positions the model takes, prompt and generated tokens together (its config's
        ``max_position_embeddings``; None when the config has none)."""
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the model's parameters."""
        return next(p.dtype for p in self.model.parameters() if p.is_floating_point())

    def sync_weights(self, model: nn.Module, adapter: str | None = None) -> None:
        """Generate with ``model`` / ``adapter`` from now on; clears the prefix cache.

        Call after every optimizer step (also when ``model`` is the same object updated in
        place): cached keys and values were computed with the old weights.
        """
        self._use(model, adapter)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def sleep(self) -> None:
        """Drop the prefix cache so that its memory serves the update (the distill loop calls
        this before every update; the cached keys are stale once the weights change). The next
        ``generate`` fills it again."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _use(self, model: nn.Module, adapter: str | None) -> None:
        if adapter is not None and adapter not in (getattr(model, "peft_config", None) or {}):
            known = sorted(getattr(model, "peft_config", None) or {})
            raise ValueError(f"HFRolloutEngine: the model has no adapter {adapter!r} (adapters: {known})")
        self.model, self.adapter = model, adapter
        self.eos_ids = eos_token_ids(model.generation_config.eos_token_id, self.tokenizer)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Complete each prompt (token ids of the rendered prompt; nothing is added to them).

        Prompt i is sampled from its own random stream seeded by its row seed
        (:func:`stages.engines.row_seeds`: ``params.seeds[i]``, else ``params.seed + i``), without
        touching the global RNG: the same prompt, row seed, weights and device give the same
        completion whatever the other prompts and ``batch_size`` (up to the float noise of
        batched logits). Unseeded sampling draws the row seeds from torch's global RNG.

        Raises:
            ValueError: an empty prompt, or ``params.seeds`` not one per prompt.
        """
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("HFRolloutEngine.generate: empty prompt")
        seeds = row_seeds(params, len(prompt_ids))
        if seeds is None and params.temperature > 0:
            seeds = torch.randint(0, 2**62, (len(prompt_ids),), device="cpu").tolist()
        out: list[Generation] = []
        scope = contextlib.nullcontext()
        if self.adapter is not None:
            from stages.core.models.composer import adapter_scope

            scope = adapter_scope(self.model, self.adapter)
        with scope:
            for b in range(0, len(prompt_ids), self.batch_size):
                batch = [list(p) for p in prompt_ids[b : b + self.batch_size]]
                out += self._generate_batch(batch, params, None if seeds is None else seeds[b : b + self.batch_size])
        return out

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams,
                        seeds: list[int] | None) -> list[Generation]:
        """Complete one mini-batch; ``seeds``: its rows' seeds (None when greedy)."""
        config = generation_config(params, self.tokenizer.pad_token_id, self.eos_ids,
                                   compile_decode=self.compile_decode)
        recorder = _SampledLogprobs(params.temperature)
        processors = LogitsProcessorList([recorder])
        if params.temperature > 0:
            processors.append(_RowSampler(params, seeds))
        kwargs = {"logits_processor": processors}
        if params.stop:
            kwargs["tokenizer"] = self.tokenizer
        # the prefill's activations die within the call: heap blocks, not fresh pages (transient_blocks)
        with torch.inference_mode(), _clean_defaults(self.model), _few_row_linears(self.model), transient_blocks():
            new = self._new_tokens(prompts, config, kwargs)
            logprobs = recorder.finish(new)
        return [self._finish(ids, lps, params) for ids, lps in zip(new.tolist(), logprobs.tolist())]

    def _new_tokens(self, prompts: list[list[int]], config: GenerationConfig, kwargs: dict) -> torch.Tensor:
        """(B, n) LongTensor on the CPU: the tokens ``generate`` appended to each prompt."""
        if self.prefix_cache is not None:
            return torch.tensor(generate_cached(self.model, prompts, config, self.prefix_cache,
                                                self.tokenizer.pad_token_id, self.eos_ids, **kwargs), device="cpu")
        width, pad, device = max(len(p) for p in prompts), self.tokenizer.pad_token_id, self.device
        # left padding, built on the host and sent in one copy
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long, device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=device)
        seqs = self.model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config, **kwargs)
        return seqs[:, width:].cpu()

    def _finish(self, ids: list[int], logprobs: list[float], params: SamplingParams) -> Generation:
        """Trim padding after eos / stop string, cut the text, and name the finish reason
        (:func:`stages.engines.finish_generation`); special tokens stay in the text
        (:attr:`stages.engines.Generation.text`)."""
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        return finish_generation(ids, logprobs, self.eos_ids, params.stop, decode)
