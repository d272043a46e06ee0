"""Composer of LOPD (Eq. 5-6 of the LOPD paper): encoder LoRA psi + QFormer compressor chi.

One backbone lives in memory and serves three roles, told apart by which LoRA adapter is
active during a forward pass (one peft model, several named adapters):

- student: adapter ``"student"`` (or no adapter for full fine-tuning, see ``teacher.py``);
- teacher: adapters DISABLED, i.e. the frozen initial backbone theta_bar;
- composer encoder Enc_psi: adapter ``"composer"`` (psi) on the same frozen base weights.

Adapter switching goes through :func:`adapter_scope`, never through bare peft calls, because
peft's ``set_adapter`` / ``disable_adapter_layers`` flip ``requires_grad`` of the other adapters
and autograd reads that flag at backward time: a composer forward followed by a teacher
forward would silently lose the composer's gradients. ``adapter_scope`` puts every
``requires_grad`` flag back right after each switch. For activation checkpointing use
:func:`enable_activation_checkpointing`: its recompute runs under the adapter state that was
active during the original forward (otherwise the recompute uses whichever adapter is active
at backward time and gives wrong gradients).

The compressor chi (Eq. 6: K learned queries, QFormer blocks, readout) is
:class:`stages.core.models.compressor.LatentCompressor`.

Experiences are right-padded token id tensors of "task x + experience m_j" sequences,
tokenised by the caller; ``max_exp_tokens`` keeps the first tokens of longer ones.
"""
from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import PreTrainedModel

from stages.core.models.composer_config import CONFIG_FILE
from stages.core.models.compressor import LatentCompressor, default_heads
from stages.core.run.modes import share

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# the encoder LoRA psi of A.1 of the LOPD paper: all seven linear projections of every block
ENCODER_TARGET_MODULES = (*DEFAULT_TARGET_MODULES, "gate_proj", "up_proj", "down_proj")
COMPOSER_ADAPTER = "composer"
COMPRESSOR_FILE = "compressor.safetensors"


# ---------------------------------------------------------------------------------------------
# Adapters on the shared backbone
# ---------------------------------------------------------------------------------------------


def base_model(backbone: nn.Module) -> PreTrainedModel:
    """The underlying Hugging Face causal LM of ``backbone`` (a PeftModel or a plain model)."""
    return backbone.get_base_model() if isinstance(backbone, PeftModel) else backbone


def add_lora_adapter(
    model: nn.Module,
    name: str,
    rank: int = 8,
    alpha: int = 16,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
) -> PeftModel:
    """Add a trainable LoRA adapter ``name`` to ``model`` and return the peft model holding it.

    A plain Hugging Face model is wrapped with ``get_peft_model`` (which freezes all its base
    weights, in place); a PeftModel gets the adapter added next to the existing ones. The new
    adapter's parameters have ``requires_grad=True``. The wrapped plain model has ``name``
    active; a PeftModel keeps its active adapter. LoRA B starts at zero, so the new adapter is
    the identity until trained (test gradients after perturbing B).

    Raises:
        ValueError: ``model`` already has an adapter called ``name``.
    """
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(target_modules)
    )
    if isinstance(model, PeftModel):
        if name in model.peft_config:
            raise ValueError(f"the backbone already has an adapter called {name!r}")
        with preserve_requires_grad(model):
            model.add_adapter(name, config)
    else:
        model = get_peft_model(model, config, adapter_name=name)
    for p in adapter_parameters(model, name):
        p.requires_grad_(True)
    return model


def adapter_parameters(backbone: nn.Module, name: str) -> list[nn.Parameter]:
    """All parameters of the LoRA adapter ``name`` (empty for a model without it)."""
    params = []
    for module in backbone.modules():
        if isinstance(module, BaseTunerLayer):
            for layer_name in module.adapter_layer_names:
                container = getattr(module, layer_name)
                if name not in container:
                    continue
                item = container[name]
                if isinstance(item, nn.Module):
                    params.extend(item.parameters())
                elif isinstance(item, nn.Parameter):
                    params.append(item)
    return params


