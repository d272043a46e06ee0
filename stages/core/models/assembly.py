"""Model assembly of the training stages: student, composer phi, frozen anchor phi_0, teachers.

- :func:`load_composer` is THE composer loader (trainable phi, frozen phi_0, a resumed
  coldstart's phi): a :func:`~stages.core.models.composer.save_composer` folder as a named LoRA
  adapter on a backbone plus its QFormer compressor.
- :func:`load_models` builds the modules of a LOPD run (fresh or from a checkpoint),
  :func:`save_models` writes a step's trainable state into a checkpoint folder and
  :func:`save_final` the merged student of a finished run.
- Teacher copies of baseline methods: :func:`frozen_teacher_copy` (a separate frozen module),
  :func:`ema_update_` (EMA of a separate teacher), and on one peft backbone with a teacher and a
  student adapter :func:`ema_update_adapter_` / :func:`copy_adapter_`.
"""
from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file
from torch import nn

from stages.core.models.composer import (
    COMPRESSOR_FILE, Composer, adapter_parameters, add_lora_adapter, base_model, preserve_requires_grad,
)
from stages.core.models.composer_config import read_composer_config
from stages.core.models.backbone import (
    load_policy, master_dtype, merge_lora_float32, resolve_device_dtype, resolve_model,
)
from stages.core.models.student import STUDENT_ADAPTER
from stages.core.run.checkpoint import OPTIMIZER_FILE, readable
from stages.core.run.modes import share
from stages.core.run.sharding import DCP_FOLDER

_HPARAMS = ("J", "K", "depth", "heads", "mlp_ratio", "lora_rank", "lora_alpha", "target_modules",
            "max_exp_tokens")


# ---------------------------------------------------------------------------------------------
# The composer loader
# ---------------------------------------------------------------------------------------------


def load_composer(backbone: nn.Module, ckpt_dir: str | Path, *, trainable: bool, backbone_id: str,
                  adapter_name: str | None = None) -> Composer:
    """A composer saved by :func:`~stages.core.models.composer.save_composer`, on ``backbone``.

    Its LoRA psi is loaded as adapter ``adapter_name`` (default: the name it was saved under)
    and its compressor chi from ``compressor.safetensors``. A plain Hugging Face model is
    wrapped into a PeftModel (base weights frozen): use the returned ``composer.backbone``
    afterwards. The ``requires_grad`` flags of every other parameter and the backbone's
    train/eval mode stay as they were (peft would switch the mode with ``trainable``).

    Args:
        trainable: phi requires grad (True: the composer being trained; False: a frozen copy
            such as phi_0, the anchor target of Eq. 13 of the LOPD paper).
        backbone_id: the backbone the caller runs; must equal the recorded ``backbone_id``.
        adapter_name: adapter name on ``backbone`` (to hold two composers on one backbone).

    Returns:
        The composer (the compressor is built, then overwritten with the saved weights).

    Raises:
        ValueError: the checkpoint was trained on another backbone id or hidden size,
            ``backbone`` already has an adapter of that name, or a file of the checkpoint is
            missing or damaged (one line naming it).
    """
    ckpt = Path(ckpt_dir)
    cfg = read_composer_config(ckpt)
    if cfg["backbone_id"] != backbone_id:
        raise ValueError(f"composer in {ckpt} was trained on backbone {cfg['backbone_id']}, got {backbone_id}")
    d = base_model(backbone).config.hidden_size
    if cfg["hidden_size"] != d:
        raise ValueError(f"composer in {ckpt} was trained on backbone {cfg['backbone_id']} (hidden size "
                         f"{cfg['hidden_size']}), got {backbone_id} with hidden size {d}")
    saved_name, name = cfg["adapter_name"], adapter_name or cfg["adapter_name"]
    training = backbone.training
    if isinstance(backbone, PeftModel) and name in backbone.peft_config:
        raise ValueError(f"the backbone already has an adapter called {name!r}")
    with readable(ckpt / saved_name, "the composer's encoder adapter"):
        if isinstance(backbone, PeftModel):
            with preserve_requires_grad(backbone):
                backbone.load_adapter(str(ckpt / saved_name), adapter_name=name, is_trainable=trainable)
        else:
            backbone = PeftModel.from_pretrained(backbone, str(ckpt / saved_name), adapter_name=name,
                                                 is_trainable=trainable)
    # checkpoints written before qformer_shared existed stack separate blocks
    # ... and before memory_norm / readout existed read the hidden states as they are, with a LayerNorm readout
    composer = Composer(backbone, adapter_name=name, qformer_shared=cfg.get("qformer_shared", False),
                        memory_norm=cfg.get("memory_norm", "layer"), readout=cfg.get("readout", "qformer"),
                        latent_scale=cfg.get("latent_scale", 1.0), span_marker=cfg.get("span_marker", ()),
                        **{k: cfg[k] for k in _HPARAMS})
    with readable(ckpt / COMPRESSOR_FILE, "the composer's compressor"):
        composer.compressor.load_state_dict(load_file(str(ckpt / COMPRESSOR_FILE)))
    for p in composer.trainable_parameters():
        p.requires_grad_(trainable)
    composer.backbone.train(training)
    return composer


