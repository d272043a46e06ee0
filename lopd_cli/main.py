"""`lopd`: Latent On-Policy Self-Distillation for LLM agents.

Pipeline: collect -> index -> coldstart -> distill -> evaluate. Every command only turns its flags
into a validated config and calls ``stages.<stage>.run(config)``; a stage command's flags are the
fields of its settings model, made from it (:func:`lopd_cli.options.settings_command`).
"""
from __future__ import annotations

from typing import Optional

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from lopd_cli.errors import HintingGroup, err_console, friendly, one_line_warning
from lopd_cli.options import CONFIG, MethodOptionsCommand, given_flags, given_options, settings_command
from lopd_cli.plan import plan as _plan
from lopd_cli.store import store_restore, store_versions

app = typer.Typer(
    name="lopd",
    cls=HintingGroup,  # --learning-rate: did you mean --lr?
    help="Post-train LLM agents with Latent On-Policy Self-Distillation (LOPD).\n\n"
    "Stages: collect -> index -> coldstart -> distill -> evaluate; `sft` warm-starts a student; `study` compares methods.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # click's plain help: flags shown as flags (rich's shows `--resume <bool>`)
)

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"lopd {version('lopd')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("lopd (not installed: pip install -e .)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                      help="Print lopd's version and exit."),
) -> None:
    """Post-train LLM agents with Latent On-Policy Self-Distillation (LOPD)."""
    import os
    import sys
    import warnings

    if not sys.stdout.isatty():  # output to a file or pipe: rich would wrap tables at 80 columns, mid-word
        os.environ.setdefault("COLUMNS", "200")
    # no weight-loading bar on every model load (transformers reads this when first imported); ours stay
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
    warnings.showwarning = one_line_warning


def _config(ctx: typer.Context, config_file: Optional[str], config_cls: type, exclude: tuple[str, ...] = (),
            resume: bool = False, required: Optional[tuple[str, str]] = None) -> BaseModel:
    """The command's validated config from its settings by field name (:func:`stages.settings.resolve`):
    the flags given, the ``--config`` file, with ``resume`` the run folder's saved settings, the
    flags' defaults. ``required``: ``(field, message)``, refused with the message when no flag
    nor the file gives the field."""
    from stages.settings import resolve, validated

    given, defaults = given_flags(ctx, exclude)
    values = resolve(config_cls, ctx.info_name, given, config_file, defaults=defaults, resume=resume,
                     note=lambda message: err_console.print(f"note: {message}", soft_wrap=True))
    if required is not None and values.get(required[0]) is None:
        raise ValueError(required[1])
    return validated(config_cls, values, flags=given, config_file=config_file)


@app.command(cls=settings_command("stages.collect:CollectConfig"))
@friendly
def collect(ctx: typer.Context, config: Optional[str] = CONFIG) -> None:
    """Roll out a policy on an environment's tasks and store scored trajectories."""
    from stages import collect as stage
    from stages.envs import env_names

    stage.run(_config(ctx, config, stage.CollectConfig, required=(
        "env", f"--env is required ({', '.join(env_names())}), as a flag or in the --config file")))


@app.command(cls=settings_command("stages.index:IndexConfig"))
@friendly
def index(ctx: typer.Context, config: Optional[str] = CONFIG) -> None:
    """Embed new trajectories and build the vector and full-text indexes used for retrieval."""
    from stages import index as stage

    stage.run(_config(ctx, config, stage.IndexConfig))


@app.command(cls=settings_command("stages.coldstart.settings:ColdstartConfig"))
@friendly
def coldstart(ctx: typer.Context, config: Optional[str] = CONFIG) -> None:
    """Cold-start the composer phi_0 on successful trajectories, backbone frozen."""
    from stages.coldstart.settings import ColdstartConfig

    settings = _config(ctx, config, ColdstartConfig, resume=ctx.params["resume"])  # refused before torch loads
    from stages.core.data.store import ExperienceStore

    ExperienceStore.check_location(settings.experiences, create=False)  # a missing store, too
    from stages.coldstart import recipe as stage

    stage.run(settings)


