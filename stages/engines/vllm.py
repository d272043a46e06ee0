"""The ``vllm`` rollout engine: vLLM's offline ``LLM`` on the GPU the trainer uses.

Written against the documented offline API of vLLM 0.26 (``pip install '.[vllm]'``); it is
UNVERIFIED ON A GPU until a GPU run checks it (the normal test suite drives it with a stand-in
``vllm`` module). What it relies on, and nothing more: ``LLM(...)``, ``LLM.generate`` with
``TokensPrompt`` prompts, one ``SamplingParams`` per prompt and a ``LoRARequest``;
``LLM.sleep`` / ``LLM.wake_up(tags)`` (sleep mode); ``LLM.collective_rpc("reload_weights",
kwargs={"weights_path": ...})`` (the worker's in-place reload from a folder) and
``LLM.reset_prefix_cache``.

* **generate**: all prompts in one ``LLM.generate`` call (vLLM schedules its own batches and
  caches prefixes itself); :func:`vllm_sampling_kwargs` maps :class:`stages.engines.SamplingParams`
  one to one. A completion becomes a :class:`Generation` by vLLM's own verdict
  (:meth:`VLLMRolloutEngine._finish`): vLLM stops at the token that completes a stop string
  (``stop_reason`` is that string, its text is cut before it), at an eos or stop token id
  (``stop_reason`` None for the model's eos id, the id for one of ``stop_token_ids``; the id is
  the last one kept and its text is left out), or at ``max_tokens`` (``"length"``).
* **temperature**: vLLM's ``SamplingParams`` raises above 2 and samples any temperature in
  (0, 0.01) at 0.01; such temperatures are refused (:func:`stages.engines.check_vllm_temperature`).
* **log-probs**: ``logprobs=0`` returns the sampled token's log-prob, and the engine is built with
  ``logprobs_mode="processed_logprobs"``: for a sampled request vLLM's sampler returns
  ``log_softmax`` of the logits after the temperature AND after top-k / top-p truncation
  (renormalised over the kept tokens); for a greedy request, of the logits without temperature.
  So vLLM's value is the project's (``log_softmax(raw / T)``, :class:`Generation`) for greedy
  decoding and for untruncated sampling (top_p 1, top_k 0), and ``-log(kept mass)`` higher per
  token otherwise (between 0 and ``-log(top_p)`` for top-p alone, unbounded with top-k); vLLM has
  no mode with the temperature but without the truncation (``raw_logprobs`` drops the
  temperature too). So when the sampling truncates, an engine that holds a trained model
  recomputes the sampled tokens' log-probs with that model's own forward (no grad, the synced
  weights and adapter, ``log_softmax(raw / T)`` in float32 as the ``hf`` engine records them),
  one forward over each prompt + completion with logits at the completion only. A model folder
  served as it is (``lopd evaluate``, which reads no log-probs) keeps vLLM's values.
* **reproducibility**: vLLM makes its scheduling deterministic only with its engine core in the
  calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which the engine sets unless the
  environment already sets the variable. vLLM then seeds the calling process's global random
  generators when it starts; the engine puts them back (the trainer's random streams stay its
  own). Batch invariance (``VLLM_BATCH_INVARIANT=1``, left to the user) is what would make one
  prompt's completion independent of the prompts batched beside it.
* **sync_weights**: a LoRA student's adapter is saved to a fresh folder and used through a fresh
  ``LoRARequest`` (new name and int id per version: vLLM caches adapters by id); a fully
  fine-tuned student is saved whole (``save_pretrained``) and reloaded in place from that folder.
* **sleep**: frees the engine's GPU memory while the trainer runs: level 1 for LoRA (base
  weights parked in CPU memory), level 2 for full fine-tuning (weights dropped: the next wake
  reloads the newest saved version). ``generate`` wakes the engine. After a wake, a LoRA adapter
  vLLM already served is registered again under a fresh int id (same folder), so vLLM loads it
  anew rather than applying one it loaded before the sleep (vLLM 0.27.1 was reported to stop
  applying such an adapter after a level-1 wake); a step without training rows syncs nothing,
  and its next rollouts still use a freshly loaded adapter. An engine built from a
  model folder (``lopd evaluate``) serves it as it is: no sleep mode, nothing to sync.
* **a student folder** is served as it was trained (:func:`serving_args`): a LoRA adapter
  folder as its base model plus the adapter through vLLM's LoRA path, a LoRA student merged in
  float32 in float32 (vLLM's float32 path is UNVERIFIED ON A GPU, as the rest), anything else
  in bfloat16.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from stages.engines import (
    Generation, SamplingParams, check_engine, check_vllm_temperature, eos_token_ids, row_seeds,
)

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
TRAINING_GPU_SHARE = 0.4  # GPU memory share of an engine that sits next to the trainer
SERVING_GPU_SHARE = 0.85  # ... and of one that has the GPU to itself (lopd evaluate)


def vllm_sampling_kwargs(params: SamplingParams, eos_ids: list[int], seed: int | None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments for one prompt sampled with ``params``.

    One to one: temperature (0 = greedy), top_p, top_k (our 0 = off is vLLM's -1), stop
    strings, ``max_new_tokens`` -> ``max_tokens``, ``seed``; the eos ids stop the completion
    (``stop_token_ids``); ``logprobs=0``: the sampled token's log-prob only. Everything vLLM
    would otherwise let reshape the distribution is pinned off (penalties, min-p, min tokens),
    as the ``hf`` engine pins the model's generation config. The text keeps special tokens, with
    no space added between them (as the ``hf`` engine decodes: :attr:`stages.engines.Generation.text`);
    vLLM leaves out the text of the eos or stop token id that ends a completion.

    Raises:
        ValueError: a temperature vLLM would not sample as asked (:func:`check_vllm_temperature`).
    """
    check_vllm_temperature(params.temperature)
    return dict(n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or -1,
                max_tokens=params.max_new_tokens, stop=list(params.stop), stop_token_ids=list(eos_ids), seed=seed,
                logprobs=0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_p=0.0,
                min_tokens=0, ignore_eos=False, skip_special_tokens=False, spaces_between_special_tokens=False,
                include_stop_str_in_output=False)