# ---------------------------------------------------------------------------------------------
# The modules of a LOPD run
# ---------------------------------------------------------------------------------------------


@dataclass
class Models:
    """The modules of a LOPD run (see :func:`load_models`)."""

    tokenizer: object
    student: nn.Module
    student_adapter: str | None
    composer: Composer
    anchor: Composer | None
    student_params: list[nn.Parameter]
    composer_params: list[nn.Parameter]


def _whole_student(resume_from: Path | None) -> bool:
    """Whether checkpoint ``resume_from`` holds a fully fine-tuned student as a model folder
    (``student/``); a sharded run's checkpoint holds it in ``sharded/`` instead, restored after
    sharding (:mod:`stages.core.run.sharding`), so the student starts from ``--model``."""
    return resume_from is not None and not (Path(resume_from) / DCP_FOLDER).is_dir()


def load_student(model: str, lora_rank: int, resume_from: Path | None,
                 adapter: str = STUDENT_ADAPTER, *, device: str | None = None,
                 dtype: str | None = None) -> tuple[nn.Module, str | None, object, list[nn.Parameter]]:
    """A student on backbone ``model`` alone (methods without a composer).

    LoRA adapter ``adapter`` (rank ``lora_rank``, alpha 2 x rank; restored from
    ``resume_from/student`` when resuming), or with ``lora_rank=0`` the whole model (from
    ``resume_from/student`` when resuming). Only the student's parameters require grad. The
    backbone is loaded on ``device`` in ``dtype`` (None: :func:`load_policy`'s automatic
    choice); peft keeps a LoRA adapter of a bf16/fp16 backbone in float32, and a whole student
    is loaded in :func:`~stages.core.models.backbone.master_dtype` (float32 under bf16/fp16:
    its forwards compute in ``dtype`` under
    :func:`~stages.core.models.backbone.compute_autocast`).

    Returns:
        ``(module, adapter or None, tokenizer, trainable parameters)``.
    """
    if lora_rank == 0:
        source = str(resume_from / "student") if _whole_student(resume_from) else model
        device, dtype = resolve_device_dtype(device, dtype)
        net, tokenizer = load_policy(source, dtype=master_dtype(dtype), device=device)
        net.requires_grad_(True)
        return net, None, tokenizer, list(net.parameters())
    backbone, tokenizer = load_policy(model, dtype=dtype, device=device)
    backbone.requires_grad_(False)
    if resume_from:
        with readable(resume_from / "student", "the student's adapter"):
            backbone = PeftModel.from_pretrained(backbone, str(resume_from / "student"), adapter_name=adapter,
                                                 is_trainable=True)
    else:
        backbone = add_lora_adapter(backbone, adapter, lora_rank, 2 * lora_rank)
    params = adapter_parameters(backbone, adapter)
    for p in params:
        p.requires_grad_(True)
    return backbone, adapter, tokenizer, params