@app.command()
@friendly
def ladder(
    run: str = typer.Argument(..., metavar="RUN", help="A finished `lopd coldstart --out` folder (run it from the folder the cold start ran in: the run's paths are relative to it).", show_default=False),
    targets: Optional[int] = typer.Option(None, "--targets", min=0, help="Held-out targets to score (a seeded subset; 0 = all; default: the run's --ladder-targets)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the subset (default: the run's --seed)."),
    out: Optional[str] = typer.Option(None, "--out", help="Also write the ladder as JSON here."),
    rungs: Optional[str] = typer.Option(None, "--rungs", help="The rungs to score, comma-separated, e.g. d,e ((a) and (c) always; leaving out h and h' skips their training; default: all)."),
) -> None:
    """Score a finished cold start's composer on the ladder of controls: (a) no latents, (b) untrained,
    (c) retrieved, (d) another task's, (e) another environment's, (f) its own trajectory, (g) as text,
    (h) free vectors, (h') a composer reading the task text alone, (i) another environment's as text. The
    run folder gains only free_prompt.safetensors and task_only_composer.safetensors: when the run has none
    (or they were trained from other settings), (h) trains first for the run's --steps (about as long as the
    cold start) and (h') for 4 x --steps (an lr sweep of three on the training tasks, then the final run)."""
    from stages.coldstart.ladder.rescore import rescore

    rescore(run, targets=targets, seed=seed, out=out, rungs=rungs)


@app.command(cls=settings_command("stages.sft:SftConfig"))
@friendly
def sft(ctx: typer.Context, config: Optional[str] = CONFIG) -> None:
    """Supervised fine-tuning on verified trajectories: the warm start of a study, or the SFT and
    rejection-sampling baselines. Only the action tokens are supervised."""
    from stages import sft as stage

    stage.run(_config(ctx, config, stage.SftConfig, resume=ctx.params["resume"]))


@app.command(cls=MethodOptionsCommand)
@friendly
def distill(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, "--config", help="TOML/YAML/JSON file with any of these options; flags override it; the resolved config is saved as OUT/config.json."),
    option: list[str] = typer.Option([], "--option", "-o", help="A method option as KEY=VALUE (JSON value, else a string), repeatable: -o ppo_epochs=2."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Train data-parallel in N processes on this node (launches torchrun; one GPU each under CUDA); --tasks-per-step is the global batch, split over them; --resume needs the same N."),
) -> None:
    """Train the student on its own rollouts with --method (default lopd: latent-context teacher,
    reverse KL + margin + anchor).

    With --resume the run's saved OUT/config.json supplies every option not given again.
    The lopd options (--composer, --margin, --J, ...) are made from its Options model.
    """
    from stages.distill.settings import parse_options, settings

    given, _ = given_flags(ctx, exclude=("option", "resume", "nproc"))
    flags = {**given, **parse_options(option)}
    if isinstance(flags.get("model"), str):  # a misspelt --model first, before the method's own options
        from stages.core.models.backbone import DEFAULT_MODEL, resolve_model

        if flags["model"] != DEFAULT_MODEL:
            resolve_model(flags["model"])
    run_config = settings(flags, config, ctx.params["resume"])  # validated and resolved (lopd: its composer read)
    if nproc > 1:  # every check that needs no model, here, before torchrun starts N processes
        from stages.core.run import distributed
        from stages.distill.checks import preflight

        preflight(run_config, world_size=nproc)
        raise typer.Exit(distributed.launch(nproc, given_options(ctx, skip=("nproc",))))
    from stages.distill import recipe as stage  # torch loads once the settings are valid

    stage.run(run_config)


@app.command(cls=settings_command("stages.evaluate:EvaluateConfig"))
@friendly
def evaluate(
    ctx: typer.Context,
    config: Optional[str] = CONFIG,
    compare: bool = typer.Option(False, "--compare", help="Compare report files instead: lopd evaluate --compare A.json B.json"),
    reports: Optional[list[str]] = typer.Argument(None, metavar="REPORT", help="Report files for --compare.", show_default=False),
) -> None:
    """Score a model on a benchmark with its official checker, or compare reports side by side."""
    from pathlib import Path

    if compare:
        from stages.compare import compare as compare_reports
        from stages.compare import differences, write_comparison

        if not reports or len(reports) < 2:
            raise ValueError("--compare needs at least two report files: lopd evaluate --compare A.json B.json")
        Console().print(compare_reports([Path(r) for r in reports]))
        for line in differences([Path(r) for r in reports]):  # what the deltas measure besides the models
            err_console.print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)
        out = ctx.params["out"]
        if out:  # the same numbers as a file: JSON for .json, else CSV
            Console().print(f"comparison written to {write_comparison([Path(r) for r in reports], Path(out))}")
        return
    from stages import evaluate as stage

    stage.run(_config(ctx, config, stage.EvaluateConfig, exclude=("compare", "reports"), required=(
        "bench", "--bench is required (bfcl-v3, bfcl-single, humaneval-plus, mbpp-plus, acebench, envscaler, "
                 "lopd-bed, lopd-bed-values, lopd-bed-transfer, livecodebench); to compare reports: lopd evaluate --compare A.json B.json")))


