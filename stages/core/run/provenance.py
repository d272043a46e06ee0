"""Provenance of stage runs: git commit, deterministic run ids, run manifests."""
from __future__ import annotations

import hashlib
import json
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import BaseModel

from schemas import RunManifest


def git_commit() -> str:
    """The commit of the lopd source tree, or "" when it is not a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def lopd_version() -> str:
    """Installed lopd version ("0+unknown" when run from an uninstalled tree)."""
    try:
        return version("lopd")
    except PackageNotFoundError:
        return "0+unknown"


def config_run_id(stage: str, config: BaseModel, keys: list[str]) -> str:
    """A deterministic run id ``<stage>-<hash>`` from the config fields named in ``keys``.

    The same settings give the same id, which is what lets ``--resume`` find a run's rows.
    """
    payload = json.dumps({k: getattr(config, k) for k in keys}, sort_keys=True, default=str)
    return f"{stage}-{hashlib.sha1(payload.encode()).hexdigest()[:10]}"


def write_manifest(path: Path, stage: str, run_id: str, config: BaseModel, data: str = "") -> RunManifest:
    """Write the run manifest (stage, resolved config, version, commit, the data it read) as JSON at ``path``.

    A manifest of the same run already there (a resumed run) keeps its first start's time and
    commit; this start is added to its ``resumes``."""
    manifest = RunManifest(
        run_id=run_id, stage=stage, config=config.model_dump_json(),
        lopd_version=lopd_version(), git_commit=git_commit(), data=data,
    )
    try:
        first = RunManifest.model_validate_json(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: this start is the first
        first = None
    if first is not None and first.run_id == run_id:
        manifest = manifest.model_copy(update={
            "created_at": first.created_at, "git_commit": first.git_commit,
            "resumes": [*first.resumes, f"{manifest.created_at.isoformat()} {manifest.git_commit}"]})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(manifest.model_dump_json(indent=2))
    tmp.replace(path)
    return manifest
