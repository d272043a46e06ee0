"""`lopd evaluate`: bench scoring with official checkers, behaviour statistics, reports, compare.

A scripted engine replays canned answers (no LLM): episodes run one at a time (batch size 1), and
the engine moves to the next task's script whenever a prompt has no assistant turn yet.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from rich.console import Console

from schemas import ToolCall, Trajectory, Turn
from stages.benches import bfcl_scores, evalplus_evaluate, humaneval_base
from stages.envs import EnvError, make_env
from stages.engines import Generation
from stages.compare import compare
from stages.evaluate import EvaluateConfig, behaviour_stats, repeated_calls, model_slug, run
from stages.study.final import kept
from tests.tiny import tiny_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FIXTURES = Path(__file__).parent / "fixtures"
LCB_SOLUTIONS = json.loads((FIXTURES / "livecodebench_solutions.json").read_text())


def needs(path: Path):
    return pytest.mark.skipif(not path.exists(), reason=f"shared data missing: {path}")


class SequentialEngine:
    """Plays ``scripts[i]`` (one action per step) for the i-th episode; "Done." after a script ends."""

    def __init__(self, scripts: list[list[str]]):
        self.scripts, self.episode = scripts, -1

    def generate(self, prompt_ids, params):
        out = []
        for ids in prompt_ids:
            step = tiny_tokenizer().decode(ids).count("<|im_start|>assistant") - 1
            self.episode += step == 0
            script = self.scripts[self.episode]
            text = script[step] if step < len(script) else "Done."
            n = len(text.split())
            out.append(Generation(text=text, token_ids=[0] * n, logprobs=[0.0] * n, num_tokens=n,
                                  finish_reason="eos"))
        return out


def _run(tmp_path, scripts, **kw):
    (tmp_path / "report.json").unlink(missing_ok=True)  # a report of other settings is never replaced
    config = EvaluateConfig(out=str(tmp_path / "report.json"), batch_size=1, **kw)
    report = run(config, Console(file=open("/dev/null", "w")), engine=SequentialEngine(scripts), tokenizer=tiny_tokenizer())
    assert json.loads((tmp_path / "report.json").read_text())["scores"] == report["scores"]
    return report


def _traj(turns: list[Turn], task_id: str = "t") -> Trajectory:
    return Trajectory(trajectory_id="x", task_id=task_id, env="toy", split="test", prompt="p", policy="m", messages=[],
                      turns=turns, reward=1.0, success=True, num_steps=len(turns),
                      num_tool_calls=sum(len(t.tool_calls) for t in turns), run_id="r")


def test_behaviour_stats_known_values():
    a, a2, b = ToolCall(name="f", arguments='{"x": 1, "y": 2}'), ToolCall(name="f", arguments='{"y": 2, "x": 1}'), ToolCall(name="g")
    t1 = _traj([Turn(action="1", tool_calls=[a, b], action_tokens=10), Turn(action="2", tool_calls=[a2], action_tokens=4),
                Turn(action="3", tool_calls=[b, b], action_tokens=2), Turn(action="end", action_tokens=1)])
    t2 = _traj([Turn(action="only", action_tokens=20)])
    stats = behaviour_stats([t1, t2])
    assert stats == {"mean_steps": 2.5, "tool_calls_per_step": 1.0, "first_step_tokens": 15.0,
                     "repeated_calls_per_task": 1.5}  # t1 repeats: a2 (same as a), b, b
    assert (repeated_calls(t1), repeated_calls(t2)) == (3, 0)


def test_a_study_keeps_each_tasks_behaviour_of_its_final_evaluations():
    report = {"bench": "lopd-bed", "scores": {}, "per_task": [
        {"task_id": "t", "reward": 1.0, "success": True, "steps": 4, "tool_calls": 5, "repeated_calls": 3,
         "messages": [{"role": "user", "content": "long transcript"}]}]}
    assert kept(report)["per_task"] == [{"task_id": "t", "reward": 1.0, "success": True, "steps": 4, "tool_calls": 5,
                                         "repeated_calls": 3}]


def test_compare_shows_deltas_vs_first(tmp_path):
    paths = []
    for i, (model, score) in enumerate([("base", 0.25), ("lopd", 0.5)]):
        report = {"bench": "acebench", "model": model, "scores": {"end_to_end": score},
                  "behaviour": {"mean_steps": 3.0 + i}}
        paths.append(tmp_path / f"{model}.json")
        paths[-1].write_text(json.dumps(report))
    console = Console(record=True, width=150)
    console.print(compare(paths))
    text = console.export_text()
    assert "0.500 (+0.250)" in text and "4.000 (+1.000)" in text and "base" in text and "lopd" in text
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json: missing field 'bench'"):
        compare([paths[0], tmp_path / "bad.json"])


def test_compare_refuses_other_benches_and_data_and_labels_a_repeated_model(tmp_path):
    def write(name, bench, model="m", data_dir=None):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        path = tmp_path / name / "r.json"
        path.write_text(json.dumps({"bench": bench, "model": model, "scores": {"pass@1": 0.5}, "behaviour": {},
                                    "config": {"data_dir": data_dir}}))
        return path

    he, mbpp = write("he", "humaneval-plus"), write("mbpp", "mbpp-plus")
    with pytest.raises(ValueError, match=r"mbpp/r.json: a mbpp-plus report cannot be compared with .*he/r.json \(humaneval-plus\)"):
        compare([he, mbpp])
    other = write("other", "humaneval-plus", data_dir="/data/HumanEvalPlus-v0.1.9.jsonl.gz")
    with pytest.raises(ValueError, match="scored on other data"):
        compare([he, other])
    console = Console(record=True, width=200)
    console.print(compare([he, write("again", "humaneval-plus")]))
    text = console.export_text()
    assert "m (he/r.json)" in text and "m (again/r.json)" in text


@pytest.mark.parametrize("bench,flag", [("acebench", "--data-dir <ACEBench>/data_all/data_en (git clone "
                                                     "github.com/ACEBench/ACEBench)"),
                                        ("humaneval-plus", "--data-dir <HumanEvalPlus-v0.1.10.jsonl.gz or its folder> "
                                         "(download it from the releases of github.com/evalplus/humanevalplus_release)"),
                                        ("mbpp-plus", "--data-dir <MbppPlus-v0.2.0.jsonl.gz or its folder> "
                                         "(download it from the releases of github.com/evalplus/mbppplus_release)"),
                                        ("livecodebench", "livecodebench/code_generation_lite")])
def test_missing_data_error_says_what_to_pass(tmp_path, bench, flag):
    with pytest.raises(EnvError, match="pass --data-dir") as err:
        run(EvaluateConfig(bench=bench, data_dir=None, out=str(tmp_path / "r.json")), Console(file=open("/dev/null", "w")))
    assert flag in str(err.value) and "\n" not in str(err.value)
    assert "shared/" not in str(err.value)  # no path of the developers' machines


def test_livecodebench_reference_passes_empty_fails(tmp_path):
    ids = ["lcbfx_stdin", "lcbfx_functional", "lcbfx_compressed"]
    good = _run(tmp_path, [[f"```python\n{LCB_SOLUTIONS[i]}```"] for i in ids], bench="livecodebench",
                data_dir=str(FIXTURES / "livecodebench"), release="v6", model="tiny")
    assert good["scores"] == {"pass@1": 1.0}
    assert "graded by LiveCodeBench's own testing_util (nvidia-livecodebench)" in good["notes"]
    assert {r["info"]["grader"] for r in good["per_task"]} == {"livecodebench testing_util"}
    assert [r["task_id"] for r in good["per_task"]] == ids and good["config"]["temperature"] == 0.0
    assert good["behaviour"]["mean_steps"] == 1.0 and good["behaviour"]["tool_calls_per_step"] == 0.0
    assert {"git_commit", "started_at", "finished_at", "seconds", "model"} <= good.keys()
    empty = _run(tmp_path, [[""]] * 2, bench="livecodebench", data_dir=str(FIXTURES / "livecodebench"), release="v5")
    assert empty["scores"] == {"pass@1": 0.0} and len(empty["per_task"]) == 2


def test_livecodebench_report_says_the_harness_graded_when_the_official_grader_is_missing(monkeypatch):
    from stages import benches

    monkeypatch.setattr(benches, "official_testing_util", lambda: None)
    prepared = benches.BENCHES["livecodebench"].prepare(
        EvaluateConfig(bench="livecodebench", data_dir=str(FIXTURES / "livecodebench")))
    assert any(n.startswith("graded by lopd's harness: LiveCodeBench's grader is not installed") for n in prepared.notes)


@needs(SHARED / "acebench")
def test_acebench_possible_answers_score_full_process_accuracy(tmp_path):
    from tests.test_env_acebench import _path

    tasks = make_env("acebench", data_dir=SHARED / "acebench").tasks("test")
    # the 20 multi-step tasks come first (the multi-turn ones need a simulated user: test_env_acebench);
    # each plays its milestone strings as written, then ends the dialogue as ACEBench's agent does
    report = _run(tmp_path, [_path(t) + ["finish conversation"] for t in tasks], bench="acebench",
                  data_dir=str(SHARED / "acebench"), limit=20)
    scores = report["scores"]
    assert scores["process_accuracy"] == scores["multi_step_process_accuracy"] == 1.0
    passed = [r["info"]["end_to_end"] for r in report["per_task"]]
    assert scores["end_to_end"] == scores["multi_step_end_to_end"] == round(sum(passed) / 20, 3)
    assert scores["pooled_end_to_end"] == pytest.approx(sum(passed) / 20)
    assert any("simulated user" in n and "Travel user rules" in n for n in report["notes"])
    assert report["rules"].startswith("acebench episode rules: official")
    assert "simulated user: smollm2-135m (the evaluated model: no --user-model given" in report["rules"]
    empty = _run(tmp_path, [["Sorry."]] * 3, bench="acebench", data_dir=str(SHARED / "acebench"), limit=3, max_turns=2)
    assert empty["scores"] == {"end_to_end": 0.0, "process_accuracy": 0.0, "multi_step_end_to_end": 0.0,
                               "multi_step_process_accuracy": 0.0, "pooled_end_to_end": 0.0,
                               "pooled_process_accuracy": 0.0}
    assert f"data: {SHARED / 'acebench'}, language en (3 multi-step, 0 multi-turn tasks, 0 of them on Travel)" in empty["notes"]


def test_envscaler_oracle_actions_score_full(tmp_path):
    from tests.test_env_envscaler import ORACLE

    tasks = make_env("envscaler").tasks("test")
    report = _run(tmp_path, [ORACLE[t.task_id] for t in tasks], bench="envscaler")
    assert report["scores"] == {"mean_reward": 1.0, "mean_reward_se": 0.0, "success_rate": 1.0, "success_rate_se": 0.0}
    assert report["behaviour"]["tool_calls_per_step"] > 0
    assert report["rules"] == "envscaler episode rules: official"  # the benchmark's own rules, named
    empty = _run(tmp_path, [["Done."]] * len(tasks), bench="envscaler")
    assert empty["scores"]["success_rate"] == 0.0
    # the bundled fixtures are labelled as such, in the report and in a comparison
    assert report["fixtures"] is True and any("bundled test fixtures" in n for n in report["notes"])
    (tmp_path / "a.json").write_text(json.dumps(report))
    (tmp_path / "b.json").write_text(json.dumps(empty))
    assert "bundled test fixtures, not the benchmark" in compare([tmp_path / "a.json", tmp_path / "b.json"]).title


def _evalplus_rows(name: str, n: int) -> list[dict]:
    with gzip.open(next((SHARED / "evalplus").glob(name)), "rt") as fh:
        return [json.loads(next(fh)) for _ in range(n)]


@needs(SHARED / "evalplus")
@pytest.mark.parametrize("bench,pattern", [("humaneval-plus", "HumanEvalPlus*"), ("mbpp-plus", "MbppPlus*")])
def test_evalplus_canonical_solutions_pass_empty_fail(tmp_path, bench, pattern):
    pytest.importorskip("evalplus.evaluate", reason="evalplus' evaluator needs appdirs, wget, tempdir, tree-sitter-python")
    rows = _evalplus_rows(pattern, 3)
    full = {r["task_id"]: (r["prompt"] + r["canonical_solution"] if bench == "humaneval-plus" else r["canonical_solution"])
            for r in rows}
    data = next((SHARED / "evalplus").glob(pattern))
    good = evalplus_evaluate(bench, data, full, tmp_path / "cache", workers=1)
    assert good == {tid: {"base": True, "plus": True} for tid in full}
    bad = evalplus_evaluate(bench, data, {tid: "" for tid in full}, tmp_path / "cache", workers=1)
    assert bad == {tid: {"base": False, "plus": False} for tid in full}
    if bench == "humaneval-plus":
        assert humaneval_base(full) == {tid: True for tid in full}
        assert humaneval_base({tid: "" for tid in full}) == {tid: False for tid in full}


@needs(SHARED / "evalplus")
def test_humaneval_plus_run_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("evalplus.evaluate", reason="evalplus' evaluator needs appdirs, wget, tempdir, tree-sitter-python")
    monkeypatch.setenv("LOPD_CACHE", str(tmp_path / "lopd-cache"))
    rows = _evalplus_rows("HumanEvalPlus*", 2)
    scripts = [[f"```python\n{r['prompt']}{r['canonical_solution']}```"] for r in rows]
    report = _run(tmp_path, scripts, bench="humaneval-plus", data_dir=str(SHARED / "evalplus"), limit=2, workers=1)
    assert report["scores"] == {"pass@1_base": 1.0, "pass@1_plus": 1.0, "humaneval_base": 1.0}
    assert report["per_task"][0]["plus"] is True


@needs(SHARED / "bfcl_v3")
def test_bfcl_ground_truth_passes_empty_fails_per_category():
    from stages.envs.bfcl_multi import score_multi_turn

    for category in ("base", "miss_func", "miss_param", "long_context"):
        task = make_env("bfcl", data_dir=SHARED / "bfcl_v3", categories=[category]).tasks("test", limit=1)[0]
        gt = task.meta["ground_truth"]
        assert score_multi_turn(task, [[turn] if turn else [] for turn in gt]), category
        assert not score_multi_turn(task, [[] for _ in gt]), category


def test_bfcl_scores_per_category_and_mean():
    def traj(cat: str, ok: bool) -> Trajectory:
        t = _traj([Turn(action="a")], task_id=f"{cat}_0")
        return t.model_copy(update={"success": ok, "info": json.dumps({"category": cat})})

    scores = bfcl_scores([traj("multi_turn_base", True), traj("multi_turn_base", False), traj("multi_turn_miss_func", True)])
    assert scores == {"base": 0.5, "miss_func": 1.0, "mean": 0.75}


def test_model_slug():
    assert model_slug("runs/lopd/final") == "runs-lopd-final" and model_slug("Qwen/Qwen3-4B") == "Qwen-Qwen3-4B"


def test_turn_cap_is_max_turns_and_accepts_max_steps():
    assert EvaluateConfig(bench="bfcl-v3", max_turns=3).max_turns == 3
    assert EvaluateConfig(bench="bfcl-v3", max_steps=2).max_turns == 2  # the former name
    assert EvaluateConfig.model_validate({"bench": "bfcl-v3", "max_steps": 4}).model_dump()["max_turns"] == 4
    with pytest.raises(ValueError):
        EvaluateConfig(bench="bfcl-v3", max_turns=0)


def test_reference_nll_equals_unpadded_per_token_reference_and_reaches_the_report(tmp_path):
    """reference_nll (batched, right-padded) = -mean log p of the reference ids + eos after the recorded
    prompt, computed one task at a time and one token at a time; and `lopd evaluate --bench
    bfcl-single` with an hf engine writes it per task and as the mean."""
    import torch

    from stages.benches import BENCHES
    from stages.core.text.chat import render_prompt
    from stages.engines import make_engine
    from stages.evaluate import reference_nll
    from tests.tiny import tiny_model

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    config = EvaluateConfig(bench="bfcl-single", limit=3, max_new_tokens=4, batch_size=2,
                            out=str(tmp_path / "report.json"))
    # the prompts' keys and values come from the generation's prefix cache (a budget that fits two
    # of the three: one prompt is encoded afresh)
    engine = make_engine("hf", model, tok, batch_size=2, prefix_cache_tokens=2000)
    report = run(config, Console(file=open("/dev/null", "w")), engine=engine, tokenizer=tok)
    assert engine.prefix_cache.entries
    prepared = BENCHES["bfcl-single"].prepare(config)
    env = prepared.env_factory()
    expected = {}
    for task in prepared.tasks:
        prompt = tok(render_prompt(tok, env.reset(task), task.tool_schemas), add_special_tokens=False)["input_ids"]
        target = tok(env.reference_actions(task)[0], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logits_TV = model(input_ids=torch.tensor([prompt + target])).logits[0].double()
        nll = [-torch.log_softmax(logits_TV[len(prompt) + k - 1], -1)[tid].item() for k, tid in enumerate(target)]
        expected[task.task_id] = sum(nll) / len(nll)
    per_task = {row["task_id"]: row["reference_nll"] for row in report["per_task"]}
    assert per_task == pytest.approx(expected, rel=1e-4)
    assert len({round(v, 6) for v in per_task.values()}) == 3
    assert report["scores"]["reference_nll"] == pytest.approx(sum(expected.values()) / 3, rel=1e-4)
    # a trajectory with no recorded prompt is left out rather than guessed
    bare = _traj([Turn(action="x", tool_calls=[], observation="", action_tokens=1)], task_id=prepared.tasks[0].task_id)
    assert reference_nll(model, None, tok, prepared, [bare]) == {}


def test_protocols_fill_what_is_not_given_and_the_report_records_it(tmp_path):
    from stages.evaluate import apply_protocol

    greedy = apply_protocol(EvaluateConfig(bench="bfcl-v3"))
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.max_new_tokens, greedy.max_turns) == (0.0, 1.0, 0, 256, 20)
    paper = apply_protocol(EvaluateConfig(bench="bfcl-v3", protocol="paper"))
    assert (paper.temperature, paper.top_p, paper.top_k, paper.max_new_tokens, paper.max_turns) == (0.7, 0.95, 20, 40_960, 30)
    coding = apply_protocol(EvaluateConfig(bench="humaneval-plus", protocol="paper", max_new_tokens=512, top_k=0))
    with pytest.raises(ValueError, match="no token budget or step cap for lopd-bed"):
        apply_protocol(EvaluateConfig(bench="lopd-bed", protocol="paper"))
    bed = apply_protocol(EvaluateConfig(bench="lopd-bed", protocol="paper", max_new_tokens=64, max_turns=6))
    assert (bed.temperature, bed.max_new_tokens, bed.max_turns) == (0.7, 64, 6)
    assert (coding.temperature, coding.top_k, coding.max_new_tokens) == (0.7, 0, 512)  # flags win
    report = _run(tmp_path, [["Done."]], bench="envscaler", limit=1, protocol="paper", max_turns=2)
    assert report["config"]["protocol"] == "paper"
    assert (report["config"]["temperature"], report["config"]["top_k"], report["config"]["max_turns"]) == (0.7, 20, 2)


def test_standard_error_over_tasks_hand_computed():
    from stages.benches import standard_error

    assert standard_error([1.0, 0.0, 0.0, 1.0]) == pytest.approx((1 / 12) ** 0.5)  # var 1/3 over 4 tasks
    assert standard_error([0.5, 0.5, 0.5]) == 0.0 and standard_error([1.0]) == 0.0


def test_paired_difference_by_hand_and_in_the_compare_table(tmp_path):
    from rich.console import Console

    from stages.compare import compare, differences, paired_difference

    base = [{"task_id": "a", "reward": 0.0, "success": False}, {"task_id": "b", "reward": 0.5, "success": False},
            {"task_id": "c", "reward": 1.0, "success": True}, {"task_id": "only-base", "reward": 1.0}]
    other = [{"task_id": "c", "reward": 1.0, "success": True}, {"task_id": "a", "reward": 1.0, "success": True},
             {"task_id": "b", "reward": 0.0, "success": False}, {"task_id": "only-other", "reward": 0.0}]
    # differences over a, b, c: +1, -0.5, 0 -> mean 1/6, sample sd sqrt(((5/6)^2+(2/3)^2+(1/6)^2)/2) = sqrt(7/12)
    mean, se, n, up, down = paired_difference(base, other, "reward")
    assert (n, up, down) == (3, 1, 1)
    assert abs(mean - 1 / 6) < 1e-12 and abs(se - (7 / 12) ** 0.5 / 3 ** 0.5) < 1e-12
    mean, se, n, _, _ = paired_difference(base, other, "success")  # +1, 0, 0
    assert n == 3 and abs(mean - 1 / 3) < 1e-12 and abs(se - (1 / 3) ** 0.5 / 3 ** 0.5) < 1e-12
    assert paired_difference(base, other, "reference_nll") is None
    paths = []
    for name, rows in (("base", base), ("other", other)):
        report = {"bench": "lopd-bed", "model": name, "scores": {"mean_reward": 0.5}, "behaviour": {}, "per_task": rows}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(report))
        paths.append(path)
    console = Console(width=200, record=True)
    console.print(compare(paths))
    text = console.export_text()
    assert "paired Δ reward" in text and "+0.167 ± 0.441 (1 higher / 1 lower, n 3)" in text
    [line] = differences(paths)
    assert "scored other tasks than" in line
    assert "(1 only in it, 1 only in the first, 3 in both): its score deltas are unpaired" in line
    assert differences([paths[0], paths[0]]) == []  # the same tasks: no warning


def test_compare_warns_of_other_decoding_and_a_composer_and_names_the_composer(tmp_path):
    from typer.testing import CliRunner

    from lopd_cli.main import app

    config = {"protocol": "greedy", "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 256,
              "max_turns": 30, "seed": 0, "composer": None, "store": None, "data_dir": None}
    rows = [{"task_id": "a", "success": True}, {"task_id": "b", "success": False}]
    paths = []
    for name, changes in (("base", {}), ("composer", {"max_new_tokens": 96, "seed": 1, "composer": "runs/c0/final",
                                                      "store": "runs/store"})):
        report = {"bench": "lopd-bed", "model": "m", "scores": {"mean_reward": 0.5}, "behaviour": {},
                  "per_task": rows, "config": {**config, **changes}}
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(report))
    base, composer = map(str, paths)
    result = CliRunner().invoke(app, ["evaluate", "--compare", base, composer])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "metric" in line)
    assert "m (no composer)" in header and "m + composer runs/c0/final" in header
    from stages.compare import differences

    assert differences(paths) == [  # the seed is unused by greedy decoding: no warning
        f"{composer} was decoded otherwise than {base}: max_new_tokens 96 ({base}: 256): its deltas are not the "
        "models' alone",
        f"{composer} generated with composer runs/c0/final (store runs/store), {base} with none: its deltas "
        "include the composer's effect"]
    assert sum(line.startswith("warning: ") for line in result.output.splitlines()) == 2  # one line each


def test_tasks_past_the_context_window_score_0_and_the_report_counts_them(tmp_path):
    class ShortWindow(SequentialEngine):
        context_window = 64  # every livecodebench fixture prompt is longer

    (tmp_path / "report.json").unlink(missing_ok=True)
    config = EvaluateConfig(out=str(tmp_path / "report.json"), batch_size=1, bench="livecodebench",
                            data_dir=str(FIXTURES / "livecodebench"), release="v6", model="tiny")
    with pytest.warns(RuntimeWarning, match="context window of 64: episode ended, scored 0"):
        report = run(config, Console(file=open("/dev/null", "w")), engine=ShortWindow([["x"]] * 3),
                     tokenizer=tiny_tokenizer())
    assert report["scores"] == {"pass@1": 0.0} and len(report["per_task"]) == 3 and report["context_overflows"] == 3
    assert {r["info"]["stopped"] for r in report["per_task"]} == {"context window"}
    assert ("3 task(s) ended at the model's context window, scored 0 (info.stopped 'context window'): "
            "lower --max-new-tokens or --max-turns") in report["notes"]
