"""`lopd`: Latent On-Policy Self-Distillation for LLM agents.

Pipeline: collect -> index -> coldstart -> distill -> evaluate. Every command only turns its flags
into a validated config and calls ``stages.<stage>.run(config)``.
"""
from __future__ import annotations

from typing import Optional

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from lopd_cli.errors import HintingGroup, err_console, friendly, one_line_warning
from lopd_cli.options import (
    ALLOW_OVERLAP_HELP, CONFIG, DATA_DIR, DEVICE, DTYPE, EPISODE_BATCH, EPISODE_RULES, LOG, LOG_HELP, PREFIX_CACHE, RESUME_RUN,
    SAMPLING_SEED, STORE, UNSAFE_EXEC,
    MethodOptionsCommand, given_flags, given_options,
)
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


@app.command()
@friendly
def collect(
    ctx: typer.Context,
    config: Optional[str] = CONFIG,
    env: Optional[str] = typer.Option(None, "--env", help="Environment: bfcl, code, envscaler, lopd-bed (lopd's bundled study bed), acebench, livecodebench, taco (required, as a flag or in --config)."),
    store: str = STORE,
    split: str = typer.Option("train", "--split", help="Task split: train or test (bfcl also has heldout, its held-out single-turn tasks; lopd-bed also has warmup, test_values and transfer)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Play at most N tasks. (default: all)"),
    samples_per_task: int = typer.Option(1, "--samples-per-task", "-G", help="Rollouts per task (G)."),
    model: str = typer.Option("smollm2-135m", "--model", help="Policy: smollm2-135m (embedded), an HF id or a local path."),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    data_dir: Optional[str] = DATA_DIR,
    max_turns: int = typer.Option(30, "--max-turns", "--max-steps", help="Action cap per episode (--max-steps: older spelling)."),
    episode_rules: Optional[str] = EPISODE_RULES,
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="Generated tokens per action."),
    temperature: float = typer.Option(0.7, "--temperature", help="Sampling temperature (0 = greedy)."),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling mass."),
    top_k: int = typer.Option(0, "--top-k", help="Sample from the k most likely tokens only; 0 = off (the paper samples with 20, B.2)."),
    seed: int = SAMPLING_SEED,
    batch_size: int = EPISODE_BATCH,
    prefix_cache_tokens: int = PREFIX_CACHE,
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Run name (default: derived from the settings)."),
    resume: bool = typer.Option(False, "--resume", help="Skip tasks this run already stored."),
    reference: bool = typer.Option(False, "--reference", help="Play each task's reference solution (BFCL possible answer, HumanEval canonical solution) through the real environment and checker instead of a model: seeds the store with verified demonstrations."),
    unsafe_exec: bool = UNSAFE_EXEC,
    allow_overlap: bool = typer.Option(False, "--allow-overlap", help=ALLOW_OVERLAP_HELP),
) -> None:
    """Roll out a policy on an environment's tasks and store scored trajectories."""
    from stages import collect as stage
    from stages.envs import env_names

    stage.run(_config(ctx, config, stage.CollectConfig, required=(
        "env", f"--env is required ({', '.join(env_names())}), as a flag or in the --config file")))


