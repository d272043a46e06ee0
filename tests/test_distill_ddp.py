"""Data-parallel `lopd distill` (stages/core/run/distributed.py).

The first test starts a REAL ``torchrun`` of 2 CPU processes (gloo) on the tiny model and toy
environment of tests/test_distill.py (each process runs ``python -m tests.distill_driver``, the
CLI with those test doubles) training LOPD, SIGKILLs the whole process tree once step 1's
checkpoint is written, resumes it with a second torchrun, and compares the result with a
1-process run of the same global batch: metrics (loss, grad norms, LOPD's beta ...), store rows
and the trainable weights (student LoRA and composer). The second torchrun then trains SDPO
(whose loss is a token mean over the step's distilled tokens and whose EMA teacher moves every
step) and it is compared the same way (one torchrun start-up for both: they are the slow part).
LOPD decodes greedily, so its comparison is of the training math alone (an odd number of rows:
the ranks' shares differ); SDPO samples its groups (temperature 1): each rollout's row seed
depends on its position in the step's whole task list, not on the rank, so the ranks sample the
rollouts one process samples.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.core.data.store import ExperienceStore
from stages.core.run import checkpoint as ckpt
from stages.core.run import distributed
from stages.core.run.distributed import World
from stages.distill.recipe import TIMING_FIELDS, DistillConfig, Distiller
from stages.methods import get_method
from tests.test_distill import _hash_embedder, assets, make_config, metrics  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "tests.distill_driver", "distill"]
TRAINABLE = ("student/adapter_model.safetensors", "composer/composer/adapter_model.safetensors",
             "composer/compressor.safetensors")


# 3 tasks x 1 rollout = 3 rows: rank 0 trains 2, rank 1 one (micro-batches of 2)
SPLIT = dict(steps=2, checkpoint_every=1, tasks_per_step=3, group_size=1, temperature=0.0, micro_batch=2)


def _config(assets, tmp: Path, name: str):
    return make_config(assets, tmp, name, **SPLIT)


def _sdpo_config(assets, tmp: Path, name: str) -> DistillConfig:
    # sampled groups of 2: a success's sibling or a failure's feedback as context (6 rows, 3 per rank)
    lopd = make_config(assets, tmp, name, **{**SPLIT, "group_size": 2, "temperature": 1.0}).flat()
    common = {k: v for k, v in lopd.items() if k in DistillConfig.model_fields and k != "options"}
    return DistillConfig(**{**common, "method": "sdpo", "run_id": "lopd-test"})


def _run_torchrun(args: list[str]) -> None:
    done = subprocess.run([*TORCHRUN, *args], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def _assert_same_training(two, one, trainable: tuple[str, ...]) -> None:
    """Metrics (timings aside) and store rows of the two runs, and their step-2 trainable weights."""
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]  # noqa: E731
    got, want = strip(metrics(Path(two.out))), strip(metrics(Path(one.out)))
    assert [r["step"] for r in got] == [1, 2] and got[0].keys() == want[0].keys()
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), (a, b)
    assert want[1]["loss"] != want[0]["loss"] and want[0]["grad_norm_student"] > 0
    assert _rows(two.store) == _rows(one.store) and len(_rows(one.store)) == 2 * one.tasks_per_step * one.group_size
    for name in trainable:
        a = load_file(str(Path(two.out) / "checkpoints" / "step-2" / name))
        b = load_file(str(Path(one.out) / "checkpoints" / "step-2" / name))
        assert a.keys() == b.keys()
        for k in a:
            # Adam divides by the gradient's running scale, so float noise in a near-zero gradient
            # can move a weight by a fraction of a step. The noise: another summation order across
            # ranks, and the hf engine's CPU decode, whose products' last bits depend on the rows a
            # step decodes (each rank decodes its share); lr is 1e-2
            # (3e-3 seen on 1 of 256 LoRA entries before the few-row decode, 6e-3 since; SDPO with
            # pi_old from the training forward: 1.4e-2 on 1 of 256), so 2e-2 of a step is allowed
            torch.testing.assert_close(a[k], b[k], rtol=2e-4, atol=2e-4)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread, as the torchrun workers (OMP_NUM_THREADS=1): a 1-process run compared
    with them then sums in the same kernels' order (on 2 threads a near-zero gradient's float noise
    moved one LoRA entry of an SDPO run by 8e-3 of an Adam step)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _config_file(config, tmp: Path) -> Path:
    path = tmp / f"{Path(config.out).name}.json"
    path.write_text(json.dumps({k: v for k, v in config.flat().items() if k != "resume"}))
    return path


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its workers (they run in sessions of their own)."""
    victims = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    for p in victims:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(victims, timeout=30)


def _rows(store) -> list[tuple]:
    return sorted((t.trajectory_id, tuple(tuple(u.token_ids) for u in t.turns), t.reward)
                  for t in ExperienceStore.open(store).query(run_id="lopd-test"))


