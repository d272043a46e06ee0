"""The whole pipeline through the CLI with a tiny in-process model and 2 tasks per stage:
collect (reference + policy) -> index -> coldstart -> distill -> evaluate (base vs student) -> compare."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.core.data.store import ExperienceStore
from tests.tiny import save_tiny

runner = CliRunner()


def _ok(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, f"lopd {' '.join(args)}\n{res.output}\n{res.exception!r}"
    return res.output


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_pipeline_end_to_end(tmp_path):
    tiny = str(save_tiny(tmp_path / "tiny"))
    store, composer, run, reports = (str(tmp_path / n) for n in ("store", "composer0", "lopd", "eval"))

    # HumanEval problems are HumanEval+ evaluation tasks: training on them is refused unless allowed
    refused = runner.invoke(app, ["collect", "--env", "code", "--reference", "--limit", "4", "--store", store])
    assert refused.exit_code != 0 and "humaneval-plus" in refused.output and not Path(store).exists()
    _ok(["collect", "--env", "code", "--reference", "--limit", "4", "--store", store, "--allow-overlap"])
    _ok(["collect", "--env", "code", "--limit", "2", "--model", tiny, "--store", store,
         "--max-new-tokens", "8", "--samples-per-task", "2", "--allow-overlap"])
    rows = ExperienceStore.open(store).query()
    assert len(rows) == 8 and sum(r.success for r in rows) >= 4

    _ok(["index", "--store", store])
    out = _ok(["coldstart", "--experiences", store, "--out", composer, "--model", tiny, "--steps", "2",
               "--J", "2", "--K", "2", "--depth", "1", "--max-exp-tokens", "48", "--checkpoint-every", "1",
               "--eval-every", "2", "--heldout-fraction", "0.25"])
    assert (tmp_path / "composer0" / "final" / "composer_config.json").is_file(), out

    # like the quickstart: a config file (using the paper's name `lambda`) plus flags
    config = tmp_path / "distill.toml"
    config.write_text('env = "code"\nlambda = 0.3\nJ = 2\nK = 2\nsteps = 1\ntasks_per_step = 1\n'
                      'group_size = 2\nmax_new_tokens = 8\nlr = 1e-3\nallow_overlap = true\n')
    distill = ["distill", "--config", str(config), "--store", store, "--composer", f"{composer}/final",
               "--out", run, "--model", tiny]
    _ok(distill)
    metrics = [json.loads(line) for line in (tmp_path / "lopd" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["reverse_kl"] >= 0.0
    assert json.loads((tmp_path / "lopd" / "config.json").read_text())["options"]["lam"] == 0.3
    assert ExperienceStore.open(store).count() == 10  # the step's 2 rollouts joined the memory
    _ok(["distill", "--out", run, "--resume", "--steps", "2"])  # the saved config supplies the rest
    metrics = [json.loads(line) for line in (tmp_path / "lopd" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert ExperienceStore.open(store).count() == 12
    weights = tmp_path / "lopd" / "final" / "student" / "model.safetensors"
    written = weights.stat().st_mtime_ns
    _ok(distill + ["--resume", "--steps", "2"])  # a second `make demo`: finished, nothing added
    assert len((tmp_path / "lopd" / "metrics.jsonl").read_text().splitlines()) == 2
    assert ExperienceStore.open(store).count() == 12
    assert weights.stat().st_mtime_ns == written  # the final student is not written again
    student = f"{run}/final/student"
    assert AutoModelForCausalLM.from_pretrained(student).config.vocab_size > 0

    for name, model in (("base", tiny), ("lopd", student)):
        _ok(["evaluate", "--bench", "envscaler", "--model", model, "--limit", "2", "--max-new-tokens", "8",
             "--max-steps", "2", "--out", f"{reports}/{name}.json"])
        report = json.loads((tmp_path / "eval" / f"{name}.json").read_text())
        assert report["bench"] == "envscaler" and report["model"] == model and len(report["per_task"]) == 2
    table = _ok(["evaluate", "--compare", f"{reports}/base.json", f"{reports}/lopd.json"])
    assert "compare envscaler" in table and re.search(r"\([+-]\d\.\d{3}\)", table)
