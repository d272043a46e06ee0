"""`lopd ladder RUN`: score a finished cold start's composer on the ladder of controls again
(:mod:`stages.coldstart.ladder`), with the code of this checkout.

The store and settings are the run's own (its ``config.json``; relative paths are read from the
current folder, so run it from the folder the cold start ran in); the composer is the run's
``final/``, the untrained rung (b) its seeded init (:mod:`stages.coldstart.composer`). Nothing of
the training loop runs. The files it adds to the run folder are the free-vector control (h)
(``free_prompt.safetensors``) and the task-only composer (h') (``task_only_composer.safetensors``)
when it had to train them, so that a second scoring reuses them.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from stages.coldstart.composer import FINAL, initial_phi
from stages.coldstart.data import ColdstartData, split_targets, successful_trajectories
from stages.coldstart.ladder.rungs import Ladder, print_ladder, run_ladder
from stages.coldstart.settings import RUNG_NAMES, ColdstartConfig, rung_list
from stages.core.models.composer_config import CONFIG_FILE
from stages.core.run.resources import map_large_blocks


def rescore(run: str, *, targets: int | None = None, seed: int | None = None, out: str | None = None,
            rungs: str | None = None, console: Console | None = None) -> Ladder | None:
    """The ladder of the finished run ``run`` on at most ``targets`` held-out targets (0 = all)
    chosen with ``seed`` (defaults: the run's ``ladder_targets`` and ``seed``), its ``rungs``
    (comma-separated; None: all); printed, and written as JSON to ``out`` when given. None when
    fewer than 2 held-out targets have partners in their own and in another environment.

    Raises:
        ValueError: ``run`` is missing, not a folder, holds no readable ``config.json``, names a
            store that is not there from the current folder, or is not finished (file named); an
            unknown rung.
    """
    rungs = ",".join(RUNG_NAMES) if rungs is None else rungs
    rung_list(rungs, "--rungs")  # an unknown rung is refused before the model loads
    console = console or Console()
    folder = Path(run)
    config = _saved_config(folder)
    if out is not None and Path(out).is_dir():
        raise ValueError(f"--out {out}: is a folder; give the JSON file to write")
    final = folder / FINAL / CONFIG_FILE
    if not final.is_file() or json.loads(final.read_text()).get("coldstart_steps") != config.steps:
        raise ValueError(f"{folder}: not finished (no {FINAL}/ composer of its {config.steps} steps)")
    map_large_blocks()
    ladder = _ladder_of(config, folder, targets, seed, rungs, console)
    if ladder is None:
        console.print(f"[yellow]{folder}: fewer than 2 held-out targets have another task's experiences of their "
                      "own and of another environment: no ladder[/]")
        return None
    print_ladder(console, ladder, title=f"composer ladder of {folder}")
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(ladder.model_dump_json(indent=2))
    return ladder


def _ladder_of(config: ColdstartConfig, folder: Path, targets: int | None, seed: int | None, rungs: str,
               console: Console) -> Ladder | None:
    """The run's final composer on its backbone, store and task split, scored on the ladder."""
    from stages.core.data.retrieval import Retriever
    from stages.core.data.store import ExperienceStore
    from stages.core.models.assembly import load_composer
    from stages.core.models.backbone import (DEFAULT_MODEL, disable_dropout, load_policy, resolve_device_dtype,
                                             resolve_model)
    from stages.core.models.composer import enable_activation_checkpointing

    device, dtype = resolve_device_dtype(config.device, config.dtype)
    model, tokenizer = load_policy(config.model, dtype=dtype, device=device)
    backbone_id = config.model if config.model == DEFAULT_MODEL else resolve_model(config.model)
    store = ExperienceStore.open(config.experiences, create=False)
    split = split_targets(tokenizer, successful_trajectories(store, config), config)
    composer = load_composer(model, folder / FINAL, trainable=True, backbone_id=backbone_id)
    untrained = initial_phi(composer, config, tokenizer)
    disable_dropout(composer.backbone)
    if config.activation_checkpointing:  # the controls (h) and (h') train as the composer did
        enable_activation_checkpointing(composer.backbone)
    composer.backbone.eval()
    data = ColdstartData(Retriever(store), tokenizer, config, split.heldout_tasks)
    return run_ladder(composer, tokenizer, data, split.train, split.heldout, config, untrained, folder,
                      limit=targets, seed=seed, console=console, rungs=rungs)


def _saved_config(folder: Path) -> ColdstartConfig:
    """The validated settings in ``folder/config.json``; one-line errors naming the file and field."""
    if not folder.exists():
        raise ValueError(f"{folder}: does not exist (give a `lopd coldstart --out` folder)")
    if not folder.is_dir():
        raise ValueError(f"{folder}: is a file; give a `lopd coldstart --out` folder")
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder}: no config.json (not a `lopd coldstart --out` folder)")
    try:
        config = ColdstartConfig.model_validate_json(path.read_text())
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise ValueError(f"{path}: field '{field}': {err['msg']}") from None
    unnamed = [name for name in ("experiences", "out") if name not in config.model_fields_set]
    if unnamed:  # a run's config names where it ran: no defaults here
        raise ValueError(f"{path}: field '{unnamed[0]}': Field required")
    if not Path(config.experiences).exists():
        raise ValueError(f"{path}: field 'experiences': {config.experiences} is not there from {Path.cwd()}; "
                         "run `lopd ladder` from the folder the cold start ran in")
    return config
