"""The vllm rollout engine (stages.engines.vllm) against a stand-in ``vllm`` module.

vLLM cannot run on the CPU machines, so these tests check the engine's side of the contract:
what it hands vLLM (LLM settings, prompts, sampling parameters, LoRA requests, sleep / wake /
reload calls) and how it turns vLLM's outputs into Generations (same rule as the hf engine).
Whether vLLM itself behaves as its documentation says is for a GPU run to check.
"""
from __future__ import annotations

import functools
import importlib.machinery
import os
import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
import torch
from safetensors.torch import load_file

from stages.engines import Generation, SamplingParams, check_engine
from stages.engines.hf import HFRolloutEngine
from stages.engines.vllm import VLLMRolloutEngine, vllm_sampling_kwargs
from tests.tiny import save_tiny, tiny_model, tiny_tokenizer

PROMPT = "The quick brown fox"


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@functools.lru_cache(maxsize=2)
def _decode(skip_special_tokens: bool):
    return functools.partial(tiny_tokenizer().decode, skip_special_tokens=skip_special_tokens)


def vllm_completion(ids: list[int], lps: list[float], kwargs: dict, tokenizer=None) -> SimpleNamespace:
    """The ``CompletionOutput`` vLLM makes of the sampled stream ``ids`` (ids of ``tokenizer``,
    default the tiny tokenizer) under ``vllm.SamplingParams(**kwargs)``, as its scheduler's
    check_stop and its detokenizer (special tokens skipped or not, as ``kwargs`` say) stop:
    at an id of ``stop_token_ids`` (kept; stop_reason None for the model's eos id, else the id;
    its text left out), at the token whose text completes a stop string (kept; stop_reason the
    string; the text cut before it), or at ``max_tokens`` (finish_reason "length")."""
    decode, eos = _decode(kwargs["skip_special_tokens"]), tiny_tokenizer().eos_token_id
    if tokenizer is not None:
        decode = functools.partial(tokenizer.decode, skip_special_tokens=kwargs["skip_special_tokens"])
        eos = tokenizer.eos_token_id
    for k in range(1, len(ids) + 1):
        if ids[k - 1] in kwargs["stop_token_ids"]:
            reason, stop_reason, text = "stop", None if ids[k - 1] == eos else ids[k - 1], decode(ids[:k - 1])
        else:
            text = decode(ids[:k])
            hits = sorted((text.index(s), s) for s in kwargs["stop"] if s in text)
            reason, stop_reason = ("stop", hits[0][1]) if hits else ("length", None)
            text = text[:hits[0][0]] if hits else text
            if not hits and k < min(len(ids), kwargs["max_tokens"]):
                continue
        steps = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(ids[:k], lps)]
        return SimpleNamespace(token_ids=ids[:k], logprobs=steps, text=text, finish_reason=reason,
                               stop_reason=stop_reason)
    raise AssertionError("vllm_completion: empty stream")


