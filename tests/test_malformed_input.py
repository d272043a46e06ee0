"""Hostile-user probes: each malformed input is exactly one `error:` line naming the file and the
field, a non-zero exit, no traceback, and nothing half-made left behind."""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.envs.envscaler_data import FIXTURES_DIR
from tests.test_store_recovery import damaged_store, error_lines

runner = CliRunner()


@dataclass
class Probe:
    """``build(tmp_path)`` writes the bad input and returns (CLI args, the file to name, the field)."""

    build: Callable[[Path], tuple[list[str], Path | str, str]]
    leaves_nothing: str | None = None  # a path (relative to tmp_path) that must not exist afterwards


def _report(tmp: Path, name: str, content: bytes) -> Path:
    path = tmp / name
    path.write_bytes(content)
    return path


def _good_report(tmp: Path) -> Path:
    return _report(tmp, "good.json", json.dumps(
        {"bench": "bfcl-v3", "model": "a", "scores": {"acc": 0.5}, "behaviour": {"mean_steps": 2.0}}).encode())


def _compare(bad: bytes) -> Callable:
    def build(tmp: Path):
        path = _report(tmp, "bad.json", bad)
        return ["evaluate", "--compare", str(_good_report(tmp)), str(path)], path, ""
    return build


def _bad_report(**fields) -> bytes:
    return json.dumps({"bench": "bfcl-v3", "model": "b", "scores": {"acc": 0.4},
                       "behaviour": {"mean_steps": 1.0}, **fields}).encode()


def _corrupt(damage: str) -> Callable:
    def build(tmp: Path):
        path = damaged_store(tmp, damage)
        return ["index", "--store", str(path)], path, "'trajectories'"
    return build


def _envscaler_data(tmp: Path) -> Path:
    folder = tmp / "data"
    shutil.copytree(FIXTURES_DIR, folder)
    tasks = folder / "tasks.jsonl"
    tasks.write_bytes(tasks.read_bytes().replace(b"a", b"\xe9", 1))  # Latin-1 e-acute
    return tasks


def _bad_config(tmp: Path):
    path = tmp / "run.toml"
    path.write_bytes(b"steps = 3\n# caf\xe9\n")
    return ["distill", "--config", str(path), "--env", "envscaler", "--composer", str(tmp)], path, "offset"


def _empty_model(tmp: Path):
    (tmp / "model").mkdir()
    args = ["collect", "--env", "envscaler", "--model", str(tmp / "model"), "--store", str(tmp / "store"), "--limit", "1"]
    return args, tmp / "model" / "config.json", "--model"


def _truncated_weights(tmp: Path):
    from tests.tiny import save_tiny

    folder = save_tiny(tmp / "model")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a full disk, a killed copy
    args = ["collect", "--env", "envscaler", "--model", str(folder), "--store", str(tmp / "store"), "--limit", "1"]
    return args, folder, "cannot load the model's weights"


PROBES = {
    "store-deleted-file": Probe(_corrupt("delete")),
    "store-truncated-file": Probe(_corrupt("truncate")),
    "store-garbage-file": Probe(_corrupt("garbage")),
    "store-nonexistent": Probe(lambda tmp: (["coldstart", "--experiences", str(tmp / "nope"), "--out",
                                             str(tmp / "cs")], tmp / "nope", "experience store"),
                               leaves_nothing="cs"),
    "compare-scores-null": Probe(_compare(_bad_report(scores=None))),
    "compare-string-score": Probe(_compare(_bad_report(scores={"acc": "high"}))),
    "compare-string-behaviour": Probe(_compare(_bad_report(behaviour={"mean_steps": "2"}))),
    "compare-not-json": Probe(_compare(b"{not json")),
    "compare-json-list": Probe(_compare(b"[1, 2]")),
    "compare-non-utf8": Probe(_compare(b'{"bench": "bfcl-v3\xff"}')),
    "config-non-utf8": Probe(_bad_config),
    "data-non-utf8": Probe(lambda tmp: (["collect", "--env", "envscaler", "--data-dir", str(_envscaler_data(tmp).parent),
                                         "--store", str(tmp / "store")], tmp / "data" / "tasks.jsonl", "line 1"),
                           leaves_nothing="store"),
    "model-empty-folder": Probe(_empty_model, leaves_nothing="store"),
    "model-truncated-weights": Probe(_truncated_weights, leaves_nothing="store"),
}
FIELDS = {"compare-scores-null": "'scores'", "compare-string-score": "'scores.acc'",
          "compare-string-behaviour": "'behaviour.mean_steps'", "compare-not-json": "line 1 column 2",
          "compare-json-list": "top level", "compare-non-utf8": "offset 18"}


@pytest.mark.parametrize("name", list(PROBES))
def test_malformed_input_is_one_line(tmp_path, name):
    probe = PROBES[name]
    args, file, field = probe.build(tmp_path)
    field = field or FIELDS[name]
    res = runner.invoke(app, args)
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output
    lines = error_lines(res.output)
    assert len(lines) == 1, res.output
    assert str(file) in lines[0] and field in lines[0], lines[0]
    if probe.leaves_nothing:
        assert not (tmp_path / probe.leaves_nothing).exists()


class ConnectError(Exception):
    """Stands in for the HTTP client's connection failure (no network in tests)."""


@pytest.fixture
def no_hub(monkeypatch):
    """The hub lookup fails like a machine without network; the dataset loader must never run."""
    import datasets
    from huggingface_hub import HfApi

    calls = []

    def offline(self, repo_id, **kwargs):
        calls.append((repo_id, kwargs.get("timeout")))
        raise ConnectError("[Errno -2] Name or service not known")

    def loader(*args, **kwargs):
        raise AssertionError("datasets.load_dataset must not be called for a mistyped folder")

    monkeypatch.setattr(HfApi, "dataset_info", offline)
    monkeypatch.setattr(datasets, "load_dataset", loader)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return calls


@pytest.mark.parametrize("args", [
    ["collect", "--env", "envscaler", "--store", "store"],
    ["evaluate", "--bench", "livecodebench", "--out", "report.json"],
])
def test_relative_missing_data_dir_fails_fast(tmp_path, monkeypatch, no_hub, args):
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    res = runner.invoke(app, [*args, "--data-dir", "no_such/dir"])
    assert time.perf_counter() - start < 5
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = error_lines(res.output)
    assert len(lines) == 1 and "--data-dir no_such/dir: no such file or folder" in lines[0], res.output
    assert str(tmp_path) in lines[0]
    assert no_hub == [("no_such/dir", 5)]  # one lookup with a timeout, no retries
    assert not (tmp_path / "store").exists() and not (tmp_path / "report.json").exists()


def test_hub_dataset_id_lookup(monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    from stages.core.data.inputs import hub_dataset_id

    def missing(self, repo_id, **kwargs):
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
        Exception.__init__(err, "404")
        raise err

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(HfApi, "dataset_info", missing)
    with pytest.raises(ValueError, match="no Hugging Face dataset of that name"):
        hub_dataset_id("no_such/dir")
    with pytest.raises(ValueError, match=r"^--data-dir \./x/y: no such file or folder"):
        hub_dataset_id("./x/y")  # a path, never an id
    monkeypatch.setattr(HfApi, "dataset_info", lambda self, repo_id, **kw: object())
    assert hub_dataset_id("owner/name") == "owner/name"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(HfApi, "dataset_info", missing)
    assert hub_dataset_id("owner/name") == "owner/name"  # offline: the loader's cache decides
