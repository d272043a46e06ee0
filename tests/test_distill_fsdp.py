"""Full fine-tuning with the student sharded by FSDP2 (``lopd distill --shard fsdp``,
stages/core/run/sharding.py), on 2 CPU processes (gloo) and the tiny model.

LOPD: a REAL 2-process ``torchrun`` run (each process runs ``python -m tests.distill_driver``,
the CLI with the test doubles of tests/test_distill.py) is SIGKILLed once step 1's checkpoint
(a DCP folder) is written, resumed by a second torchrun, and compared with a 1-process run of
the same global batch (greedy decoding: both runs sample the same tokens): metrics, store rows,
the step-2 weights and the exported final student. GRPO samples its groups (temperature 1);
each rollout's row seed depends on its position in the step's whole task list, not on the rank
(stages/engines/rollout.py), so the sharded run, killed and resumed the same way, equals a
1-process run too. Multi-node: two
torchrun launchers of one process each (c10d rendezvous over loopback) train step 1, and three
processes resume the DCP checkpoint (resharded) for step 2: equal to the 1-process run too.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from stages.core.run import checkpoint as ckpt
from stages.core.run.sharding import DCP_FOLDER
from stages.distill.recipe import TIMING_FIELDS, DistillConfig, Distiller
from tests.test_distill import _hash_embedder, assets, make_config, metrics  # noqa: F401 (fixtures)
from tests.test_distill_ddp import _kill_tree, _rows, one_thread

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "tests.distill_driver", "distill"]
# 3 tasks x 1 rollout = 3 rows: rank 0 trains 2 (micro-batches of 1: two), rank 1 one (one
# micro-batch and one idle pass); full fine-tuning
SPLIT = dict(steps=2, checkpoint_every=1, tasks_per_step=3, group_size=1, temperature=0.0, micro_batch=1,
             student_lora_rank=0, lr=1e-3)


def _lopd(assets, tmp: Path, name: str, **kw) -> DistillConfig:
    return make_config(assets, tmp, name, **{**SPLIT, **kw})


def _grpo(assets, tmp: Path, name: str, **kw) -> DistillConfig:
    # groups of 2 sampled rollouts (temperature 1): rewards vary within a group
    lopd = _lopd(assets, tmp, name, group_size=2, temperature=1.0, **kw).flat()
    common = {k: v for k, v in lopd.items() if k in DistillConfig.model_fields and k != "options"}
    return DistillConfig(**{**common, "method": "grpo"})


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _config_file(config: DistillConfig, tmp: Path) -> Path:
    path = tmp / f"{Path(config.out).name}.json"
    path.write_text(json.dumps({k: v for k, v in config.flat().items() if k != "resume"}))
    return path


def _run_killed_after_step_1(config: DistillConfig, tmp: Path) -> None:
    """Start the 2-process run of ``config`` and SIGKILL it once step 1's checkpoint exists."""
    out, log = Path(config.out), tmp / f"{Path(config.out).name}.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*TORCHRUN, "--config", str(_config_file(config, tmp))], cwd=ROOT,
                                stdout=sink, stderr=sink, env=_env())
        while proc.poll() is None and not (out / "checkpoints" / "step-1").is_dir():
            time.sleep(0.02)
        killed = proc.poll() is None
        _kill_tree(proc)
    assert killed, f"finished before the kill: {log.read_text()[-3000:]}"
    assert not (out / "final").exists()


