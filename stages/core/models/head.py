"""The LM head split off a causal LM: its decoder's last hidden states, and the head that turns
them into logits, so a loss can apply the head only at the positions it supervises.

A Hugging Face causal LM computes ``logits = lm_head(decoder(...).last_hidden_state)``; some
architectures then change the logits (soft-capping, a logit scale or divisor). :func:`output_head`
checks, once per model, that the model's logits ARE its output embedding applied to the
decoder's last hidden state (a 2-token forward compared both ways), and returns the head's
weight and bias only then; :func:`forward_outputs` runs either the whole model (logits) or the
decoder alone (hidden states) with the same arguments. A model whose logits differ, whose head
is not a plain ``nn.Linear`` (a LoRA-adapted head) or whose weights are sharded (FSDP2
DTensors) gets ``None``: its callers keep the full-logits path.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
from peft import PeftModel
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from stages.core.losses.head import LMHead
from stages.core.models.composer import adapter_scope
from stages.core.models.shared_prefix import position_keys, prefix_groups, right_padded_lengths, shared_prefix_outputs
from stages.core.run.resources import transient_blocks


_CHECKED: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def _causal_lm(model: nn.Module) -> nn.Module:
    """The transformers causal LM inside ``model`` (a peft wrapper's base model, with its LoRA
    layers injected in place)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def _decoder(model: nn.Module) -> nn.Module:
    lm = _causal_lm(model)
    decoder = getattr(lm, "base_model", None)
    if decoder is None or decoder is lm:
        raise ValueError(f"{type(lm).__name__} has no separate decoder module (base_model)")
    return decoder


def forward_outputs(model: nn.Module, hidden: bool, **inputs: Any) -> Tensor:
    """The model's logits (B, T, V), or with ``hidden`` its decoder's last hidden states (B, T, d).

    ``inputs`` are the keyword arguments of the model's forward (``input_ids`` or
    ``inputs_embeds``, ``attention_mask``, ``position_ids``, ``use_cache``); the active adapter is
    the caller's. With ``hidden`` the LM head is not applied: :func:`output_head` gives it.
    Right-padded rows (token ids or embeddings) that share a long prefix (the G rollouts of a
    task; LOPD's teacher view of them) run with that prefix encoded once
    (:mod:`stages.core.models.shared_prefix`): the same values up to float rounding.

    Raises:
        ValueError: ``hidden`` for a model without a separate decoder module.
    """
    run = _decoder(model) if hidden else model
    pick = _last_hidden if hidden else _logits
    key, groups = _shareable_groups(model, inputs)
    # without a gradient every layer's blocks die within the forward: the allocator may reuse them
    with contextlib.nullcontext() if torch.is_grad_enabled() else transient_blocks():
        if groups:
            return shared_prefix_outputs(run, pick, key, inputs[key], inputs["attention_mask"], groups)
        return pick(run(**inputs))


def _logits(out: Any) -> Tensor:
    return out.logits


def _last_hidden(out: Any) -> Tensor:
    return out.last_hidden_state


_SHARED_INPUTS = {"attention_mask", "use_cache", "position_ids"}


def _shareable_groups(model: nn.Module, inputs: dict[str, Any]) -> tuple[str, list[tuple[list[int], int]]]:
    """The sequence argument (``input_ids`` or ``inputs_embeds``) and
    :func:`stages.core.models.shared_prefix.prefix_groups` of the batch, or no groups where a
    shared-prefix forward does not apply: other inputs than the sequence, mask, ``use_cache`` and
    default position ids (0..T-1 in every row), a mask that is not right-padded, activation
    checkpointing (transformers turns the KV cache off under it) or sharded (FSDP2) weights."""
    keys = set(inputs)
    sequence = keys & {"input_ids", "inputs_embeds"}
    if len(sequence) != 1 or "attention_mask" not in keys or not keys <= sequence | _SHARED_INPUTS:
        return "", []
    key = sequence.pop()
    seq = inputs[key]
    positions = inputs.get("position_ids")
    if positions is not None and not torch.equal(positions, torch.arange(seq.shape[1], device=positions.device)
                                                 .expand_as(positions)):
        return key, []
    lm = _causal_lm(model)
    if getattr(lm, "is_activation_checkpointing", False) or isinstance(next(lm.parameters()), DTensor):
        return key, []
    lengths = right_padded_lengths(inputs["attention_mask"])
    if lengths is None:
        return key, []
    return key, prefix_groups(position_keys(seq), lengths)


def output_head(model: nn.Module) -> LMHead | None:
    """The output embedding of ``model`` as an :class:`LMHead`, or None where the model's logits
    are not exactly that head applied to its decoder's last hidden state.

    Checked once per model object (a no-grad forward of 2 tokens through the whole model and
    through the decoder + head, with every adapter disabled; relative tolerance 1e-4); later
    calls only re-read the head's tensors, so a trained head is returned as it is now.
    Never checked (None at once): a head that is not a plain ``nn.Linear``, or DTensor weights.
    """
    lm = _causal_lm(model)
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if type(head) is not nn.Linear or isinstance(head.weight, DTensor):
        return None
    if model not in _CHECKED:
        _CHECKED[model] = _head_reproduces_logits(model, head)
    return LMHead(head.weight, head.bias) if _CHECKED[model] else None


def _head_reproduces_logits(model: nn.Module, head: nn.Linear) -> bool:
    try:
        decoder = _decoder(model)
    except ValueError:
        return False
    ids_12 = torch.tensor([[0, 1]], device=head.weight.device)
    with torch.no_grad(), adapter_scope(model, None):
        logits_12V = model(input_ids=ids_12, use_cache=False).logits
        hidden_12d = decoder(input_ids=ids_12, use_cache=False).last_hidden_state
        rebuilt_12V = nn.functional.linear(hidden_12d, head.weight, head.bias)
    if logits_12V.shape != rebuilt_12V.shape:
        return False
    scale = float(logits_12V.abs().max()) or 1.0
    return float((logits_12V - rebuilt_12V).abs().max()) <= 1e-4 * scale