def base_parameters(backbone: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Named parameters of ``backbone`` that belong to no adapter (the frozen theta_bar)."""
    names = backbone.peft_config.keys() if isinstance(backbone, PeftModel) else ()
    adapter_ids = {id(p) for name in names for p in adapter_parameters(backbone, name)}
    return [(n, p) for n, p in backbone.named_parameters() if id(p) not in adapter_ids]


def _adapter_state(backbone: nn.Module) -> str | None:
    """Name of the active adapter, or None when adapters are disabled / absent."""
    if not isinstance(backbone, PeftModel):
        return None
    layer = next(m for m in backbone.modules() if isinstance(m, BaseTunerLayer))
    return None if layer.disable_adapters else backbone.active_adapter


@contextlib.contextmanager
def preserve_requires_grad(model: nn.Module) -> Iterator[None]:
    """Put back the ``requires_grad`` flag of every existing parameter on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _set_adapter_state(backbone: PeftModel, name: str | None) -> None:
    """Activate adapter ``name`` (None = disable all), keeping every ``requires_grad`` flag."""
    with preserve_requires_grad(backbone):
        if name is None:
            backbone.base_model.disable_adapter_layers()
        else:
            backbone.base_model.enable_adapter_layers()
            backbone.set_adapter(name)


@contextlib.contextmanager
def adapter_scope(backbone: nn.Module, name: str | None) -> Iterator[None]:
    """Run the enclosed forward passes with adapter ``name`` active (None = no adapter).

    On exit the previous adapter state comes back. ``requires_grad`` of every parameter is
    left exactly as it was (peft's own switching flips it; see the module docstring). A plain
    (non-peft) model accepts only ``name=None`` and is left untouched.

    Raises:
        ValueError: ``name`` is not an adapter of ``backbone``.
    """
    if not isinstance(backbone, PeftModel):
        if name is not None:
            raise ValueError(f"adapter {name!r} requested on a model without adapters")
        yield
        return
    if name is not None and name not in backbone.peft_config:
        raise ValueError(f"the backbone has no adapter {name!r}: {sorted(backbone.peft_config)}")
    active, state = backbone.active_adapter, _adapter_state(backbone)
    if state != name:
        _set_adapter_state(backbone, name)
    try:
        yield
    finally:
        if backbone.active_adapter != active:
            _set_adapter_state(backbone, active)
        if _adapter_state(backbone) != state:
            _set_adapter_state(backbone, state)


def _recompute_under_current_adapter(backbone: nn.Module):
    """Checkpoint ``context_fn``: the recompute runs with the adapter active at forward time."""
    return contextlib.nullcontext(), adapter_scope(backbone, _adapter_state(backbone))


def enable_activation_checkpointing(backbone: nn.Module) -> None:
    """Turn on activation checkpointing of the decoder layers, safe under adapter switching.

    Non-reentrant ``torch.utils.checkpoint`` whose recompute restores the adapter state
    (student / composer / none) captured at forward time, so each role's layers are
    recomputed with the weights they actually used. The hook transformers adds with it, which
    makes the frozen embeddings' output require a gradient (needed by reentrant checkpointing
    only), is removed: otherwise the backward computes the input gradients of layer 0's frozen
    projections and of the embeddings' output, which nothing uses.
    """
    model = base_model(backbone)
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs={
            "use_reentrant": False,
            "context_fn": functools.partial(_recompute_under_current_adapter, backbone),
        }
    )
    model.disable_input_require_grads()


# ---------------------------------------------------------------------------------------------
# Composer (Eq. 5-6) and its checkpoints
# ---------------------------------------------------------------------------------------------


