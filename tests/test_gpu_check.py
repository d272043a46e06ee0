"""benchmarks/gpu_check.py's CPU dry run: every check runs on the tiny model, the vLLM checks
against a stand-in ``vllm`` whose ``LLM`` runs the transformers model itself (greedy, sampling
with vLLM's top-k / top-p rule and processed log-probs, stop ids, sleep, reload_weights, LoRA
requests), so the checks' own arithmetic and plumbing are exercised; a stand-in that keeps stale
weights or a stale adapter makes them FAIL. Whether real vLLM passes is for a GPU run."""
from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class ModelLLM:
    """vLLM's offline ``LLM`` as far as the checks use it, on the transformers model (float32).

    ``broken``: "reload" ignores ``reload_weights`` (stale weights), "lora" serves the first
    adapter it was given whatever the request (a stale adapter)."""

    broken = ""

    def __init__(self, model: str, dtype: str, enable_sleep_mode: bool, enable_lora: bool = False, **kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.model, self.tokenizer, self.adapters = self._load(model), AutoTokenizer.from_pretrained(model), {}

    def sleep(self, level: int) -> None:
        if level == 2 and self.broken != "reload":  # weights dropped (kept, stale, when broken)
            self.model = None

    def wake_up(self, tags=None) -> None:
        pass

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        assert method == "reload_weights"
        if self.broken != "reload":
            self.model = self._load(kwargs["weights_path"])

    def reset_prefix_cache(self) -> None:
        pass

    def _lora(self, request: LoRARequest):
        from peft import PeftModel

        if request.lora_int_id not in self.adapters:
            self.adapters[request.lora_int_id] = PeftModel.from_pretrained(copy.deepcopy(self.model), request.lora_path)
        key = min(self.adapters) if self.broken == "lora" else request.lora_int_id
        return self.adapters[key].eval()

    def _next(self, logits: torch.Tensor, k: dict, generator) -> tuple[int, float]:
        if k["temperature"] == 0:
            return int(logits.argmax()), float(torch.log_softmax(logits, -1).max())
        x = logits / k["temperature"]
        if k["top_k"] > 0:
            x = x.masked_fill(x < x.topk(k["top_k"]).values[-1], -float("inf"))
        probs, order = torch.softmax(x, -1).sort()
        dropped = probs.cumsum(-1) <= 1 - k["top_p"]
        dropped[-1] = False
        x[order[dropped]] = -float("inf")
        logp = torch.log_softmax(x, -1)  # processed: after temperature and truncation
        t = int(torch.multinomial(logp.exp(), 1, generator=generator))
        return t, float(logp[t])

    def generate(self, prompts, sampling_params, *, use_tqdm=True, lora_request=None):
        model = self._lora(lora_request) if lora_request is not None else self.model
        outputs = []
        for prompt, params in zip(prompts, sampling_params):
            k = params.kwargs
            generator = torch.Generator().manual_seed(k["seed"]) if k["seed"] is not None else None
            ids, out, lps = list(prompt["prompt_token_ids"]), [], []
            with torch.no_grad():
                for _ in range(k["max_tokens"]):
                    t, lp = self._next(model(input_ids=torch.tensor([ids + out])).logits[0, -1].float(), k, generator)
                    out.append(t), lps.append(lp)
                    if t in k["stop_token_ids"]:
                        break
            stopped = out[-1] in k["stop_token_ids"]
            text = self.tokenizer.decode(out[:-1] if stopped else out, skip_special_tokens=k["skip_special_tokens"])
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(
                token_ids=out, logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(out, lps)], text=text,
                finish_reason="stop" if stopped else "length", stop_reason=None)]))
        return outputs


@pytest.fixture
def model_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    vllm.LLM = ModelLLM
    vllm.SamplingParams = lambda **kwargs: SimpleNamespace(kwargs=kwargs)
    vllm.TokensPrompt = lambda **kwargs: dict(kwargs)
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(ModelLLM, "broken", "")
    return ModelLLM


def test_the_dry_run_passes_every_check_and_prints_one_table(gpu_check, model_vllm, capsys):
    rows = gpu_check.main(["--dry-run", "--tokens", "6", "--cycles", "3"])
    out = capsys.readouterr().out
    assert [(r.name, r.result) for r in rows] == [(name, "PASS") for name in gpu_check.CHECKS], out
    table = out[out.index("check "):]
    assert all(f"{r.name:<17} PASS" in table for r in rows)
    by_name = {r.name: r.numbers for r in rows}
    assert "completions changed by the update (v2)" in by_name["vllm-full-sync"]
    assert "versions served [2, 3, 4]" in by_name["vllm-lora-cycles"]
    assert "-log kept mass, mean" in by_name["vllm-logprobs"] and "bench_step" not in by_name["bench-step"]
    assert "s/step" in by_name["bench-step"] and "[float32 / bf16]" in by_name["bf16-parity"]
    assert "its FLOP bound" in by_name["composer"] and "anchor phi_0 forward" in by_name["composer"]


@pytest.mark.parametrize("broken,check", [("reload", "vllm-full-sync"), ("lora", "vllm-lora-cycles")])
def test_stale_weights_or_adapters_fail_their_check(gpu_check, model_vllm, broken, check):
    model_vllm.broken = broken
    (row,) = gpu_check.main(["--dry-run", "--tokens", "6", "--cycles", "3", "--only", check])
    assert row.result == "FAIL", row.numbers


def test_truncation_unaccounted_for_fails_the_logprob_check(gpu_check, model_vllm, monkeypatch):
    """A kept-mass rule that does not match the sampler's (here: none) leaves the top-p 0.95
    difference unexplained."""
    monkeypatch.setattr(gpu_check, "kept_mass", lambda logits, top_p: torch.ones(logits.shape[0]))
    (row,) = gpu_check.main(["--dry-run", "--tokens", "6", "--only", "vllm-logprobs", "--lp-mean", "1e-4"])
    assert row.result == "FAIL" and "T0.7 top-p 0.95" in row.numbers


def test_without_vllm_the_vllm_checks_skip_with_the_reason(gpu_check, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    rows = gpu_check.main(["--dry-run", "--only", "vllm-full-sync", "vllm-logprobs", "vllm-lora-cycles"])
    assert {r.result for r in rows} == {"SKIP"} and all("vllm is not importable" in r.numbers for r in rows)