def load_models(model: str, composer_dir: Path, resume_from: Path | None, *, lora_rank: int,
                freeze_composer: bool, anchor_adapter: str = "composer0",
                student_adapter: str = STUDENT_ADAPTER, device: str | None = None,
                dtype: str | None = None) -> Models:
    """Student, composer phi and frozen phi_0 of a LOPD run, fresh or from a checkpoint.

    LoRA student (``lora_rank > 0``): ONE peft backbone carries the composer adapter (phi's
    psi), ``anchor_adapter`` (phi_0, frozen) and ``student_adapter`` (new, alpha = 2 * rank,
    or restored from ``resume_from/student``); the teacher is that backbone with adapters
    disabled. Full fine-tuning (``lora_rank == 0``): the student is a separate plain model
    (a copy of ``model``, or ``resume_from/student``) and the composers sit on a frozen copy.
    phi comes from ``resume_from/composer`` when resuming, else from ``composer_dir``; phi_0
    always from ``composer_dir`` (None with ``freeze_composer``: phi stays phi_0).

    Only ``student_params`` and ``composer_params`` (empty with ``freeze_composer``) require
    grad afterwards; every base weight is frozen. Every module lives on ``device`` in ``dtype``
    (None: :func:`load_policy`'s automatic choice), except the trainable ones: a whole student
    and the compressors are kept in :func:`~stages.core.models.backbone.master_dtype` (float32
    under bf16/fp16), and peft keeps LoRA adapters of a bf16/fp16 backbone in float32.

    The composer's recorded ``backbone_id`` may be ``model`` itself or its resolved local
    path; it is checked before any model is loaded.

    Raises:
        ValueError: the composer checkpoint was trained on another backbone.
    """
    recorded = read_composer_config(composer_dir)["backbone_id"]  # a name, or an older run's resolved path
    if recorded not in (model, resolve_model(model)):  # before loading (or downloading) the model
        raise ValueError(f"composer in {composer_dir} was trained on backbone {recorded}, got {model}")
    device, dtype = resolve_device_dtype(device, dtype)
    if lora_rank == 0 and _whole_student(resume_from):
        student, tokenizer = load_policy(str(resume_from / "student"), dtype=master_dtype(dtype), device=device)
        backbone = load_policy(model, dtype=dtype, device=device)[0]
    elif lora_rank == 0:  # the student from the checkpoint's own values, not the bf16 rounding
        student, tokenizer = load_policy(model, dtype=master_dtype(dtype), device=device)
        backbone = load_policy(model, dtype=dtype, device=device)[0]
    else:
        backbone, tokenizer = load_policy(model, dtype=dtype, device=device)
        student = None
    composer = load_composer(backbone, resume_from / "composer" if resume_from else composer_dir,
                             trainable=True, backbone_id=recorded)
    backbone = composer.backbone
    anchor = None if freeze_composer else load_composer(
        backbone, composer_dir, trainable=False, backbone_id=recorded, adapter_name=anchor_adapter)
    if lora_rank > 0:
        student = backbone
        if resume_from:
            with readable(resume_from / "student", "the student's adapter"):
                backbone.load_adapter(str(resume_from / "student"), adapter_name=student_adapter,
                                      is_trainable=True)
        else:
            add_lora_adapter(backbone, student_adapter, lora_rank, 2 * lora_rank)
        student_params = adapter_parameters(backbone, student_adapter)
    else:
        student_params = list(student.parameters())
    composer_params = [] if freeze_composer else composer.trainable_parameters()
    for module in (backbone, student, composer, anchor):
        if module is not None:
            module.requires_grad_(False)
    for p in student_params + composer_params:
        p.requires_grad_(True)
    return Models(tokenizer, student, student_adapter if lora_rank > 0 else None, composer, anchor,
                  student_params, composer_params)