class FakeLLM:
    """Records what the engine asks of vLLM; ``generate`` answers with ``respond(prompt_ids, params)``:
    the sampled stream (token ids, log-probs) that :func:`vllm_completion` stops as vLLM does, or a
    ready ``CompletionOutput``-like namespace; set by the test."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.generated = kwargs, [], []
        self.multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        self.respond = lambda ids, params: ([5, 6], [-0.5, -0.25])
        random.seed(0)  # as vLLM's in-process worker seeds the global generators at start
        numpy.random.seed(0)
        torch.manual_seed(0)
        FakeLLM.last = self

    def generate(self, prompts, sampling_params, *, use_tqdm=True, lora_request=None):
        assert use_tqdm is False and len(prompts) == len(sampling_params)
        self.generated.append((prompts, sampling_params, lora_request))
        self.calls.append(("generate", lora_request.lora_int_id if lora_request else None))
        outputs = []
        for prompt, params in zip(prompts, sampling_params):
            answer = self.respond(prompt["prompt_token_ids"], params.kwargs)
            out = answer if isinstance(answer, SimpleNamespace) else vllm_completion(*answer, params.kwargs)
            outputs.append(SimpleNamespace(outputs=[out]))
        return outputs

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs=None):
        folder = Path(kwargs["weights_path"])  # read now: the engine may remove it later
        self.calls.append(("rpc", method, folder.name, load_file(folder / "model.safetensors")))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)  # the engine sets it; undone after
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kwargs: SimpleNamespace(kwargs=kwargs)
    vllm.TokensPrompt = lambda **kwargs: dict(kwargs)  # a TypedDict in vLLM
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    return vllm


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def ids(tok):
    return tok(PROMPT, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("base"))


def lora_student(folder: Path, rank: int = 4):
    """A LoRA adapter "student" on the tiny model loaded from ``folder`` (so it has a name_or_path)."""
    from stages.core.models.backbone import load_policy
    from stages.core.models.composer import add_lora_adapter

    return add_lora_adapter(load_policy(str(folder))[0], "student", rank=rank, alpha=2 * rank)


# --- sampling parameters ----------------------------------------------------------------------


def test_sampling_kwargs_map_every_field():
    params = SamplingParams(temperature=0.3, top_p=0.8, top_k=5, max_new_tokens=17, stop=["\n", "END"], seed=3)
    assert vllm_sampling_kwargs(params, [2, 7], 11) == dict(
        n=1, temperature=0.3, top_p=0.8, top_k=5, max_tokens=17, stop=["\n", "END"], stop_token_ids=[2, 7], seed=11,
        logprobs=0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_p=0.0, min_tokens=0,
        ignore_eos=False, skip_special_tokens=False, spaces_between_special_tokens=False,
        include_stop_str_in_output=False)
    greedy = vllm_sampling_kwargs(SamplingParams(temperature=0, top_k=0), [2], None)
    assert (greedy["temperature"], greedy["top_k"], greedy["stop"], greedy["seed"]) == (0.0, -1, [], None)


def test_generate_hands_vllm_the_prompts_and_one_seed_per_prompt(fake_vllm, tok, ids):
    engine = VLLMRolloutEngine(tiny_model(tok), tok)
    params = SamplingParams(temperature=0.5, top_p=0.9, top_k=3, max_new_tokens=4, stop=["x"], seed=100)
    gens = engine.generate([ids, ids[:2], [9]], params)
    prompts, sampling, lora = FakeLLM.last.generated[-1]
    assert prompts == [{"prompt_token_ids": ids}, {"prompt_token_ids": ids[:2]}, {"prompt_token_ids": [9]}]
    assert [s.kwargs for s in sampling] == [vllm_sampling_kwargs(params, [tok.eos_token_id], 100 + i) for i in range(3)]
    assert lora is None and len(gens) == 3
    engine.generate([ids, ids], params.model_copy(update={"seed": None}))
    assert [s.kwargs["seed"] for s in FakeLLM.last.generated[-1][1]] == [None, None]
    engine.generate([ids, ids], params.model_copy(update={"seeds": [7, 5]}))  # row seeds win over seed
    assert [s.kwargs["seed"] for s in FakeLLM.last.generated[-1][1]] == [7, 5]
    assert engine.generate([], params) == []
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([ids, []], params)


# --- outputs ----------------------------------------------------------------------------------


def test_outputs_map_like_the_hf_engine(fake_vllm, tok, ids):
    """For the same sampled stream, both engines record the same Generation (ids, text, log-probs,
    finish reason) when vLLM stops it as its scheduler and detokenizer do: at a stop string, at an
    eos, at max_tokens."""
    model = tiny_model(tok)
    hf = HFRolloutEngine(model, tok)
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    (full,) = hf.generate([ids], greedy)
    stop = next(full.text[i : i + 2] for i in range(1, len(full.text) - 1) if "\ufffd" not in full.text[i : i + 2])
    (cut,) = hf.generate([ids], greedy.model_copy(update={"stop": [stop]}))
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]
    assert cut.num_tokens < full.num_tokens
    eos = tok.eos_token_id
    ended = full.token_ids[:3] + [eos]
    by_eos = Generation(text=tok.decode(full.token_ids[:3]), token_ids=ended, logprobs=[*full.logprobs[:3], -0.1],
                        num_tokens=4, finish_reason="eos")
    engine = VLLMRolloutEngine(model, tok)
    cases = [  # (the sampled stream and its log-probs, params, the Generation hf records)
        (full.token_ids, full.logprobs, greedy, full),
        (full.token_ids + [7, 8], full.logprobs + [-1.0, -1.0], greedy, full),  # vLLM stops at max_tokens
        (full.token_ids, full.logprobs, greedy.model_copy(update={"stop": [stop]}), cut),
        (ended + [9, 9], [*full.logprobs[:3], -0.1, -1.0, -1.0], greedy, by_eos),
    ]
    for stream, lps, params, want in cases:
        FakeLLM.last.respond = lambda p, k, out=(stream, lps): out
        (got,) = engine.generate([ids], params)
        assert (got.text, got.token_ids, got.num_tokens, got.finish_reason) == (
            want.text, want.token_ids, want.num_tokens, want.finish_reason)
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-5, rtol=0)


def completion(ids, text, finish_reason, stop_reason, lps=None):
    """A vLLM ``CompletionOutput`` as the test writes it."""
    lps = lps or [-1.0] * len(ids)
    steps = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(ids, lps)]
    return SimpleNamespace(token_ids=ids, logprobs=steps, text=text, finish_reason=finish_reason,
                           stop_reason=stop_reason)


def test_vllm_verdict_text_and_stop_reason_are_kept(fake_vllm, tok, ids):
    """Each stop_reason vLLM gives: a stop string (its cut text kept, even where a full decode of
    the ids does not show the string), None (the model's eos) and an int (a stop token id) end
    with "eos"; "length" keeps its text; anything else is refused."""
    engine = VLLMRolloutEngine(tiny_model(tok), tok)
    eos = tok.eos_token_id
    cases = [  # (vLLM's CompletionOutput, the Generation recorded)
        (completion([5, 6], "ab", "stop", "never there"), Generation("ab", [5, 6], [-1.0, -1.0], 2, "stop")),
        (completion([5, eos], "a", "stop", None), Generation("a", [5, eos], [-1.0, -1.0], 2, "eos")),
        (completion([5, 6, eos], "ab", "stop", eos), Generation("ab", [5, 6, eos], [-1.0] * 3, 3, "eos")),
        (completion([5, 6], "a b", "length", None, [-0.5, -0.25]),
         Generation("a b", [5, 6], [-0.5, -0.25], 2, "length")),
    ]
    for out, want in cases:
        FakeLLM.last.respond = lambda p, k, out=out: out
        assert engine.generate([ids], SamplingParams(temperature=0)) == [want]
    for out, match in [(completion([5, 6], "ab", "stop", None), r"stopped on None, not an eos id \[2\]"),
                       (completion([5, 6], "ab", "stop", 6), "stopped on 6"),
                       (completion([5], "a", "abort", None), "'abort'")]:
        FakeLLM.last.respond = lambda p, k, out=out: out
        with pytest.raises(RuntimeError, match=match):
            engine.generate([ids], SamplingParams(temperature=0))
    no_logprobs = completion([5], "a", "length", None)
    no_logprobs.logprobs = None
    FakeLLM.last.respond = lambda p, k: no_logprobs
    with pytest.raises(RuntimeError, match="no log-probs"):
        engine.generate([ids], SamplingParams())


def test_tool_call_tags_the_tokenizer_marks_special_stay_in_the_text(fake_vllm, ids):
    """As the hf engine (tests/test_engines.py): vLLM is asked to keep special tokens in the text,
    so a two-call action whose ``<tool_call>`` tags the tokenizer marks special reads as two calls."""
    from stages.core.text.toolcalls import parse_tool_calls

    tok = tiny_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>"], special_tokens=True)
    action = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
              '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    stream = tok(action, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    engine = VLLMRolloutEngine(tiny_model(tok), tok)
    FakeLLM.last.respond = lambda p, k: vllm_completion(stream, [-1.0] * len(stream), k, tokenizer=tok)
    (gen,) = engine.generate([ids], SamplingParams(temperature=0, max_new_tokens=64))
    assert (gen.token_ids, gen.finish_reason, gen.text) == (stream, "eos", action)
    assert [c.name for c in parse_tool_calls(gen.text)] == ["a", "b"]


# --- behaviour log-probs, temperature, reproducibility ------------------------------------------


def reference_logprobs(model, prompt: list[int], stream: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(raw / T) of ``stream`` after ``prompt`` under ``model`` as it is (float32)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + stream])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(stream)[:, None])[:, 0]


@pytest.mark.parametrize("lora", [False, True])
def test_truncated_sampling_records_the_models_untruncated_logprobs(fake_vllm, tok, ids, base_folder, lora):
    """vLLM's processed log-probs (after top-p / top-k) are replaced by log_softmax(raw / T) of the
    trained model (its adapter active, the weights of the last sync) whenever the sampling
    truncates; greedy and untruncated sampling keep vLLM's values."""
    from stages.core.models.composer import adapter_scope

    if lora:
        model, adapter = lora_student(base_folder, rank=4), "student"
        lora_b = [p for n, p in model.named_parameters() if "lora_B.student" in n]
        with torch.no_grad():
            for p in lora_b:
                p.normal_(0, 0.5)
    else:
        model, adapter = tiny_model(tok), None
    engine = VLLMRolloutEngine(model, tok, adapter=adapter)
    stream = [5, 6, 7, 8, 9]
    processed = [-0.01] * len(stream)  # vLLM's values after truncation: what must not be recorded
    FakeLLM.last.respond = lambda p, k: (stream, processed)
    base = SamplingParams(max_new_tokens=len(stream))
    for update in ({"temperature": 0.7, "top_p": 0.95}, {"temperature": 1.3, "top_p": 1.0, "top_k": 5}):
        params = base.model_copy(update=update)
        (got,) = engine.generate([ids], params)
        with adapter_scope(model, adapter):
            want = reference_logprobs(model, ids, stream, params.temperature)
        torch.testing.assert_close(torch.tensor(got.logprobs), want, atol=1e-5, rtol=0)
        assert got.token_ids == stream and got.finish_reason == "length"
    if lora:  # the adapter is what the behaviour policy samples with: without it the values differ
        with adapter_scope(model, None):
            assert (reference_logprobs(model, ids, stream, 0.7) - want).abs().max() > 1e-3
        with torch.no_grad():
            for p in lora_b:
                p.mul_(-1.0)
        engine.sleep()
        engine.sync_weights(model, adapter)
        (got,) = engine.generate([ids], base.model_copy(update={"temperature": 0.7}))
        with adapter_scope(model, adapter):
            want = reference_logprobs(model, ids, stream, 0.7)
        torch.testing.assert_close(torch.tensor(got.logprobs), want, atol=1e-5, rtol=0)
    for update in ({"temperature": 0.0}, {"temperature": 0.7, "top_p": 1.0, "top_k": 0}):
        (got,) = engine.generate([ids], base.model_copy(update=update))
        assert got.logprobs == processed  # vLLM's value is already log_softmax(raw / T) there


def test_a_served_folder_keeps_vllms_logprobs(fake_vllm, tok, ids, tmp_path):
    engine = VLLMRolloutEngine(str(save_tiny(tmp_path / "m")), tok)
    FakeLLM.last.respond = lambda p, k: ([5, 6], [-0.01, -0.02])
    (got,) = engine.generate([ids], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=2))
    assert got.logprobs == [-0.01, -0.02]


