"""The run loggers for real (the `tensorboard` and `wandb` packages of the dev extra): a 2-step
distill run with ``--log tensorboard`` writes events that TensorBoard's own reader reads back
(scalars per step, the sample-rollout text), and with ``--log wandb`` (offline, no network) a
W&B run folder whose history and samples tables hold the values of metrics.jsonl."""
from __future__ import annotations

import json
import time

import pytest

from stages.distill.recipe import Distiller
from tests.test_distill import _hash_embedder, assets, make_config, metrics  # noqa: F401 (fixtures)


def test_tensorboard_events_read_back(assets, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = Distiller(make_config(assets, tmp_path, "tb", steps=2, log="tensorboard"))
    trainer.fit()
    rows = metrics(trainer.out)
    events = EventAccumulator(str(trainer.out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    rewards = events.Scalars("distill/reward_mean")
    assert [e.step for e in rewards] == [1, 2]
    assert [e.value for e in rewards] == pytest.approx([r["reward_mean"] for r in rows])
    assert "distill/step" not in events.Tags()["scalars"]
    texts = events.Tensors("distill/samples/text_summary")
    assert [e.step for e in texts] == [1, 2]
    shown = texts[-1].tensor_proto.string_val[0].decode()
    assert "first" in shown and "best" in shown and "worst" in shown and "task `" in shown and "```" in shown


def test_wandb_offline_run_holds_the_metrics_and_samples(assets, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer = Distiller(make_config(assets, tmp_path, "wb", steps=2, log="wandb"))
    trainer.fit()
    rows = metrics(trainer.out)
    (run,) = (trainer.out / "wandb").glob("offline-run-*")  # offline: nothing was sent anywhere
    # the run file holds each history item as its key and JSON value (W&B has no offline reader in
    # Python: its core is a Go binary), so look for them as bytes
    # W&B's core process may still be writing the file when finish() returns on a loaded machine:
    # wait for it (up to 60 s) before reading
    deadline = time.monotonic() + 60
    path = run / "run-lopd-test.wandb"
    while b"distill/reverse_kl" not in (records := path.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for row in rows:
        assert b"distill/reverse_kl" in records and json.dumps(row["reverse_kl"]).encode() in records
    tables = sorted((run / "files" / "media" / "table" / "distill").glob("samples_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[-1].read_text())
    assert table["columns"][:4] == ["step", "roles", "task_id", "reward"]
    assert {r[0] for r in table["data"]} == {2} and any("best" in r[1] for r in table["data"])
