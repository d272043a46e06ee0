"""The hf engine samples exactly as SamplingParams asks: a checkpoint whose generation_config.json
sets min_p, typical_p, suppress_tokens, min_length (and other processors) changes neither the
logits processors ``generate`` runs nor the recorded log-probs."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import (
    LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

from stages.core.models.backbone import load_policy
from stages.engines import SamplingParams
from stages.engines.hf import HFRolloutEngine, _RowSampler, _SampledLogprobs
from tests.tiny import save_tiny

PROMPTS = ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "The quick brown fox"]
# what a checkpoint may carry; each one adds a processor or warper when generate reads it
CHECKPOINT_FIELDS = {
    "do_sample": True, "temperature": 0.3, "top_k": 3, "top_p": 0.5, "min_p": 0.2, "typical_p": 0.6,
    "epsilon_cutoff": 0.01, "eta_cutoff": 0.01, "min_length": 40, "min_new_tokens": 6,
    "repetition_penalty": 3.0, "no_repeat_ngram_size": 1, "suppress_tokens": [5, 6, 7],
    "begin_suppress_tokens": [8], "bad_words_ids": [[9]], "renormalize_logits": True,
    "remove_invalid_values": True, "max_length": 12,
}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The tiny model saved with CHECKPOINT_FIELDS in its generation_config.json, loaded from disk."""
    folder = save_tiny(tmp_path_factory.mktemp("ckpt"))
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **CHECKPOINT_FIELDS}))
    model, tok = load_policy(str(folder), dtype="float32", device="cpu")
    assert model.generation_config.min_p == 0.2 and model.generation_config.suppress_tokens == [5, 6, 7]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return model, tok, ids


def _processors_of(model, run) -> list[list]:
    """The processor lists ``generate`` built during ``run()`` (one per generate call)."""
    seen, real = [], model._get_logits_processor

    def spy(*args, **kwargs) -> LogitsProcessorList:
        procs = real(*args, **kwargs)
        seen.append(list(procs))
        return procs

    model._get_logits_processor = spy
    try:
        run()
    finally:
        del model._get_logits_processor
    return seen


@pytest.mark.parametrize("params, warpers", [
    (SamplingParams(temperature=0, max_new_tokens=8), []),
    (SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=8, seed=3), [(TemperatureLogitsWarper, 0.7)]),
    (SamplingParams(temperature=1.0, top_p=0.9, top_k=5, max_new_tokens=8, seed=3),
     [(TopKLogitsWarper, 5), (TopPLogitsWarper, 0.9)]),
])
def test_processors_are_exactly_those_asked_for(loaded, params, warpers):
    model, tok, ids = loaded
    engine = HFRolloutEngine(model, tok, batch_size=2)
    calls = _processors_of(model, lambda: engine.generate(ids, params))
    assert len(calls) == 1
    procs = calls[0]
    assert isinstance(procs[0], _SampledLogprobs)  # the recorder sees the raw logits
    # generate builds nothing from the config: sampling is the engine's _RowSampler, last, with its warpers
    assert [type(p) for p in procs[1:]] == ([_RowSampler] if params.temperature > 0 else [])
    got = [(type(p), getattr(p, "temperature", None) or getattr(p, "top_k", None) or getattr(p, "top_p", None))
           for p in (procs[1].warpers if params.temperature > 0 else [])]
    assert got == [(cls, pytest.approx(value)) for cls, value in warpers]
    assert model.generation_config.min_p == 0.2 and model.generation_config.min_length == 40  # restored


@pytest.mark.parametrize("cache_tokens", [0, 10_000])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_equal_the_models_and_lengths_are_ours(loaded, cache_tokens, temperature):
    model, tok, ids = loaded
    engine = HFRolloutEngine(model, tok, batch_size=2, prefix_cache_tokens=cache_tokens)
    params = SamplingParams(temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=20, seed=5)
    for prompt, gen in zip(ids, engine.generate(ids, params)):
        seq = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = model(seq).logits[0, len(prompt) - 1:-1].double()
        want = torch.log_softmax(logits / (temperature or 1.0), -1).gather(1, torch.tensor(gen.token_ids)[:, None])
        torch.testing.assert_close(torch.tensor(gen.logprobs, dtype=torch.float64), want.squeeze(1), atol=1e-4, rtol=0)
        # max_length 12 of the checkpoint does not cut the 20 new tokens asked for
        assert gen.num_tokens == 20 or gen.finish_reason == "eos"