@app.command()
@friendly
def index(
    ctx: typer.Context,
    config: Optional[str] = CONFIG,
    store: str = STORE,
    embedder: Optional[str] = typer.Option(None, "--embedder", help="minilm (packaged all-MiniLM-L6-v2) or a sentence-transformers id/path. (default: the store's, else minilm)"),
    field: Optional[str] = typer.Option(None, "--field", metavar="[task|trajectory|trace]", help="What to embed: task (the task text), trajectory (the transcript), or trace (task + observation-lite trace, searched with an instruction-prefixed task query: asymmetric, A.3). (default: the store's, else task)"),
    batch_size: int = typer.Option(32, "--batch-size", help="Texts per embedder batch."),
    ann_threshold: int = typer.Option(10_000, "--ann-threshold", help="Build an ANN index from this many rows on (exact search below)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Drop all embeddings and indexes first (to change embedder or field)."),
    rows_per_write: int = typer.Option(2048, "--rows-per-write", help="Embeddings per table append (one table version each)."),
    max_chars: int = typer.Option(4000, "--max-chars", help="Text length cut for --field trajectory and trace (characters)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Embed new trajectories and build the vector and full-text indexes used for retrieval."""
    from stages import index as stage

    stage.run(_config(ctx, config, stage.IndexConfig))


@app.command()
@friendly
def coldstart(
    ctx: typer.Context,
    config: Optional[str] = CONFIG,
    experiences: str = typer.Option("runs/store", "--experiences", help="Indexed experience store (`lopd index`) whose successful trajectories train the composer."),
    out: str = typer.Option("runs/composer0", "--out", help="Output folder (checkpoints, metrics.jsonl, final/)."),
    model: str = typer.Option("smollm2-135m", "--model", help="Frozen backbone: smollm2-135m, an HF id or a local path."),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    steps: int = typer.Option(200, "--steps", help="Optimizer steps."),
    lr: float = typer.Option(1e-4, "--lr", help="AdamW learning rate of the composer."),
    batch_size: int = typer.Option(2, "--batch-size", help="Target trajectories per step."),
    J: int = typer.Option(3, "--J", help="Retrieved experiences per task."),
    K: int = typer.Option(32, "--K", help="Latent tokens per experience."),
    depth: int = typer.Option(8, "--depth", help="QFormer block applications."),
    qformer_shared: bool = typer.Option(True, "--qformer-shared/--no-qformer-shared", help="One QFormer block applied --depth times (the paper's) or --depth separate blocks."),
    memory_norm: str = typer.Option("layer", "--memory-norm", metavar="[layer|token]", help="What the compressor reads: the encoder's hidden states as they are (layer) or standardised per feature over each experience's tokens (token), which removes the component all tokens share."),
    readout: str = typer.Option("qformer", "--readout", metavar="[qformer|pointer|span|centred]", help="How the compressor's queries become latents: a LayerNorm of them (qformer), each a weighted sum of the experience's token embeddings, pointed at by the query (pointer), or the embeddings of K tokens of the experience from its first action on plus a learned, gated qformer readout (span), or the qformer readout plus a learned constant that alone takes the part of the gradient all of a step's experiences share, so the compressor learns only what differs between them (centred)."),
    lora_rank: int = typer.Option(8, "--lora-rank", help="Rank of the composer encoder's LoRA."),
    max_exp_tokens: int = typer.Option(256, "--max-exp-tokens", help="Token budget per (task, experience) pair."),
    max_len: int = typer.Option(1024, "--max-len", help="Token cap of a target conversation."),
    placement: str = typer.Option("prefix", "--placement", metavar="[prefix|per-turn|framed]", help="Latents after the task prompt (prefix), before each action (per-turn, Eq. 8), or inside the first user message between framing texts (framed, A.4)."),
    heldout_fraction: float = typer.Option(0.2, "--heldout-fraction", help="Share of tasks held out to measure the NLL."),
    checkpoint_every: int = typer.Option(50, "--checkpoint-every", help="Steps between checkpoints."),
    eval_every: int = typer.Option(50, "--eval-every", help="Steps between held-out evaluations."),
    env: Optional[str] = typer.Option(None, "--env", help="Use only this environment's trajectories (default: all)."),
    exclude_same_task: bool = typer.Option(True, "--exclude-same-task/--allow-same-task", help="Never retrieve a trajectory of the target's own task (it would hold the answer)."),
    activation_checkpointing: bool = typer.Option(True, "--activation-checkpointing/--no-activation-checkpointing", "--grad-checkpointing/--no-grad-checkpointing", help="Recompute backbone activations in backward: less memory, slower steps (--grad-checkpointing: older spelling)."),
    grad_clip: float = typer.Option(1.0, "--grad-clip", "--max-grad-norm", help="Gradient clipping of phi (--max-grad-norm: older spelling)."),
    lr_encoder: Optional[float] = typer.Option(None, "--lr-encoder", help="Learning rate of the composer's encoder LoRA (default: --lr; the compressor trains at --lr)."),
    objective: Optional[str] = typer.Option(None, "--objective", metavar="[action-nll|contrast|text-kl]", help="What the steps after --reconstruction-steps minimise: the action NLL, plus the contrast hinge (contrast) or the text teacher's KL (text-kl). (default: contrast with --contrast-weight, text-kl with --text-kl-weight, else action-nll)"),
    reconstruction_steps: int = typer.Option(0, "--reconstruction-steps", help="The first this many of --steps pre-train the composer to autoencode its inputs (the teacher reproduces each from its latents); the rest train the action objective."),
    latent_scale: float = typer.Option(1.0, "--latent-scale", help="The latents' initial norm as a multiple of the mean token-embedding norm (qformer, span and centred readouts; pointer latents are embedding mixtures already)."),
    contrast_weight: float = typer.Option(0.0, "--contrast-weight", help="Add this times a hinge that makes each target's NLL with its own experiences' latents lower than with another target's by --contrast-margin (0 = off; needs --batch-size 2+)."),
    contrast_margin: float = typer.Option(0.05, "--contrast-margin", help="The gap (nats per token) --contrast-weight asks for."),
    text_kl_weight: float = typer.Option(0.0, "--text-kl-weight", help="Add this times the forward KL(text teacher || latent teacher) on the action tokens: the teacher reading the experiences' latents is asked to predict what it predicts from their plain text (0 = off; not with --contrast-weight; one more teacher forward per target)."),
    text_kl_top_m: Optional[int] = typer.Option(None, "--text-kl-top-m", help="The text KL over the text teacher's top-M tokens plus a tail bucket, its targets computed once per training target and kept in OUT/text_teacher/ (default: over the full vocabulary, the text teacher run every step)."),
    self_retrieval: bool = typer.Option(False, "--self-retrieval/--no-self-retrieval", help="A training target's own trajectory is its first experience (the official recipe's allow_self_retrieval); held-out scoring never does this, except the ladder's oracle rung (f)."),
    ladder: bool = typer.Option(True, "--ladder/--no-ladder", help="At the end, score the ladder of controls (no latents ... free vectors; trains the free-vector control for --steps more steps)."),
    ladder_targets: int = typer.Option(32, "--ladder-targets", help="Held-out targets the ladder scores (a seeded subset; 0 = all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of init, split and batch order."),
    log: str = LOG,
    resume: bool = RESUME_RUN,
) -> None:
    """Cold-start the composer phi_0 on successful trajectories, backbone frozen."""
    from stages.coldstart.settings import ColdstartConfig

    settings = _config(ctx, config, ColdstartConfig, resume=resume)  # refused before torch loads
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
) -> None:
    """Score a finished cold start's composer on the ladder of controls: (a) no latents, (b) untrained,
    (c) retrieved, (d) another task's, (e) another environment's, (f) its own trajectory, (g) as text,
    (h) free vectors, (i) another environment's as text. The run folder gains only free_prompt.safetensors:
    when the run has none, (h) trains first for the run's --steps (about as long as the cold start)."""
    from stages.coldstart.ladder.rescore import rescore

    rescore(run, targets=targets, seed=seed, out=out)


@app.command()
@friendly
def sft(
    ctx: typer.Context,
    config: Optional[str] = CONFIG,
    store: str = typer.Option("runs/store", "--store", help="Experience store whose verified trajectories train the student."),
    out: str = typer.Option("runs/sft", "--out", help="Output folder (checkpoints, metrics.jsonl, final/student: use it as --model)."),
    model: str = typer.Option("smollm2-135m", "--model", help="Student to fine-tune: smollm2-135m, an HF id or a local path."),
    env: Optional[str] = typer.Option(None, "--env", help="Use only this environment's rows."),
    split: str = typer.Option("warmup", "--split", help="Split of the rows: warmup (the warm start), train (an SFT / rejection-sampling baseline)."),
    source: str = typer.Option("any", "--source", metavar="[reference|student|any]", help="reference (replayed verified references), student (a model's own successes: rejection-sampling fine-tuning) or any."),
    from_run: Optional[str] = typer.Option(None, "--from-run", help="Only the rows of this run id (e.g. one lopd collect run: lopd show STORE lists them)."),
    min_reward: float = typer.Option(1.0, "--min-reward", help="Least reward of a row that trains (rows must also count as successes)."),
    steps: int = typer.Option(40, "--steps", help="Optimizer steps."),
    batch_size: int = typer.Option(4, "--batch-size", help="Training sequences per step."),
    lr: float = typer.Option(5e-5, "--lr", help="AdamW learning rate."),
    lora_rank: int = typer.Option(0, "--lora-rank", help="0: fine-tune every weight; else a LoRA adapter of this rank, merged into final/student."),
    max_len: int = typer.Option(1024, "--max-len", help="Token cap of a training sequence."),
    grad_clip: float = typer.Option(1.0, "--grad-clip", help="Gradient-norm clipping."),
    checkpoint_every: int = typer.Option(20, "--checkpoint-every", help="Steps between checkpoints."),
    keep_checkpoints: int = typer.Option(1, "--keep-checkpoints", help="Checkpoints kept (the newest)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data order."),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    log: str = LOG,
    resume: bool = RESUME_RUN,
) -> None:
    """Supervised fine-tuning on verified trajectories: the warm start of a study, or the SFT and
    rejection-sampling baselines. Only the action tokens are supervised."""
    from stages import sft as stage

    stage.run(_config(ctx, config, stage.SftConfig, resume=resume))


@app.command(cls=MethodOptionsCommand)
@friendly
def distill(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, "--config", help="TOML/YAML/JSON file with any of these options; flags override it."),
    method: Optional[str] = typer.Option(None, "--method", help="Training method: lopd, lopd-text, grpo, sdft, opsd, sdpo, skill-sd (stages/methods). (default lopd)"),
    option: list[str] = typer.Option([], "--option", "-o", help="A method option as KEY=VALUE (JSON value, else a string), repeatable: -o ppo_epochs=2."),
    env: Optional[str] = typer.Option(None, "--env", help="Training environment: bfcl, code, envscaler, lopd-bed (lopd's bundled study bed), acebench, livecodebench, taco."),
    store: Optional[str] = typer.Option(None, "--store", help="Indexed experience store (grows during training); refused when missing, unless --new-store. (default runs/store)"),
    new_store: Optional[bool] = typer.Option(None, "--new-store", help="Start an empty experience store at --store when none is there. (default: refuse a missing store)"),
    out: Optional[str] = typer.Option(None, "--out", help="Run folder. (default runs/lopd)"),
    model: Optional[str] = typer.Option(None, "--model", help="Student/teacher backbone. (default smollm2-135m)"),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Environment task files. (default: the environment's packaged data)"),
    lr: Optional[float] = typer.Option(None, "--lr", help="Learning rate. (default 1e-5)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="Training steps. (default 10)"),
    tasks_per_step: Optional[int] = typer.Option(None, "--tasks-per-step", help="Tasks per step (B). (default 2)"),
    group_size: Optional[int] = typer.Option(None, "--group-size", help="Rollouts per task (G). (default 2)"),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Environment step cap per episode. (default 30)"),
    episode_rules: Optional[str] = EPISODE_RULES,
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Tokens per action. (default 256)"),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Token cap of a training sequence; a sequence whose prompt alone fills it is skipped and counted. (default: none)"),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Training sequences per forward/backward (gradients accumulate exactly). (default 4)"),
    student_lora_rank: Optional[int] = typer.Option(None, "--student-lora-rank", help="Student LoRA rank; 0 = full fine-tuning. (default 8)"),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Steps between checkpoints (one is also written after step 1 and after the last). (default 5)"),
    keep_checkpoints: Optional[int] = typer.Option(None, "--keep-checkpoints", help="Checkpoints kept (the newest). (default 2)"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Rollout sampling temperature. (default 0.7)"),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Rollout nucleus mass. (default 0.95)"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Rollout top-k, 0 = off (the paper samples with 20, B.2). (default 0)"),
    engine: Optional[str] = typer.Option(None, "--engine", metavar="[hf|vllm]", help="Rollout engine: hf or vllm. (default hf)"),
    rollout_batch: Optional[int] = typer.Option(None, "--rollout-batch", help="Episodes generated together. (default 8)"),
    compile_decode: Optional[bool] = typer.Option(None, "--compile-decode/--no-compile-decode", help="hf engine on a GPU: compile the decoding forward (torch.compile; about 4x faster calls once compiled, but each new batch or length bucket compiles again for a minute or more: for one-turn rollouts at a fixed batch); may change on --resume. (default off: eager)"),
    activation_checkpointing: Optional[bool] = typer.Option(None, "--activation-checkpointing/--no-activation-checkpointing", help="Recompute activations in backward: less memory, slower steps. (default off)"),
    grad_clip: Optional[float] = typer.Option(None, "--grad-clip", help="Gradient-norm clipping, 0 = off. (default 1.0)"),
    embedder: Optional[str] = typer.Option(None, "--embedder", help="Embedder of new rollouts (lopd, the method that retrieves; the other methods append them unembedded for `lopd index`). (default: the store's)"),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Run name in the store. (default: the saved one, else random)"),
    log: Optional[str] = typer.Option(None, "--log", metavar="[none|tensorboard|wandb]", help=LOG_HELP + " (default none)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the initialisation, the task order and the rollouts' sampling. (default 0)"),
    allow_overlap: Optional[bool] = typer.Option(None, "--allow-overlap/--no-allow-overlap", help=ALLOW_OVERLAP_HELP + " (default off)"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in --out (its saved settings apply; flags given override, e.g. --steps)."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="[none|fsdp]", help="none, or fsdp: shard a fully fine-tuned student (--student-lora-rank 0) over the --nproc / torchrun processes (FSDP2; lopd and grpo, hf engine). (default none)"),
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
    run_config = settings(flags, config, resume)
    if "composer" in run_config.options:  # a composer method (lopd): a folder that holds none, refused before torch
        from stages.core.models.composer_config import read_composer_config

        read_composer_config(run_config.options["composer"])
    if nproc > 1:  # every check that needs no model, here, before torchrun starts N processes
        from stages.core.run import distributed
        from stages.distill.checks import preflight

        preflight(run_config, world_size=nproc)
        raise typer.Exit(distributed.launch(nproc, given_options(ctx, skip=("nproc",))))
    from stages.distill import recipe as stage  # torch loads once the settings are valid

    stage.run(run_config)


@app.command()
@friendly
def evaluate(
    ctx: typer.Context,
    config: Optional[str] = CONFIG,
    bench: Optional[str] = typer.Option(None, "--bench", metavar="BENCH", help="Required unless --compare: bfcl-v3, bfcl-single (held-out single-turn), humaneval-plus, mbpp-plus, acebench, envscaler, lopd-bed (lopd's study bed, held-out phrasings), lopd-bed-values (new values in train phrasings), lopd-bed-transfer (its transfer environments), livecodebench."),
    model: str = typer.Option("smollm2-135m", "--model", help="Model to evaluate: smollm2-135m, an HF id or a local path (e.g. runs/lopd/final/student)."),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    limit: Optional[int] = typer.Option(None, "--limit", help="At most N tasks; bfcl-v3: N per category, of its 4 (base, miss_func, miss_param, long_context), so --limit 1 runs 4 tasks. (default: all)"),
    out: Optional[str] = typer.Option(None, "--out", help="Report JSON path (default runs/eval/<bench>-<model>[-composer-<composer>].json); a report of other settings there is refused, not replaced. With --compare: write the comparison there, JSON for .json, else CSV."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Benchmark data folder/file (or HF dataset id for livecodebench). (default: the bench's packaged data)"),
    release: str = typer.Option("v6", "--release", metavar="[v5|v6]", help="LiveCodeBench release window: v5 or v6."),
    language: str = typer.Option("en", "--language", metavar="[en|zh]", help="acebench: the language of --data-dir, en (ACEBench's data_en) or zh (data_zh: its Chinese prompts and Chinese agent platforms)."),
    protocol: str = typer.Option("greedy", "--protocol", metavar="[greedy|paper]", help="Decoding protocol: greedy (temperature 0, the bench's budget and step cap) or paper (Table 5 of the LOPD paper: temperature 0.7, top-p 0.95, top-k 20, its budgets and step caps). Flags below override it."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Override the protocol's decoding temperature."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Override the protocol's nucleus mass."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Override the protocol's top-k (0 = off)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Override the bench's tokens per action."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", "--max-steps", help="Override the bench's action cap per episode (--max-steps: older spelling)."),
    episode_rules: Optional[str] = EPISODE_RULES,
    batch_size: int = EPISODE_BATCH,
    workers: int = typer.Option(2, "--workers", help="evalplus evaluator processes."),
    prefix_cache_tokens: int = PREFIX_CACHE,
    seed: int = SAMPLING_SEED,
    engine: str = typer.Option("hf", "--engine", metavar="[hf|vllm]", help="Rollout engine: hf (transformers) or vllm (vLLM on a CUDA GPU, pip install '.[vllm]'; no reference_nll, not with --composer)."),
    user_model: Optional[str] = typer.Option(None, "--user-model", help="acebench: the model that plays the user of the multi-turn tasks (default: --model); envscaler: the user of the conversational tasks (default: none, those tasks are left out)."),
    composer: Optional[str] = typer.Option(None, "--composer", help="Composer folder (coldstart/distill output; needs --store): condition the frozen --model on latents of experiences retrieved from --store, placed as the composer was trained (the paper's base + composer row)."),
    store: Optional[str] = typer.Option(None, "--store", help="Indexed experience store the --composer's experiences come from (successful train-split rows of other tasks)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted evaluation: the tasks finished before (kept in OUT.partial.jsonl as each ends) are not played again."),
    compare: bool = typer.Option(False, "--compare", help="Compare report files instead: lopd evaluate --compare A.json B.json"),
    reports: Optional[list[str]] = typer.Argument(None, metavar="REPORT", help="Report files for --compare.", show_default=False),
    unsafe_exec: bool = UNSAFE_EXEC,
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
    only: Optional[list[str]] = typer.Option(None, "--only", metavar="NAME[:SEED]", help="Train only this run, NAME or NAME:SEED (repeatable; the others are left as they are): run a study in parts, in any order."),
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
    runs: list[str] = typer.Argument(..., metavar="RUN", help="Run folders: coldstart, distill or study folders (several are overlaid), folders of evaluation reports, or report files (lopd evaluate --out).", show_default=False),
    out: Optional[str] = typer.Option(None, "--out", help="Where the plots and summary.md go (default: <first run folder>/report)."),
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
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", help="Also upload the folder to this Hugging Face model repo (owner/name; needs a token and the network)."),
) -> None:
    """Write a run's trained student as a folder that `lopd evaluate --model` and
    transformers' AutoModelForCausalLM.from_pretrained load, with a model card."""
    from stages import export as stage

    stage.run(stage.ExportConfig(run=run, out=out, step=step, merge=merge, push_to_hub=push_to_hub))


app.command(name="plan")(friendly(_plan))  # lopd_cli/plan.py


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
