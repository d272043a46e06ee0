"""Study files (budgets, errors, growth, the example studies), `lopd study --report-only` on
committed results folders, and a study's SFT and RFT entries (the study helpers: tests/test_study.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lopd_cli.main import app
from stages.study import recipe as study
from stages.study.layout import load_study
from tests.test_coldstart import one_thread  # noqa: F401 (fixture: bit-exact runs need one thread in and out of process)
from tests.test_distill import ENV, _hash_embedder, assets  # noqa: F401 (fixtures; registers the toy env)
from tests.test_study import ROOT, SFT_RUNS, _results, runner, write_study


def test_unequal_budgets_and_unknown_options_are_one_line_errors(assets, tmp_path):
    result = runner.invoke(app, ["study", "--config", str(write_study(assets, tmp_path, steps=3))])
    assert result.exit_code == 2
    assert "share the rollout budget" in result.output and "grpo: 3 steps x 4 rollouts" in result.output
    result = runner.invoke(app, ["study", "--config", str(write_study(assets, tmp_path, margin=0.1))])
    assert result.exit_code == 2 and "study run 'grpo'" in result.output and "margin" in result.output
    assert not (tmp_path / "study" / "study.json").exists()  # nothing was started


def test_study_file_errors_name_the_field(tmp_path):
    bad = tmp_path / "s.toml"
    bad.write_text('store = "x"\nruns = [{name = "a b"}]\n')
    with pytest.raises(ValueError, match=r"s.toml: field runs.0.name"):
        load_study(bad)


def test_a_study_may_grow_but_not_change_a_run():
    """Comparing a study's saved settings with the current ones: runs are matched by name, so an
    added or dropped entry or other seeds keep the finished runs valid; another method or settings
    of a named run, or another shared setting, do not. A setting the saved file lacks (written
    before it existed) counts as its default."""
    from stages.study.layout import StudyConfig, changed_settings

    def settings(**extra):
        base = {"store": "s", "runs": [{"name": "vanilla", "method": "vanilla"}, {"name": "lopd", "settings": {"J": 2}}]}
        return json.loads(StudyConfig.model_validate({**base, **extra}).model_dump_json())

    saved = settings()
    grown = settings(seeds=[0, 1], runs=saved["runs"] + [{"name": "grpo", "method": "grpo", "seeds": [3]}])
    assert changed_settings(saved, grown) == []
    assert changed_settings(saved, settings(runs=saved["runs"][:1])) == []
    assert changed_settings(saved, settings(runs=[saved["runs"][0], {"name": "lopd", "settings": {"J": 3}}])) == ["runs.lopd"]
    assert changed_settings(saved, settings(eval_limit=50)) == ["eval_limit"]
    older = {k: v for k, v in saved.items() if k != "final_evals"}
    assert changed_settings(older, saved) == []
    assert changed_settings(older, settings(final_evals=[{"bench": "lopd-bed"}])) == ["final_evals"]
    with pytest.raises(ValueError, match="unknown bench 'nosuch'"):
        StudyConfig.model_validate({**saved, "final_evals": [{"bench": "nosuch"}]})


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "examples" / "study").glob("*.toml")),
                         ids=lambda p: p.name)
def test_example_study_files_are_valid_at_equal_budget(path):
    """Every shipped study file loads, gives each run the same rollout budget, and every run's
    settings are valid distill settings for its method (an unknown option would fail here)."""
    from stages.study.recipe import check_budget, distill_config

    from stages.study.sft import SFT_METHODS, sft_config

    config = load_study(path)
    steps, per_step = check_budget(config)
    assert steps * per_step >= 1
    trained = [(run, seed) for run in config.runs if run.method != "vanilla" for seed in config.seeds_of(run)]
    assert trained and all(distill_config(config, run, seed).steps == steps for run, seed in trained
                           if run.method not in SFT_METHODS)
    for run, seed in trained:
        if run.method in SFT_METHODS:  # as many sequences as a distill run's rollouts
            settings = sft_config(config, run, seed, steps, per_step)
            assert settings.steps * settings.batch_size == steps * per_step


def test_noise_line_and_wall_time_read_as_numbers():
    from stages.study.report import noise_line, wall_time

    assert noise_line(0.0, 100) == ("The base model solves 0 of 100: a true rate up to 3/100 = 0.030 is "
                                    "consistent with that (95%, rule of three).")
    assert "failure rate up to 3/4 = 0.750" in noise_line(1.0, 4)
    assert "3/2" not in noise_line(0.0, 2) and "too few" in noise_line(0.0, 2)  # 3/2 > 1 bounds nothing
    assert noise_line(0.5, 4) == "One evaluation's binomial standard error at the base model's score: ±0.250."
    assert (wall_time(12.4), wall_time(59.9), wall_time(60), wall_time(12360)) == ("12 s", "60 s", "1.0 min", "206.0 min")


def test_report_only_redraws_a_committed_results_folder_from_results_json(tmp_path):
    from stages.study.report import curves, finished_only, lopd_margins

    copy = tmp_path / "bfcl-cpu"
    shutil.copytree(ROOT / "docs" / "results" / "bfcl-cpu", copy)
    toml = "\n".join(line for line in (copy / "study.toml").read_text().splitlines()
                     if not line.startswith("results ="))  # the copy is the results folder, redrawn as --out
    (copy / "study.toml").write_text(toml)
    for png in copy.glob("*.png"):
        png.unlink()
    saved = json.loads((copy / "results.json").read_text())  # skill-sd as it stood before it ran: pending
    saved["table"] = [{"run": r["run"], "method": r["method"], "seeds": [], "pending": [0]} if r["run"] == "skill-sd"
                      else r for r in saved["table"]]
    (copy / "results.json").write_text(json.dumps(saved))
    result = runner.invoke(app, ["study", "--config", str(copy / "study.toml"), "--out", str(copy), "--report-only"])
    assert result.exit_code == 0, result.output
    assert not (copy / "runs").exists() and not (copy / "vanilla").exists() and not (copy / "study.json").exists()
    table = (copy / "table.md").read_text()
    assert "(min..max) [the evaluation's standard error over tasks" in table
    assert "(min..max) [the evaluation's standard error over tasks" in result.output  # printed as written, not as markup
    assert "solves 0 of 100: a true rate up to 3/100 = 0.030" in table and "Wall time of the finished parts: 225.0 min." in table
    assert "| skill-sd | skill-sd | 0 | - | pending (seeds [0]) |" in table
    for png in ("heldout.png", "heldout_nll.png", "train_reward.png", "lopd_dual.png"):
        assert (copy / png).read_bytes()[:4] == b"\x89PNG"
    results = _results(copy)
    assert results["plots"] == ["heldout.png", "train_reward.png", "heldout_nll.png", "lopd_dual.png"]
    # what is drawn: finished runs only (the pending skill-sd is in no plot or legend), vanilla one value
    drawn = curves(finished_only(results["evaluations"], results["table"]), "generations", "reference_nll")
    assert list(drawn) == ["vanilla", "lopd", "grpo", "opsd", "sdft", "sdpo"]
    assert [p[0] for p in drawn["vanilla"]] == [0] and [p[0] for p in drawn["lopd"]] == [0, 16]
    lopd_final = drawn["lopd"][-1]
    assert lopd_final[2] <= lopd_final[1] <= lopd_final[3]  # mean within the min..max band of the 2 seeds
    assert lopd_margins(load_study(copy / "study.toml")) == {"lopd": 0.05}  # the Delta panel's dashed line
    other = tmp_path / "other.toml"  # a study file of other settings is refused in one line
    other.write_text((copy / "study.toml").read_text().replace("eval_limit = 100", "eval_limit = 50"))
    result = runner.invoke(app, ["study", "--config", str(other), "--out", str(copy), "--report-only"])
    assert result.exit_code == 2 and "eval_limit differ" in result.output


def test_sft_and_rft_entries_train_at_the_study_budget_and_are_evaluated_inside(assets, tmp_path):
    """``sft`` fine-tunes on the train references of its store copy, ``rft`` first plays the
    train tasks (the generation budget: 2 steps x 2 tasks x 2 samples) and fine-tunes on the
    successes of that collect; both as many sequences per step as a distill run's rollouts,
    evaluated every ``eval_every`` sequences and finally, rows in the table."""
    from stages.core.data.store import ExperienceStore

    model_dir, _, seed_store = assets
    store = tmp_path / "store"
    rows = ExperienceStore.open(seed_store, create=False).query()
    ExperienceStore.open(store).append([t.model_copy(update={"policy": "reference"}) for t in rows])
    config = tmp_path / "study.toml"
    config.write_text(f"""
