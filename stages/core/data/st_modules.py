"""The sentence-transformers pipeline a sentence-embedding model folder declares, read without
the sentence-transformers library (its import costs seconds and pulls scikit-learn and scipy).

A sentence-transformers folder lists its modules in ``modules.json``; the pipeline read here is
``Transformer`` (the Hugging Face checkpoint, its ``sentence_bert_config.json``: max_seq_length,
do_lower_case), one ``Pooling`` (``<path>/config.json``: the pooling mode(s), as
sentence-transformers computes them), any ``Dense`` layers (``<path>/config.json`` and their
``linear`` weights; the activation a ``torch.nn`` class) and ``Normalize``, with the prompts of
``config_sentence_transformers.json`` (``prompts``, ``default_prompt_name``). A folder without
``modules.json`` is a plain checkpoint: mean pooling, no prompt (sentence-transformers'
default too). Any other module or setting is refused with one line (:class:`ValueError`).

The vectors stored are always L2-normalised (cosine search), so a ``Normalize`` module changes
nothing and a pipeline without one gives the same directions as sentence-transformers.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

# the legacy boolean keys of a Pooling config, in the order sentence-transformers reads them
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
POOLING_MODES = tuple(_LEGACY_POOLING.values())
_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
# the prompts sentence-transformers' encode_document tries, in order
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")
Role = Literal["text", "query", "document"]


@dataclass
class Pipeline:
    """What to do after the tokenizer: where the transformer's files are, then pooling, dense
    layers and prompts.

    Attributes:
        transformer: the folder (or hub subfolder, "" = the root) of the Hugging Face checkpoint.
        max_length: tokens kept per text (``sentence_bert_config.json``'s max_seq_length), None: unset.
        lowercase: lowercase every text first (``do_lower_case``).
        pooling: the pooling modes, concatenated in this order.
        dense: (linear layer, activation) pairs applied after pooling, in order.
        prompts: prompt name -> text prepended; ``default_prompt``: the name used for plain texts.
    """

    transformer: str = ""
    max_length: int | None = None
    lowercase: bool = False
    pooling: tuple[str, ...] = ("mean",)
    dense: list[tuple[nn.Linear, nn.Module]] = field(default_factory=list)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None

    def prompt(self, role: Role) -> str:
        """The text prepended to a text of ``role``, as sentence-transformers' ``encode`` (text),
        ``encode_query`` (query: the ``query`` prompt) and ``encode_document`` (the first of
        ``document``, ``passage``, ``corpus``) pick it; else the default prompt, else ""."""
        names = {"text": (), "query": ("query",), "document": _DOCUMENT_PROMPTS}[role]
        name = next((n for n in names if n in self.prompts), self.default_prompt)
        return self.prompts.get(name, "") if name else ""

    def pool(self, hidden_BTd: Tensor, mask_BT: Tensor) -> Tensor:
        """(B, P) sentence vectors of the (B, T, d) token states under the 0/1 ``mask_BT``: each
        pooling mode (P = modes x d) as sentence-transformers computes it, then the dense layers."""
        mask_BT1 = mask_BT.unsqueeze(-1).to(hidden_BTd.dtype)
        parts = []
        for mode in self.pooling:
            if mode == "cls":  # the first attended token (left padding too)
                first_B = mask_BT.to(torch.int).argmax(dim=1)
                parts.append(hidden_BTd[torch.arange(len(first_B)), first_B])
            elif mode == "max":
                parts.append(hidden_BTd.masked_fill(mask_BT1 == 0, float("-inf")).max(dim=1).values)
            elif mode == "lasttoken":  # the last attended token
                T = mask_BT.shape[1]
                last_B = T - 1 - mask_BT.flip(1).to(torch.int).argmax(dim=1)
                parts.append((hidden_BTd * mask_BT1)[torch.arange(len(last_B)), last_B])
            else:  # mean, mean_sqrt_len_tokens, weightedmean
                weights_BT1 = mask_BT1
                if mode == "weightedmean":
                    weights_BT1 = mask_BT1 * torch.arange(1, mask_BT.shape[1] + 1, dtype=hidden_BTd.dtype)[:, None]
                total_Bd = (hidden_BTd * weights_BT1).sum(1)
                count_B1 = weights_BT1.sum(1).clamp(min=1e-9)
                parts.append(total_Bd / (count_B1.sqrt() if mode == "mean_sqrt_len_tokens" else count_B1))
        out = torch.cat(parts, dim=-1)
        for linear, activation in self.dense:
            out = activation(linear(out.to(linear.weight.dtype)))
        return out

    def dim(self, hidden_size: int) -> int:
        """Size of the vectors :meth:`pool` returns for a transformer of ``hidden_size``."""
        return self.dense[-1][0].out_features if self.dense else len(self.pooling) * hidden_size


def read_pipeline(model: str, local: bool) -> Pipeline:
    """The pipeline the folder or hub id ``model`` declares (module docstring).

    Raises:
        ValueError: a module, pooling mode, activation or setting this reader does not compute
            (one line naming the file and field).
        FileNotFoundError: a declared file cannot be read (offline and not cached, for a hub id).
    """
    modules = _json(model, local, "modules.json")
    pipe = Pipeline()
    st_config = _json(model, local, "config_sentence_transformers.json") or {}
    pipe.prompts = {k: v or "" for k, v in (st_config.get("prompts") or {}).items()}
    pipe.default_prompt = st_config.get("default_prompt_name")
    if pipe.default_prompt is not None and pipe.default_prompt not in pipe.prompts:
        raise ValueError(f"--embedder {model}: config_sentence_transformers.json: default_prompt_name "
                         f"{pipe.default_prompt!r} is not one of its prompts {sorted(pipe.prompts)}")
    if modules is None:  # a plain checkpoint
        pipe.max_length = _bert_config(model, local, "").get("max_seq_length")
        return pipe
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [m.get("type") for m, k in zip(modules, kinds) if k not in _MODULES]
    order_ok = kinds[:2] == ["Transformer", "Pooling"] and set(kinds[2:]) <= {"Dense", "Normalize"}
    if unknown or not order_ok:
        raise ValueError(f"--embedder {model}: modules.json declares {kinds}: only Transformer, Pooling, then "
                         f"Dense / Normalize modules are computed here" + (f" (not {unknown[0]})" if unknown else ""))
    pipe.transformer = modules[0].get("path", "")
    bert = _bert_config(model, local, pipe.transformer)
    pipe.max_length, pipe.lowercase = bert.get("max_seq_length"), bool(bert.get("do_lower_case", False))
    where = _sub(modules[1].get("path", ""), "config.json")
    pipe.pooling = _pooling(model, where, _json(model, local, where) or {})
    pipe.dense = [_dense(model, local, m["path"]) for m, k in zip(modules, kinds) if k == "Dense"]
    return pipe


def _sub(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _bert_config(model: str, local: bool, folder: str) -> dict:
    return _json(model, local, _sub(folder, "sentence_bert_config.json")) or {}


def _pooling(model: str, where: str, config: dict) -> tuple[str, ...]:
    """The pooling modes of a Pooling config (the current ``pooling_mode`` or the legacy booleans)."""
    if config.get("include_prompt") is False:
        raise ValueError(f"--embedder {model}: {where}: include_prompt false (prompt tokens left out of the "
                         "pooling) is not computed here")
    mode = config.get("pooling_mode")
    if mode is None:
        mode = [m for key, m in _LEGACY_POOLING.items() if config.get(key)] or ["mean"]
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise ValueError(f"--embedder {model}: {where}: pooling mode {bad or modes} is not one of {POOLING_MODES}")
    return modes


def _dense(model: str, local: bool, folder: str) -> tuple[nn.Linear, nn.Module]:
    """A Dense module: its linear layer (weights ``linear.weight`` / ``linear.bias`` of
    ``model.safetensors`` or ``pytorch_model.bin``) and its activation (a ``torch.nn`` class)."""
    where = _sub(folder, "config.json")
    config = _json(model, local, where) or {}
    if config.get("use_residual") or config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ValueError(f"--embedder {model}: {where}: a residual or renamed-input Dense is not computed here")
    name = config.get("activation_function", "torch.nn.modules.activation.Tanh")  # sentence-transformers' default
    module, _, cls = name.rpartition(".")
    activation = getattr(importlib.import_module(module), cls, None) if name.startswith("torch.nn.") else None
    if not (isinstance(activation, type) and issubclass(activation, nn.Module)):
        raise ValueError(f"--embedder {model}: {where}: activation_function {name!r} is not a torch.nn module")
    linear = nn.Linear(int(config["in_features"]), int(config["out_features"]), bias=bool(config.get("bias", True)))
    weights = _file(model, local, _sub(folder, "model.safetensors"))
    if weights is not None:
        from safetensors.torch import load_file

        state = load_file(str(weights))
    elif (weights := _file(model, local, _sub(folder, "pytorch_model.bin"))) is not None:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"--embedder {model}: {folder}: no model.safetensors nor pytorch_model.bin")
    linear.load_state_dict({k.removeprefix("linear."): v for k, v in state.items() if k.startswith("linear.")})
    return linear.eval(), activation().eval()


def _file(model: str, local: bool, name: str) -> Path | None:
    """The local path of file ``name`` of ``model`` (downloaded for a hub id), None when the
    folder or hub repo has no such file."""
    if local:
        path = Path(model) / name
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        return Path(hf_hub_download(model, name))
    except RemoteEntryNotFoundError:
        return None


def _json(model: str, local: bool, name: str):
    path = _file(model, local, name)
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"--embedder {model}: {name}: not JSON ({err})") from None
