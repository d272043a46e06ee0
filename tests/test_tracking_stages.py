"""`--log tensorboard|wandb` on `lopd coldstart` and `lopd sft` (the one logger of distill,
:mod:`stages.core.run.tracking`): every metrics row reaches TensorBoard as ``<stage>/<metric>``
scalars that TensorBoard's own reader reads back; a missing logger package is one line naming
the extra, before any run folder is made; a resumed run may switch the logger."""
from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.core.data.store import ExperienceStore
from stages import sft
from stages.coldstart.settings import ColdstartConfig
from stages.sft import SftConfig
from tests.test_coldstart import cfg as coldstart_cfg
from tests.test_coldstart import metrics, one_thread, run, store_path, tiny_dir  # noqa: F401 (fixtures)
from tests.test_sft import cfg as sft_cfg
from tests.test_sft import store_path as sft_store  # noqa: F401 (fixture)


def _scalars(folder, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_coldstart_logs_every_step_to_tensorboard(tmp_path, store_path, tiny_dir):
    run(coldstart_cfg(tmp_path, store_path, tiny_dir, steps=3, ladder=False, log="tensorboard"))
    rows = metrics(tmp_path / "out")
    logged = _scalars(tmp_path / "out", "coldstart/loss")
    assert [s for s, _ in logged] == [1, 2, 3]
    assert [v for _, v in logged] == pytest.approx([r["loss"] for r in rows])
    assert _scalars(tmp_path / "out", "coldstart/heldout_nll")[-1][1] == pytest.approx(rows[-1]["heldout_nll"])


def test_sft_logs_every_step_and_a_resume_may_switch_the_logger(tmp_path, sft_store, tiny_dir):
    sft.run(sft_cfg(tmp_path, sft_store, tiny_dir, steps=2))
    sft.run(sft_cfg(tmp_path, sft_store, tiny_dir, steps=4, resume=True, log="tensorboard"))
    rows = metrics(tmp_path / "out")
    logged = _scalars(tmp_path / "out", "sft/nll")
    assert [s for s, _ in logged] == [3, 4]  # the steps run with the logger on
    assert [v for _, v in logged] == pytest.approx([r["nll"] for r in rows[2:]])


@pytest.mark.parametrize("command", ["coldstart", "sft"])
def test_a_missing_logger_package_is_one_line_before_any_run_folder(tmp_path, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "wandb", None)
    out = tmp_path / "run"
    ExperienceStore.open(tmp_path / "store")  # an empty store: the logger is refused before the rows are read
    store = "--experiences" if command == "coldstart" else "--store"
    result = CliRunner().invoke(app, [command, store, str(tmp_path / "store"), "--out", str(out), "--log", "wandb"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["error: --log wandb needs the `wandb` package: pip install -e '.[wandb]' (or --log none; "
                     "metrics.jsonl is written either way)"]
    assert not out.exists()


@pytest.mark.parametrize("config_cls", [ColdstartConfig, SftConfig])
def test_an_unknown_logger_is_refused_by_the_settings(config_cls):
    required = {"experiences": "s", "out": "o"} if config_cls is ColdstartConfig else {"store": "s"}
    with pytest.raises(ValueError, match="tensorboard"):
        config_cls(**required, log="mlflow")
