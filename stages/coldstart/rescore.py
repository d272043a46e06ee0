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

from rich.console import Console

from stages.coldstart.ladder import FREE_PROMPT, Ladder, print_ladder
from stages.coldstart.recipe import Coldstart
from stages.coldstart.settings import ColdstartConfig
from stages.core.run.resources import map_large_blocks


def rescore(run: str, *, targets: int = 32, seed: int = 0, out: str | None = None,
            console: Console | None = None) -> Ladder | None:
    """The ladder of the finished run ``run`` on at most ``targets`` held-out targets (0 = all)
    chosen with ``seed``; printed, and written as JSON to ``out`` when given. None when fewer
    than 2 held-out targets have partners in their own and in another environment.

    Raises:
        ValueError: ``run`` holds no ``config.json`` or is not finished (file named).
    """
    console = console or Console()
    folder = Path(run)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder}: no config.json (not a `lopd coldstart --out` folder)")
    saved = json.loads((folder / "config.json").read_text())
    config = ColdstartConfig.model_validate(saved)
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
