"""What the CLI prints reads whole in a 100-column console: every table has no line past 100
characters, its title's words intact (never folded mid-word into a narrower table), no cell cut to
"…"; a distill step's line breaks only between its fields."""
from __future__ import annotations

import json
from datetime import datetime

import pytest
from rich.console import Console

WIDTH = 100
MODEL = "runs/quickstart/lopd/final/student"
STORE = "runs/quickstart/experiments/bed-warm/store"


def _rendered(print_to) -> str:
    console = Console(width=WIDTH, record=True, color_system=None)
    print_to(console)
    return console.export_text()


def _evaluate(console):
    from stages.evaluate import report_table

    console.print(report_table({"bench": "bfcl-single", "model": MODEL, "per_task": [{}] * 40,
                                "scores": {"accuracy": 0.0}, "behaviour": {"first_step_tokens": 60.2}}))


def _compare(console, tmp_path):
    from stages.compare import compare

    for name, model in (("base", "smollm2-135m"), ("lopd", MODEL)):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "bench": "bfcl-single", "model": model, "fixtures": True, "scores": {"accuracy": 0.0},
            "behaviour": {}, "config": {"composer": f"{MODEL}/../composer0/final" if name == "lopd" else None}}))
    console.print(compare([tmp_path / "base.json", tmp_path / "lopd.json"]))


def _collect(console):
    from stages.collect import CollectConfig, CollectReport, _print_summary

    _print_summary(console, CollectReport(run_id="r", tasks=40, skipped_tasks=0, trajectories=40, mean_reward=1.0,
                                          success_rate=1.0, generated_tokens=0, tokens_per_s=0.0, seconds=12.0),
                   CollectConfig(env="lopd-bed", split="warmup", store=STORE))


def _coldstart(console):
    from stages.coldstart.ladder.heldout import HeldoutResult
    from stages.coldstart.recipe import ColdstartReport, _print_summary

    held = HeldoutResult.model_construct(nll_no_latents=0.6481, nll_untrained=0.6479, nll_trained=0.6473,
                                         nll_other_experiences=0.6476, trajectories=8, tokens=512)
    _print_summary(console, ColdstartReport.model_construct(
        run_id="r", out=OUT, final=f"{OUT}/final/composer", backbone_id="smollm2-135m", steps=10, start_step=0,
        train_trajectories=30, train_tasks=30, too_long=0, heldout_trajectories=8, heldout_tasks=8, final_loss=0.61,
        final_loss_steps=5, heldout=held, seconds=100.0, seconds_per_step=10.0, peak_rss_mb=2100.0,
        backbone_unchanged=True))


def _ladder(console):
    from stages.coldstart.ladder.rungs import COMPARISONS, RUNGS, Difference, Ladder, print_ladder

    print_ladder(console, Ladder.model_construct(
        nll={k: 0.6 for k in RUNGS}, nll_decisive={k: 2.1 for k in RUNGS}, latent_cosine=0.93,
        differences=[Difference(x=x, y=y, diff=-0.0123, se=0.0011, diff_decisive=-0.123, se_decisive=0.011)
                     for x, y in COMPARISONS], latent_cosine_untrained=0.99, targets=120, tokens=4321,
        decisive_tokens=321))


def _store_versions(console, monkeypatch):
    from stages import store_admin

    problem = f"lance cannot read {STORE}/trajectories.lance/data/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.lance"
    monkeypatch.setattr(store_admin, "list_versions", lambda *a: [
        store_admin.VersionInfo(1, datetime(2025, 1, 2, 3, 4, 5), 40, False, problem),
        store_admin.VersionInfo(2, datetime(2025, 1, 2, 3, 5, 5), 80, True)])
    store_admin.run_versions(store_admin.StoreAdminConfig(store=STORE), console)


OUT = "runs/quickstart/experiments/a-composer-trained-on-the-bed-warm-start-with-a-long-name"
# (draw, the words its title must show whole)
TABLES = {"evaluate": (_evaluate, f"bfcl-single - {MODEL}"),
          "compare": (_compare, "compare bfcl-single (on bundled test fixtures, not the benchmark)"),
          "collect": (_collect, f"collect lopd-bed/warmup -> {STORE}"),
          "coldstart": (_coldstart, f"coldstart -> {OUT}"),
          "ladder": (_ladder, "composer ladder (held-out teacher NLL): 120 targets, 4321 action tokens, 321 decisive"),
          "store versions": (_store_versions, f"{STORE}: table 'trajectories'")}


@pytest.mark.parametrize("name", TABLES)
def test_every_table_fits_100_columns_with_its_title_words_whole(name, tmp_path, monkeypatch):
    draw, title = TABLES[name]
    given = {"tmp_path": tmp_path, "monkeypatch": monkeypatch}
    text = _rendered(lambda c: draw(c, **{k: v for k, v in given.items() if k in draw.__code__.co_varnames}))
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert "…" not in text, text  # no cell cut short
    above = set(text.split("┏")[0].split())  # the title's words: everything above the top border
    assert [w for w in title.split() if w not in above] == [], text


def test_a_distill_step_breaks_only_between_fields_at_100_columns():
    from types import SimpleNamespace

    from stages.distill.recipe import Distiller
    from stages.methods.lopd import LOPD

    row = {"step": 12, "reward_mean": 0.125, "success_rate": 0.0625, "loss": 0.12345, "tokens_per_s": 123.4,
           "seconds": 45.6, "peak_rss_mb": 2345.0, "skipped_rows": 0, "action_tokens": 100,
           **{k: 12.25 for k in LOPD.metrics}}  # at 100 columns rich broke "margin_term | 12.25"
    text = _rendered(lambda c: Distiller._log(SimpleNamespace(
        console=c, method=SimpleNamespace(metrics=LOPD.metrics), config=SimpleNamespace(steps=20), logger=None), row))
    lines = text.splitlines()
    assert lines[0].startswith("step 12/20 reward 0.125") and max(len(line) for line in lines) <= WIDTH, text
    fields = ["reward 0.125", "success 6%", *(f"{k} 12.25" for k in LOPD.metrics), "loss 0.1235", "123 tok/s",
              "2345 MB"]
    assert [f for f in fields if not any(f in line for line in lines)] == [], text  # none split over two lines


def test_a_plan_breaks_its_long_lines_at_spaces_at_100_columns():
    from typer.testing import CliRunner

    from lopd_cli.main import app

    out = CliRunner().invoke(app, ["plan", "--model", "qwen3-4b", "--gpu-gb", "16"]).output
    assert max(len(line) for line in out.splitlines()) <= WIDTH, out
    assert "plan: qwen3-4b (4.02B parameters), --method lopd, LoRA rank 8, bfloat16, not sharded; micro-batch 4 x " \
           "2048 tokens" in " ".join(x.strip() for x in out.splitlines()), out  # whole words, in order
