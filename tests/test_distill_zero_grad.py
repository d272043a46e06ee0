"""A run whose steps have a zero gradient says so (issue 31 item 13): GRPO on an environment
whose reward never varies learns nothing; the run warns at the second such step and its
summary lists them. Tiny model and seed store of tests/test_distill.py."""
from __future__ import annotations

import dataclasses
import io

from rich.console import Console

import stages.distill.recipe as distill
from stages.envs import StepResult, register
from tests.test_distill import ToyEnv, _hash_embedder, assets  # noqa: F401 (fixtures)
from tests.test_method_grpo import grpo_config

FLAT = "toy-flat-reward"


@register(FLAT)
class FlatEnv(ToyEnv):
    """The toy two-turn environment, every episode rewarded 1: no group has reward variance."""

    name = FLAT

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        return dataclasses.replace(result, reward=1.0) if result.done else result


def _run(config) -> tuple[distill.DistillReport, str]:
    out = io.StringIO()
    report = distill.run(config, Console(file=out, width=300))
    return report, " ".join(out.getvalue().split())


def test_zero_gradient_steps_warn_after_two_and_in_the_summary(assets, tmp_path):
    report, text = _run(grpo_config(assets, tmp_path, "flat", env=FLAT, steps=3))
    assert report.zero_grad_steps == [1, 2, 3]
    assert text.count("warning: steps 1, 2 had a zero gradient") == 1  # once, at the second step
    assert "warning: 3 of the 3 steps run now (steps 1..3 of 3) had a zero gradient: steps 1, 2, 3;" in text


def test_a_resumed_run_counts_its_zero_gradient_steps_among_the_steps_it_ran(assets, tmp_path):
    """Resumed after step 1 of a run extended to 3 steps: this call ran steps 2 and 3 only."""
    config = grpo_config(assets, tmp_path, "flat", env=FLAT, steps=1)
    first, text = _run(config)
    assert first.zero_grad_steps == [1]
    assert "warning: 1 of the 1 step run now (step 1 of 1) had a zero gradient: step 1;" in text
    report, again = _run(config.model_copy(update={"resume": True, "steps": 3}))
    assert (report.first_step, report.last_step, report.zero_grad_steps) == (2, 3, [2, 3])
    assert "warning: steps 2, 3 had a zero gradient: the student did not change at those steps" in again
    assert "warning: 2 of the 2 steps run now (steps 2..3 of 3) had a zero gradient: steps 2, 3;" in again


def test_a_learning_run_has_no_zero_gradient_warning_and_a_finished_one_says_so(assets, tmp_path):
    config = grpo_config(assets, tmp_path, "varied", temperature=1.0, group_size=4, steps=2)
    report, text = _run(config)
    assert report.zero_grad_steps == [] and "zero gradient" not in text
    assert "steps 1..2 (2 this call)" in text
    _, again = _run(config.model_copy(update={"resume": True}))  # nothing left to train
    assert "all 2 steps were done already (0 this call)" in again and "3..2" not in again


def test_training_sequences_skipped_by_max_len_are_named_on_the_step_line(assets, tmp_path):
    """A --max-len that the prompt alone fills trains nothing; the run says so and names the flag."""
    report, text = _run(grpo_config(assets, tmp_path, "short", temperature=1.0, group_size=4, steps=1, max_len=4))
    assert "warning: step 1:" in text and "training sequences skipped, their prompt alone fills --max-len 4" in text
    assert "no action token was trained" in text and "raise --max-len" in text
    _, fits = _run(grpo_config(assets, tmp_path, "fits", temperature=1.0, group_size=4, steps=1))
    assert "training sequences skipped" not in fits
