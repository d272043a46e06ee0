"""`lopd plan` (stages/plan.py): parameter counts against real models, the per-rank memory of
sharded and unsharded full fine-tuning, and the command's output and refusals."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.plan import GB, PlanInput, backbone_of, plan, render
from tests.tiny import save_tiny, tiny_model, tiny_tokenizer


def test_parameter_count_of_a_config_folder_matches_the_model(tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    model = tiny_model(tiny_tokenizer())
    b = backbone_of(str(folder))
    assert b.params() == sum(p.numel() for p in model.parameters())
    assert b.layer_params() == sum(p.numel() for p in model.model.layers[0].parameters())


def test_qwen3_8b_full_fine_tuning_fits_80gb_only_sharded():
    b = backbone_of("qwen3-8b")
    assert b.params() == pytest.approx(8.19e9, rel=0.01)  # Qwen3-8B: 8.2B parameters
    common = dict(backbone="qwen3-8b", method="lopd", nproc=8, student_lora_rank=0, micro_batch=1,
                  max_len=4096, activation_checkpointing=True)
    whole, sharded = plan(PlanInput(**common)), plan(PlanInput(**common, shard="fsdp"))
    assert whole.components["student weights"] == 2 * b.params()  # bfloat16, every rank
    assert sharded.components["student weights"] == 4 * b.params() // 8  # float32 master, 1/8 each
    assert sharded.components["optimizer (AdamW)"] == 8 * b.params() // 8
    assert not whole.fits and sharded.fits and sharded.peak < whole.peak - 40 * GB
    text = render(PlanInput(**common, shard="fsdp"), sharded)
    assert "FSDP2 over 8 ranks" in text and "fits on 80 GB" in text


def test_lora_student_and_grpo_hold_no_teacher_copy():
    lora = plan(PlanInput(backbone="qwen3-8b", method="lopd"))
    grpo = plan(PlanInput(backbone="qwen3-8b", method="grpo", student_lora_rank=0))
    assert lora.components["teacher copies"] == 0 and grpo.components["teacher copies"] == 0
    assert plan(PlanInput(backbone="qwen3-8b", method="grpo", student_lora_rank=0,
                          kl_coef=0.1)).components["teacher copies"] > 0


def test_plan_command_prints_the_verdict_and_refuses_bad_settings():
    ok = CliRunner().invoke(app, ["plan", "--model", "qwen3-8b", "--student-lora-rank", "0", "--nproc", "8",
                                  "--shard", "fsdp", "--micro-batch", "1", "--max-len", "4096",
                                  "--activation-checkpointing"])
    assert ok.exit_code == 0 and "per rank:" in ok.output and "fits on 80 GB GPUs" in ok.output
    for args, message in ((["--model", "nope-7b"], "unknown backbone 'nope-7b'"),
                          (["--model", "qwen3-8b", "--shard", "fsdp"], "add --student-lora-rank 0"),
                          (["--model", "qwen3-8b", "--method", "skill-sd"], "lopd plan knows --method")):
        bad = CliRunner().invoke(app, ["plan", *args])
        assert bad.exit_code != 0 and message in bad.output, bad.output
