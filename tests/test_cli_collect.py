"""`lopd collect` end to end through the CLI, with a tiny in-process model and real environments."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.core.data.store import ExperienceStore
from tests.tiny import save_tiny

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("tiny")))


def _collect(tiny_dir, store, *extra):
    args = ["collect", "--env", "envscaler", "--model", tiny_dir, "--store", str(store),
            "--limit", "2", "--max-new-tokens", "8", "--max-steps", "2", "--temperature", "0", *extra]
    return runner.invoke(app, args)


def test_collect_writes_scored_trajectories_and_resumes(tiny_dir, tmp_path):
    store = tmp_path / "store"
    res = _collect(tiny_dir, store, "--samples-per-task", "2")
    assert res.exit_code == 0, res.output
    rows = ExperienceStore.open(store).query()
    assert len(rows) == 4 and len({r.task_id for r in rows}) == 2
    for r in rows:
        assert 0.0 <= r.reward <= 1.0 and r.env == "envscaler" and r.split == "train"
        assert r.num_steps == len(r.turns) >= 1 and r.policy == tiny_dir
        assert "checks" in json.loads(r.info) and r.run_id.startswith("collect-")
    assert "mean reward" in res.output
    manifests = list((store / "runs").glob("*.json"))
    assert len(manifests) == 1 and json.loads(manifests[0].read_text())["stage"] == "collect"
    # which data it read, printed and recorded: here the bundled fixtures, labelled as such
    assert "bundled test fixtures" in json.loads(manifests[0].read_text())["data"]
    assert "data: " in res.output

    again = _collect(tiny_dir, store, "--samples-per-task", "2")
    assert again.exit_code == 2 and "--resume" in again.output
    resumed = _collect(tiny_dir, store, "--samples-per-task", "2", "--resume", "--limit", "3")
    assert resumed.exit_code == 0, resumed.output
    assert ExperienceStore.open(store).count() == 6  # only the third task was played


def test_collect_errors_are_one_line(tiny_dir, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    res = _collect(tiny_dir, a_file)
    assert res.exit_code == 2 and "is a file" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["collect", "--env", "nope", "--store", str(tmp_path / "s")])
    assert res.exit_code == 2 and "unknown --env 'nope'" in res.output
    assert not (tmp_path / "s").exists()  # nothing is created for a run that cannot start
    res = _collect(tiny_dir, tmp_path / "s2", "--data-dir", str(tmp_path / "missing"))
    assert res.exit_code == 2 and "missing" in res.output


def test_turn_cap_is_max_turns_and_accepts_max_steps():
    from stages.collect import CollectConfig

    assert CollectConfig(env="envscaler", store="s").max_turns == 30
    assert CollectConfig(env="envscaler", store="s", max_turns=3).max_turns == 3
    assert CollectConfig(env="envscaler", store="s", max_steps=2).max_turns == 2  # the former name
    with pytest.raises(ValueError):
        CollectConfig(env="envscaler", store="s", max_turns=0)


def test_ctrl_c_says_interrupted_and_how_to_continue(monkeypatch, tmp_path):
    """Ctrl-C (KeyboardInterrupt) exits 130 with one line; a command with --resume adds how to
    continue, in that flag's own words."""
    from stages import collect, index

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(collect, "run", interrupted)
    monkeypatch.setattr(index, "run", interrupted)
    res = runner.invoke(app, ["collect", "--env", "envscaler", "--store", str(tmp_path / "s")])
    assert res.exit_code == 130
    assert res.output.strip() == ("interrupted: rerun the same command with --resume to continue "
                                  "(skip tasks this run already stored)")
    res = runner.invoke(app, ["index", "--store", str(tmp_path / "s")])
    assert res.exit_code == 130 and res.output.strip() == "interrupted"


def test_ctrl_c_of_an_evaluation_gives_its_resume_flags_first_sentence_whole(monkeypatch):
    """The hint is the --resume help's first sentence without its asides (was cut at the first
    bracket: "... (continue an interrupted evaluation: the tasks finished before)")."""
    from stages import evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "run", interrupted)
    res = runner.invoke(app, ["evaluate", "--bench", "bfcl-single"])
    assert res.exit_code == 130
    assert " ".join(res.output.split()) == ("interrupted: rerun the same command with --resume to continue "
                                            "(continue an interrupted evaluation: the tasks finished before "
                                            "are not played again)")


def test_tables_in_a_log_file_are_not_wrapped_at_80_columns(monkeypatch):
    """Output that is not a terminal (a log file, CliRunner) gets 200 columns unless COLUMNS is set:
    rich's default of 80 split the compare table's cells mid-line."""
    monkeypatch.delenv("COLUMNS", raising=False)
    reports = [f"docs/results/bed-v2/eval/lopd-bed-{who}.json" for who in ("base", "sft0")]
    res = runner.invoke(app, ["evaluate", "--compare", *reports])
    assert res.exit_code == 0, res.output
    assert "+0.100 ± 0.056 (3 higher / 0 lower, n 30)" in res.output
