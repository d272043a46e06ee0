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
    assert "| bfcl-single | - | - | accuracy 0.250 |" in text
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


def _eval_report(path, model, accuracy):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bench": "lopd-bed", "model": str(model), "scores": {"mean_reward": accuracy},
                                "behaviour": {}, "per_task": [{"task_id": "a"}, {"task_id": "b"}]}))


def test_a_folder_of_evaluation_reports_alone_is_summarised(tmp_path):
    _eval_report(tmp_path / "eval" / "base.json", "smollm2-135m", 0.25)
    _eval_report(tmp_path / "eval" / "student.json", "runs/x/final/student", 0.5)
    result = runner.invoke(app, ["report", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "eval" / "report" / "summary.md").read_text()
    assert "| lopd-bed | smollm2-135m | 2 | mean_reward 0.250 |" in text
    assert "| lopd-bed | runs/x/final/student | 2 | mean_reward 0.500 |" in text
    assert not list((tmp_path / "eval" / "report").glob("*.png"))


def test_a_run_reports_its_evaluations_beside_it_and_report_files_given(tmp_path):
    _write(tmp_path / "runs" / "lopd", _distill_rows(1.0))
    (tmp_path / "runs" / "lopd" / "final" / "student").mkdir(parents=True)
    _eval_report(tmp_path / "runs" / "eval" / "mine.json", tmp_path / "runs" / "lopd" / "final" / "student", 0.5)
    _eval_report(tmp_path / "runs" / "eval" / "other.json", tmp_path / "runs" / "other", 0.75)
    _eval_report(tmp_path / "kept" / "base.json", "smollm2-135m", 0.125)
    result = runner.invoke(app, ["report", str(tmp_path / "runs" / "lopd"), str(tmp_path / "kept" / "base.json")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "runs" / "lopd" / "report" / "summary.md").read_text()
    assert "mean_reward 0.500" in text and "mean_reward 0.125" in text and "mean_reward 0.750" not in text
    assert "## lopd" in text and (tmp_path / "runs" / "lopd" / "report" / "reward.png").is_file()
    (tmp_path / "notes.json").write_text("{}")
    result = runner.invoke(app, ["report", str(tmp_path / "runs" / "lopd"), str(tmp_path / "notes.json")])
    assert result.exit_code == 2 and "notes.json: not an evaluation report" in result.output
