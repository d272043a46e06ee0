"""benchmarks/bench_rollout.py keeps running on the engine's code paths (no timing is checked
here): a two-layer SmolLM2-shaped LoRA student on the CPU, where nothing compiles, so the
``compile`` mode (its static cache rounded up) must sample the same tokens as ``eager``."""
from __future__ import annotations

from benchmarks.bench_rollout import main


def test_every_mode_runs_its_calls_and_the_modes_sample_the_same_tokens(capsys):
    rows = main(["--shape", "smollm2-135m", "--layers", "2", "--device", "cpu", "--prompt-len", "40",
                 "--task-len", "8", "--response-len", "6", "--batch", "4", "--group-size", "2", "--calls", "2",
                 "--batches", "4", "2", "--modes", "eager", "compile", "no-prefix-cache", "--timeout", "300"])
    assert [r["mode"] for r in rows] == ["eager", "compile", "no-prefix-cache"]
    for row in rows:
        assert row["status"] == "ok"
        assert [c["rows"] for c in row["calls"]] == [4, 2]
        assert all(c["seconds"] > 0 and 0 < c["generated"] <= c["rows"] * 6 for c in row["calls"])
    generated = {r["mode"]: [c["generated"] for c in r["calls"]] for r in rows}
    assert generated["compile"] == generated["eager"]
    table = capsys.readouterr().out
    assert table.count("| ok |") == 3
