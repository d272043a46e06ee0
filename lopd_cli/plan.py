"""`lopd plan`: the estimated memory per rank of a distill run (stages/plan.py), no model loaded."""
from __future__ import annotations

import typer


def plan(ctx: typer.Context) -> None:
    """Estimate the memory per rank (weights, gradients, optimizer, activations, teacher copies,
    composer, rollout) of a distill run and say whether it fits --gpu-gb.

    Exit status: 0 when it fits; 1 when it does not (after the table and the settings that would
    fit); 2 for bad settings."""
    from stages import plan as stage

    values = ctx.params  # the flags: the fields of stages.plan.PlanInput
    _check(values["method"], {name: values[name] for name in (
        "dtype", "shard", "student_lora_rank", "micro_batch", "max_len", "activation_checkpointing", "rollout_batch",
        "max_new_tokens", "J", "K", "max_exp_tokens", "kl_coef", "teacher")})
    settings = stage.PlanInput(**{name: value for name, value in values.items() if value is not None})
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