out = "{tmp_path / 'study'}"
results = "{tmp_path / 'committed'}"
env = "{ENV}"
store = "{store}"
bench = "bfcl-single"
eval_limit = 2
eval_every = 4
eval_max_new_tokens = 4

[[final_evals]]
bench = "bfcl-single"
limit = 2
max_new_tokens = 4

[distill]
model = "{model_dir}"
steps = 2
tasks_per_step = 2
group_size = 2
max_new_tokens = 8
temperature = 1.0
lr = 1e-3
student_lora_rank = 4
max_len = 256
{SFT_RUNS}
[[runs]]
name = "vanilla"
method = "vanilla"
""")
    result = runner.invoke(app, ["study", "--config", str(config)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "study"
    results = _results(out)
    gens = sorted((e["run"], e["generations"]) for e in results["evaluations"])
    assert gens == [("rft", 0), ("rft", 4), ("rft", 8), ("sft", 0), ("sft", 4), ("sft", 8), ("vanilla", 0)]
    sft_run = json.loads((out / "runs" / "sft-seed0" / "train" / "config.json").read_text())
    assert (sft_run["source"], sft_run["steps"], sft_run["batch_size"], sft_run["lora_rank"], sft_run["lr"]) == (
        "reference", 2, 4, 4, 1e-3)
    rft_run = json.loads((out / "runs" / "rft-seed0" / "train" / "config.json").read_text())
    assert (rft_run["source"], rft_run["from_run"], rft_run["lr"]) == ("student", "study-rft-seed0-collect", 1e-3)
    played = ExperienceStore.open(out / "runs" / "rft-seed0" / "store", create=False)
    assert played.count(run_id="study-rft-seed0-collect") == 8  # 2 x 2 tasks, 2 samples each
    assert played.count(run_id="study-rft-seed0-collect", success=True) >= 1
    rows = {r["run"]: r for r in results["table"]}
    assert rows["sft"]["generations"] == 8 and rows["sft"]["train_reward"] is None
    assert not [t for t in results["training"] if t["run"] in ("sft", "rft")]
    assert sorted(r["run"] for r in results["final_table"]) == ["rft", "sft", "vanilla"]
    # no distill run, no training reward: the results folder gets what was drawn
    assert results["plots"] == ["heldout.png", "heldout_nll.png"] and (tmp_path / "committed" / "heldout.png").is_file()
    assert not (tmp_path / "committed" / "train_reward.png").exists()
    with pytest.raises(ValueError, match="study run 'sft': steps is set by the study"):
        study.run_study(load_study(config).model_copy(update={"runs": [
            study.StudyRun(name="sft", method="sft", settings={"steps": 3})]}))


def test_report_only_pairs_the_committed_bed_finals_against_lopd_anew(tmp_path):
    """The committed bed study redrawn from its results.json: the final table is paired anew from
    the kept per-task rows, so each finished run's success minus LOPD's shows."""
    copy = tmp_path / "bed-cpu"
    shutil.copytree(ROOT / "docs" / "results" / "bed-cpu", copy)
    toml = "\n".join(line for line in (copy / "study.toml").read_text().splitlines()
                     if not line.startswith("results ="))  # drawn here, not into the repository's folder
    (copy / "study.toml").write_text(toml)
    result = runner.invoke(app, ["study", "--config", str(copy / "study.toml"), "--out", str(copy), "--report-only"])
    assert result.exit_code == 0, result.output
    results = _results(copy)
    finished = results["finished"]

    def per_task(run: str) -> dict[str, float]:  # each task's success, averaged over the run's seeds
        seeds = [f["finals"]["lopd-bed"]["per_task"] for name, f in finished.items() if name.startswith(f"{run}-seed")]
        return {t["task_id"]: sum(float(s[i]["success"]) for s in seeds) / len(seeds) for i, t in enumerate(seeds[0])}

    lopd, grpo = per_task("lopd"), per_task("grpo")
    diffs = [grpo[task] - lopd[task] for task in lopd]
    row = next(r for r in results["final_table"] if r["bench"] == "lopd-bed" and r["run"] == "grpo")
    assert row["success_vs_lopd"] == pytest.approx(sum(diffs) / len(diffs))
    assert (row["success_vs_lopd_higher"], row["success_vs_lopd_lower"]) == (
        sum(d > 0 for d in diffs), sum(d < 0 for d in diffs))
    assert row["lopd_run"] == "lopd" and len(diffs) == 300
    assert "| Δ success vs lopd (paired) |" in (copy / "table.md").read_text()



@pytest.mark.parametrize("folder", ["bed-cpu", "bfcl-cpu"])
def test_report_only_writes_out_and_leaves_the_committed_results_folder_as_it_is(tmp_path, folder):
    """`--report-only` of a study whose ``results`` folder is kept in the repository: the bed
    study (the base model's evaluation restored, finished runs from results.json) and the BFCL
    study (redrawn from results.json alone) write into ``out`` only: no file of the results
    folder changes and none is added."""
    committed, out = tmp_path / folder, tmp_path / "out"
    shutil.copytree(ROOT / "docs" / "results" / folder, committed)
    toml = "\n".join(line for line in (committed / "study.toml").read_text().splitlines()
                     if not line.startswith(("results =", "out =")))
    (committed / "study.toml").write_text(f'out = "{out}"\nresults = "{committed}"\n{toml}')
    before = {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()}
    result = runner.invoke(app, ["study", "--config", str(committed / "study.toml"), "--report-only"])
    assert result.exit_code == 0, result.output
    assert {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()} == before
    assert (out / "table.md").read_text().startswith("Held-out") and (out / "results.json").is_file()


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("examples/study/*.toml")),
                         ids=lambda p: p.name)
def test_every_example_study_file_validates_and_shares_one_budget(path):
    """The shipped study files: every run's distill settings and method options validate, at one budget."""
    import tomllib

    from stages.study.layout import StudyConfig
    from stages.study.recipe import check_budget, distill_config
    from stages.study.sft import SFT_METHODS

    config = StudyConfig(**tomllib.loads(path.read_text()))
    for run in config.runs:
        if run.method != "vanilla" and run.method not in SFT_METHODS:
            for seed in config.seeds_of(run):
                assert distill_config(config, run, seed).method == run.method
    check_budget(config)
