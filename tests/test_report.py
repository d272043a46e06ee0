"""`lopd report`: plots and summary of run folders from their metrics.jsonl and evaluate reports."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from lopd_cli.main import app

runner = CliRunner()


def _write(folder, rows, tail=""):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def _distill_rows(scale):
    return [{"step": s, "generations": 4 * s, "reward_mean": 0.1 * s * scale, "reverse_kl": 1.0 / s, "Delta": 0.2 * s,
             "beta": 0.0, "grad_norm_student": 0.5, "seconds": 10.0 + s, "peak_rss_mb": 900.0} for s in (1, 2, 3)]


def test_report_overlays_runs_of_a_study_folder_and_summarises(tmp_path):
    study = tmp_path / "study"
    _write(study / "runs" / "lopd-seed0" / "train", _distill_rows(1.0))
    # a killed run's half-written last line costs that row only
    _write(study / "runs" / "grpo-seed0" / "train", [{"step": 1, "generations": 4, "reward_mean": 0.5, "pg_loss": 0.25}],
           tail='{"step": 2, "generations": 8, "rew')
    (study / "runs" / "lopd-seed0" / "evals").mkdir()
    (study / "runs" / "lopd-seed0" / "evals" / "gen-12.json").write_text(
        json.dumps({"bench": "bfcl-single", "scores": {"accuracy": 0.25}, "behaviour": {}}))
    result = runner.invoke(app, ["report", str(study)])
    assert result.exit_code == 0, result.output
    out = study / "report"
    assert "grpo-seed0" in result.output and str(out) in result.output.replace("\n", "")
    for png in ("reward.png", "loss.png", "dual.png", "grad_norms.png", "seconds.png", "memory.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG", png
    assert not (out / "anchor.png").exists()  # no run logged an anchor
    text = (out / "summary.md").read_text()
    assert "## lopd-seed0" in text and "| reward_mean | 0.1 | 0.3 | 0.1 | 0.3 |" in text
    assert "## grpo-seed0" in text and "1 steps (last: 1)" in text
    assert "| bfcl-single | accuracy 0.250 |" in text
    assert "line 2: not a metrics row" in result.output


def test_report_of_two_folders_labels_by_folder_and_goes_to_out(tmp_path):
    _write(tmp_path / "a", _distill_rows(1.0))
    _write(tmp_path / "b", [{"step": 1, "loss": 2.0, "nll": 2.0, "grad_norm": 3.0, "seconds": 1.0}])  # a coldstart run
    result = runner.invoke(app, ["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r" / "summary.md").read_text()
    assert "## a" in text and "## b" in text and "| nll | 2 | 2 | 2 | 2 |" in text


def test_report_errors_are_one_line(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such run folder" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no metrics.jsonl under" in result.output
    assert not (tmp_path / "empty" / "report").exists()
