"""One process per run folder: a second process is refused at once, naming the first; the lock
goes with its holder (kill -9 leaves none); the same process and its children (``--nproc``'s
workers) pass."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from stages.core.run import runs

ROOT = Path(__file__).resolve().parent.parent
HOLD = """
import sys
sys.path.insert(0, {root!r})
from pydantic import BaseModel
from stages.core.run import runs
class Cfg(BaseModel):
    out: str
runs.freeze_config(sys.argv[1], "sft", "sft-1", Cfg(out=sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""
OPEN = """
import sys
sys.path.insert(0, {root!r})
from pydantic import BaseModel
from stages.core.run import runs
class Cfg(BaseModel):
    out: str
print(runs.open_run(sys.argv[1], "sft", Cfg(out=sys.argv[1]), resume=True).resuming)
"""


class Cfg(BaseModel):
    out: str


def _python(script: str, out: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script.format(root=str(ROOT)), str(out)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_second_process_refused_naming_the_first_until_it_dies(tmp_path):
    out = tmp_path / "run"
    holder = _python(HOLD, out)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        with pytest.raises(ValueError, match=rf"^{out} is in use by process {holder.pid} \(sft: .*since .*UTC\): "
                                             r"wait for it to end or choose another --out$"):
            runs.open_run(out, "sft", Cfg(out=str(out)), resume=True)
        with pytest.raises(ValueError, match=f"in use by process {holder.pid}"):
            runs.freeze_config(out, "sft", "sft-2", Cfg(out=str(out)))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert runs.open_run(out, "sft", Cfg(out=str(out)), resume=True).resuming  # a killed holder leaves no lock


def test_same_process_and_its_children_pass(tmp_path):
    out = tmp_path / "run"
    runs.freeze_config(out, "sft", "sft-1", Cfg(out=str(out)))
    assert runs.open_run(out, "sft", Cfg(out=str(out)), resume=True).resuming  # e.g. a resume inside `lopd study`
    child = _python(OPEN, out)  # a worker that `--nproc` started under this launcher
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0 and stdout.strip() == "True", stderr


def test_a_check_that_finds_no_folder_writes_nothing(tmp_path):
    runs.open_run(tmp_path / "none", "sft", Cfg(out="x"), resume=False)
    assert not (tmp_path / "none").exists()