def test_two_processes_equal_one_process_lopd_killed_and_resumed_and_sdpo(assets, tmp_path):
    """LOPD: killed after step 1's checkpoint, resumed; then SDPO straight, in the same processes."""
    lopd_one, sdpo_one = _config(assets, tmp_path, "lopd-one"), _sdpo_config(assets, tmp_path, "sdpo-one")
    with one_thread():
        Distiller(lopd_one).fit()
        Distiller(sdpo_one).fit()
    assert all(row["distill_tokens"] > 0 for row in metrics(Path(sdpo_one.out)))
    lopd, sdpo = _config(assets, tmp_path, "lopd-two"), _sdpo_config(assets, tmp_path, "sdpo-two")
    out, cfg, log = Path(lopd.out), _config_file(lopd, tmp_path), tmp_path / "torchrun.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*TORCHRUN, "--config", str(cfg)], cwd=ROOT, stdout=sink, stderr=sink,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        while proc.poll() is None and not (out / "checkpoints" / "step-1").is_dir():
            time.sleep(0.02)
        killed = proc.poll() is None
        _kill_tree(proc)
    assert killed, f"finished before the kill: {log.read_text()[-2000:]}"
    assert not (out / "final").exists()
    _run_torchrun(["--config", str(cfg), "--resume", "--then", "distill", "--config", str(_config_file(sdpo, tmp_path))])

    _assert_same_training(lopd, lopd_one, TRAINABLE)
    last = out / "checkpoints" / "step-2"
    assert (last / "rng-rank0.pt").is_file() and (last / "rng-rank1.pt").is_file()
    assert not (last / ckpt.RNG_FILE).exists() and ckpt.read_state(last)["world_size"] == 2
    assert (out / "final" / "student" / "model.safetensors").is_file()
    _assert_same_training(sdpo, sdpo_one, ("student/adapter_model.safetensors", "teacher/adapter_model.safetensors"))
    with pytest.raises(ValueError, match=r"'world_size' is 2, but this run has 1 process.*--nproc 2"):
        Distiller(lopd.model_copy(update={"resume": True}))


def test_span_splits_into_contiguous_near_equal_shares():
    for size in range(1, 5):
        for n in range(0, 11):
            spans = [World(rank=r, size=size).span(n) for r in range(size)]
            assert [i for lo, hi in spans for i in range(lo, hi)] == list(range(n))
            assert max(hi - lo for lo, hi in spans) - min(hi - lo for lo, hi in spans) <= 1
    assert distributed.share("abcde", World(rank=1, size=2)) == ["d", "e"]


def test_rank_rng_files_restore_each_rank(tmp_path):
    torch.manual_seed(1)
    first = ckpt.capture_rng()
    torch.manual_seed(2)
    second = ckpt.capture_rng()
    folder = ckpt.write_checkpoint(tmp_path, 1, lambda f: None, {"step": 1}, keep=2, rank_rngs=[first, second])
    assert sorted(p.name for p in folder.glob("rng*")) == ["rng-rank0.pt", "rng-rank1.pt"]
    torch.manual_seed(3)
    ckpt.restore_rng(folder, rank=1)
    drawn = torch.rand(3)
    torch.manual_seed(2)
    assert torch.equal(drawn, torch.rand(3))


def test_refusals_name_the_fix():
    two = World(rank=0, size=2)
    with pytest.raises(ValueError, match="skill-sd.*cannot train data-parallel"):
        distributed.check_split(two, get_method("skill-sd"), tasks_per_step=4)
    with pytest.raises(ValueError, match="--tasks-per-step 1 < 2 processes"):
        distributed.check_split(two, get_method("lopd"), tasks_per_step=1)
    distributed.check_split(two, get_method("grpo"), tasks_per_step=2)
    with pytest.raises(ValueError, match=r"ck/state.json: field 'world_size' is 1, but this run has 2"):
        distributed.check_resume(two, Path("ck"), {"step": 3})
    distributed.check_resume(World(), Path("ck"), {"step": 3})


def test_nproc_relaunches_the_given_options_under_torchrun(monkeypatch, tmp_path):
    launched = []
    monkeypatch.setattr(distributed.subprocess, "call", lambda cmd: launched.append(cmd) or 0)
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # the `lopd` script
    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    # --max-len: at the defaults (whole 30-turn episodes) the memory check refuses a step on this machine
    result = CliRunner().invoke(app, ["distill", "--method", "grpo", "--env", "bfcl", "--steps", "3",
                                      "--max-len", "512", "--store", store, "--new-store", "--out", out,
                                      "-o", "ppo_epochs=2", "--resume", "--nproc", "2"])
    assert result.exit_code == 0, result.output
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "lopd_cli",
            "distill"]
    assert len(launched) == 1 and launched[0][:len(head)] == head

    def flags(argv: list[str]) -> list[tuple[str, ...]]:
        """Each flag with the value that follows it (the order of flags does not matter to the CLI)."""
        groups: list[list[str]] = []
        for arg in argv:
            if arg.startswith("--"):
                groups.append([arg])
            else:
                groups[-1].append(arg)
        return sorted(map(tuple, groups))

    assert flags(launched[0][len(head):]) == flags(
        ["--method", "grpo", "--option", "ppo_epochs=2", "--env", "bfcl", "--store", store, "--new-store",
         "--out", out, "--steps", "3", "--max-len", "512", "--resume"])
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    with pytest.raises(ValueError, match="inside torchrun"):
        distributed.launch(2, ["distill"])
