"""Rollout engines (stages.engines): token-id prompts, sampled ids + log-probs, finish reasons,
top-k, weight sync, adapters and the factory. Uses the tiny in-process model."""
from __future__ import annotations

import copy
import functools
from unittest import mock

import pytest
import torch

from stages.engines import ENGINES, Generation, SamplingParams, make_engine
from stages.engines import hf
from stages.engines.hf import HFRolloutEngine, generation_config
from stages.engines.prefix_cache import COMPILED_CACHE_MULTIPLE
from tests.tiny import tiny_model, tiny_tokenizer

PROMPTS = [
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the weather?<|im_end|>\n",
]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(tok)


@pytest.fixture(scope="module")
def ids(tok):
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def engine(model, tok):
    return HFRolloutEngine(model, tok, batch_size=8)


def assert_same(a: list[Generation], b: list[Generation], atol: float = 1e-5) -> None:
    """Same texts, token ids and finish reasons; log-probs equal up to float noise."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.text, x.token_ids, x.num_tokens, x.finish_reason) == (y.text, y.token_ids, y.num_tokens, y.finish_reason)
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol, rtol=0)


def teacher_forced(model, prompt: list[int], gen: Generation, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of a fresh forward over prompt + completion, at the sampled ids."""
    seq = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return lp.gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1)


# --- prompts as token ids -------------------------------------------------------------------


def test_ids_prompt_equals_text_prompt_through_generate(model, tok, ids, engine):
    """Left-padding the ids ourselves gives what generate gives for the tokenized text."""
    gens = engine.generate(ids, GREEDY)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        seqs = model.generate(**enc, max_new_tokens=GREEDY.max_new_tokens, do_sample=False,
                              pad_token_id=tok.pad_token_id, eos_token_id=engine.eos_ids)
    for g, row in zip(gens, seqs[:, enc["input_ids"].shape[1]:].tolist()):
        assert g.token_ids == row[: g.num_tokens]
        assert g.text == tok.decode(g.token_ids[:-1] if g.finish_reason == "eos" else g.token_ids,
                                    skip_special_tokens=False)
        assert g.num_tokens == len(g.token_ids) == len(g.logprobs)
        assert all(isinstance(x, float) and x <= 0.0 for x in g.logprobs)


def test_batched_greedy_equals_unbatched_and_is_deterministic(engine, ids):
    batch = engine.generate(ids, GREEDY)
    assert len(batch) == 3
    assert batch == engine.generate(ids, GREEDY)
    assert_same([engine.generate([p], GREEDY)[0] for p in ids], batch)  # left padding is transparent
    for g in batch:
        assert g.num_tokens == len(g.token_ids) <= GREEDY.max_new_tokens
        assert g.finish_reason == ("length" if g.num_tokens == GREEDY.max_new_tokens else "eos")


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.7, max_new_tokens=4),
                                    SamplingParams(temperature=1.0, top_k=5, top_p=0.9, max_new_tokens=4)])
def test_the_generation_config_is_valid_as_transformers_checks_it(params):
    config = generation_config(params, 0, [1])
    config.validate(strict=True)  # raises where transformers would warn of a flag it ignores (top_k when greedy)
    # generate runs greedy with no warper of its own: the engine's _RowSampler samples
    assert not config.do_sample and config.top_k is None and config.temperature == config.top_p == 1.0


def test_mini_batches_match_one_batch(tok, engine, ids):
    small = HFRolloutEngine(engine.model, tok, batch_size=2)
    assert_same(small.generate(ids, GREEDY), engine.generate(ids, GREEDY))


def test_seeded_sampling_is_reproducible(engine, ids):
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=7)
    first = engine.generate(ids, params)
    assert engine.generate(ids, params) == first
    other = engine.generate(ids, params.model_copy(update={"seed": 8}))
    assert [g.token_ids for g in other] != [g.token_ids for g in first]


def test_empty_prompt_is_rejected(engine, tok):
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[1, 2], []], GREEDY)
    cached = HFRolloutEngine(engine.model, tok, prefix_cache_tokens=1000)
    with pytest.raises(ValueError, match="empty prompt"):
        cached.generate([[]], GREEDY)


