"""Prefix caching in the HF rollout engine: same completions as without it, less encoding."""
from __future__ import annotations

import pytest
import torch

from stages.engines import Generation, SamplingParams
from stages.engines.hf import HFRolloutEngine
from stages.engines.prefix_cache import PrefixCache
from tests.tiny import tiny_model, tiny_tokenizer

SYSTEM = "<|im_start|>system\nYou are a helpful assistant. Answer the question and call tools when needed.<|im_end|>\n"
QUESTIONS = ["What is 2+2?", "What is the weather in Paris today?", "def add(a, b):"]
GREEDY = SamplingParams(temperature=0, max_new_tokens=10)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(tok)


def _same(a: list[Generation], b: list[Generation]) -> bool:
    """Same texts, token ids and finish reasons, and log-probs equal up to float noise."""
    return len(a) == len(b) and all(
        (x.text, x.token_ids, x.finish_reason) == (y.text, y.token_ids, y.finish_reason)
        and torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
        for x, y in zip(a, b)
    )


def _tokens(tok, texts: list[str]) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _layers(n: int, length: int, value: float = 0.0):
    return [(torch.full((2, length, 4), value + i), torch.full((2, length, 4), -value - i)) for i in range(n)]


def _ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.long)


def test_match_finds_longest_common_prefix_and_slices_layers():
    cache = PrefixCache(100)
    cache.add(_ids(1, 2, 3, 4), _layers(2, 4, 1.0))
    cache.add(_ids(1, 2, 9), _layers(2, 3, 5.0))
    n, layers = cache.match(_ids(1, 2, 3, 7, 7))
    assert n == 3 and len(layers) == 2
    assert layers[0][0].shape == (2, 3, 4) and float(layers[0][0][0, 0, 0]) == 1.0
    assert cache.match(_ids(1, 2, 9, 9))[0] == 3
    assert cache.match(_ids(8, 1, 2)) == (0, [])


def test_add_supersedes_prefixes_and_evicts_least_recent():
    cache = PrefixCache(8)
    cache.add(_ids(1, 2), _layers(1, 2))
    cache.add(_ids(1, 2, 3), _layers(1, 3))  # supersedes (1, 2)
    assert [e.ids.tolist() for e in cache.entries] == [[1, 2, 3]]
    cache.add(_ids(5, 6, 7), _layers(1, 3))
    cache.match(_ids(1, 2, 3))  # (1, 2, 3) becomes the most recent
    cache.add(_ids(9, 9, 9), _layers(1, 3))  # 9 tokens > 8: the least recent (5, 6, 7) goes
    assert [e.ids.tolist() for e in cache.entries] == [[1, 2, 3], [9, 9, 9]]
    assert cache.tokens == 6
    cache.add(torch.arange(9), _layers(1, 9))  # longer than the whole budget: not stored
    assert cache.tokens == 6
    cache.clear()
    assert cache.entries == []


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixCache(0)


def _conversations(tok, engine, steps: int):
    """Multi-turn chats of different lengths driven by ``engine``; the completions of each step."""
    chats = [SYSTEM + f"<|im_start|>user\n{q}<|im_end|>\n" for q in QUESTIONS]
    outputs = []
    for step in range(steps):
        prompts = [c + "<|im_start|>assistant\n" for c in chats]
        gens = engine.generate(_tokens(tok, prompts), GREEDY)
        outputs.append(gens)
        chats = [p + g.text + f"<|im_end|>\n<|im_start|>user\nstep {step} " + "more " * step + "<|im_end|>\n"
                 for p, g in zip(prompts, gens)]
    return outputs


def test_cached_generation_equals_uncached_over_a_multi_turn_rollout(tok, model):
    plain = HFRolloutEngine(model, tok, batch_size=3)
    cached = HFRolloutEngine(model, tok, batch_size=3, prefix_cache_tokens=10_000)
    assert all(_same(c, p) for c, p in zip(_conversations(tok, cached, 4), _conversations(tok, plain, 4), strict=True))
    cache = cached.prefix_cache
    # steps 2-4 re-use each chat's history: most prompt tokens come from the cache
    assert cache.hit_tokens > cache.miss_tokens > 0
    newest = [e.ids for e in cache.entries[-3:]]
    # an older sequence that is a prefix of a newer one was superseded
    assert not any(torch.equal(e.ids, n[: len(e.ids)]) for e in cache.entries[:-3] for n in newest)


def test_small_budget_evicts_and_still_matches_uncached(tok, model):
    plain = HFRolloutEngine(model, tok, batch_size=3)
    cached = HFRolloutEngine(model, tok, batch_size=3, prefix_cache_tokens=120)
    assert all(_same(c, p) for c, p in zip(_conversations(tok, cached, 3), _conversations(tok, plain, 3), strict=True))
    assert 0 < cached.prefix_cache.tokens <= 120


def test_stored_keys_equal_a_fresh_forward_of_the_stored_tokens(tok, model):
    engine = HFRolloutEngine(model, tok, batch_size=3, prefix_cache_tokens=10_000)
    _conversations(tok, engine, 2)  # rows of different lengths, the second call from the cache
    for entry in engine.prefix_cache.entries:
        with torch.inference_mode():
            fresh = model(entry.ids[None], use_cache=True).past_key_values
        for (keys, values), layer in zip(entry.layers, fresh.layers):
            torch.testing.assert_close(keys, layer.keys[0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(values, layer.values[0], atol=1e-5, rtol=1e-4)


def test_seeded_sampling_and_stop_strings_match_uncached(tok, model):
    plain = HFRolloutEngine(model, tok, batch_size=2)
    cached = HFRolloutEngine(model, tok, batch_size=2, prefix_cache_tokens=10_000)
    prompts = _tokens(tok, [SYSTEM + f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in QUESTIONS])
    sampled = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    cached.generate(prompts, sampled)  # fill the cache, then generate again from it
    assert _same(cached.generate(prompts, sampled), plain.generate(prompts, sampled))
    (full,) = plain.generate(prompts[:1], GREEDY)
    stop = full.text[2:4]
    with_stop = GREEDY.model_copy(update={"stop": [stop]})
    assert _same(cached.generate(prompts[:1], with_stop), plain.generate(prompts[:1], with_stop))


def test_rows_sharing_a_long_prefix_encode_it_once(tok, model):
    system = "<|im_start|>system\n" + "You are a helpful assistant. " * 60 + "<|im_end|>\n"
    prompts = _tokens(tok, [system + f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in QUESTIONS])
    lengths = [len(p) for p in prompts]
    shared = len(tok(system, add_special_tokens=False)["input_ids"])
    assert shared >= 256  # long enough for share_prefixes' threshold
    cached = HFRolloutEngine(model, tok, batch_size=3, prefix_cache_tokens=10_000)
    assert _same(cached.generate(prompts, GREEDY), HFRolloutEngine(model, tok, batch_size=3).generate(prompts, GREEDY))
    # the system prompt was encoded once, not once per row
    assert cached.prefix_cache.miss_tokens < sum(lengths) - shared
    assert cached.prefix_cache.hit_tokens >= 3 * (shared - 1)
