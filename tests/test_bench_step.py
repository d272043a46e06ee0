"""benchmarks/bench_step.py keeps running on the project's code paths (no timing is checked here):
a one-layer SmolLM2-shaped model, one step of LOPD (composer, latent teacher, in-memory
retrieval) and of OPSD (verified references from the in-memory store)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_step", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_step"] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_step"]


@pytest.mark.parametrize("method, extra", [("lopd", []), ("lopd", ["--no-shared-latents"]), ("opsd", []),
                                           ("lopd", ["--no-head-at-supervised"])])
def test_one_small_step_trains_on_the_sampled_tokens(bench, method, extra, capsys):
    rows = bench.main(["--shape", "smollm2-135m", "--method", method, "--device", "cpu", "--layers", "1",
                       "--prompt-len", "16", "--response-len", "4", "--batch", "2", "--warmup", "0",
                       "--steps", "1", "--J", "2", "--K", "4", "--depth", "1", "--exp-tokens", "32",
                       "--matmul-n", "64", *extra])
    out = capsys.readouterr().out
    (row,) = rows
    assert row["rows"] == 2 and row["generated"] > 0
    assert row["trained"] == row["prompt"] + row["generated"]  # a row = the prompt + the sampled ids
    tokens = row["tokens"]
    assert tokens[("body", False)] >= row["prompt"] + row["generated"] - 2  # the rollout's forwards
    assert tokens[("body", True)] >= row["trained"]  # the student at least (+ LOPD's teacher and composer)
    if method == "lopd":
        assert tokens[("body", True)] >= 2 * row["trained"] + 2 * 2 * 4 + 2 * 2 * 16  # + teacher, latents, composer
        assert {"student_s", "teacher_s", "composer_s"} <= set(row)
    assert row["flops"] > 0 and "FLOP-bound time:" in out and "peak memory: RSS" in out
    if "--no-head-at-supervised" in extra:  # logits at every position the student's forward computes
        assert tokens[("head", True)] >= row["trained"]
    else:  # the losses' heads only at the sampled tokens (LOPD: student KL, teacher KL and log-probs)
        assert 0 < tokens[("head", True)] <= 3 * row["generated"] < row["trained"]