def test_sampling_params_validation():
    assert SamplingParams().top_k == 0
    for bad in ({"temperature": -1}, {"top_p": 0}, {"max_new_tokens": 0}, {"stop": [""]}, {"top_k": -1},
                {"top_n": 3}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


# --- log-probs --------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
@pytest.mark.parametrize("cache_tokens", [0, 10_000])
def test_logprobs_equal_a_teacher_forced_forward(model, tok, ids, temperature, cache_tokens):
    eng = HFRolloutEngine(model, tok, batch_size=3, prefix_cache_tokens=cache_tokens)
    params = SamplingParams(temperature=temperature, top_p=0.9, top_k=50, max_new_tokens=10, seed=1)
    for _ in range(2):  # the second call is served from the prefix cache when there is one
        for prompt, gen in zip(ids, eng.generate(ids, params)):
            assert len(gen.logprobs) == gen.num_tokens > 0
            torch.testing.assert_close(torch.tensor(gen.logprobs), teacher_forced(model, prompt, gen, temperature),
                                       atol=1e-4, rtol=0)


def test_model_generation_config_does_not_reshape_the_distribution(tok, ids, engine):
    model = tiny_model(tok)
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 1
    model.generation_config.min_new_tokens = 4
    gens = HFRolloutEngine(model, tok).generate(ids, GREEDY)
    assert_same(gens, engine.generate(ids, GREEDY))
    for prompt, g in zip(ids, gens):
        torch.testing.assert_close(torch.tensor(g.logprobs), teacher_forced(model, prompt, g, 0.0), atol=1e-4, rtol=0)


def test_cached_and_uncached_agree_on_ids_and_logprobs_over_many_calls(model, tok, ids):
    plain = HFRolloutEngine(model, tok, batch_size=2)
    cached = HFRolloutEngine(model, tok, batch_size=2, prefix_cache_tokens=10_000)
    params = SamplingParams(temperature=0.7, max_new_tokens=8, seed=11)
    prompts_plain, prompts_cached = [list(p) for p in ids], [list(p) for p in ids]
    for call in range(3):  # each call extends every prompt by its completion + a user turn
        step = params.model_copy(update={"seed": 11 + call})
        a, b = plain.generate(prompts_plain, step), cached.generate(prompts_cached, step)
        assert_same(b, a)
        suffix = tok(f"<|im_end|>\n<|im_start|>user\nturn {call}<|im_end|>\n", add_special_tokens=False)["input_ids"]
        prompts_plain = [p + g.token_ids + suffix for p, g in zip(prompts_plain, a)]
        prompts_cached = [p + g.token_ids + suffix for p, g in zip(prompts_cached, b)]
    assert cached.prefix_cache.hit_tokens > 0


# --- finish reasons ---------------------------------------------------------------------------


def test_length_finish(engine, ids):
    for g in engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=1)):
        assert g.finish_reason == "length" and g.num_tokens == 1 == len(g.logprobs)
    gens = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=3))
    assert all(g.num_tokens <= 3 for g in gens)
    assert any(g.num_tokens == 3 and g.finish_reason == "length" for g in gens)


@pytest.mark.parametrize("cache_tokens", [0, 10_000])
def test_stop_string_finish(model, tok, ids, cache_tokens):
    eng = HFRolloutEngine(model, tok, prefix_cache_tokens=cache_tokens)
    params = SamplingParams(temperature=0, max_new_tokens=24)
    (full,) = eng.generate(ids[1:2], params)
    stop = next(full.text[i : i + 2] for i in range(1, len(full.text) - 1) if "\ufffd" not in full.text[i : i + 2])
    (cut,) = eng.generate(ids[1:2], params.model_copy(update={"stop": [stop]}))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    # the sampled ids up to and including the ones that completed the stop string, no more
    assert cut.token_ids == full.token_ids[: cut.num_tokens] and cut.num_tokens < full.num_tokens
    assert stop in tok.decode(cut.token_ids) and stop not in tok.decode(cut.token_ids[:-1])
    torch.testing.assert_close(torch.tensor(cut.logprobs), torch.tensor(full.logprobs[: cut.num_tokens]),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("cache_tokens", [0, 10_000])
def test_eos_finish(engine, tok, ids, cache_tokens):
    (full,) = engine.generate(ids[1:2], GREEDY)
    assert full.num_tokens > 3 and full.finish_reason == "length"
    # make eos outscore the 3rd greedy token wherever that token wins: eos must come by step 3
    model = copy.deepcopy(engine.model)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] = 2 * model.lm_head.weight[full.token_ids[2]]
    eos_engine = HFRolloutEngine(model, tok, prefix_cache_tokens=cache_tokens)
    gens = eos_engine.generate(ids, GREEDY)
    g = gens[1]
    assert g.finish_reason == "eos" and g.num_tokens <= 3
    assert g.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in g.token_ids[:-1]
    assert g.token_ids[:-1] == full.token_ids[: g.num_tokens - 1]
    assert "<|im_end|>" not in g.text and tok.pad_token_id not in g.token_ids
    assert len(g.logprobs) == g.num_tokens
    torch.testing.assert_close(torch.tensor(g.logprobs), teacher_forced(model, ids[1], g, 0.0), atol=1e-4, rtol=0)
    assert_same([eos_engine.generate([p], GREEDY)[0] for p in ids], gens)


