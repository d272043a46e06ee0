"""Prefix caching in the HF rollout engine: same completions as without it, less encoding."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from stages.engines import Generation, SamplingParams
from stages.engines.hf import HFRolloutEngine
from stages.engines.prefix_cache import PrefixCache, _common_prefix, _encode_prefix, share_prefixes
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


# --- the G rollouts of one task: one prompt, encoded once -----------------------------------------


def _group_prompts(tok, questions: list[str], group: int) -> list[list[int]]:
    """``group`` copies of each question's prompt, in the order play() sends them (task by task)."""
    system = "<|im_start|>system\n" + "You are a helpful assistant. " * 8 + "<|im_end|>\n"
    return [p for q in questions for p in _tokens(tok, [system + f"<|im_start|>user\n{q}<|im_end|>\n"
                                                        "<|im_start|>assistant\n"]) * group]


def _teacher_forced(model, prompt: list[int], gen: Generation, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of one fresh forward over prompt + completion, at the sampled ids."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits / (temperature or 1.0), -1).gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]


def test_identical_prompts_are_encoded_once_with_the_same_greedy_ids_and_logprobs(tok, model):
    prompts = _group_prompts(tok, QUESTIONS[:1], 4)
    length = len(prompts[0])
    assert 3 * (length - 1) >= 256 > length  # shared only because four rows share it
    cached = HFRolloutEngine(model, tok, batch_size=4, prefix_cache_tokens=10_000)
    gens = cached.generate(prompts, GREEDY)
    assert _same(gens, HFRolloutEngine(model, tok, batch_size=4).generate(prompts, GREEDY))
    # the prompt less its last token once, then each row's last prompt token
    assert cached.prefix_cache.miss_tokens == length - 1 + 4
    assert cached.prefix_cache.hit_tokens == 4 * (length - 1)
    for prompt, g in zip(prompts, gens):
        torch.testing.assert_close(torch.tensor(g.logprobs), _teacher_forced(model, prompt, g, 0.0), atol=1e-4, rtol=0)


def test_sampled_rollouts_of_one_prompt_differ_and_keep_their_sampling_logprobs(tok, model):
    prompts = _group_prompts(tok, QUESTIONS[:2], 4)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=5)
    cached = HFRolloutEngine(model, tok, batch_size=8, prefix_cache_tokens=10_000)
    gens = cached.generate(prompts, sampled)
    assert _same(gens, HFRolloutEngine(model, tok, batch_size=8).generate(prompts, sampled))
    for task in (gens[:4], gens[4:]):  # rows of one prompt are independent samples
        assert len({tuple(g.token_ids) for g in task}) > 1
    for prompt, g in zip(prompts, gens):
        torch.testing.assert_close(torch.tensor(g.logprobs), _teacher_forced(model, prompt, g, 1.0), atol=1e-4, rtol=0)
    # the part all eight rows share was encoded once; what follows it in each prompt is too short
    # (3 x ~15 tokens) to be worth a forward of its own, so each row encoded its own
    shared = _common_prefix(torch.tensor(prompts[0]), torch.tensor(prompts[4]))
    assert cached.prefix_cache.miss_tokens == shared + sum(len(p) - shared for p in prompts)


def test_share_prefixes_encodes_the_prefix_that_saves_most_first_and_stops_below_the_threshold(tok, model):
    prompts = [torch.tensor(p) for p in _group_prompts(tok, QUESTIONS, 2)]  # rows 2k and 2k+1 alike
    system = min(_common_prefix(prompts[0], prompts[2]), _common_prefix(prompts[0], prompts[4]))
    encoded = []
    cache = PrefixCache(10_000)
    with torch.inference_mode(), mock.patch("stages.engines.prefix_cache._encode_prefix",
                                            side_effect=lambda m, ids, c: (encoded.append(len(ids)),
                                                                           _encode_prefix(m, ids, c))):
        share_prefixes(model, prompts, cache, min_tokens=1)
    # first the system part (all six rows: saves 5 x its length), then each question's rest
    assert encoded[0] == system and sorted(encoded[1:]) == sorted(len(p) - 1 for p in prompts[::2])
    assert [cache.match(p[:-1])[0] for p in prompts] == [len(p) - 1 for p in prompts]
    encoded.clear()
    with torch.inference_mode(), mock.patch("stages.engines.prefix_cache._encode_prefix",
                                            side_effect=lambda m, ids, c: encoded.append(len(ids))):
        share_prefixes(model, prompts, PrefixCache(10_000), min_tokens=6 * system)
    assert encoded == []  # no prefix saves that many positions


def test_a_shorter_pair_sharing_the_longer_pairs_system_prompt_encodes_only_its_rest(tok, model):
    """Two tasks x 2 rollouts whose prompts share a 283-token system prompt, one task's prompt
    twice the other's ([557, 557, 1158, 1158], as BFCL batches come): the longer pair is encoded
    first and holds the system prompt, so the shorter pair encodes only what follows it (it used
    to encode the system prompt again: a forward of zero new tokens, which raised)."""
    gen = torch.Generator().manual_seed(0)
    words = lambda n: torch.randint(10, len(tok), (n,), generator=gen)  # noqa: E731
    system = words(283)
    short, long = torch.cat([system, words(557 - 283)]), torch.cat([system, words(1158 - 283)])
    prompts = [short, short.clone(), long, long.clone()]
    encoded, cache = [], PrefixCache(10_000)
    with torch.inference_mode(), mock.patch("stages.engines.prefix_cache._encode_prefix",
                                            side_effect=lambda m, ids, c: (encoded.append(len(ids)),
                                                                           _encode_prefix(m, ids, c))):
        share_prefixes(model, prompts, cache)
    assert encoded == [1157, 556]
    assert cache.miss_tokens == 1157 + (556 - 283)  # each token once
    assert [cache.match(p[:-1])[0] for p in prompts] == [556, 556, 1157, 1157]
    engine = HFRolloutEngine(model, tok, batch_size=4, prefix_cache_tokens=10_000)
    batch = [p.tolist() for p in prompts]
    assert _same(engine.generate(batch, GREEDY), HFRolloutEngine(model, tok, batch_size=4).generate(batch, GREEDY))


def test_lora_student_shares_its_prompt_and_the_cache_empties_before_the_update(tok):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    student = get_peft_model(tiny_model(tok), config, adapter_name="student").eval()
    prompts = _group_prompts(tok, QUESTIONS[:1], 4)
    cached = HFRolloutEngine(student, tok, adapter="student", batch_size=4, prefix_cache_tokens=10_000)
    plain = HFRolloutEngine(student, tok, adapter="student", batch_size=4)
    assert _same(cached.generate(prompts, GREEDY), plain.generate(prompts, GREEDY))
    assert cached.prefix_cache.hit_tokens == 4 * (len(prompts[0]) - 1)
    cached.sleep()  # what the distill loop calls before every update
    assert cached.prefix_cache.entries == []
    with torch.no_grad():
        for name, p in student.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    cached.sync_weights(student, "student")
    assert _same(cached.generate(prompts, GREEDY), plain.generate(prompts, GREEDY))