def _torchrun(*commands: list[str]) -> None:
    argv = [a for i, cmd in enumerate(commands) for a in ([] if i == 0 else ["--then", "distill"]) + cmd]
    done = subprocess.run([*TORCHRUN, *argv], cwd=ROOT, env=_env(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-4000:]


def _assert_same(two: DistillConfig, one: DistillConfig) -> None:
    """Metrics to 1e-5 relative (timings aside), store rows, and the final students to 1e-4 (a
    tenth of one step at lr 1e-3: Adam divides by the gradient's running scale, so float noise
    in a near-zero gradient moves a weight by a fraction of a step; the hf engine's CPU decode
    products' last bits depend on the rows a step decodes, and each rank decodes its share:
    3.3e-5 seen on 1 of 8,192 entries)."""
    # rollout_logp_abs_diff is the decode's float noise against the training forward (~1e-6 nats
    # here): it depends on the rows each rank decodes, so it is bounded, not compared
    noise = ("rollout_logp_abs_diff",)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_FIELDS + noise} for r in rows]  # noqa: E731
    got, want = strip(metrics(Path(two.out))), strip(metrics(Path(one.out)))
    assert [r["step"] for r in got] == [1, 2] and got[0].keys() == want[0].keys()
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), (a, b)
    assert all(r.get(k, 0.0) < 1e-4 for r in metrics(Path(two.out)) + metrics(Path(one.out)) for k in noise)
    assert want[0]["grad_norm_student"] > 0 and want[1]["grad_norm_student"] != want[0]["grad_norm_student"]
    assert _rows(two.store) == _rows(one.store)
    a = load_file(str(Path(two.out) / "final" / "student" / "model.safetensors"))
    b = load_file(str(Path(one.out) / "final" / "student" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-4)


def _assert_sharded_checkpoint(out: Path) -> None:
    last = out / "checkpoints" / "step-2"
    assert ckpt.read_state(last)["world_size"] == 2 and not (last / "student").exists()
    keys = FileSystemReader(str(last / DCP_FOLDER)).read_metadata().state_dict_metadata
    assert any(k.startswith("model.student.") for k in keys) and any(k.startswith("optim.") for k in keys)
    assert sorted(p.name for p in (last / DCP_FOLDER).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    rows = metrics(out)
    assert all(r["gather_s"] > 0 for r in rows)


@pytest.fixture(scope="module")
def lopd_one(assets, tmp_path_factory) -> DistillConfig:
    """The 1-process LOPD run (full fine-tuning, not sharded) the sharded runs are compared with."""
    config = _lopd(assets, tmp_path_factory.mktemp("lopd-one"), "lopd-one")
    with one_thread():
        Distiller(config).fit()
    return config


def test_fsdp_two_processes_equal_one_lopd_and_grpo_killed_and_resumed(assets, lopd_one, tmp_path):
    lopd, grpo = _lopd(assets, tmp_path, "lopd-fsdp", shard="fsdp"), _grpo(assets, tmp_path, "grpo-fsdp", shard="fsdp")
    grpo_one = _grpo(assets, tmp_path, "grpo-one")
    with one_thread():
        Distiller(grpo_one).fit()
    _run_killed_after_step_1(lopd, tmp_path)
    _run_killed_after_step_1(grpo, tmp_path)
    _torchrun(["--config", str(_config_file(lopd, tmp_path)), "--resume"],
              ["--config", str(_config_file(grpo, tmp_path)), "--resume"])
    _assert_same(lopd, lopd_one)
    _assert_same(grpo, grpo_one)
    assert 0 < metrics(Path(grpo_one.out))[0]["reward_mean"] < 1  # rewards vary: GRPO has advantages to learn from
    for config in (lopd, grpo):
        _assert_sharded_checkpoint(Path(config.out))
    assert "gather_s" not in metrics(Path(lopd_one.out))[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_fsdp_two_nodes_over_loopback_then_three_processes_equal_one_process(assets, lopd_one, tmp_path):
    """Two torchrun launchers of one process each (``--nnodes 2``, c10d rendezvous on
    127.0.0.1), as on two machines, train step 1 of one sharded LOPD run together (with
    activation checkpointing: the recomputed layers give the same numbers); a 3-process torchrun
    resumes its DCP checkpoint (resharded from 2 to 3) for step 2. Greedy rollouts do not depend
    on the ranks' seeds, so the whole run equals the 1-process one."""
    config = _lopd(assets, tmp_path, "lopd-nodes", shard="fsdp", activation_checkpointing=True)
    cfg, port = _config_file(config, tmp_path), _free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lopd-nodes",
               "-m", "tests.distill_driver", "distill", "--config", str(cfg), "--steps", "1"]
    nodes = [subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for _ in range(2)]
    logs = [node.communicate(timeout=600)[0].decode() for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert ckpt.read_state(Path(config.out) / "checkpoints" / "step-1")["world_size"] == 2
    three = [*TORCHRUN[:4], "--nproc_per_node=3", *TORCHRUN[5:]]
    done = subprocess.run([*three, "--config", str(cfg), "--resume"], cwd=ROOT, env=_env(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    _assert_same(config, lopd_one)
    last = Path(config.out) / "checkpoints" / "step-2"
    assert ckpt.read_state(last)["world_size"] == 3
    assert len(list((last / DCP_FOLDER).glob("*.distcp"))) == 3
