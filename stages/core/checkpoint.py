"""Checkpoints, resume and crash consistency of the LOPD training loop (`lopd distill`).

What a run saves and how it comes back: :func:`load_models` builds the student, composer phi
and frozen phi_0 fresh or from a checkpoint; :func:`save_models` / :func:`write_checkpoint`
save them atomically with the optimizer, RNG and loop state; :func:`save_final` writes the
merged student.

Layout of a run folder ``out``::

    out/config.json               resolved DistillConfig (with its run_id)
    out/metrics.jsonl             one row per finished step
    out/checkpoints/step-N/       student/  composer/  optimizer.pt  rng.pt  state.json
    out/final/student/            merged plain Hugging Face model + tokenizer
    out/final/composer/           the trained composer phi (``save_composer`` format)

A checkpoint is written into a hidden temporary sibling folder and renamed into place, so a
``step-N`` folder is either complete or absent (a SIGKILL leaves at most a ``.step-N.tmp-*``
folder, removed by :func:`clean_partial`). ``state.json`` holds step, beta, data position and
run id; ``rng.pt`` the python / numpy / torch RNG states; ``optimizer.pt`` the AdamW state.

Store consistency (the choice made for self-evolving memory): step N's trajectories are
appended in ONE store transaction at the end of step N, tagged with the run id, with
``info["distill_step"] = N`` and deterministic ids ``<run_id>-<N>-<i>``; the checkpoint of
step N (if any) is written after that append. On resume from checkpoint C,
:func:`drop_rows_after` deletes this run's rows (and their embeddings) of steps > C, so the
store holds exactly the rows it held when checkpoint C was written and the replayed steps
never duplicate rows. Rows of other runs are never touched.
"""
from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from stages.core.composer import (
    COMPRESSOR_FILE, Composer, adapter_parameters, add_lora_adapter, load_composer, read_composer_config,
    save_composer,
)
from stages.core.policy import load_policy, resolve_model
from stages.core.retrieval import open_embeddings
from stages.core.store import ExperienceStore, sql_in
from stages.core.teacher import STUDENT_ADAPTER

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.json"
RNG_FILE = "rng.pt"
OPTIMIZER_FILE = "optimizer.pt"
STEP_KEY = "distill_step"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dirs(out: Path) -> list[Path]:
    """Complete checkpoint folders ``out/checkpoints/step-N``, oldest (lowest N) first."""
    root = Path(out) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint folder of ``out``, or None when there is none."""
    dirs = checkpoint_dirs(out)
    return dirs[-1] if dirs else None


def clean_partial(out: Path) -> None:
    """Remove temporary folders left by a checkpoint or final write that was killed midway."""
    for pattern in (f"{CHECKPOINTS}/.step-*.tmp-*", f"{CHECKPOINTS}/.old-*", ".final.tmp-*"):
        for p in Path(out).glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


def write_checkpoint(out: Path, step: int, fill: Callable[[Path], None], state: dict, keep: int) -> Path:
    """Atomically write ``out/checkpoints/step-<step>`` and keep only the newest ``keep`` ones.

    Args:
        fill: writes the model files (student, composer, optimizer) into the folder it gets.
        state: JSON-serialisable training state (step, beta, data position, run id ...),
            written as ``state.json`` together with the current RNG states (``rng.pt``).
        keep: number of checkpoints to keep, >= 1.

    Returns:
        The checkpoint folder.

    Raises:
        FileExistsError: a checkpoint of ``step`` exists already.
    """
    root = Path(out) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    if final.exists():
        raise FileExistsError(f"checkpoint {final} exists already")
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}.tmp-", dir=root))
    try:
        fill(tmp)
        torch.save(capture_rng(), tmp / RNG_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in checkpoint_dirs(out)[:-keep]:  # renamed first: a killed rmtree leaves no step-N
        trash = root / f".old-{old.name}"
        os.rename(old, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return final


def save_student(folder: Path, *, student: nn.Module, adapter: str | None, tokenizer,
                 optimizer: torch.optim.Optimizer) -> None:
    """Write the student and optimizer of a step into ``folder`` (part of write_checkpoint's ``fill``).

    ``student/``: the peft adapter ``adapter`` of ``student`` (adapter_config.json +
    adapter_model.safetensors), or with ``adapter=None`` the whole fully fine-tuned model and
    its tokenizer; ``optimizer.pt``: the optimizer state dict.
    """
    if adapter:  # peft writes a named adapter into <folder>/<adapter>/ (FIELD-NOTES pitfall 4)
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

    A LoRA student is merged from ``checkpoint/student`` onto a freshly loaded ``model``
    (W + s * B A), so the folder loads with ``AutoModelForCausalLM.from_pretrained`` and the
    training backbone stays untouched. A fully fine-tuned ``student`` is saved as it is.
    ``export(folder)`` writes the method's own final artifacts (LOPD: ``composer/``).
    Written to a temporary folder and renamed, so ``final`` is complete or absent; ``final``
    names its checkpoint in ``checkpoint.txt``, and one already made from ``checkpoint`` is kept
    as it is (a finished run resumed again writes nothing).
    """
    from peft import PeftModel

    final = Path(out) / "final"
    marker = final / "checkpoint.txt"
    if marker.is_file() and marker.read_text() == checkpoint.name:
        return final
    tmp = Path(tempfile.mkdtemp(prefix=".final.tmp-", dir=out))
    try:
        if adapter:
            fresh = load_policy(model)[0]
            student = PeftModel.from_pretrained(fresh, str(checkpoint / "student")).merge_and_unload()
        student.save_pretrained(tmp / "student")
        tokenizer.save_pretrained(tmp / "student")
        if export is not None:
            export(tmp)
        (tmp / "checkpoint.txt").write_text(checkpoint.name)
        shutil.rmtree(final, ignore_errors=True)  # a re-run replaces an older final folder
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_frozen_composer(backbone: nn.Module, composer_dir: Path, adapter_name: str) -> Composer:
    """A composer checkpoint as a FROZEN extra adapter ``adapter_name`` on ``backbone``.

    Used for phi_0, the cold-start composer whose latents c_phi0 are the anchor target of
    Eq. 13 of the LOPD paper: its LoRA and compressor parameters have requires_grad=False.
    """
    cfg = read_composer_config(composer_dir)
    backbone.load_adapter(str(Path(composer_dir) / cfg["adapter_name"]), adapter_name=adapter_name,
                          is_trainable=False)
    hparams = {k: cfg[k] for k in ("J", "K", "depth", "heads", "mlp_ratio", "lora_rank",
                                   "lora_alpha", "target_modules", "max_exp_tokens")}
    frozen = Composer(backbone, adapter_name=adapter_name, **hparams)
    frozen.compressor.load_state_dict(load_file(str(Path(composer_dir) / COMPRESSOR_FILE)))
    frozen.requires_grad_(False)
    return frozen


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


def load_models(model: str, composer_dir: Path, resume_from: Path | None, *, lora_rank: int,
                freeze_composer: bool, anchor_adapter: str = "composer0",
                student_adapter: str = STUDENT_ADAPTER) -> Models:
    """Student, composer phi and frozen phi_0 of a LOPD run, fresh or from a checkpoint.

    LoRA student (``lora_rank > 0``): ONE peft backbone carries the composer adapter (phi's
    psi), ``anchor_adapter`` (phi_0, frozen) and ``student_adapter`` (new, alpha = 2 * rank,
    or restored from ``resume_from/student``); the teacher is that backbone with adapters
    disabled. Full fine-tuning (``lora_rank == 0``): the student is a separate plain model
    (a copy of ``model``, or ``resume_from/student``) and the composers sit on a frozen copy.
    phi comes from ``resume_from/composer`` when resuming, else from ``composer_dir``; phi_0
    always from ``composer_dir`` (None with ``freeze_composer``: phi stays phi_0).

    Only ``student_params`` and ``composer_params`` (empty with ``freeze_composer``) require
    grad afterwards; every base weight is frozen.

    The composer's recorded ``backbone_id`` may be ``model`` itself or its resolved local
    path; it is checked before any model is loaded.

    Raises:
        ValueError: the composer checkpoint was trained on another backbone.
    """
    recorded = read_composer_config(composer_dir)["backbone_id"]  # a name, or an older run's resolved path
    if recorded not in (model, resolve_model(model)):  # before loading (or downloading) the model
        raise ValueError(f"composer in {composer_dir} was trained on backbone {recorded}, got {model}")
    if lora_rank == 0 and resume_from:
        student, tokenizer = load_policy(str(resume_from / "student"))
        backbone = load_policy(model)[0]
    else:
        backbone, tokenizer = load_policy(model)
        student = copy.deepcopy(backbone) if lora_rank == 0 else None
    composer = load_composer(backbone, resume_from / "composer" if resume_from else composer_dir,
                             backbone_id=recorded)
    backbone = composer.backbone
    anchor = None if freeze_composer else load_frozen_composer(backbone, composer_dir, anchor_adapter)
    if lora_rank > 0:
        student = backbone
        if resume_from:
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


def read_state(ckpt: Path) -> dict:
    """The ``state.json`` of a checkpoint folder.

    Raises:
        ValueError: missing or unreadable state file (named in the message).
    """
    path = Path(ckpt) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable checkpoint state ({err})") from None


def capture_rng() -> dict:
    """The python, numpy and torch (CPU) global RNG states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng(ckpt: Path) -> None:
    """Restore the RNG states saved in ``ckpt/rng.pt`` by :func:`write_checkpoint`."""
    states = torch.load(Path(ckpt) / RNG_FILE, weights_only=False)  # our own file: numpy state
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of steps > ``step`` from a metrics.jsonl file (rewritten atomically).

    A line cut short by a kill (not valid JSON) is dropped too. Returns the number of rows
    kept (0 when the file does not exist).
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)
    return len(kept)


def step_row_id(run_id: str, step: int, index: int) -> str:
    """Deterministic trajectory id of the ``index``-th row appended at ``step`` of a run."""
    return f"{run_id}-{step:06d}-{index:04d}"


def drop_rows_after(store: ExperienceStore, run_id: str, step: int) -> int:
    """Delete run ``run_id``'s trajectories (and embeddings) of distill steps > ``step``.

    Rows are recognised by ``info["distill_step"]``; other runs' rows are never touched.
    Returns the number of trajectories deleted.
    """
    stale = [t.trajectory_id for t in store.query(run_id=run_id)
             if json.loads(t.info).get(STEP_KEY, 0) > step]
    if stale:
        where = sql_in("trajectory_id", stale)
        embeddings = open_embeddings(store)
        if embeddings is not None:  # embeddings first: a crash here leaves rows to re-embed
            embeddings.delete(where)
        store.table.delete(where)
    return len(stale)