@pytest.mark.parametrize("temperature", [0.005, 2.5])
def test_temperatures_vllm_would_not_sample_are_refused_first(fake_vllm, tok, ids, tmp_path, temperature):
    from stages.distill.recipe import DistillConfig, Distiller

    msg = rf"^engine 'vllm' samples temperature 0 \(greedy\) or 0.01 to 2.0, got {temperature}: use --engine hf"
    with pytest.raises(ValueError, match=msg):
        check_engine("vllm", temperature)
    check_engine("hf", temperature)
    engine = VLLMRolloutEngine(tiny_model(tok), tok)
    engine.sleep()
    with pytest.raises(ValueError, match=msg):
        engine.generate([ids], SamplingParams(temperature=temperature))
    assert FakeLLM.last.calls == [("sleep", 2)]  # refused before waking or generating
    with pytest.raises(ValueError, match=msg):
        Distiller(DistillConfig(env="code", store=str(tmp_path / "s"), out=str(tmp_path / "o"), method="grpo",
                                engine="vllm", temperature=temperature))
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


def test_edge_temperatures_vllm_samples_as_asked_pass(fake_vllm):
    for temperature in (0.0, 0.01, 1.0, 2.0):
        check_engine("vllm", temperature)


def test_engine_core_runs_in_process_and_the_callers_random_state_is_kept(fake_vllm, tok, monkeypatch):
    """vLLM schedules deterministically only in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: set
    unless the environment says otherwise); its start seeds the global generators (the stand-in
    does as vLLM does), and the engine puts the caller's back."""
    model = tiny_model(tok)

    def draws(seed: int, build: bool = False):
        random.seed(seed), numpy.random.seed(seed), torch.manual_seed(seed)
        if build:
            VLLMRolloutEngine(model, tok)
        return random.random(), float(numpy.random.rand()), float(torch.rand(1))

    assert draws(7, build=True) == draws(7) != draws(0)
    assert FakeLLM.last.multiprocessing == "0"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    VLLMRolloutEngine(model, tok)
    assert FakeLLM.last.multiprocessing == "1"


# --- weights ----------------------------------------------------------------------------------