class Composer(nn.Module):
    """phi = (psi, chi): encoder LoRA on the shared frozen backbone + QFormer compressor.

    The backbone is NOT a registered sub-module (it is shared with the student and the
    teacher): ``composer.parameters()`` / ``state_dict()`` cover the compressor only, and
    :meth:`trainable_parameters` gives all of phi for an optimizer. Use ``composer.backbone``
    (the peft model carrying the composer adapter) for the student and teacher forwards.

    Args:
        backbone: Hugging Face causal LM or PeftModel. A plain model gets wrapped (its base
            weights frozen); an existing adapter called ``adapter_name`` is reused as psi.
            For full fine-tuning of the student pass the frozen teacher copy here.
        J: experiences per task (recorded in the checkpoint; ``forward`` accepts any J).
        K: latent tokens per experience (default 32).
        depth: QFormer block applications (default 8); qformer_shared: one block applied
            ``depth`` times (default, the paper's) or ``depth`` separate blocks; heads: attention
            heads (default: largest divisor of d that is <= 8); mlp_ratio: QFormer MLP width / d;
            memory_norm: ``"layer"`` (default) or ``"token"``; readout: ``"qformer"`` (default),
            ``"pointer"``, ``"span"`` or ``"centred"`` (each: :mod:`stages.core.models.readouts`); latent_scale: the qformer
            readout's latents start at this multiple of the mean input-embedding row norm (an
            init only: a checkpoint holds the trained gain); span_marker: the token ids where the
            ``"span"`` readout's span starts (the tokenized experience action label).
        lora_rank, lora_alpha, target_modules: encoder LoRA psi (defaults 8, 16 and the seven
            projections q/k/v/o/gate/up/down of A.1; dropout 0). Composers saved before this
            default load with the modules they recorded (q/k/v/o).
        max_exp_tokens: experiences longer than this keep their first tokens (None = all).
        adapter_name: name of the composer adapter on the backbone.

    Raises:
        ValueError: invalid ``heads``.
    """

    def __init__(
        self,
        backbone: nn.Module,
        *,
        J: int = 3,
        K: int = 32,
        depth: int = 8,
        qformer_shared: bool = True,
        heads: int | None = None,
        mlp_ratio: int = 4,
        memory_norm: str = "layer",
        readout: str = "qformer",
        latent_scale: float = 1.0,
        span_marker: Sequence[int] = (),
        lora_rank: int = 8,
        lora_alpha: int = 16,
        target_modules: Sequence[str] = ENCODER_TARGET_MODULES,
        max_exp_tokens: int | None = 512,
        adapter_name: str = COMPOSER_ADAPTER,
    ) -> None:
        super().__init__()
        if not (isinstance(backbone, PeftModel) and adapter_name in backbone.peft_config):
            backbone = add_lora_adapter(backbone, adapter_name, lora_rank, lora_alpha, target_modules)
        object.__setattr__(self, "backbone", backbone)  # shared, deliberately not a sub-module
        base = base_model(backbone)
        d = base.config.hidden_size
        heads = heads or default_heads(d)
        self.hparams = {
            "J": J, "K": K, "depth": depth, "qformer_shared": qformer_shared, "heads": heads, "mlp_ratio": mlp_ratio,
            "memory_norm": memory_norm, "readout": readout, "latent_scale": latent_scale,
            "span_marker": list(span_marker),
            "lora_rank": lora_rank, "lora_alpha": lora_alpha,
            "target_modules": list(target_modules), "max_exp_tokens": max_exp_tokens,
            "adapter_name": adapter_name, "hidden_size": d,
        }
        self.K = K
        self.adapter_name = adapter_name
        self.max_exp_tokens = max_exp_tokens
        self.span_marker = list(span_marker)
        emb = base.get_input_embeddings().weight
        target_norm = latent_scale * emb.detach().float().norm(dim=-1).mean().item()
        # float32 under a bf16/fp16 backbone: an AdamW step would round away on most bf16 entries
        self.compressor = LatentCompressor(d, K, depth, heads, mlp_ratio, target_norm, qformer_shared,
                                           memory_norm, readout).to(
            device=emb.device, dtype=torch.promote_types(emb.dtype, torch.float32)
        )

    def trainable_parameters(self) -> list[nn.Parameter]:
        """All of phi: the composer LoRA parameters psi, then the compressor parameters chi."""
        return adapter_parameters(self.backbone, self.adapter_name) + list(self.compressor.parameters())

    def encode(self, exp_ids_NL: Tensor, exp_mask_NL: Tensor) -> Tensor:
        """E_j for N experience sequences (Eq. 5-6): latents_NKd (N, K, d), backbone dtype.

        The compressor keeps float32 parameters under a bf16/fp16 backbone (the LoRA psi too,
        as peft does): the backbone's hidden states enter it cast to its dtype, its latents
        leave in the backbone's dtype.

        Args:
            exp_ids_NL: LongTensor (N, L), right-padded token ids of "task x + experience m_j".
            exp_mask_NL: BoolTensor (N, L) (or 0/1), True on real tokens.

        Raises:
            ValueError: shape mismatch, or an experience without any real token.
        """
        if exp_ids_NL.dim() != 2 or exp_ids_NL.shape != exp_mask_NL.shape:
            raise ValueError(
                f"expected ids and mask of the same (N, L) shape, got {tuple(exp_ids_NL.shape)} "
                f"and {tuple(exp_mask_NL.shape)}"
            )
        if self.max_exp_tokens is not None:
            exp_ids_NL = exp_ids_NL[:, : self.max_exp_tokens]
            exp_mask_NL = exp_mask_NL[:, : self.max_exp_tokens]
        mask_NL = exp_mask_NL.bool()
        if not mask_NL.any(dim=1).all():
            raise ValueError("every experience needs at least one real token (mask all False)")
        decoder = base_model(self.backbone).get_decoder()
        with adapter_scope(self.backbone, self.adapter_name):
            hidden_NLd = decoder(
                input_ids=exp_ids_NL, attention_mask=mask_NL.long(), use_cache=False
            ).last_hidden_state  # (N, L, d)
        embed = base_model(self.backbone).get_input_embeddings()
        dtype = self.compressor.queries.dtype
        emb_NLd = self.compressor.read.embeddings(embed, exp_ids_NL, mask_NL, self.span_marker, self.K)
        if emb_NLd is not None:
            emb_NLd = emb_NLd.to(dtype)
        return self.compressor(hidden_NLd.to(dtype), mask_NL, emb_NLd).to(hidden_NLd.dtype)

    def forward(self, exp_ids_BJL: Tensor, exp_mask_BJL: Tensor) -> Tensor:
        """c_phi of Eq. 7: latents of J experiences per row, concatenated over j.

        Args:
            exp_ids_BJL: LongTensor (B, J, L), right-padded; exp_mask_BJL: (B, J, L) bool.

        Returns:
            c_phi_BJKd: (B, J*K, d), experience j at rows [j*K, (j+1)*K).

        Identical composer inputs (the G rollouts of one task retrieve the same experiences) are
        encoded once and indexed back, so the result and its gradients equal encoding each copy.
        """
        if exp_ids_BJL.dim() != 3:
            raise ValueError(f"expected (B, J, L) experience ids, got {tuple(exp_ids_BJL.shape)}")
        B, J, L = exp_ids_BJL.shape
        ids_NL, mask_NL = exp_ids_BJL.reshape(B * J, L), exp_mask_BJL.reshape(B * J, L)
        first_U, inverse_N = unique_rows(ids_NL, mask_NL)
        latents_UKd = self.encode(ids_NL[first_U], mask_NL[first_U])
        return latents_UKd[inverse_N].reshape(B, J * self.K, -1)