def serving_args(model: str) -> tuple[dict[str, Any], str | None]:
    """How vLLM serves the model folder or hub id ``model`` as it was trained: ``(LLM keyword
    arguments: model, dtype and any LoRA settings; the LoRA adapter folder to serve through a
    LoRARequest, or None)``.

    * a LoRA adapter folder (``adapter_config.json`` without ``config.json``: ``lopd export``
      without ``--merge``): its base model (:func:`stages.core.models.backbone.adapter_base`) with
      ``enable_lora``, one LoRA, ``max_lora_rank`` the adapter's rank rounded up to one vLLM
      takes, and the adapter applied unmerged (its update is never rounded onto the base's grid);
    * a LoRA student merged in float32 (``final/student``, ``lopd export --merge``: its config
      carries ``lopd_merged_lora``): float32, as ``load_policy`` loads it (in bfloat16 most of
      a small merged update rounds back onto the base weights);
    * any other folder or id: bfloat16 (the dtype the ``hf`` engine loads on a GPU).

    Raises:
        ValueError: an adapter vLLM cannot apply as trained (rank above 512, ``modules_to_save``,
            DoRA), or an adapter_config.json without a base (one line naming the file).
    """
    import json

    from stages.core.models.backbone import adapter_base, merged_lora, resolve_model

    config = Path(model) / "adapter_config.json"
    if not (config.is_file() and not (Path(model) / "config.json").is_file()):
        return dict(model=model, dtype="float32" if merged_lora(model) else "bfloat16"), None
    lora = json.loads(config.read_text())
    rank = max([int(lora.get("r") or 0), *map(int, (lora.get("rank_pattern") or {}).values())])
    if rank > LORA_RANKS[-1]:
        raise ValueError(f"{config}: LoRA rank {rank} is above vLLM's largest, {LORA_RANKS[-1]}: "
                         "lopd export --merge writes a whole model vLLM serves")
    for key, what in (("modules_to_save", "fully trained modules"), ("use_dora", "DoRA")):
        if lora.get(key):
            raise ValueError(f"{config}: {key} ({what}) is not applied by vLLM's LoRA: "
                             "lopd export --merge writes a whole model vLLM serves")
    base = resolve_model(adapter_base(config))
    return dict(model=base, dtype="float32" if merged_lora(base) else "bfloat16", enable_lora=True, max_loras=1,
                max_lora_rank=next(r for r in LORA_RANKS if r >= rank)), str(model)


