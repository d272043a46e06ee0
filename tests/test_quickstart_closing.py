"""examples/quickstart/closing.py: the quickstart's closing words, read off a run folder laid out as
examples/quickstart/run.sh leaves it (synthetic reports here)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "closing", Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "closing.py")
closing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(closing)


def _report(successes: list[bool], nll: list[float]) -> dict:
    return {"per_task": [{"task_id": f"t{i}", "success": s, "reward": float(s), "reference_nll": x}
                         for i, (s, x) in enumerate(zip(successes, nll))]}


def test_a_tiny_standard_error_keeps_two_significant_digits():
    assert closing.plus_minus(-0.0034, 0.00041) == "-0.00340 ± 0.00041"
    assert closing.plus_minus(0.25, 0.25) == "+0.250 ± 0.250" and closing.plus_minus(0.0, 0.0) == "+0.000 ± 0.000"


def test_verdict_needs_two_standard_errors_and_knows_which_way_is_better():
    assert closing.verdict(0.10, 0.04) == "better"
    assert closing.verdict(0.10, 0.06) == "no change beyond 2 SE"
    assert closing.verdict(-0.10, 0.04) == "worse"
    assert closing.verdict(-0.10, 0.04, lower_is_better=True) == "better"
    assert closing.verdict(0.0, 0.0) == "no change beyond 2 SE"


def test_closing_words_say_what_moved_and_what_did_not(tmp_path, capsys):
    run = tmp_path / "quickstart"
    (run / "eval").mkdir(parents=True)
    warm = _report([False, True, False, False], [1.0, 0.8, 1.2, 0.9])
    # success: one task up, none down (+0.25 ± 0.25: no change); NLL lower on every task by 0.1-0.2
    lopd = _report([True, True, False, False], [0.9, 0.6, 1.05, 0.8])
    (run / "eval" / "lopd-bed-warm.json").write_text(json.dumps(warm))
    (run / "eval" / "lopd-bed-lopd.json").write_text(json.dumps(lopd))
    (run / "composer").mkdir()
    (run / "composer" / "ladder.json").write_text(json.dumps({"targets": 8, "decisive_tokens": 40, "differences": [
        {"x": "c", "y": "a", "diff": -0.5, "se": 0.1, "diff_decisive": -1.2, "se_decisive": 0.2},
        {"x": "c", "y": "d", "diff": 0.0, "se": 0.01, "diff_decisive": -0.01, "se_decisive": 0.02}]}))
    (run / "lopd").mkdir()
    (run / "lopd" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 1, "reverse_kl": 0.4, "Delta": 0.1, "reward_mean": 0.0},
        {"step": 2, "reverse_kl": 0.2, "Delta": 0.3, "reward_mean": 0.5})))
    assert closing.main(run) == 0
    out = capsys.readouterr().out
    assert ("the warm start solved 1 and LOPD's student 2 (one evaluation at their rate 0.375 has two standard "
            "errors of ±0.484)") in out
    assert "success rate: +0.250 ± 0.250 paired over 4 tasks (1 higher, 0 lower): no change beyond 2 SE." in out
    assert "(nats/token): -0.137 ± 0.024 paired over 4 tasks (0 higher, 4 lower): better." in out
    assert "with its latents against without: -1.200 ± 0.200 nats: better." in out
    assert "another task's (the content): -0.010 ± 0.020 nats: no change beyond 2 SE." in out
    assert "LOPD trained 2 steps." in out and "0.400 at step 1, 0.200 at the last step" in out and "mean +0.200" in out and "0.250." in out


def test_closing_words_skip_what_the_run_did_not_write(tmp_path, capsys):
    assert closing.main(tmp_path) == 0
    out = capsys.readouterr().out
    assert "What happened:" in out and "solved" not in out and "composer" not in out