def unique_rows(ids_NL: Tensor, mask_NL: Tensor) -> tuple[Tensor, Tensor]:
    """Distinct rows of right-padded token ids (padding ignored): ``(first_U, inverse_N)``.

    ``first_U`` (U,) long: the index of each distinct row's first occurrence, in order;
    ``inverse_N`` (N,) long: which distinct row each row is, so ``rows[first_U][inverse_N]``
    equals ``rows`` on every real token.
    """
    key_NL = torch.where(mask_NL.bool(), ids_NL, -1)
    _, inverse_N = torch.unique(key_NL, dim=0, return_inverse=True)  # sorted distinct ids
    U, N = int(inverse_N.max()) + 1, inverse_N.numel()
    first_U = torch.full((U,), N, dtype=torch.long, device=ids_NL.device)
    first_U.scatter_reduce_(0, inverse_N, torch.arange(N, device=ids_NL.device), reduce="amin")
    order = torch.argsort(first_U)  # distinct rows in order of first occurrence
    rank_U = torch.empty_like(order)
    rank_U[order] = torch.arange(U, device=ids_NL.device)
    return first_U[order], rank_U[inverse_N]


def save_composer(composer: Composer, out_dir: str | Path, config: dict) -> Path:
    """Write a composer checkpoint to ``out_dir`` and return the folder.

    Files: ``<adapter_name>/`` (psi in peft format: peft saves a named adapter into its own
    sub-folder), ``compressor.safetensors`` (chi), ``composer_config.json`` (``config`` merged
    with the composer's hyper-parameters and hidden size). Load it with
    :func:`stages.core.models.assembly.load_composer`.

    Args:
        config: must hold ``backbone_id``; ``placement`` defaults to "prefix" (its readers
            look it up in :data:`stages.core.latent.placements.PLACEMENTS`, which names the known
            ones when it is not there); any further JSON-serialisable keys are recorded as given.

    Raises:
        ValueError: no ``backbone_id``.
    """
    if "backbone_id" not in config:
        raise ValueError("config must record the backbone id under 'backbone_id'")
    record = {"placement": "prefix", **config, **composer.hparams}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    composer.backbone.save_pretrained(str(out), selected_adapters=[composer.adapter_name])
    state = {k: v.detach().contiguous() for k, v in composer.compressor.state_dict().items()}
    save_file(state, str(out / COMPRESSOR_FILE))
    (out / CONFIG_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
    share(out / COMPRESSOR_FILE)  # safetensors writes owner-only files
    share(out / composer.adapter_name)
    return out
