"""File modes of what lopd writes for sharing: the modes a plain ``open``/``mkdir`` gives.

safetensors (0.8) writes its files owner-only (0600), and ``tempfile.mkdtemp``, which the atomic
checkpoint and ``final/`` writes start from, makes owner-only folders. Run folders are for
sharing (a lab's shared disk, a copy to another machine), so after writing, lopd gives every
file 0666 and every folder 0777 less the process umask, as ``open`` and ``mkdir`` do.
"""
from __future__ import annotations

import os
from pathlib import Path


def process_umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def share(path: str | Path) -> None:
    """Give ``path`` (a file, or a folder and everything under it) a plain write's mode.

    Files get ``0o666 & ~umask``, folders ``0o777 & ~umask``; symbolic links are left alone.
    """
    path = Path(path)
    mask = process_umask()
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        if not p.is_symlink():
            p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)
