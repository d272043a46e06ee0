"""`lopd ladder RUN`: score a finished cold start's composer on the ladder of controls again
(:mod:`stages.coldstart.ladder`), with the code of this checkout.

The run folder is copied into a temporary folder first (a cold start resumed writes into its
folder); the store and settings are the run's own (its ``config.json``; relative paths are read
from the current folder, so run it from the folder the cold start ran in). The one file it adds
to the run folder is the free-vector control (h) (``free_prompt.safetensors``) when it had to
train one, so that a second scoring reuses it.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from stages.coldstart.free_prompt import FREE_PROMPT
from stages.coldstart.ladder import Ladder, print_ladder
from stages.coldstart.recipe import Coldstart
from stages.coldstart.settings import ColdstartConfig
from stages.core.run.resources import map_large_blocks


def rescore(run: str, *, targets: int | None = None, seed: int | None = None, out: str | None = None,
            console: Console | None = None) -> Ladder | None:
    """The ladder of the finished run ``run`` on at most ``targets`` held-out targets (0 = all)
    chosen with ``seed`` (defaults: the run's ``ladder_targets`` and ``seed``); printed, and
    written as JSON to ``out`` when given. None when fewer than 2 held-out targets have partners
    in their own and in another environment.

    Raises:
        ValueError: ``run`` is missing, not a folder, holds no readable ``config.json``, names a
            store that is not there from the current folder, or is not finished (file named).
    """
    console = console or Console()
    folder = Path(run)
    config = _saved_config(folder)
    if out is not None and Path(out).is_dir():
        raise ValueError(f"--out {out}: is a folder; give the JSON file to write")
    saved = json.loads((folder / "config.json").read_text())
    map_large_blocks()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run"  # the copy is the run's folder now (its frozen config says so)
        shutil.copytree(folder, copy)
        (copy / "config.json").write_text(json.dumps({**saved, "out": str(copy)}, indent=2))
        coldstart = Coldstart(config.model_copy(update={"resume": True, "out": str(copy)}), console)
        if coldstart.start_step != config.steps:
            raise ValueError(f"{folder}: not finished (checkpoint at step {coldstart.start_step} of {config.steps})")
        coldstart.composer.backbone.eval()
        ladder = coldstart.ladder_eval(limit=targets, seed=seed)
        if (copy / FREE_PROMPT).is_file() and not (folder / FREE_PROMPT).is_file():
            shutil.copy2(copy / FREE_PROMPT, folder / FREE_PROMPT)
    if ladder is None:
        console.print(f"[yellow]{folder}: fewer than 2 held-out targets have another task's experiences of their "
                      "own and of another environment: no ladder[/]")
        return None
    print_ladder(console, ladder, title=f"composer ladder of {folder}")
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(ladder.model_dump_json(indent=2))
    return ladder


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
    if not Path(config.experiences).exists():
        raise ValueError(f"{path}: field 'experiences': {config.experiences} is not there from {Path.cwd()}; "
                         "run `lopd ladder` from the folder the cold start ran in")
    return config