def truncates(params: SamplingParams) -> bool:
    """Whether ``params`` sample from a top-p / top-k truncated distribution (vLLM's log-probs then
    differ from ``log_softmax(raw / T)``)."""
    return params.temperature > 0 and (params.top_p < 1 or params.top_k > 0)


@contextlib.contextmanager
def kept_random_state() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's (CPU and every visible CUDA device's) global random
    state on exit: an in-process vLLM engine seeds them while it starts."""
    import numpy

    py_state, np_state = random.getstate(), numpy.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        numpy.random.set_state(np_state)


class VLLMRolloutEngine:
    """Rollouts with vLLM (see the module docstring for what is mapped and how weights move).

    Args:
        model: the policy being trained (a transformers model, or a peft model holding
            ``adapter``), or a model folder / hub id to serve as it is (:func:`serving_args`).
        tokenizer: its tokenizer (eos id, decoding); prompts arrive tokenized.
        adapter: the LoRA adapter of ``model`` to generate with; None: ``model``'s full weights.
        gpu_memory_utilization: vLLM's share of the GPU memory (weights + KV cache); default
            :data:`TRAINING_GPU_SHARE` for a trained model, :data:`SERVING_GPU_SHARE` for a folder.
        max_model_len: longest prompt + completion (default: the model's context length).

    Attributes:
        version: weight versions synced so far (1 after construction for a trained model).

    Raises:
        ValueError: vllm is not installed, ``adapter`` is not an adapter of ``model`` (or its
            base model has no ``name_or_path``), a LoRA rank above 512, a fully fine-tuned
            ``model`` that is a peft model, or an adapter folder vLLM cannot serve (:func:`serving_args`).
    """

    def __init__(self, model: nn.Module | str, tokenizer, *, adapter: str | None = None,
                 gpu_memory_utilization: float | None = None, max_model_len: int | None = None):
        check_engine("vllm")
        self._vllm = importlib.import_module("vllm")
        self._lora_request_cls = importlib.import_module("vllm.lora.request").LoRARequest
        self.tokenizer, self.adapter, self.version = tokenizer, adapter, 0
        self._work = tempfile.TemporaryDirectory(prefix="lopd-vllm-")  # weight versions; removed with the engine
        self._folder: Path | None = None  # the newest saved version
        self._lora = None
        self._lora_ids = itertools.count(1)  # vLLM caches adapters by int id: one per registration
        self._lora_served = False  # vLLM has loaded the current LoRARequest (a generate used it)
        self._model: nn.Module | None = None  # the trained model (recomputes truncated log-probs)
        self._asleep: set[str] = set()
        self.device = torch.device("cuda")
        kwargs: dict[str, Any] = {}
        served_adapter = None  # a LoRA adapter folder served as it is
        if isinstance(model, str):  # a folder or hub id, served as it is (serving_args)
            from transformers import GenerationConfig

            llm_args, served_adapter = serving_args(model)
            path, self.dtype = llm_args.pop("model"), getattr(torch, llm_args.pop("dtype"))
            kwargs.update(llm_args)
            try:
                generation_eos = GenerationConfig.from_pretrained(path).eos_token_id
            except OSError:  # no generation_config.json: the tokenizer's eos alone
                generation_eos = None
            self.sleep_level = 0
        else:
            from stages.core.models.composer import base_model

            self.dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
            generation_eos = model.generation_config.eos_token_id
            if adapter is not None:
                if adapter not in (getattr(model, "peft_config", None) or {}):
                    known = sorted(getattr(model, "peft_config", None) or {})
                    raise ValueError(f"VLLMRolloutEngine: the model has no adapter {adapter!r} (adapters: {known})")
                rank = model.peft_config[adapter].r
                if rank > LORA_RANKS[-1]:
                    raise ValueError(f"VLLMRolloutEngine: LoRA rank {rank} is above vLLM's largest, {LORA_RANKS[-1]}")
                path = base_model(model).name_or_path  # vLLM loads the frozen base from where it came
                if not path:
                    raise ValueError("VLLMRolloutEngine: the LoRA student's base model has no name_or_path "
                                     "(load it with from_pretrained)")
                kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=next(r for r in LORA_RANKS if r >= rank))
                self.sleep_level = 1
            elif base_model(model) is not model:
                raise ValueError("VLLMRolloutEngine: a fully fine-tuned student must be a plain transformers model, "
                                 "not a peft model (give its LoRA adapter instead)")
            else:
                self.sleep_level = 2
            self._save(model)  # version 1: vLLM starts from the weights as they are now
            self._model = model
            if adapter is None:
                path = str(self._folder)
        self.eos_ids = eos_token_ids(generation_eos, tokenizer)
        share = gpu_memory_utilization or (SERVING_GPU_SHARE if self.sleep_level == 0 else TRAINING_GPU_SHARE)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # deterministic scheduling (module docstring)
        with kept_random_state():
            self.llm = self._vllm.LLM(model=path, dtype=str(self.dtype).removeprefix("torch."),
                                      gpu_memory_utilization=share, max_model_len=max_model_len,
                                      enable_sleep_mode=self.sleep_level > 0, logprobs_mode="processed_logprobs",
                                      **kwargs)
        if served_adapter is not None:
            self._register_lora(served_adapter, "student")

    @property
    def context_window(self) -> int:
        """vLLM's ``max_model_len``: the most tokens of a prompt and its completion (vLLM refuses a
        longer prompt)."""
        return self.llm.llm_engine.model_config.max_model_len

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Complete each prompt (token ids of the rendered prompt; nothing is added to them).

        Prompt i is sampled under its row seed (:func:`stages.engines.row_seeds`:
        ``params.seeds[i]``, else ``params.seed + i``) by vLLM's per-request generator: the same
        prompt and row seed (and weights) give the same completion on the same GPU and vLLM
        version, with the engine core in this process (module docstring), up to the float noise
        of the prompts batched beside it (``VLLM_BATCH_INVARIANT=1`` removes that). With a top-p / top-k truncation and a trained
        model, the log-probs are recomputed with the model (module docstring).

        Raises:
            ValueError: an empty prompt, a temperature vLLM would not sample as asked, or
                ``params.seeds`` not one per prompt.
            RuntimeError: vLLM aborted a request, returned no log-probs, or stopped on an id
                that is not an eos id.
        """
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("VLLMRolloutEngine.generate: empty prompt")
        if not prompt_ids:
            return []
        seeds = row_seeds(params, len(prompt_ids)) or [None] * len(prompt_ids)
        sampling = [self._vllm.SamplingParams(**vllm_sampling_kwargs(params, self.eos_ids, seed)) for seed in seeds]
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        self._wake()
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False, lora_request=self._lora)
        self._lora_served = self._lora is not None
        gens = [self._finish(out.outputs[0]) for out in outputs]
        if truncates(params) and self._model is not None:
            gens = self._model_logprobs(prompt_ids, gens, params.temperature)
        return gens

    def sync_weights(self, model: nn.Module, adapter: str | None = None) -> None:
        """Generate with the current weights of ``model`` (its adapter ``adapter``) from now on.

        LoRA: the adapter is saved to a fresh folder and a fresh ``LoRARequest`` (name
        ``<adapter>-v<version>``, the next int id) serves it. Full fine-tuning: the model is
        saved to a fresh folder and reloaded in place now (or, while asleep, at the next wake).
        The previous version's folder is removed.

        Raises:
            ValueError: an engine built from a folder, or a change between LoRA and full
                fine-tuning or of the adapter's name.
        """
        if self.sleep_level == 0:
            raise ValueError("VLLMRolloutEngine: built from a model folder, it has no trained weights to sync")
        if adapter != self.adapter:
            raise ValueError(f"VLLMRolloutEngine: built for adapter {self.adapter!r}, asked to sync {adapter!r}")
        self._save(model)
        self._model = model
        if adapter is None and "weights" not in self._asleep:
            self._reload()

    def sleep(self) -> None:
        """Free the engine's GPU memory for training (no-op for a served folder or when asleep)."""
        if self.sleep_level and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = {"weights", "kv_cache"}

    def _wake(self) -> None:
        if "weights" in self._asleep:
            self.llm.wake_up(tags=["weights"])
            if self.sleep_level == 2:  # level 2 dropped the weights: load the newest version
                self._reload()
            elif self._lora_served:  # loaded before the sleep: served again under a fresh id
                self._register_lora(self._lora.lora_path, f"{self.adapter}-v{self.version}-wake")
        if "kv_cache" in self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
        self._asleep = set()

    def _reload(self) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._folder)})
        self.llm.reset_prefix_cache()  # cached keys and values came from the old weights

    def _save(self, model: nn.Module) -> None:
        """Write the next weight version (the adapter, or the whole model and its tokenizer)."""
        self.version += 1
        old, self._folder = self._folder, Path(self._work.name) / f"v{self.version}"
        if self.adapter is None:
            model.save_pretrained(self._folder)
            self.tokenizer.save_pretrained(self._folder)
        else:
            model.save_pretrained(str(self._folder), selected_adapters=[self.adapter])
            # peft writes an adapter not named "default" into <folder>/<adapter>/
            path = self._folder if self.adapter == "default" else self._folder / self.adapter
            if not (path / "adapter_config.json").is_file():
                raise RuntimeError(f"VLLMRolloutEngine: no adapter_config.json in {path} after saving {self.adapter!r}")
            self._register_lora(str(path), f"{self.adapter}-v{self.version}")
        if old is not None:  # vLLM holds that version in memory or will never need it again
            shutil.rmtree(old, ignore_errors=True)

    def _register_lora(self, path: str, name: str) -> None:
        """Serve the adapter folder ``path`` through a fresh ``LoRARequest`` (the next int id)."""
        self._lora = self._lora_request_cls(lora_name=name, lora_int_id=next(self._lora_ids), lora_path=path)
        self._lora_served = False

    def _finish(self, out: Any) -> Generation:
        """vLLM's ``CompletionOutput`` -> :class:`Generation`, by vLLM's verdict (module docstring):
        its ids and log-probs as they are, its text (cut before a stop string, without the eos)."""
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"VLLMRolloutEngine: vLLM ended a completion with {out.finish_reason!r}")
        if out.logprobs is None:
            raise RuntimeError("VLLMRolloutEngine: vLLM returned no log-probs (logprobs=0 was asked for)")
        ids = list(out.token_ids)
        logprobs = [step[t].logprob for step, t in zip(out.logprobs, ids)]
        if out.finish_reason == "length":
            reason = "length"
        elif isinstance(out.stop_reason, str):  # a stop string
            reason = "stop"
        elif ids and ids[-1] in self.eos_ids:  # stop_reason None (the model's eos) or the stop token id
            reason = "eos"
        else:
            raise RuntimeError(f"VLLMRolloutEngine: vLLM stopped on {out.stop_reason!r}, not an eos id {self.eos_ids}")
        return Generation(text=out.text, token_ids=ids, logprobs=logprobs, num_tokens=len(ids), finish_reason=reason)

    def _model_logprobs(self, prompt_ids: list[list[int]], gens: list[Generation], temperature: float
                        ) -> list[Generation]:
        """``gens`` with each sampled token's ``log_softmax(raw / temperature)`` under the trained
        model (its adapter active): one no-grad forward per prompt + completion, logits at the
        completion positions only, upcast to float32 (float64 stays) before the temperature."""
        from stages.core.losses.chunking import upcast_dtype
        from stages.core.losses.lopd import sampled_token_logprobs
        from stages.core.models.composer import adapter_scope

        model, out = self._model, []
        device = next(p.device for p in model.parameters())
        with torch.no_grad(), adapter_scope(model, self.adapter):
            for prompt, gen in zip(prompt_ids, gens):
                if not gen.token_ids:  # nothing to score (logits_to_keep=0 would keep every position)
                    out.append(gen)
                    continue
                ids_1T = torch.tensor([list(prompt) + gen.token_ids[:-1]], device=device)
                logits_1NV = model(input_ids=ids_1T, logits_to_keep=gen.num_tokens, use_cache=False).logits
                logits_1NV = logits_1NV.to(upcast_dtype(logits_1NV.dtype)) / temperature
                logp_1N = sampled_token_logprobs(logits_1NV, torch.tensor([gen.token_ids], device=device))
                out.append(dataclasses.replace(gen, logprobs=logp_1N[0].tolist()))
        return out
