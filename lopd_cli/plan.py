"""`lopd plan`: the estimated memory per rank of a distill run (stages/plan.py), no model loaded."""
from __future__ import annotations

from typing import Optional

import typer


def plan(
    model: str = typer.Option(..., "--model", help="Backbone: a config.json, its folder, or a known name (qwen3-8b, qwen3-4b, qwen3-1.7b, smollm2-135m)."),
    method: str = typer.Option("lopd", "--method", help="lopd, grpo, sdft, opsd, sdpo or skill-sd."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Ranks (GPUs) in all: processes per node x nodes."),
    dtype: str = typer.Option("bfloat16", "--dtype", metavar="[bfloat16|float16|float32]", help="Run dtype: bfloat16, float16 or float32."),
    shard: str = typer.Option("none", "--shard", metavar="[none|fsdp]", help="none or fsdp (as lopd distill --shard)."),
    student_lora_rank: int = typer.Option(8, "--student-lora-rank", help="0 = full fine-tuning."),
    micro_batch: int = typer.Option(4, "--micro-batch", help="Training sequences per forward/backward."),
    max_len: int = typer.Option(2048, "--max-len", help="Tokens of a training sequence."),
    activation_checkpointing: bool = typer.Option(False, "--activation-checkpointing/--no-activation-checkpointing", help="Recompute activations in backward."),
    rollout_batch: int = typer.Option(8, "--rollout-batch", help="Episodes generated together."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="Tokens per action."),
    J: int = typer.Option(3, "--J", help="lopd: retrieved experiences per row."),
    K: int = typer.Option(32, "--K", help="lopd: latent tokens per experience."),
    max_exp_tokens: int = typer.Option(512, "--max-exp-tokens", help="lopd: tokens per experience."),
    kl_coef: float = typer.Option(0.0, "--kl-coef", help="grpo, skill-sd: > 0 keeps a frozen reference copy."),
    teacher: str = typer.Option("frozen", "--teacher", help="sdft/opsd: frozen, ema or current."),
    gpu_gb: float = typer.Option(80.0, "--gpu-gb", min=1.0, help="Memory of one GPU in GB."),
    composer_blocks: Optional[int] = typer.Option(None, "--composer-blocks", min=1, help="lopd: QFormer blocks (1 when shared, the default)."),
) -> None:
    """Estimate the memory per rank (weights, gradients, optimizer, activations, teacher copies,
    composer, rollout) of a distill run and say whether it fits --gpu-gb.

    Exit status: 0 when it fits; 1 when it does not (after the table and the settings that would
    fit); 2 for bad settings."""
    from stages import plan as stage

    _check(method, dict(dtype=dtype, shard=shard, student_lora_rank=student_lora_rank, micro_batch=micro_batch,
                        max_len=max_len, activation_checkpointing=activation_checkpointing, rollout_batch=rollout_batch,
                        max_new_tokens=max_new_tokens, J=J, K=K, max_exp_tokens=max_exp_tokens, kl_coef=kl_coef,
                        teacher=teacher))
    settings = stage.PlanInput(
        backbone=model, method=method, nproc=nproc, dtype=dtype, shard=shard, student_lora_rank=student_lora_rank,
        micro_batch=micro_batch, max_len=max_len, activation_checkpointing=activation_checkpointing,
        rollout_batch=rollout_batch, max_new_tokens=max_new_tokens, J=J, K=K, max_exp_tokens=max_exp_tokens,
        kl_coef=kl_coef, teacher=teacher, gpu_gb=gpu_gb, **({"composer_blocks": composer_blocks} if composer_blocks else {}))
    result = stage.plan(settings)
    typer.echo(stage.render(settings, result))
    if not result.fits:
        raise typer.Exit(1)


def _check(method: str, values: dict) -> None:
    """Validate plan settings as `lopd distill` does: each by the field of its name in
    :class:`stages.distill.settings.DistillConfig`, else in ``method``'s options model, else in
    the first method's that has it (``J``: lopd's; ``kl_coef``: grpo's; ``teacher``: sdft's).

    Raises:
        ValidationError: the first invalid value (its location: the setting's name).
    """
    from pydantic import create_model

    from stages.distill.settings import DistillConfig
    from stages.methods.options import METHOD_OPTIONS

    models = [DistillConfig, METHOD_OPTIONS.get(method, DistillConfig), *METHOD_OPTIONS.values()]
    fields = {name: next(m.model_fields[name] for m in models if name in m.model_fields) for name in values}
    create_model("PlanSettings", **{name: (f.annotation, f) for name, f in fields.items()})(**values)
