"""Run-folder rules shared by the training stages (`lopd coldstart`, `lopd distill`).

A run folder ``out`` holds one run of one stage::

    out/config.json      the resolved config, frozen when the run starts (rewritten on resume)
    out/manifest.json    stage, run id, config, lopd version, git commit
    out/metrics.jsonl    one JSON row per finished step ({"step": N, ...})
    out/.lock            the pid and command of the process running it (:mod:`stages.core.run.lock`)

(checkpoint folders: :mod:`stages.core.run.checkpoint`; what each stage adds: its own module.)

Rules (:func:`open_run`): an ``out`` in use by another process is refused, naming it
(:mod:`stages.core.run.lock`: checked when ``out`` exists, taken at the latest by
:func:`freeze_config`); an ``out`` that holds a run is refused unless the run resumes; a
resumed run's config is compared with the frozen one, and only fields the stage names may
differ (:data:`RESUMABLE`: settings that do not change the meaning of finished steps). Path
fields are compared after resolving, so ``runs/store`` and ``/abs/runs/store`` are the same
store. The allowed changes are reported in one line (:func:`describe_changes`). On resume the
metrics rows of steps after the checkpoint are dropped (:func:`truncate_metrics`).

Data order: a seeded stream of per-epoch permutations indexed by position
(:func:`seeded_stream`), a pure function of (seed, position), so a resumed run sees the same
data as a straight one. Coldstart keeps its own integer-keyed stream
(:func:`coldstart_stream`): switching it would change the batches of seeded coldstart runs.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from stages.core.run.checkpoint import clean_partial, latest_checkpoint, read_json_object
from stages.core.run.lock import lock_run_folder
from stages.core.run.provenance import config_run_id, write_manifest

CONFIG_FILE = "config.json"
MANIFEST_FILE = "manifest.json"
METRICS_FILE = "metrics.jsonl"
# Settings a resumed run may change in every stage: they do not change the meaning of the
# steps already done (stages add their own logging settings, e.g. eval_every, log).
RESUMABLE = frozenset({"resume", "steps", "checkpoint_every", "keep_checkpoints", "max_len", "device", "dtype"})


@dataclass(frozen=True)
class RunFolder:
    """What :func:`open_run` found in a run folder.

    Attributes:
        out: the run folder.
        resuming: a run of this stage is there and is continued.
        saved: its frozen config (``config.json``) as stored; None when fresh (or for a run
            folder written before config.json existed).
        changes: ``(field, old, new)`` of the settings the resumed run changes.
    """

    out: Path
    resuming: bool
    saved: dict | None
    changes: list[tuple[str, object, object]] = field(default_factory=list)


def saved_config(out: Path) -> dict | None:
    """The frozen ``config.json`` of run folder ``out`` (None when there is none).

    Raises:
        ValueError: the file is unreadable or not a JSON object (the message names it).
    """
    path = Path(out) / CONFIG_FILE
    return read_json_object(path, "run config") if path.is_file() else None


def _same_path(a: object, b: object) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
    return a == b


def config_changes(saved: dict, config: BaseModel, *, source: Path, may_change: Iterable[str],
                   path_fields: Iterable[str] = ()) -> list[tuple[str, object, object]]:
    """Compare a resumed run's ``config`` with its frozen ``saved`` one.

    ``saved`` is validated with ``config``'s class first, so older spellings (aliases) and
    fields added since (defaults) compare as the class reads them.

    Args:
        source: the file ``saved`` came from (named in errors).
        may_change: fields that may differ.
        path_fields: fields holding paths, compared after resolving (relative vs absolute
            spelling, ``~``, symlinks) against the current working directory.

    Returns:
        ``(field, old, new)`` for every allowed field that differs (``resume`` left out),
        in field order.

    Raises:
        ValueError: ``saved`` is no valid config of that class, or a field outside
            ``may_change`` differs (``"<source>: field 'lr' is 0.01, the resumed run asks
            for 0.5 (only checkpoint_every, ... may change)"``).
    """
    def dump(c: BaseModel) -> dict:  # a config with nested parts (distill's method options) flattens them
        return c.flat() if hasattr(c, "flat") else c.model_dump()

    try:
        old = dump(type(config).model_validate(saved))
    except (ValidationError, ValueError) as err:
        raise ValueError(f"{source}: not a valid {type(config).__name__}: "
                         f"{str(err).splitlines()[0]}") from None
    new, allowed, paths = dump(config), set(may_change), set(path_fields)
    changes = []
    for key, value in new.items():
        same = _same_path(old.get(key), value) if key in paths else old.get(key) == value
        if same:
            continue
        if key not in allowed:
            raise ValueError(f"{source}: field '{key}' is {old.get(key)!r}, the resumed run asks for "
                             f"{value!r} (only {', '.join(sorted(allowed))} may change)")
        if key != "resume":
            changes.append((key, old.get(key), value))
    return changes


def describe_changes(changes: list[tuple[str, object, object]]) -> str:
    """One line for the console: ``"resume: changed max_len 1024 -> 2048, steps 6 -> 7"``."""
    return "resume: changed " + ", ".join(f"{k} {a} -> {b}" for k, a, b in changes)


def start_note(folder: RunFolder, resume: bool) -> str | None:
    """The line a starting run prints about its folder: the settings a resumed run changes
    (:func:`describe_changes`), or with ``resume`` that the folder holds no run to continue
    (``"note: nothing to resume in OUT: starting a new run"``); None when there is nothing to say."""
    if folder.changes:
        return describe_changes(folder.changes)
    if resume and not folder.resuming:
        return f"note: nothing to resume in {folder.out}: starting a new run"
    return None


def open_run(out: Path, stage: str, config: BaseModel, *, resume: bool,
             may_change: Iterable[str] = RESUMABLE, path_fields: Iterable[str] = ()) -> RunFolder:
    """Check run folder ``out`` before a ``stage`` run starts; nothing is written but the
    lock of an existing ``out`` (:func:`stages.core.run.lock.lock_run_folder`).

    A folder holds a run when it has a ``config.json`` or a ``metrics.jsonl``.

    Args:
        config: the new run's settings.
        resume: continue the run in ``out`` (a folder without a run starts fresh).
        may_change, path_fields: see :func:`config_changes`.

    Returns:
        The :class:`RunFolder` (``changes`` lists what the resumed run changes).

    Raises:
        ValueError: another process uses ``out``; ``out`` holds a run and ``resume`` is False;
            it holds another stage's run; or the resumed config differs in a field that may not
            change (file and field named).
    """
    out = Path(out)
    if out.is_dir():
        lock_run_folder(out, stage)
    saved = saved_config(out)
    if saved is None and not (out / METRICS_FILE).is_file():
        return RunFolder(out, resuming=False, saved=None)
    manifest = out / MANIFEST_FILE
    found = json.loads(manifest.read_text()).get("stage", stage) if manifest.is_file() else stage
    if found != stage:
        raise ValueError(f"{out} holds a {found} run, not a {stage} run: choose another --out")
    if not resume:
        run_id = f" {saved['run_id']}" if saved and saved.get("run_id") else ""
        raise ValueError(f"{out} already holds a {stage} run{run_id}: pass --resume to continue it "
                         "or choose another --out")
    changes = [] if saved is None else config_changes(
        saved, config, source=out / CONFIG_FILE, may_change=may_change, path_fields=path_fields)
    return RunFolder(out, resuming=True, saved=saved, changes=changes)


@dataclass(frozen=True)
class RunStart:
    """Where a training stage's run starts (:func:`start_run`).

    Attributes:
        run_id: the run's id (:func:`stages.core.run.provenance.config_run_id`).
        folder: what :func:`open_run` found.
        checkpoint: the newest complete checkpoint to resume from; None for a fresh run (or
            a resumed one without a checkpoint yet).
    """

    run_id: str
    folder: RunFolder
    checkpoint: Path | None


def start_run(out: Path, stage: str, config: BaseModel, run_keys: list[str], *, resume: bool,
              may_change: Iterable[str] = RESUMABLE, path_fields: Iterable[str] = (),
              say: Callable[[str], object] = print) -> RunStart:
    """The start of a single-process training run: its id, the run folder check, the resume point.

    Removes what a killed checkpoint write left (:func:`stages.core.run.checkpoint.clean_partial`),
    checks ``out`` (:func:`open_run`; nothing is written), reports the settings a resumed run
    changes, or a ``resume`` with nothing to resume, through ``say`` (:func:`start_note`) and finds the newest checkpoint when resuming. Freeze the config
    (:func:`freeze_config`) once the rest of the setup has succeeded.

    Args:
        run_keys: the config fields the run id hashes.
        resume, may_change, path_fields: see :func:`open_run`.
        say: prints one line (e.g. a rich console's ``print``).

    Raises:
        ValueError: see :func:`open_run`.
    """
    out = Path(out)
    run_id = config_run_id(stage, config, run_keys)
    clean_partial(out)
    folder = open_run(out, stage, config, resume=resume, may_change=may_change, path_fields=path_fields)
    if note := start_note(folder, resume):
        say(note)
    return RunStart(run_id, folder, latest_checkpoint(out) if resume else None)


def freeze_config(out: Path, stage: str, run_id: str, config: BaseModel) -> None:
    """Write ``out/config.json`` (atomically) and ``out/manifest.json`` for a starting run.

    Call it once the run's setup has succeeded, so a failed start leaves no run behind. Takes
    the folder's lock first if :func:`open_run` found no folder to lock.

    Raises:
        ValueError: another process took ``out`` meanwhile (it is named).
    """
    out = Path(out)
    lock_run_folder(out, stage)
    tmp = out / f".{CONFIG_FILE}.tmp"
    tmp.write_text(config.model_dump_json(indent=2))
    tmp.replace(out / CONFIG_FILE)
    write_manifest(out / MANIFEST_FILE, stage, run_id, config)


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def append_metrics(path: Path, row: dict) -> None:
    """Append one JSON row (a finished step's metrics) to the metrics file ``path``."""
    with Path(path).open("a") as f:
        f.write(json.dumps(row) + "\n")


def read_metrics(path: Path) -> list[dict]:
    """The rows of metrics file ``path`` ([] when it does not exist).

    Raises:
        json.JSONDecodeError: a line is not JSON (run :func:`truncate_metrics` first after a kill).
    """
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of steps > ``step`` from a metrics file (rewritten atomically).

    A line cut short by a kill (not valid JSON) is dropped too.

    Returns:
        The number of rows kept (0 when the file does not exist).
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


# ---------------------------------------------------------------------------------------------
# Seeded data order
# ---------------------------------------------------------------------------------------------


def _permutation_stream(n: int, start: int, count: int, rng_of_epoch: Callable[[int], random.Random]) -> list[int]:
    """Elements ``start .. start+count-1`` of the concatenated per-epoch permutations of range(n)."""
    if n < 1:
        raise ValueError(f"a data stream needs at least one item, got n={n}")
    out, perms = [], {}
    for pos in range(start, start + count):
        epoch = pos // n
        if epoch not in perms:
            perm = list(range(n))
            rng_of_epoch(epoch).shuffle(perm)
            perms[epoch] = perm
        out.append(perms[epoch][pos % n])
    return out


def seeded_stream(n: int, seed: int, start: int, count: int) -> list[int]:
    """Items ``start .. start+count-1`` of the seeded stream over range(n) (distill's task order).

    Epoch e is ``list(range(n))`` shuffled by ``random.Random(f"{seed}-{e}")``; position p is
    element ``p % n`` of epoch ``p // n``. A pure function of (n, seed, position).

    Raises:
        ValueError: ``n < 1``.
    """
    return _permutation_stream(n, start, count, lambda epoch: random.Random(f"{seed}-{epoch}"))


def coldstart_stream(n: int, seed: int, start: int, count: int) -> list[int]:
    """Like :func:`seeded_stream`, epochs shuffled by ``random.Random(seed * 1_000_003 + e)``.

    Coldstart's batch order (targets of 0-based step s: ``start = s * batch_size``), kept
    apart from :func:`seeded_stream` because that one orders differently and seeded coldstart
    runs must keep their batches.

    Raises:
        ValueError: ``n < 1``.
    """
    return _permutation_stream(n, start, count, lambda epoch: random.Random(seed * 1_000_003 + epoch))
