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


def _eval_report(path, model, accuracy, bench="lopd-bed"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bench": bench, "model": str(model), "scores": {"mean_reward": accuracy},
                                "behaviour": {}, "per_task": [{"task_id": "a", "reward": accuracy},
                                                              {"task_id": "b", "reward": 0.0}]}))


def test_summary_pairs_the_reports_of_one_bench_task_by_task(tmp_path):
    """Two reports of the same bench: summary.md gives `lopd evaluate --compare`'s paired differences."""
    for name, successes, nll in (("warm", [1, 0, 0], [0.5, 0.7, 0.9]), ("lopd", [1, 1, 0], [0.4, 0.6, 0.85])):
        path = tmp_path / "eval" / f"lopd-bed-{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"bench": "lopd-bed", "model": name, "scores": {"success_rate": sum(successes) / 3},
                                    "behaviour": {}, "per_task": [
                                        {"task_id": f"t{i}", "success": bool(x), "reward": float(x), "reference_nll": y}
                                        for i, (x, y) in enumerate(zip(successes, nll))]}))
    given = [str(tmp_path / "eval" / f"lopd-bed-{name}.json") for name in ("warm", "lopd")]  # the first is the base
    result = runner.invoke(app, ["report", *given, "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r" / "summary.md").read_text()
    assert "Paired over tasks, lopd-bed: each report minus" in text and "lopd-bed-warm.json." in text
    assert "lopd-bed-lopd.json | success | +0.333 ± 0.333 | 3 | 1 / 0 |" in text
    assert "lopd-bed-lopd.json | reference_nll | -0.083 ± 0.017 | 3 | 0 / 3 |" in text


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
    result = runner.invoke(app, ["report", str(tmp_path / "notes.json")])
    assert result.exit_code == 2 and "notes.json: not an evaluation report" in result.output


def test_summary_names_every_input_with_its_numbers_or_why_it_gave_none(tmp_path):
    """Each path given has its line in summary.md; nothing is dropped in silence, not even a run
    whose folder has the name of another's (two `lopd` folders), and one bad path costs its line only."""
    _write(tmp_path / "a" / "lopd", _distill_rows(1.0))
    _write(tmp_path / "b" / "lopd", [{"step": 1, "loss": 7.5}])
    _write(tmp_path / "fresh", [])  # started, no step yet
    (tmp_path / "bare").mkdir()
    _eval_report(tmp_path / "eval" / "base.json", "smollm2-135m", 0.125)
    _eval_report(tmp_path / "kept.json", "runs/x/final/student", 0.375)
    (tmp_path / "notes.json").write_text("{}")
    (tmp_path / "cut.json").write_text('{"bench": ')
    given = [tmp_path / n for n in ("a/lopd", "b/lopd", "fresh", "bare", "eval", "kept.json", "notes.json",
                                    "cut.json", "gone")]
    result = runner.invoke(app, ["report", *map(str, given), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r" / "summary.md").read_text()
    lines = {path: next((x for x in text.splitlines() if x.startswith(f"- `{path}`: ")), None) for path in given}
    assert None not in lines.values(), text
    assert "(3 steps, last 3)" in lines[given[0]] and "(1 steps, last 1)" in lines[given[1]]
    assert "| reward_mean | 0.1 | 0.3 | 0.1 | 0.3 |" in text and "| loss | 7.5 | 7.5 | 7.5 | 7.5 |" in text
    assert "no step yet" in lines[given[2]] and "no metrics.jsonl under it" in lines[given[3]]
    assert "base.json" in lines[given[4]] and "mean_reward 0.125" in text and "mean_reward 0.375" in text
    assert "not read: not an evaluation report" in lines[given[6]] and "not read: not JSON" in lines[given[7]]
    assert "not read: no such run folder" in lines[given[8]]
    for path in given[2:4] + given[6:]:  # each unread path also warned of, in one line
        assert str(path) in result.output.replace("\n", "")


def test_the_quickstart_s_report_shows_every_training_and_evaluation(tmp_path):
    """examples/quickstart/run.sh's `lopd report` line, run by bash on a run folder laid out as the
    script leaves it (BFCL=1 included): the warm start, the composer, the LOPD student and every
    evaluation are in summary.md."""
    import subprocess
    from pathlib import Path

    script = (Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "run.sh").read_text()
    start = script.index("\ninputs=(")
    line = script[start:script.index("\n", script.index("\nlopd report ", start) + 1)]
    run = tmp_path / "quickstart"
    _write(run / "warm", [{"step": s, "nll": 2.0 / s} for s in (1, 2, 3, 4)])
    _write(run / "composer", [{"step": s, "loss": 1.0 / s} for s in (1, 2)])
    _write(run / "lopd", _distill_rows(1.0))
    for name, student, score in (("lopd-bed-warm", "warm", 0.05), ("lopd-bed-lopd", "lopd", 0.1),
                                 ("bfcl-single-warm", "warm", 0.0), ("bfcl-single-lopd", "lopd", 0.125)):
        model = run / student / "final" / "student"
        model.mkdir(parents=True, exist_ok=True)
        _eval_report(run / "eval" / f"{name}.json", model, score, bench=name.rsplit("-", 1)[0])
    # `lopd` stands for a function that writes its arguments, one per line
    subprocess.run(["bash", "-c", f"set -eu; lopd() {{ printf '%s\\n' \"$@\" > args; }}\n{line}"], cwd=tmp_path,
                   env={"RUN": str(run), "BFCL": "1", "PATH": "/usr/bin:/bin"}, check=True)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[0] == "report"
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = (run / "report" / "summary.md").read_text()
    assert "## warm" in text and "| nll | 2 | 0.5 | 0.5 | 2 |" in text  # the warm start
    assert "## composer" in text and "## lopd" in text
    assert "lopd-bed-warm.json" in text and "mean_reward 0.050" in text
    assert "lopd-bed-lopd.json" in text and "mean_reward 0.100" in text
    assert "bfcl-single-lopd.json" in text and "mean_reward 0.125" in text
    assert "Paired over tasks, lopd-bed: each report minus" in text and "lopd-bed-warm.json." in text  # the base
    assert "lopd-bed-lopd.json | reward | +0.025 ± 0.025 | 2 | 1 / 0 |" in text


def _distill_run(tmp_path, store_path):
    """A distill run folder whose config names ``store_path`` and run id ``distill-x``."""
    run = tmp_path / "runs" / "lopd"
    _write(run, _distill_rows(1.0))
    (run / "config.json").write_text(json.dumps({"method": "lopd", "store": str(store_path), "run_id": "distill-x"}))
    return run


def test_report_shows_first_best_and_worst_rollouts_of_the_last_steps(tmp_path):
    from schemas import Message
    from stages.core.data.experience_rows import tag_step_rows
    from stages.core.data.store import ExperienceStore
    from tests.test_coldstart import make_traj

    store = ExperienceStore.open(tmp_path / "store")
    for step in (1, 2, 3):
        rows = [make_traj(f"s{step}-{i}", step, i, success=i == 1) for i in range(3)]
        rows[2] = rows[2].model_copy(update={"reward": 0.5})  # neither first, best nor worst
        store.append(tag_step_rows([r.model_copy(update={"run_id": "distill-x"}) for r in rows], "distill-x", step))
    store.append([make_traj("other", 9, 9).model_copy(update={"run_id": "another-run"})])
    run = _distill_run(tmp_path, tmp_path / "store")
    result = runner.invoke(app, ["report", str(run), "--samples-steps", "2"])
    assert result.exit_code == 0, result.output
    text = (run / "report" / "summary.md").read_text()
    assert "### Sample rollouts" in text and "#### step 1 " not in text  # the last 2 steps only
    assert "#### step 2 (3 rollouts)" in text and "#### step 3 (3 rollouts)" in text
    assert "- first / worst: task `add-3-0`, reward 0.000, success False" in text
    assert "- best: task `add-3-1`, reward 1.000, success True" in text
    assert "task `add-3-2`" not in text and "add-9-9" not in text  # the middle rollout; another run's
    assert '[action 1] <tool_call>{"name": "add", "arguments": {"a": 3, "b": 0}}</tool_call>' in text and "[action 2] The answer is 4." in text
    off = runner.invoke(app, ["report", str(run), "--samples-steps", "0", "--out", str(tmp_path / "off")])
    assert off.exit_code == 0 and "Sample rollouts" not in (tmp_path / "off" / "summary.md").read_text()
    # a long action is cut, and a fence inside it cannot close the code block
    long = make_traj("s4", 4, 4, success=False).model_copy(update={"run_id": "distill-x", "messages": [
        Message(role="assistant", content="```fence``` " + "x" * 1000)]})
    store.append(tag_step_rows([long], "distill-x", 4))
    result = runner.invoke(app, ["report", str(run), "--samples-steps", "1", "--out", str(tmp_path / "r")])
    text = (tmp_path / "r" / "summary.md").read_text()
    assert "#### step 4 (1 rollouts)" in text and "#### step 3" not in text
    assert "... (1012 chars)\n````" in text and "x" * 300 not in text
    assert "- first / best / worst: task `add-4-4`" in text and "````\n[action 1] ```fence```" in text


def test_report_notes_a_missing_store_in_one_line(tmp_path):
    run = _distill_run(tmp_path, tmp_path / "gone")
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    text = (run / "report" / "summary.md").read_text()
    notes = [line for line in text.splitlines() if line.startswith("note: no sample rollouts")]
    gone = tmp_path / "gone"
    assert notes == [f"note: no sample rollouts: store {gone} unreadable (no experience store at {gone} "
                     f"(`lopd collect --env ENV --store {gone}` makes one))"]
    (tmp_path / "empty").mkdir()
    run = _distill_run(tmp_path, tmp_path / "empty")
    assert runner.invoke(app, ["report", str(run)]).exit_code == 0
    assert "store" in (run / "report" / "summary.md").read_text().split("note: no sample rollouts: ")[1]


def test_series_styles_share_one_colour_per_method_and_tell_lines_apart():
    from stages.report import METHOD_COLORS, identical_series, method_of, series_styles

    assert [method_of(x) for x in ("lopd", "study/grpo-seed1", "skill-sd-seed0", "sdpo", "mine")] == [
        "lopd", "grpo", "skill-sd", "sdpo", None]
    styles = series_styles(["lopd-seed0", "lopd-seed1", "grpo-seed0", "sdpo-seed0", "a", "b"])
    assert styles["lopd-seed0"]["color"] == styles["lopd-seed1"]["color"] == METHOD_COLORS["lopd"]
    assert styles["grpo-seed0"]["color"] == METHOD_COLORS["grpo"] != styles["sdpo-seed0"]["color"]
    assert styles["lopd-seed0"]["linestyle"] != styles["lopd-seed1"]["linestyle"]  # seeds of one method
    assert styles["a"]["color"] != styles["b"]["color"] and styles["a"]["color"] not in METHOD_COLORS.values()
    assert len({s["marker"] for s in styles.values()}) == 6
    # a series drawn earlier is wider, so one drawn later on the same values leaves it visible
    assert styles["grpo-seed0"]["linewidth"] > styles["sdpo-seed0"]["linewidth"]
    assert series_styles(["ablation"], {"ablation": "lopd"})["ablation"]["color"] == METHOD_COLORS["lopd"]
    flat = {"lopd": [(1, 0.0), (2, 0.0)], "grpo": [(1, 0.0), (2, 0.0)], "sdpo": [(1, 1.0), (2, 2.0)]}
    assert identical_series(flat) == [["lopd", "grpo"]]
    assert identical_series({"a": [(1, 1.0)], "b": [(1, 1.0000001)], "c": [(1, 2.0)]}) == [["a", "b"]]


def test_the_delta_panel_gets_each_lopd_run_s_margin_as_a_dashed_line(tmp_path, monkeypatch):
    from stages import report

    for name, method, margin in (("lopd-a", "lopd", 0.05), ("lopd-m0", "lopd", 0.0), ("grpo", "grpo", None)):
        _write(tmp_path / name, _distill_rows(1.0))
        options = {"margin": margin} if margin is not None else {"eps_lo": 0.2}
        (tmp_path / name / "config.json").write_text(json.dumps({"method": method, "options": options}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert report.lopd_margins({n: tmp_path / n for n in ("lopd-a", "lopd-m0", "grpo", "broken", "none")}) == {
        "lopd-a": 0.05, "lopd-m0": 0.0}
    drawn = {}
    real = report.plot_group

    def spy(path, title, metrics, runs, x, levels=None):
        drawn[path.stem] = levels
        real(path, title, metrics, runs, x, levels)

    monkeypatch.setattr(report, "plot_group", spy)
    report.run(report.ReportConfig(runs=[str(tmp_path / n) for n in ("lopd-a", "lopd-m0", "grpo")],
                                   out=str(tmp_path / "out")))
    assert drawn["dual"] == {"Delta": {"lopd-a": 0.05, "lopd-m0": 0.0}}
    assert (tmp_path / "out" / "dual.png").read_bytes()[:4] == b"\x89PNG"


def _coldstart_rows():
    final = {"heldout_nll": 0.647, "heldout_nll_no_latents": 0.797, "heldout_nll_untrained": 0.910,
             "heldout_nll_other_experiences": 0.6472}
    return [{"step": 5, "loss": 0.9, "heldout_nll": 0.70}, {"step": 10, "loss": 0.8, **final}]


def _drawn_axes(monkeypatch):
    """The axes of every figure the report draws (kept after the figure is closed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn, real = [], plt.subplots

    def spy(*args, **kwargs):
        fig, axes = real(*args, **kwargs)
        drawn.append(axes)
        return fig, axes

    monkeypatch.setattr(plt, "subplots", spy)
    return drawn


def test_the_cold_start_s_four_held_out_measures_share_one_panel(tmp_path, monkeypatch):
    from stages import report

    _write(tmp_path / "composer0", _coldstart_rows())
    drawn = _drawn_axes(monkeypatch)
    report.plot_group(tmp_path / "heldout.png", "held-out NLL", list(report.GROUPS[2][2]),
                      {"composer0": _coldstart_rows()}, "step")
    (axes,) = drawn
    panels = [ax for ax in axes.flat if ax.axison]
    assert len(panels) == 1  # one scale for the four numbers
    points = [list(zip(line.get_xdata(), line.get_ydata())) for line in panels[0].lines]
    assert points == [[(5, 0.70), (10, 0.647)], [(10, 0.797)], [(10, 0.910)], [(10, 0.6472)]]
    legend = [t.get_text() for t in axes.flat[0].figure.legends[0].get_texts()]
    assert legend == ["heldout_nll", "heldout_nll_no_latents", "heldout_nll_untrained", "heldout_nll_other_experiences"]
    assert (tmp_path / "heldout.png").read_bytes()[:4] == b"\x89PNG"


def test_runs_of_a_shared_panel_are_told_apart_by_run_and_metric(tmp_path, monkeypatch):
    from stages import report

    drawn = _drawn_axes(monkeypatch)
    report.plot_group(tmp_path / "heldout.png", "held-out NLL", ["heldout_nll", "heldout_nll_no_latents"],
                      {"a/lopd": _coldstart_rows(), "b": _coldstart_rows()}, "step")
    legend = [t.get_text() for t in drawn[0].flat[0].figure.legends[0].get_texts()]
    assert legend == ["a/lopd: heldout_nll", "a/lopd: heldout_nll_no_latents", "b: heldout_nll",
                      "b: heldout_nll_no_latents"]
    drawn.clear()
    report.plot_group(tmp_path / "loss.png", "losses", ["loss", "heldout_nll"], {"b": _coldstart_rows()}, "step")
    assert len([ax for ax in drawn[0].flat if ax.axison]) == 2  # other groups keep a panel per metric


def test_x_ticks_are_whole_numbers_also_for_a_single_point():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stages.report import integer_ticks

    for xs in ([10], [1, 2, 3, 40]):
        fig, ax = plt.subplots()
        ax.plot(xs, [0.5] * len(xs), "o")
        integer_ticks(ax)
        fig.canvas.draw()
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), (xs, ticks)
        plt.close(fig)
