"""Reliability: a REAL `kill -9` of distill, coldstart and collect at several points, then a
resume, gives the same metrics (timings aside), store rows and weights as a run never killed.

Each run is a separate process (a short driver that sets up the tiny model's test doubles: the
toy environment and the hashing embedder of tests/test_distill.py), killed with SIGKILL as soon
as its run folder shows the chosen point.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stages.coldstart import recipe as coldstart
from stages.core.data.store import ExperienceStore
from stages.distill.recipe import TIMING_FIELDS, Distiller
from tests.test_coldstart import HashEmbedder as ColdstartEmbedder
from tests.test_coldstart import cfg as coldstart_cfg
from tests.test_coldstart import one_thread, store_path, tiny_dir  # noqa: F401 (fixtures)
from tests.test_distill import _hash_embedder, assets, make_config, metrics  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent
DISTILL = """
import sys
sys.path.insert(0, {root!r})
import stages.distill.recipe as d
from tests.test_distill import HashEmbedder
d.load_embedder = lambda name=None, **kw: HashEmbedder()
d.Distiller(d.DistillConfig.model_validate_json(open(sys.argv[1]).read())).fit()
"""
COLDSTART = """
import sys
sys.path.insert(0, {root!r})
from stages.coldstart import recipe as coldstart
from tests.test_coldstart import HashEmbedder
coldstart.run(coldstart.ColdstartConfig.model_validate_json(open(sys.argv[1]).read()), embedder=HashEmbedder())
"""


def _kill_when(script: str, config_json: str, tmp: Path, ready, timeout: float = 600) -> bool:
    """Run ``script`` on ``config_json`` in a new process; SIGKILL it once ``ready()`` holds.

    Returns True when it was killed, False when it finished first.
    """
    cfg_file = tmp / f"cfg-{time.monotonic_ns()}.json"
    cfg_file.write_text(config_json)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script.format(root=str(ROOT)), str(cfg_file)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.05)
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
    return False


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def _rows(store) -> list[tuple]:
    return sorted((t.trajectory_id, tuple(tuple(u.token_ids) for u in t.turns), t.reward)
                  for t in ExperienceStore.open(store).query(run_id="lopd-test"))


@pytest.fixture(scope="module")
def straight_distill(assets, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight-kill")
    config = make_config(assets, tmp, "run", steps=3, checkpoint_every=1)
    Distiller(config).fit()
    return config


@pytest.mark.parametrize("point", ["after-step-1-row", "after-step-2-checkpoint"])
def test_distill_killed_resumes_identically(point, assets, straight_distill, tmp_path):
    config = make_config(assets, tmp_path, "killed", steps=3, checkpoint_every=1)
    out = Path(config.out)
    ready = {"after-step-1-row": lambda: _lines(out / "metrics.jsonl") >= 1,
             "after-step-2-checkpoint": lambda: (out / "checkpoints" / "step-2").is_dir()}[point]
    assert _kill_when(DISTILL, config.model_dump_json(), tmp_path, ready), "finished before the kill"
    Distiller(config.model_copy(update={"resume": True})).fit()
    assert _strip(metrics(out)) == _strip(metrics(Path(straight_distill.out)))
    assert _rows(config.store) == _rows(straight_distill.store)
    a = load_file(str(out / "final" / "student" / "model.safetensors"))
    b = load_file(str(Path(straight_distill.out) / "final" / "student" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_coldstart_killed_resumes_identically(tmp_path, store_path, tiny_dir):
    straight = coldstart_cfg(tmp_path, store_path, tiny_dir, name="straight", steps=6, checkpoint_every=1)
    coldstart.run(straight, embedder=ColdstartEmbedder())
    config = coldstart_cfg(tmp_path, store_path, tiny_dir, name="killed", steps=6, checkpoint_every=1)
    out = Path(config.out)
    assert _kill_when(COLDSTART, config.model_dump_json(), tmp_path,
                      lambda: _lines(out / "metrics.jsonl") >= 3), "finished before the kill"
    coldstart.run(config.model_copy(update={"resume": True}), embedder=ColdstartEmbedder())
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "rss_mb", "peak_rss_mb")}  # noqa: E731
                       for x in (p / "metrics.jsonl").read_text().splitlines()]
    assert strip(out) == strip(Path(straight.out))
    assert json.loads((out / "heldout.json").read_text()) == json.loads((Path(straight.out) / "heldout.json").read_text())


def test_collect_killed_resumes_identically(tmp_path, tiny_dir):
    args = ["collect", "--env", "envscaler", "--model", tiny_dir, "--limit", "4", "--samples-per-task", "2",
            "--max-new-tokens", "8", "--max-turns", "2", "--temperature", "0", "--batch-size", "2"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    cli = [sys.executable, "-m", "lopd_cli.main"]
    subprocess.run([*cli, *args, "--store", str(straight)], check=True, cwd=ROOT, capture_output=True)
    proc = subprocess.Popen([*cli, *args, "--store", str(killed)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    table = killed / "trajectories.lance" / "_versions"
    while proc.poll() is None and len(list(table.glob("*.manifest"))) < 2:  # created + one task's rows
        time.sleep(0.05)
    killed_mid = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert killed_mid, "finished before the kill"
    subprocess.run([*cli, *args, "--store", str(killed), "--resume"], check=True, cwd=ROOT, capture_output=True)
    rows = lambda s: sorted((t.trajectory_id, t.reward, tuple(tuple(u.token_ids) for u in t.turns))  # noqa: E731
                            for t in ExperienceStore.open(s).query())
    assert rows(killed) == rows(straight) and len(rows(straight)) == 8
