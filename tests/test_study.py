"""`lopd study` end to end on the tiny model: vanilla + LOPD + GRPO (two seeds) trained on the toy
environment of tests/test_distill.py and evaluated on 4 held-out BFCL single-turn tasks; a study
killed with SIGKILL in the middle of a run resumes to the same results as one never killed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.study import recipe as study
from stages.envs import make_env
from stages.envs.bfcl import is_heldout
from tests.test_coldstart import one_thread  # noqa: F401 (fixture: bit-exact runs need one thread in and out of process)
from tests.test_distill import ENV, _hash_embedder, assets  # noqa: F401 (fixtures; registers the toy env)

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
DRIVER = """
import sys
sys.path.insert(0, {root!r})
import stages.distill.recipe as d
from tests.test_distill import HashEmbedder
d.load_embedder = lambda name=None, **kw: HashEmbedder()
from stages.study import recipe as study
from stages.study.layout import load_study
study.run_study(load_study(sys.argv[1]))
"""


SFT_RUNS = """
[[runs]]
name = "sft"
method = "sft"

[[runs]]
name = "rft"
method = "rft"
settings = {lr = 1e-3}
"""


def write_study(assets, folder: Path, results: Path | None = None, sft: bool = False, **extra_grpo) -> Path:
    model_dir, composer_dir, store = assets
    text = f"""
out = "{folder / 'study'}"
{f'results = "{results}"' if results else ""}
env = "{ENV}"
store = "{store}"
composer = "{composer_dir}"
bench = "bfcl-single"
eval_limit = 4
eval_every = 4
eval_max_new_tokens = 8

[[final_evals]]
bench = "bfcl-single"
limit = 3
max_new_tokens = 8

[distill]
model = "{model_dir}"
steps = 2
tasks_per_step = 2
group_size = 2
max_new_tokens = 8
temperature = 1.0
lr = 1e-2
student_lora_rank = 4
micro_batch = 2
max_len = 256

[[runs]]
name = "vanilla"
method = "vanilla"

[[runs]]
name = "lopd"
method = "lopd"
settings = {{J = 2, K = 4, M = 5}}