def save_student(folder: Path, *, student: nn.Module, adapter: str | None, tokenizer,
                 optimizer: torch.optim.Optimizer) -> None:
    """Write the student and optimizer of a step into ``folder`` (part of write_checkpoint's ``fill``).

    ``student/``: the peft adapter ``adapter`` of ``student`` (adapter_config.json +
    adapter_model.safetensors), or with ``adapter=None`` the whole fully fine-tuned model and
    its tokenizer; ``optimizer.pt``: the optimizer state dict.
    """
    if adapter:  # peft writes a named adapter into <folder>/<adapter>/ (load it from there)
        student.save_pretrained(str(folder), selected_adapters=[adapter])
        if adapter != "student":
            os.rename(folder / adapter, folder / "student")
    else:
        student.save_pretrained(folder / "student")
        tokenizer.save_pretrained(folder / "student")
    torch.save(optimizer.state_dict(), folder / OPTIMIZER_FILE)


def save_final(out: Path, checkpoint: Path, *, model: str, tokenizer, student: nn.Module,
               adapter: str | None, export: Callable[[Path], None] | None = None) -> Path:
    """Write ``out/final``: ``student/`` (plain merged HF model + tokenizer) and what ``export`` adds.

    A LoRA student is merged from ``checkpoint/student`` onto a freshly loaded ``model`` in
    float32 on the CPU (:func:`~stages.core.models.backbone.merge_lora_float32`: W + s * B A kept
    in float32 whatever the run's dtype, since a bf16 merge rounds most of a small update away),
    so the folder loads with ``AutoModelForCausalLM.from_pretrained`` and the training backbone
    stays untouched. A fully fine-tuned ``student`` is saved as it is: in float32 for a bf16/fp16
    run (its master weights, :func:`load_student`), its ``config.json`` naming the dtype.
    ``export(folder)`` writes the method's own final artifacts (LOPD: ``composer/``).
    Written to a temporary folder and renamed, so ``final`` is complete or absent; ``final``
    names its checkpoint in ``checkpoint.txt``, and one already made from ``checkpoint`` is kept
    as it is (a finished run resumed again writes nothing). ``final`` and its files get the modes a plain
    ``mkdir`` and ``open`` give (:func:`stages.core.run.modes.share`), readable by others as the umask allows.
    """
    final = Path(out) / "final"
    marker = final / "checkpoint.txt"
    if marker.is_file() and marker.read_text() == checkpoint.name:
        return final
    tmp = Path(tempfile.mkdtemp(prefix=".final.tmp-", dir=out))
    try:
        if adapter:
            student = merge_lora_float32(model, checkpoint / "student")
        student.save_pretrained(tmp / "student")
        tokenizer.save_pretrained(tmp / "student")
        if export is not None:
            export(tmp)
        (tmp / "checkpoint.txt").write_text(checkpoint.name)
        share(tmp)  # mkdtemp's folder and safetensors' files are owner-only; final is for sharing
        shutil.rmtree(final, ignore_errors=True)  # a re-run replaces an older final folder
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def frozen_teacher_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` in eval mode with every parameter frozen (requires_grad False).

    The copy shares no storage with ``model`` (it costs a second set of weights) and keeps its
    dtype: a copy of a fully fine-tuned student is float32 under a bf16 run (:func:`load_student`),
    so an EMA of it (:func:`ema_update_`) accumulates in float32. ``model`` is left as it is.
    """
    teacher = copy.deepcopy(model)
    teacher.requires_grad_(False)
    return teacher.eval()


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"EMA rate must lie in [0, 1], got {rate}")


@torch.no_grad()
def ema_update_(teacher: nn.Module, student: nn.Module, rate: float) -> None:
    """In place over matching parameters: ``teacher <- (1 - rate) * teacher + rate * student``.

    Parameters are matched by name (buffers are not touched); ``rate=0`` keeps the teacher,
    ``rate=1`` copies the student.

    Raises:
        ValueError: ``rate`` outside [0, 1]; the two modules' parameter names or shapes differ; a
            bfloat16 / float16 teacher with ``0 < rate < 1`` (its entries would mostly not move:
            keep EMA copies in :func:`~stages.core.models.backbone.master_dtype`).
    """
    _check_rate(rate)
    low = {p.dtype for p in teacher.parameters()} & {torch.bfloat16, torch.float16}
    if low and 0.0 < rate < 1.0:
        raise ValueError(f"EMA teacher in {low.pop()}: a rate-{rate} step rounds away on most entries; "
                         "keep the EMA copy in float32")
    t_params, s_params = dict(teacher.named_parameters()), dict(student.named_parameters())
    if t_params.keys() != s_params.keys():
        odd = sorted(t_params.keys() ^ s_params.keys())
        raise ValueError(f"teacher and student parameters differ: {odd[:3]}")
    for name, t in t_params.items():
        s = s_params[name]
        if t.shape != s.shape:
            raise ValueError(f"parameter {name}: teacher {tuple(t.shape)}, student {tuple(s.shape)}")
        t.mul_(1.0 - rate).add_(s.to(t.dtype), alpha=rate)


def _adapter_pairs(backbone: nn.Module, dst: str, src: str) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(dst, src) parameter pairs of two LoRA adapters of the same rank/alpha on one peft model."""
    config = getattr(backbone, "peft_config", {})
    for name in (dst, src):
        if name not in config:
            raise ValueError(f"the backbone has no adapter {name!r}: {sorted(config)}")
    a, b = config[dst], config[src]
    if (a.r, a.lora_alpha) != (b.r, b.lora_alpha):
        raise ValueError(f"adapters {dst!r} (r={a.r}, alpha={a.lora_alpha}) and {src!r} "
                         f"(r={b.r}, alpha={b.lora_alpha}) differ in rank or alpha")
    pairs = []
    for module in backbone.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for layer_name in module.adapter_layer_names:
            container = getattr(module, layer_name)
            if (dst in container) != (src in container):
                raise ValueError(f"adapters {dst!r} and {src!r} adapt different modules")
            if dst not in container:
                continue
            d, s = container[dst], container[src]
            d_params = list(d.parameters()) if isinstance(d, nn.Module) else [d]
            s_params = list(s.parameters()) if isinstance(s, nn.Module) else [s]
            for dp, sp in zip(d_params, s_params, strict=True):
                if dp.shape != sp.shape:
                    raise ValueError(f"adapters {dst!r} and {src!r}: shapes {tuple(dp.shape)} "
                                     f"and {tuple(sp.shape)} differ")
                pairs.append((dp, sp))
    return pairs


@torch.no_grad()
def ema_update_adapter_(backbone: nn.Module, teacher_adapter: str, student_adapter: str, rate: float) -> None:
    """EMA between two LoRA adapters of one peft backbone, in place on the teacher adapter.

    Every parameter of ``teacher_adapter`` becomes ``(1 - rate) * teacher + rate * student``
    (its counterpart in ``student_adapter``); base weights and other adapters are untouched.

    Raises:
        ValueError: ``rate`` outside [0, 1], a missing adapter, or adapters of different rank,
            alpha or target modules.
    """
    _check_rate(rate)
    for t, s in _adapter_pairs(backbone, teacher_adapter, student_adapter):
        t.mul_(1.0 - rate).add_(s.to(t.dtype), alpha=rate)


@torch.no_grad()
def copy_adapter_(backbone: nn.Module, src: str, dst: str) -> None:
    """Copy the weights of LoRA adapter ``src`` into adapter ``dst`` of the same peft backbone.

    A synced teacher: afterwards ``dst`` computes what ``src`` computes.

    Raises:
        ValueError: a missing adapter, or adapters of different rank, alpha or target modules.
    """
    for d, s in _adapter_pairs(backbone, dst, src):
        d.copy_(s)
