"""`lopd plan` (stages/plan.py): parameter counts against real models, the per-rank memory of
sharded and unsharded full fine-tuning, and the command's output and refusals."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from dataclasses import replace

from stages.plan import GB, PlanInput, backbone_of, fitting, plan, render
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
    assert whole.components["student weights"] == 4 * b.params()  # float32 master weights, every rank
    assert sharded.components["student weights"] == 4 * b.params() // 8  # float32 master, 1/8 each
    assert sharded.components["optimizer (AdamW)"] == 8 * b.params() // 8
    # (the sharded head computes full logits: 7.5 GB of the 4096 x 151,936 float32 ones and their gradient)
    assert not whole.fits and sharded.fits and sharded.peak < whole.peak - 30 * GB
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
                          (["--model", "qwen3-8b", "--method", "ppo"], "lopd plan knows --method")):
        bad = CliRunner().invoke(app, ["plan", *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output
    assert "1 when it does not" in CliRunner().invoke(app, ["plan", "--help"]).output


def test_plan_refuses_the_settings_distill_and_coldstart_refuse_in_their_words():
    def line(*args):
        result = CliRunner().invoke(app, list(args))
        return result.exit_code, result.output.strip().splitlines()[-1]

    coldstart = line("coldstart", "--J", "0")
    assert coldstart == (2, "error: invalid option --J: Input should be greater than or equal to 1 (got 0)")
    assert line("plan", "--model", "qwen3-4b", "--J", "0") == coldstart
    assert line("distill", "--env", "lopd-bed", "--composer", "c", "--J", "0") == coldstart
    assert line("plan", "--model", "qwen3-4b", "--method", "sdft", "--teacher", "emma")[1].startswith(
        "error: invalid option --teacher: did you mean 'ema'?")


def test_a_misspelt_backbone_gets_the_closest_known_name():
    for name, close in (("qwen3-4", "qwen3-4b"), ("qwn3-8b", "qwen3-8b"), ("Qwen/Qwen3-4", "Qwen/Qwen3-4B")):
        with pytest.raises(ValueError, match=f"^unknown backbone '{name}': did you mean '{close}'\\? give a config"):
            backbone_of(name)
    with pytest.raises(ValueError, match="^unknown backbone 'nope-7b': give a config"):  # nothing close
        backbone_of("nope-7b")


def test_a_plan_that_does_not_fit_names_the_flags_that_do():
    p = PlanInput(backbone="qwen3-4b", gpu_gb=16)
    fit = fitting(p)
    assert not plan(p).fits and fit.fits and fit.changes == {"activation_checkpointing": True, "micro_batch": 1}
    assert plan(replace(p, **fit.changes)).fits and not plan(replace(p, micro_batch=2, activation_checkpointing=True)).fits
    assert [peak for *_, peak in fit.trail] == sorted((peak for *_, peak in fit.trail), reverse=True)
    assert fitting(replace(p, gpu_gb=200)).changes == {}  # it fits already
    assert fitting(replace(p, student_lora_rank=0, nproc=8, gpu_gb=40)).changes.get("shard") == "fsdp"
    assert "shard" not in fitting(replace(p, student_lora_rank=0, gpu_gb=40)).changes  # one rank: nothing to shard
    out = CliRunner().invoke(app, ["plan", "--model", "qwen3-4b", "--gpu-gb", "16"])
    assert out.exit_code == 1 and "does NOT fit on 16 GB" in out.output  # a script can test the verdict
    assert "fits 16 GB with --activation-checkpointing --micro-batch 1 (peak after" in out.output
    assert CliRunner().invoke(app, ["plan", "--model", "qwen3-4b", "--gpu-gb", "200"]).exit_code == 0
    tiny = CliRunner().invoke(app, ["plan", "--model", "qwen3-4b", "--gpu-gb", "4"])
    flat = " ".join(line.strip() for line in tiny.output.splitlines())  # long lines are broken at spaces
    assert tiny.exit_code == 1 and "still does NOT fit 4 GB with" in flat and "a larger GPU or more ranks" in flat


@pytest.mark.parametrize("method", ["sdpo", "skill-sd"])
def test_sdpo_and_skill_sd_hold_a_teacher_copy_of_a_full_student_and_an_adapter_of_a_lora_one(method):
    b = backbone_of("qwen3-4b")
    full = plan(PlanInput(backbone="qwen3-4b", method=method, student_lora_rank=0))
    lora = plan(PlanInput(backbone="qwen3-4b", method=method, student_lora_rank=8))
    assert full.components["teacher copies"] == 4 * b.params()  # a float32 copy of the float32 student
    assert lora.components["teacher copies"] == 4 * b.lora_params(8, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert full.components["composer + anchor"] == 0
    assert plan(PlanInput(backbone="qwen3-4b", method="skill-sd", student_lora_rank=0,
                          kl_coef=0.1)).components["teacher copies"] == 6 * b.params()  # + GRPO's bf16 reference


def test_distill_refuses_a_step_that_outgrows_free_memory_with_the_flags_that_fit(monkeypatch):
    """The newcomer's run: distill defaults (30 turns x 256 tokens, no --max-len, micro-batch 4)
    on a 20 GB machine is refused before any model loads, naming flags whose plan fits."""
    import psutil
    from types import SimpleNamespace

    from stages.distill.settings import DistillConfig
    from stages.plan import check_distill_memory, fitting, run_plan_input

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=int(20 * GB)))
    config = DistillConfig(env="bfcl", method="grpo", model="smollm2-135m", store="s", out="o", device="cpu")
    with pytest.raises(ValueError, match=r"^distill: a step needs about \d+\.\d GB \(lopd plan's estimate for micro-batch "
                                         r"4 x 8192 tokens \(no --max-len: whole episodes of 30 turns x 256 tokens "
                                         r"assumed\), float32; .*\), 20\.0 GB of memory available: fits 20 GB with "
                                         r"--activation-checkpointing"):
        check_distill_memory(config)
    p = run_plan_input(config, nproc=1, dtype="float32", available_bytes=int(20 * GB))
    changes = fitting(p).changes
    fixed = config.model_copy(update=changes)
    assert check_distill_memory(fixed).fits
    monkeypatch.setenv("LOPD_MEMORY_CHECK", "0")
    assert check_distill_memory(config) is None
    monkeypatch.delenv("LOPD_MEMORY_CHECK")
    two = check_distill_memory(fixed.model_copy(update={"max_len": 1024}), world_size=2)
    assert two.gpu_bytes == int(10 * GB)  # two processes share the machine's memory


# benchmarks/bench_vs_trl.py --tools lopd-opsd --generations 8: OPSD on SmolLM2-135M (float32, the
# CPU, LoRA rank 8), 2 tasks x 8 rollouts in one micro-batch of 16, one turn of 64 new tokens, no
# --max-len: the plan takes 512 + 64 = 576-token rows with distinct prompts.
BENCH_VS_TRL = dict(env="bfcl", method="opsd", model="smollm2-135m", store="s", out="o", device="cpu",
                    micro_batch=16, rollout_batch=16, tasks_per_step=2, group_size=8, max_turns=1,
                    max_new_tokens=64, options={"reduction": "sequence"})
# Measured (docs/results/memory-estimate.md, benchmarks/bench_memory_estimate.py, peak RSS of one real
# step): 8 distinct rows of 576 tokens peak at 6,739 MiB; 8 and 16 rows of 192 tokens at 2,942 and
# 4,606 MiB, so 8 more rows add 1,664 MiB at 192 tokens, 3 x that at 576: 16 rows of 576 tokens
# need about 6,739 + 3 x 1,664 = 11,731 MiB. (The bench's own step, rows of 192 tokens that share
# their prompt 8 times, peaks lower still.)
MEASURED_16_ROWS_576_MIB = 11_731


def test_the_bench_vs_trl_opsd_step_is_estimated_near_its_measured_peak_and_not_refused(monkeypatch):
    """Before: 22.9 GB estimated (full (B, T, V) logits at every position for student and teacher,
    52 KB per token and layer, a 2.5 GB CUDA allowance) and refused with 22.1 GB available."""
    import psutil
    from types import SimpleNamespace

    from stages.distill.settings import DistillConfig
    from stages.plan import check_distill_memory, run_plan_input

    config = DistillConfig(**BENCH_VS_TRL)
    p = run_plan_input(config, nproc=1, dtype="float32", available_bytes=int(22.1e9), device="cpu")
    assert p.max_len == 576 and p.micro_batch == 16
    peak_mib = plan(p).peak / 2**20
    assert 0.7 * MEASURED_16_ROWS_576_MIB < peak_mib < 1.3 * MEASURED_16_ROWS_576_MIB, peak_mib
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=int(22.1e9)))
    assert check_distill_memory(config).fits
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=int(4e9)))
    with pytest.raises(ValueError, match=r"^distill: a step needs about \d+\.\d GB .* 4\.0 GB of memory available"):
        check_distill_memory(config)  # what does not fit is still refused