[[runs]]
name = "grpo"
method = "grpo"
seeds = [0, 1]
settings = {{{", ".join(f"{k} = {json.dumps(v)}" for k, v in extra_grpo.items())}}}
{SFT_RUNS if sft else ""}"""
    path = folder / "study.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def straight(assets, tmp_path_factory):
    folder = tmp_path_factory.mktemp("study-straight")
    result = runner.invoke(app, ["study", "--config", str(write_study(assets, folder))])
    assert result.exit_code == 0, result.output
    return folder / "study"


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def test_study_writes_results_table_and_plots(straight):
    results = _results(straight)
    gens = {(e["run"], e["seed"]): [] for e in results["evaluations"]}
    for e in results["evaluations"]:
        gens[(e["run"], e["seed"])].append(e["generations"])
    assert gens == {("vanilla", 0): [0], ("lopd", 0): [0, 4, 8], ("grpo", 0): [0, 4, 8], ("grpo", 1): [0, 4, 8]}
    assert all(e["tasks"] == 4 and 0.0 <= e["accuracy"] <= 1.0 for e in results["evaluations"])
    assert all(e["reference_nll"] > 0 for e in results["evaluations"])  # a random tiny model: far from 0
    trained = {(e["run"], e["seed"]): e["reference_nll"] for e in results["evaluations"] if e["generations"] == 8}
    assert len(set(trained.values())) == 3  # each run's own student was scored, not the base model
    assert results["budget"] == "2 steps x 4 rollouts = 8 generations"
    # the held-out split is written down and never overlaps training
    split = results["split"]
    train_ids = {t.task_id for t in make_env("bfcl").tasks("train")}
    assert len(split["tasks"]) == 4 and all(is_heldout(t) and t not in train_ids for t in split["tasks"])
    assert "sha256" in split["rule"]
    # training rows: every step of every (run, seed), LOPD's with its Delta and beta
    steps = sorted((t["run"], t["seed"], t["step"]) for t in results["training"])
    assert steps == sorted((r, s, k) for r, s in (("lopd", 0), ("grpo", 0), ("grpo", 1)) for k in (1, 2))
    assert all("beta" in t for t in results["training"] if t["run"] == "lopd")
    rows = {r["run"]: r for r in results["table"]}
    assert rows["grpo"]["seeds"] == [0, 1] and rows["grpo"]["score_sd"] is not None
    assert rows["lopd"]["score_sd"] is None and rows["vanilla"]["generations"] == 0
    table = (straight / "table.md").read_text()
    assert all(f"| {name} | " in table for name in ("vanilla", "lopd", "grpo"))
    csv_lines = (straight / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(results["evaluations"]) and csv_lines[0].startswith("run,method,seed,generations")
    assert "held-out reference NLL" in table and "NLL vs vanilla (paired" in table
    for name in ("lopd", "grpo"):  # the paired mean of per-task changes = the change of the means
        assert rows[name]["reference_nll_delta"] == pytest.approx(
            rows[name]["reference_nll"] - rows["vanilla"]["reference_nll"], abs=1e-9)
        assert rows[name]["reference_nll_delta_se"] > 0 and 0 <= rows[name]["reference_nll_lower"] <= 1
    assert "## lopd-seed0" in (straight / "report" / "summary.md").read_text()  # lopd report of the runs
    # in-run evaluations use a prefix cache, as the base model's does: reference_nll reuses the prompts
    for path in straight.glob("runs/*/evals/gen-*.json"):
        report = json.loads(path.read_text())
        assert report["prompt_tokens_cached"] > 0, path
    for png in ("heldout.png", "heldout_nll.png", "train_reward.png", "lopd_dual.png"):
        assert (straight / png).read_bytes()[:4] == b"\x89PNG"


def test_final_evaluations_score_every_student_and_the_base_model_paired(straight):
    """``final_evals``: the base model and each finished student scored once more (here 3 BFCL
    tasks), one row per entry with mean ± SE over tasks and the paired difference to vanilla."""
    results = _results(straight)
    assert sorted(results["base_finals"]) == ["bfcl-single"]
    base = results["base_finals"]["bfcl-single"]["per_task"]
    assert len(base) == 3 and (straight / "vanilla" / "final-bfcl-single.json").is_file()
    for name in ("lopd-seed0", "grpo-seed0", "grpo-seed1"):
        tasks = results["finished"][name]["finals"]["bfcl-single"]["per_task"]
        assert [t["task_id"] for t in tasks] == [t["task_id"] for t in base]
        assert (straight / "runs" / name / "evals" / "final-bfcl-single.json").is_file()
    rows = {r["run"]: r for r in results["final_table"]}
    assert sorted(rows) == ["grpo", "lopd", "vanilla"] and rows["grpo"]["seeds"] == 2
    assert "reward_delta" not in rows["vanilla"]
    for name, seeds in (("lopd", ["lopd-seed0"]), ("grpo", ["grpo-seed0", "grpo-seed1"])):
        per_task = [[float(t["reward"]) for t in results["finished"][s]["finals"]["bfcl-single"]["per_task"]]
                    for s in seeds]
        means = [sum(col) / len(col) for col in zip(*per_task)]  # each task over the seeds
        assert rows[name]["reward"] == pytest.approx(sum(means) / 3)
        assert rows[name]["reward_delta"] == pytest.approx(rows[name]["reward"] - rows["vanilla"]["reward"])
        assert rows[name]["reward_higher"] + rows[name]["reward_lower"] <= 3
    # grpo paired against the first lopd entry: per task, grpo's success (over its seeds) minus lopd's
    lopd_success = {t["task_id"]: float(t["success"])
                    for t in results["finished"]["lopd-seed0"]["finals"]["bfcl-single"]["per_task"]}
    grpo_success = [[float(t["success"]) for t in results["finished"][s]["finals"]["bfcl-single"]["per_task"]]
                    for s in ("grpo-seed0", "grpo-seed1")]
    ids = [t["task_id"] for t in base]
    diffs = [sum(col) / 2 - lopd_success[task] for task, col in zip(ids, zip(*grpo_success))]
    assert rows["grpo"]["lopd_run"] == "lopd" and rows["grpo"]["success_vs_lopd"] == pytest.approx(sum(diffs) / 3)
    assert rows["grpo"]["success_vs_lopd_higher"] == sum(d > 0 for d in diffs)
    assert "success_vs_lopd" not in rows["lopd"] and "success_vs_lopd" not in rows["vanilla"]
    table = (straight / "table.md").read_text()
    assert "### bfcl-single (3 tasks)" in table and "| grpo | grpo | 2 | " in table
    assert "Δ success vs lopd (paired) |" in table


def test_rerun_reuses_everything(straight, assets):
    folder = straight.parent
    before = {p: p.stat().st_mtime_ns for p in straight.glob("runs/*/evals/*.json")}
    result = runner.invoke(app, ["study", "--config", str(folder / "study.toml")])
    assert result.exit_code == 0, result.output
    assert "finished earlier, reused" in result.output and "steps 1..2" not in result.output
    assert {p: p.stat().st_mtime_ns for p in straight.glob("runs/*/evals/*.json")} == before


def test_report_only_shows_unfinished_seeds_as_pending(straight, tmp_path):
    copy = tmp_path / "study"
    shutil.copytree(straight, copy)
    (copy / "runs" / "grpo-seed1" / "done.json").unlink()
    config = straight.parent / "study.toml"
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(copy), "--report-only"])
    assert result.exit_code == 0, result.output
    rows = {r["run"]: r for r in _results(copy)["table"]}
    assert rows["grpo"]["seeds"] == [0] and rows["grpo"]["pending"] == [1] and rows["grpo"]["score_sd"] is None
    assert "| grpo | grpo | 1 (+1 pending) |" in (copy / "table.md").read_text()
    empty = tmp_path / "empty"
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(empty), "--report-only"])
    assert result.exit_code == 2 and "no study results yet" in result.output


def test_only_trains_the_named_runs_and_names_unknown_ones(straight, tmp_path):
    copy = tmp_path / "study"
    shutil.copytree(straight, copy)
    (copy / "runs" / "grpo-seed1" / "done.json").unlink()  # grpo seed 1 unfinished
    config = straight.parent / "study.toml"
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(copy), "--only", "lopd"])
    assert result.exit_code == 0, result.output
    assert "lopd seed 0 finished earlier, reused" in result.output and "grpo" not in result.output.split("|")[0]
    assert not (copy / "runs" / "grpo-seed1" / "done.json").exists()  # left as it was
    assert _results(copy)["table"][2]["pending"] == [1]
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(copy), "--only", "nosuch"])
    assert result.exit_code == 2 and "--only nosuch: no such run in the study (runs: vanilla, lopd, grpo)" in result.output
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(copy), "--only", "grpo:0"])
    assert result.exit_code == 0 and "grpo seed 0 finished earlier, reused" in result.output
    assert "seed 1" not in result.output and not (copy / "runs" / "grpo-seed1" / "done.json").exists()
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(copy), "--only", "grpo:7"])
    assert result.exit_code == 2 and "--only grpo:7: run grpo has seeds 0, 1" in result.output


def test_killed_study_resumes_to_the_same_results(straight, assets, tmp_path):
    config = write_study(assets, tmp_path)
    out = tmp_path / "study"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=str(ROOT)), str(config)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    metrics = out / "runs" / "grpo-seed0" / "train" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.is_file() and metrics.read_text().strip():  # lopd done, grpo seed 0 mid-run
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (out / "results.json").exists()
    result = runner.invoke(app, ["study", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "lopd seed 0 finished earlier, reused" in result.output
    mine, theirs = _results(out), _results(straight)
    assert mine["evaluations"] == theirs["evaluations"]
    assert mine["training"] == theirs["training"] and mine["table"] == theirs["table"]


def test_results_folder_continues_a_study_without_its_out_folder(straight, assets, tmp_path):
    """The finished runs copied into ``results`` (a folder kept in the repository) are reused by a
    study whose ``out`` is gone: nothing retrains, the results are the same; a run missing there
    is trained again and ends as the straight run did."""
    shutil.copytree(straight, tmp_path / "study")
    committed = tmp_path / "committed"
    config = write_study(assets, tmp_path, results=committed)
    result = runner.invoke(app, ["study", "--config", str(config)])  # all finished: only copies
    assert result.exit_code == 0, result.output
    saved = _results(committed)
    assert sorted(saved["finished"]) == ["grpo-seed0", "grpo-seed1", "lopd-seed0"]
    assert saved["base_report"]["per_task"] and (committed / "table.md").read_text() == (straight / "table.md").read_text()
    for label in saved["finished"]:  # the training logs are kept, and the report drawn from them
        kept = committed / "training" / label / "train" / "metrics.jsonl"
        assert kept.read_text() == (straight / "runs" / label / "train" / "metrics.jsonl").read_text()
    summary = (committed / "report" / "summary.md").read_text()
    assert [line for line in summary.splitlines() if line.startswith("## ") and "seed" in line] == [
        "## grpo-seed0", "## grpo-seed1", "## lopd-seed0"]
    assert (committed / "report" / "loss.png").is_file()

    fresh = tmp_path / "machine2"
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(fresh)])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())  # rich wraps long lines
    assert f"base model's evaluation reused from {committed}" in flat
    assert flat.count(f"finished earlier, reused from {committed}") == 3
    assert not (fresh / "runs").exists()  # nothing trained or evaluated
    assert "## lopd-seed0" in (committed / "report" / "summary.md").read_text()  # redrawn from the kept logs
    mine, theirs = _results(fresh), _results(straight)
    assert mine["evaluations"] == theirs["evaluations"] and mine["training"] == theirs["training"]
    assert mine["table"] == theirs["table"]  # the paired NLL too, from the kept per-task rows
    assert mine["final_table"] == theirs["final_table"] and (fresh / "vanilla" / "final-bfcl-single.json").is_file()

    partial = _results(committed)
    del partial["finished"]["grpo-seed1"]
    (committed / "results.json").write_text(json.dumps(partial))
    again = tmp_path / "machine3"
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(again)])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (again / "runs").iterdir()] == ["grpo-seed1"]  # only the missing run trained
    mine = _results(again)
    assert mine["evaluations"] == theirs["evaluations"] and mine["table"] == theirs["table"]
    assert sorted(_results(committed)["finished"]) == ["grpo-seed0", "grpo-seed1", "lopd-seed0"]

    other = _results(committed)
    other["settings"]["eval_limit"] = 5
    (committed / "results.json").write_text(json.dumps(other))
    result = runner.invoke(app, ["study", "--config", str(config), "--out", str(tmp_path / "machine4")])
    assert result.exit_code == 2 and "written by a study with other settings (eval_limit differ)" in result.output
