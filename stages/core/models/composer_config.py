"""The file that makes a folder a composer checkpoint, ``composer_config.json`` (its backbone,
placement and hyperparameters, written by :func:`stages.core.models.composer.save_composer`),
read without torch: a command given a folder that holds none refuses before any model library
loads."""
from __future__ import annotations

from pathlib import Path

from stages.core.run.checkpoint import read_json_object

CONFIG_FILE = "composer_config.json"


def read_composer_config(ckpt_dir: str | Path) -> dict:
    """The ``composer_config.json`` of the composer checkpoint folder ``ckpt_dir``.

    Raises:
        ValueError: the file is missing (naming the command that makes one), unreadable or no
            JSON object (one line naming it).
    """
    path = Path(ckpt_dir) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no composer checkpoint ({CONFIG_FILE} missing; `lopd coldstart "
                         "--experiences STORE --out DIR` makes one in DIR/final)")
    return read_json_object(path, "composer config")