@app.command()
@friendly
def study(
    config: str = typer.Option(..., "--config", help="Study file (TOML): store, bench, seeds, a `distill` table of shared settings and `runs` entries (name, method, seeds, settings). See examples/study/."),
    out: Optional[str] = typer.Option(None, "--out", help="Study folder (default: the file's `out`, else runs/study)."),
    report_only: bool = typer.Option(False, "--report-only", help="Train and evaluate nothing: write the results of what the study folder holds into --out (unfinished runs show as pending; the study's results folder is read, not written); with no run folders, they are redrawn from the results folder's results.json alone."),
    only: Optional[list[str]] = typer.Option(None, "--only", metavar="NAME[:SEED]", help="Train only this run, NAME or NAME:SEED (repeatable; the others are left as they are): run a study in parts, in any order; an unknown name or seed is refused with the list of runs or seeds."),
) -> None:
    """Compare methods at the same rollout budget on held-out tasks: every run trained and evaluated,
    then results.json/.csv, a markdown table and plots in the study folder. Rerun to resume."""
    from stages.study.layout import load_study

    study_config = load_study(config, out)  # refused before torch loads
    from stages.study import recipe as stage

    stage.run_study(study_config, report_only=report_only, only=only)


@app.command()
@friendly
def report(
    runs: list[str] = typer.Argument(..., metavar="RUN", help="Run folders: coldstart, distill or study folders (several are overlaid), folders of evaluation reports, or report files (lopd evaluate --out); summary.md has a line for each, or why it gave nothing.", show_default=False),
    out: Optional[str] = typer.Option(None, "--out", help="Where the plots and summary.md go (default: <first run folder>/report; report files alone: <their folder>/report)."),
    samples_steps: int = typer.Option(3, "--samples-steps", min=0, help="Sample rollouts (first, best, worst) of the last N steps of each distill run in summary.md, from its experience store; 0 = none."),
) -> None:
    """Plot a run's training curves (reward, losses, LOPD's Delta and beta, anchor, gradient norms,
    seconds per step, peak memory) and summarise its metrics, sample rollouts and evaluation reports."""
    from stages import report as stage

    stage.run(stage.ReportConfig(runs=runs, out=out, samples_steps=samples_steps))


@app.command()
@friendly
def show(
    report: str = typer.Argument(..., metavar="REPORT", help="Evaluation report JSON (lopd evaluate --out), or an experience store "
                                 "folder (its collect/distill rollouts).", show_default=False),
    task: Optional[str] = typer.Option(None, "--task", help="Only tasks whose id contains this text."),
    failed: bool = typer.Option(False, "--failed", help="Only tasks the checker failed."),
    limit: Optional[int] = typer.Option(5, "--limit", help="At most N tasks."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Store only: trajectories of this run (e.g. distill-...)."),
    env: Optional[str] = typer.Option(None, "--env", help="Store only: trajectories of this environment."),
    split: Optional[str] = typer.Option(None, "--split", help="Store only: trajectories of this split."),
) -> None:
    """Print what the model said: each task's transcript (messages, tool calls), reward and
    checker verdict, from an evaluation report or an experience store."""
    from stages import show as stage

    stage.run(report, task=task, failed=failed, limit=limit, run_id=run_id, env=env, split=split)


@app.command()
@friendly
def export(
    run: str = typer.Argument(..., metavar="RUN", help="Run folder of lopd sft or lopd distill (its --out).", show_default=False),
    out: str = typer.Option(..., "--out", help="Folder to write (new or empty): model or adapter, tokenizer, README.md model card."),
    step: Optional[int] = typer.Option(None, "--step", help="Export checkpoints/step-N instead of final/student (default: final, else the newest checkpoint)."),
    merge: bool = typer.Option(False, "--merge", help="Merge a LoRA adapter into its base and write a whole model (default: the adapter alone, on the base's Hugging Face id)."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", help="Also upload the folder to this Hugging Face model repo (owner/name; needs a token and the network; offline it fails in one line and the export stays)."),
) -> None:
    """Write a run's trained student as a folder that `lopd evaluate --model` and
    transformers' AutoModelForCausalLM.from_pretrained load, with a model card."""
    from stages import export as stage

    stage.run(stage.ExportConfig(run=run, out=out, step=step, merge=merge, push_to_hub=push_to_hub))


app.command(name="plan", cls=settings_command("stages.plan:PlanInput", skip=("composer_lora_rank", "device")))(
    friendly(_plan))  # lopd_cli/plan.py


store_app = typer.Typer(help="Inspect and repair an experience store (its Lance table versions).",
                        no_args_is_help=True)
app.add_typer(store_app, name="store")
store_app.command("versions")(friendly(store_versions))  # lopd_cli/store.py
store_app.command("restore")(friendly(store_restore))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
