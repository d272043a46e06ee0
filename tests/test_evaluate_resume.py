"""`lopd evaluate`: a report of other settings is never replaced silently (the composer gets its
own default path), and an interrupted evaluation resumes from the tasks it finished."""
from __future__ import annotations

import json

import pytest
from rich.console import Console

from stages.envs import make_env
from stages.evaluate import EvaluateConfig, default_out, run
from tests.test_env_envscaler import ORACLE
from tests.test_evaluate import SequentialEngine
from tests.tiny import tiny_tokenizer

QUIET = Console(file=open("/dev/null", "w"))


class StopsAfter(SequentialEngine):
    """A SequentialEngine whose ``stop``-th episode is interrupted (Ctrl-C) at its first step."""

    def __init__(self, scripts, stop: int):
        super().__init__(scripts)
        self.stop = stop

    def generate(self, prompt_ids, params):
        if self.episode + 1 == self.stop and tiny_tokenizer().decode(prompt_ids[0]).count("<|im_start|>assistant") == 1:
            raise KeyboardInterrupt
        return super().generate(prompt_ids, params)


def _evaluate(out, engine, **kw):
    config = EvaluateConfig(bench="envscaler", out=str(out), batch_size=1, **kw)
    return run(config, QUIET, engine=engine, tokenizer=tiny_tokenizer())


def _rows(report):
    return report["per_task"]


def test_an_interrupted_evaluation_resumes_where_it_stopped(tmp_path):
    scripts = [ORACLE[t.task_id] for t in make_env("envscaler").tasks("test")]
    assert len(scripts) >= 2
    straight = _evaluate(tmp_path / "straight.json", SequentialEngine(scripts))
    out = tmp_path / "cut.json"
    with pytest.raises(KeyboardInterrupt):
        _evaluate(out, StopsAfter(scripts, stop=1))
    partial = tmp_path / "cut.partial.jsonl"
    assert not out.exists() and len(partial.read_text().splitlines()) == 1 + 1  # header + the finished task
    with pytest.raises(ValueError, match=r"cut.partial.jsonl holds 1 finished task\(s\) .*pass --resume"):
        _evaluate(out, SequentialEngine(scripts))
    with pytest.raises(ValueError, match=r"the interrupted run had other settings \(temperature: 0.0 -> 0.5"):
        _evaluate(out, SequentialEngine(scripts), resume=True, temperature=0.5)
    resumed = _evaluate(out, SequentialEngine(scripts[1:]), resume=True, workers=1)  # plays the rest only
    assert resumed["scores"] == straight["scores"] and _rows(resumed) == _rows(straight)
    assert not partial.exists() and json.loads(out.read_text())["scores"] == straight["scores"]


def test_a_report_of_other_settings_is_refused_and_the_same_settings_replace_it(tmp_path):
    scripts = [ORACLE[t.task_id] for t in make_env("envscaler").tasks("test")]
    out = tmp_path / "r.json"
    first = _evaluate(out, SequentialEngine(scripts))
    with pytest.raises(ValueError, match=rf"^{out} holds an evaluation of other settings \(limit: None -> 2\): "
                                         "give another --out, or remove it$"):
        _evaluate(out, SequentialEngine(scripts), limit=2)
    again = _evaluate(out, SequentialEngine(scripts), workers=1)  # the same evaluation: replaced
    assert again["scores"] == first["scores"]
    plain = EvaluateConfig(bench="bfcl-single", model="m")
    with_composer = EvaluateConfig(bench="bfcl-single", model="m", composer="runs/c/final", store="s")
    assert default_out(plain).name == "bfcl-single-m.json"
    assert default_out(with_composer).name == "bfcl-single-m-composer-runs-c-final.json"


def test_compare_shows_long_model_names_whole_on_a_narrow_terminal(tmp_path):
    from stages.compare import compare

    scripts = [ORACLE[t.task_id] for t in make_env("envscaler").tasks("test")]
    long = "runs/bed/a-rather-long-run-folder-name/final/student"
    for name, model in (("a.json", "smollm2-135m"), ("b.json", long)):
        report = _evaluate(tmp_path / name, SequentialEngine(scripts))
        (tmp_path / name).write_text(json.dumps({**report, "model": model}))
    console = Console(file=open("/dev/null", "w"), width=60, record=True)
    console.print(compare([tmp_path / "a.json", tmp_path / "b.json"]))
    text = console.export_text()
    assert "…" not in text  # wrapped in its column, not cut
    header = "".join(line.split("┃")[3].strip() for line in text.splitlines() if line.count("┃") == 4)
    assert header == long


def test_compare_writes_its_numbers_as_json_and_csv(tmp_path):
    import csv

    from typer.testing import CliRunner

    from lopd_cli.main import app

    scripts = [ORACLE[t.task_id] for t in make_env("envscaler").tasks("test")]
    _evaluate(tmp_path / "a.json", SequentialEngine(scripts))
    _evaluate(tmp_path / "b.json", SequentialEngine([["Done."]] * len(scripts)))
    args = ["evaluate", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out"]
    assert CliRunner().invoke(app, [*args, str(tmp_path / "c.json")]).exit_code == 0
    assert CliRunner().invoke(app, [*args, str(tmp_path / "c.csv")]).exit_code == 0
    rows = json.loads((tmp_path / "c.json").read_text())
    success = {r["report"]: r for r in rows if r["section"] == "scores" and r["metric"] == "success_rate"}
    assert success[str(tmp_path / "a.json")]["value"] == 1.0 and success[str(tmp_path / "a.json")]["delta"] is None
    assert success[str(tmp_path / "b.json")]["delta"] == -1.0
    paired = next(r for r in rows if r["section"] == "paired" and r["metric"] == "success")
    assert (paired["value"], paired["n"], paired["lower"]) == (-1.0, len(scripts), len(scripts))
    with (tmp_path / "c.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and table[0]["model"] == "smollm2-135m"


def test_a_run_refused_before_its_first_task_leaves_no_partial_file(tmp_path):
    """The partial file appears with the first finished task (a refusal after the banner, e.g. a
    store that serves none of the tasks, used to leave a header-only file behind)."""
    from stages.core.run.outputs import PartialResults

    path = tmp_path / "eval" / "r.partial.jsonl"
    PartialResults(path, {"bench": "b"}, resume=False)
    assert not path.exists()
    partial = PartialResults(path, {"bench": "b"}, resume=False)
    partial.add("t1", {"reward": 1.0})
    assert path.read_text().splitlines()[0] == '{"settings": {"bench": "b"}}'
    assert PartialResults(path, {"bench": "b"}, resume=True).rows == {"t1": {"reward": 1.0}}
