"""Atomic checkpoint folders of the training stages, RNG capture/restore and loop state.

Layout of a checkpoint::

    out/checkpoints/step-N/   what the stage's ``fill`` writes (models, optimizer.pt ...)
                              rng.pt      python / numpy / torch RNG states (a run of N > 1
                                          processes: rng-rank0.pt ... one per rank)
                              state.json  the stage's loop state (step, beta, data position ...)

A checkpoint is written into a hidden temporary sibling folder and renamed into place, so a
``step-N`` folder is either complete or absent (a SIGKILL leaves at most a ``.step-N.tmp-*``
folder, removed by :func:`clean_partial`, which also removes a half-written ``.final.tmp-*``
folder and a half-deleted old checkpoint). Only the newest ``keep`` checkpoints stay; an old
one is renamed away before it is deleted, so a killed deletion never leaves a partial
``step-N``. A saved file that cannot be read back (truncated weights, a JSON file that is no
object) is one ``ValueError`` line naming it: :func:`readable`, :func:`read_json_object`.

The other parts of a run live elsewhere: the run folder's config, manifest and metrics in
:mod:`stages.core.run.runs`, the models a checkpoint holds in :mod:`stages.core.models.assembly`, the
store rows a run appends (and their consistency with the checkpoints) in
:mod:`stages.core.data.experience_rows`.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from stages.core.run.modes import share

# numpy and torch are imported where the RNG files are written and read: the run-folder rules
# (stages.core.run.runs, stages.settings) import this module, and a refused command line loads no torch
CHECKPOINTS = "checkpoints"
STATE_FILE = "state.json"
RNG_FILE = "rng.pt"
RANK_RNG_FILE = "rng-rank{rank}.pt"  # a data-parallel run's RNG state of one rank
OPTIMIZER_FILE = "optimizer.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@contextmanager
def readable(path: Path | str, what: str) -> Iterator[None]:
    """Around a library's load of the saved file or folder ``path`` (safetensors weights, a peft
    adapter, a ``torch.save`` file): a damaged one, e.g. truncated by a full disk, is one line
    naming it instead of the loader's traceback.

    Raises:
        ValueError: ``"PATH: cannot load WHAT (the loader's first line)"`` in place of
            safetensors' ``SafetensorError`` and torch's ``RuntimeError``, ``EOFError`` or
            ``pickle.UnpicklingError`` (also a state dict whose shapes do not fit the model).
            Inside ``checkpoints/step-N`` the line adds how to resume without that checkpoint.
    """
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        step = next((d for d in (Path(path), *Path(path).parents)
                     if _STEP_DIR.match(d.name) and d.parent.name == CHECKPOINTS), None)
        hint = f"; move {step} out of {step.parent} to resume from the checkpoint before it" if step else ""
        raise ValueError(f"{path}: cannot load {what} ({first}){hint}") from err


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


def write_checkpoint(out: Path, step: int, fill: Callable[[Path], None], state: dict, keep: int,
                     rank_rngs: list[dict] | None = None) -> Path:
    """Atomically write ``out/checkpoints/step-<step>`` and keep only the newest ``keep`` ones.

    Args:
        fill: writes the model files (student, composer, optimizer) into the folder it gets.
        state: JSON-serialisable training state (step, beta, data position, run id ...),
            written as ``state.json`` together with the current RNG states (``rng.pt``).
        keep: number of checkpoints to keep, >= 1.
        rank_rngs: a data-parallel run's :func:`capture_rng` of every rank, in rank order:
            written as ``rng-rank<r>.pt`` instead of ``rng.pt``.

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
    import torch

    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}.tmp-", dir=root))
    try:
        fill(tmp)
        if rank_rngs is None:
            torch.save(capture_rng(), tmp / RNG_FILE)
        for rank, states in enumerate(rank_rngs or []):
            torch.save(states, tmp / RANK_RNG_FILE.format(rank=rank))
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
        share(tmp)  # mkdtemp's folder and safetensors' files are owner-only
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in checkpoint_dirs(out)[:-keep]:  # renamed first: a killed rmtree leaves no step-N
        trash = root / f".old-{old.name}"
        os.rename(old, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return final


def read_state(ckpt: Path) -> dict:
    """The ``state.json`` of a checkpoint folder.

    Raises:
        ValueError: missing or unreadable state file (named in the message).
    """
    return read_json_object(Path(ckpt) / STATE_FILE, "checkpoint state")


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in the saved file ``path`` (a run's config, a checkpoint's state).

    Raises:
        ValueError: ``"PATH: unreadable WHAT (why)"``: the file is missing or unreadable, is no
            UTF-8 JSON, or holds another JSON value than an object.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: unreadable {what} ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: unreadable {what} (a JSON object expected, not {type(data).__name__})")
    return data


def capture_rng() -> dict:
    """The python, numpy and torch (CPU) global RNG states."""
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng(ckpt: Path, rank: int | None = None) -> None:
    """Restore the RNG states saved in ``ckpt/rng.pt`` by :func:`write_checkpoint` (with
    ``rank``: that rank's ``rng-rank<r>.pt`` of a data-parallel run)."""
    import numpy as np
    import torch

    name = RNG_FILE if rank is None else RANK_RNG_FILE.format(rank=rank)
    with readable(Path(ckpt) / name, "RNG states"):
        states = torch.load(Path(ckpt) / name, weights_only=False)  # our own file: numpy state
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