# --- top-k ------------------------------------------------------------------------------------


def test_top_k_one_is_greedy(engine, ids):
    greedy = engine.generate(ids, GREEDY)
    for seed in (0, 1):
        sampled = engine.generate(ids, GREEDY.model_copy(update={"temperature": 1.0, "top_k": 1, "top_p": 1.0,
                                                                 "seed": seed}))
        assert [g.token_ids for g in sampled] == [g.token_ids for g in greedy]


def test_top_k_limits_the_support(engine, ids):
    """Every sampled token is among the k most likely; without top-k some are not."""
    k = 3

    def ranks(params):
        out = []
        for seed in range(4):
            for prompt, g in zip(ids, engine.generate(ids, params.model_copy(update={"seed": seed}))):
                seq = torch.tensor([prompt + g.token_ids])
                with torch.no_grad():
                    logits = engine.model(seq).logits[0, len(prompt) - 1 : -1]
                chosen = logits.gather(1, torch.tensor(g.token_ids)[:, None])
                out += (logits > chosen).sum(1).tolist()  # 0 = the most likely token
        return out

    hot = SamplingParams(temperature=5.0, top_p=1.0, max_new_tokens=8)
    assert max(ranks(hot.model_copy(update={"top_k": k}))) < k
    assert max(ranks(hot)) >= k


# --- weights and adapters ---------------------------------------------------------------------


def test_sync_weights_clears_the_prefix_cache_and_uses_new_weights(tok, ids):
    model = tiny_model(tok)
    eng = HFRolloutEngine(model, tok, batch_size=3, prefix_cache_tokens=10_000)
    before = eng.generate(ids, GREEDY)
    assert eng.prefix_cache.entries
    with torch.no_grad():  # an "optimizer step" in place
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    eng.sync_weights(model)
    assert eng.prefix_cache.entries == []
    after = eng.generate(ids, GREEDY)
    fresh = HFRolloutEngine(model, tok, batch_size=3).generate(ids, GREEDY)
    assert_same(after, fresh, atol=1e-4)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    other = tiny_model(tok, seed=1)  # a different model object
    eng.sync_weights(other)
    assert eng.model is other and eng.adapter is None
    assert_same(eng.generate(ids, GREEDY), HFRolloutEngine(other, tok).generate(ids, GREEDY), atol=1e-4)


