"""The import layers of pyproject.toml ([tool.importlinter]) hold: `lint-imports` of this
checkout's modules passes (cli > stage modules > methods > engines > core > schemas; no cycles)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def test_import_contracts_are_kept():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
