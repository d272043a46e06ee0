"""Score a finished cold start's held-out targets again, four ways (no latents, the untrained
composer, the trained one, the trained one given another task's experiences: see
stages/coldstart/ladder/heldout.py), with the code of this checkout, and print the result as JSON.

    python examples/study/composer_heldout.py runs/bed/composer0

The run folder is copied into a temporary folder first (a cold start resumed writes into its
folder), so it is left as it was; the store and settings are the run's own (its config.json): run
it from the folder the cold start ran in. The full ladder of controls (the same four and four more:
another environment's experiences, the target's own trajectory, the experiences as text, free
vectors) is `lopd ladder RUN_FOLDER`.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from stages.coldstart.recipe import Coldstart, ColdstartConfig
from stages.core.run.resources import map_large_blocks


def main() -> None:
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "config.json").is_file():
        raise SystemExit("usage: composer_heldout.py RUN_FOLDER (a `lopd coldstart --out` folder with config.json)")
    run = Path(sys.argv[1])
    config = ColdstartConfig.model_validate_json((run / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:  # the run's relative paths, rebuilt under tmp
        shutil.copytree(run, Path(tmp) / config.out)
        for field in (config.experiences, config.model):  # the store, and a backbone given as a folder
            if not Path(field).is_absolute() and Path(field).exists():
                (Path(tmp) / field).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / field).symlink_to(Path(field).resolve())
        os.chdir(tmp)
        map_large_blocks()
        coldstart = Coldstart(config.model_copy(update={"resume": True}))
        if coldstart.start_step != config.steps:
            raise SystemExit(f"{run}: not finished (checkpoint at step {coldstart.start_step} of {config.steps})")
        print(coldstart.heldout_eval(baselines=True).model_dump_json(indent=2))


if __name__ == "__main__":
    main()