def _lora_model(tok):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    peft_model = get_peft_model(tiny_model(tok), config, adapter_name="student")
    peft_model.add_adapter("other", config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # nonzero B: the adapters change the outputs
    peft_model.eval()
    return peft_model


def test_adapter_is_used_and_previous_state_restored(tok, ids):
    from stages.core.models.composer import _adapter_state, adapter_scope

    peft_model = _lora_model(tok)
    base = HFRolloutEngine(tiny_model(tok), tok).generate(ids, GREEDY)
    student = make_engine("hf", peft_model, tok, adapter="student")
    assert student.adapter == "student"
    with adapter_scope(peft_model, None):  # adapters off outside the engine: it still uses "student"
        gens = student.generate(ids, GREEDY)
        assert _adapter_state(peft_model) is None
    assert [g.token_ids for g in gens] != [g.token_ids for g in base]
    with adapter_scope(peft_model, "student"):
        assert_same(HFRolloutEngine(peft_model, tok).generate(ids, GREEDY), gens)  # None: what is active
        for prompt, g in zip(ids, gens):
            torch.testing.assert_close(torch.tensor(g.logprobs), teacher_forced(peft_model, prompt, g, 0.0),
                                       atol=1e-4, rtol=0)
    with adapter_scope(peft_model, "other"):
        other = HFRolloutEngine(peft_model, tok).generate(ids, GREEDY)
        assert_same(student.generate(ids, GREEDY), gens)  # "student" again, then back to "other"
        assert _adapter_state(peft_model) == "other"
    assert [g.token_ids for g in other] != [g.token_ids for g in gens]
    student.sync_weights(peft_model, "other")
    assert_same(student.generate(ids, GREEDY), other)
    # adapter=None on a model with adapters disabled: the base model
    with adapter_scope(peft_model, None):
        assert_same(HFRolloutEngine(peft_model, tok).generate(ids, GREEDY), base, atol=1e-4)


def test_unknown_adapter_is_rejected(tok):
    with pytest.raises(ValueError, match="no adapter 'student'"):
        HFRolloutEngine(tiny_model(tok), tok, adapter="student")
    peft_model = _lora_model(tok)
    eng = HFRolloutEngine(peft_model, tok, adapter="student")
    with pytest.raises(ValueError, match=r"no adapter 'nope' \(adapters: \['other', 'student'\]\)"):
        eng.sync_weights(peft_model, "nope")


# --- factory ----------------------------------------------------------------------------------


def test_make_engine(model, tok):
    eng = make_engine("hf", model, tok, batch_size=3, prefix_cache_tokens=500)
    assert isinstance(eng, HFRolloutEngine) and eng.batch_size == 3 and eng.prefix_cache.max_tokens == 500
    assert eng.device == torch.device("cpu") and eng.dtype == torch.float32
    assert make_engine("hf", model, tok).prefix_cache is None
    with pytest.raises(ValueError, match=r"unknown engine 'sglang'; known engines: hf, vllm") as err:
        make_engine("sglang", model, tok)
    assert all(name in str(err.value) for name in ENGINES)


def test_engine_errors(model, tok):
    bare = tiny_tokenizer()
    bare.pad_token = None
    with pytest.raises(ValueError, match="pad_token"):
        HFRolloutEngine(model, bare)
    with pytest.raises(ValueError, match="batch_size"):
        HFRolloutEngine(model, tok, batch_size=0)


def test_decoding_is_compiled_only_when_asked(model, tok, ids):
    """Eager by default (on a GPU transformers would compile the decoding forward for the
    prefix-cached path's StaticCache, once per cache shape). With ``compile_decode`` the static
    cache's length is rounded up to a multiple of COMPILED_CACHE_MULTIPLE: the extra slots are
    masked, so the tokens and log-probs are those of the exact length (on a CPU nothing compiles)."""
    assert generation_config(GREEDY, 0, [1]).disable_compile
    assert not generation_config(GREEDY, 0, [1], compile_decode=True).disable_compile
    lengths, real = [], model.generate

    def spy(*args, **kwargs):
        lengths.append(kwargs["cache"].get_max_length())
        return real(*args, **kwargs)

    params = SamplingParams(temperature=0.7, max_new_tokens=6, seed=3)
    with mock.patch.object(model, "generate", spy):
        runs = [HFRolloutEngine(model, tok, prefix_cache_tokens=10_000, compile_decode=c).generate(ids, params)
                for c in (False, True)]
    longest = max(len(p) for p in ids) + params.max_new_tokens
    assert lengths == [longest, -(-longest // COMPILED_CACHE_MULTIPLE) * COMPILED_CACHE_MULTIPLE]
    assert lengths[1] > lengths[0]
    assert_same(runs[1], runs[0])


# --- decode steps of few rows on the CPU --------------------------------------------------------


class _QuantLinear(torch.nn.Linear):
    """A subclass of nn.Linear, as quantized layers are."""


def _rows_spy(fn, seen: list[int]):
    """``fn(layer, ..., x)`` that also appends the number of rows of each ``x`` to ``seen``."""
    def spy(layer, *args):
        seen.append(args[-1].numel() // layer.in_features)
        return fn(layer, *args)
    return spy


@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (1, 4), (2, 2), (5, 1), (3, 7)])
@pytest.mark.parametrize("bias", [False, True])
def test_few_row_linears_compute_the_same_product_and_are_removed_on_exit(shape, bias):
    """Inside the block a plain float32 CPU linear runs ``_linear_few_rows``: the product of at
    most FEW_ROWS rows as (W @ x.T).T, more rows by F.linear; same values and shape, contiguous.
    Subclasses, layers with a forward of their own on the instance and float64 layers are left,
    and no instance forward stays behind, also when the block raises."""
    torch.manual_seed(0)
    plain, sub, wide = torch.nn.Linear(24, 40, bias=bias), _QuantLinear(24, 40), torch.nn.Linear(24, 40).double()
    hooked = torch.nn.Linear(24, 40)
    hooked.forward = own = functools.partial(torch.nn.functional.linear, weight=hooked.weight, bias=None)
    net = torch.nn.ModuleList([plain, sub, wide, hooked])
    x = torch.randn(*shape, 24)
    with pytest.raises(KeyError), hf._few_row_linears(net):
        assert plain.forward.func is hf._linear_few_rows
        assert "forward" not in sub.__dict__ and "forward" not in wide.__dict__ and hooked.forward is own
        y = plain(x)
        assert y.shape == (*shape, 40) and y.is_contiguous()
        torch.testing.assert_close(y, torch.nn.functional.linear(x, plain.weight, plain.bias), atol=1e-6, rtol=1e-5)
        raise KeyError("the block raises")
    assert "forward" not in plain.__dict__ and hooked.forward is own


def test_decode_steps_take_the_few_row_product_with_the_same_tokens(model, tok, ids):
    """Two prompts: the prefill runs F.linear, each decode step the (W @ x.T).T product; greedy
    tokens and log-probs are those of F.linear everywhere (FEW_ROWS 0)."""
    seen: list[int] = []
    engine = HFRolloutEngine(model, tok)
    with mock.patch.object(hf, "_linear_few_rows", _rows_spy(hf._linear_few_rows, seen)):
        fast = engine.generate(ids[:2], GREEDY)
    with mock.patch.object(hf, "FEW_ROWS", 0):
        plain = engine.generate(ids[:2], GREEDY)
    assert 2 in seen and max(seen) > hf.FEW_ROWS
    assert_same(fast, plain)
    assert not [m for m in model.modules() if "forward" in m.__dict__]


def test_lora_layers_take_the_few_row_product_of_peft_s_forward(tok, ids):
    """A peft LoRA linear with one plain adapter active runs base + scaling * B(A x) on few rows
    inside the block, equal to peft's forward; disabled adapters, two active adapters and dropout
    at work keep peft's forward. Decode steps of an adapter's rollout take it."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear as LoraLinear

    from stages.core.models.composer import adapter_scope

    peft_model = _lora_model(tok)
    lora = [m for m in peft_model.modules() if isinstance(m, LoraLinear)]
    with adapter_scope(peft_model, "student"), hf._few_row_linears(peft_model):
        assert all(m.forward.func is hf._lora_few_rows and m.forward.args[1] == "student" for m in lora)
        for rows in (1, 2, 3, 4, 6):
            x = torch.randn(rows, 1, lora[0].in_features)
            torch.testing.assert_close(lora[0](x), LoraLinear.forward(lora[0], x), atol=1e-6, rtol=1e-5)
    assert not [m for m in peft_model.modules() if "forward" in m.__dict__]
    with adapter_scope(peft_model, None):
        assert hf._plain_lora(lora[0]) is None  # adapters off
    lora[0].set_adapter(["student", "other"])
    assert hf._plain_lora(lora[0]) is None  # two adapters at once
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.1)
    dropped = next(m for m in get_peft_model(tiny_model(tok), config).modules() if isinstance(m, LoraLinear))
    assert hf._plain_lora(dropped.train()) is None and hf._plain_lora(dropped.eval()) == "default"
    seen: list[int] = []
    with mock.patch.object(hf, "_lora_few_rows", _rows_spy(hf._lora_few_rows, seen)):
        make_engine("hf", _lora_model(tok), tok, adapter="student").generate(ids, GREEDY)
    assert 3 in seen and max(seen) > hf.FEW_ROWS  # decode steps of the 3 prompts, and the prefill


def test_tool_call_tags_the_tokenizer_marks_special_stay_in_the_text():
    """A tokenizer may mark ``<tool_call>`` / ``</tool_call>`` special; a sampled two-call action
    must still read as two calls (decoded with special tokens skipped, the tags vanish and the
    two JSON objects read as one bare call)."""
    from stages.core.text.toolcalls import parse_tool_calls

    tok = tiny_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>"], special_tokens=True)
    action = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
              '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    script = tok(action, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert {tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")} <= set(script)
    prompt = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    model = tiny_model(tok)

    def scripted(module, args, kwargs, out):  # greedy decoding then emits script after the prompt
        step = int(kwargs["position_ids"][0, -1]) + 1 - len(prompt)
        out.logits[:, -1] = -1e4
        out.logits[:, -1, script[step]] = 0.0
        return out

    model.register_forward_hook(scripted, with_kwargs=True)
    (gen,) = HFRolloutEngine(model, tok).generate([prompt], SamplingParams(temperature=0, max_new_tokens=64))
    assert gen.token_ids == script and gen.finish_reason == "eos"
    assert gen.text == action
    assert [c.name for c in parse_tool_calls(gen.text)] == ["a", "b"]
