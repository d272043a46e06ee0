"""`lopd evaluate`: benchmark scores and behaviour statistics of a policy (side-by-side comparison of
reports: :mod:`stages.compare`).

A run plays every task of the bench once with greedy decoding (temperature 0 unless overridden;
the value used is recorded), scores the trajectories with the bench's official checker (see
:mod:`stages.benches`), and writes one JSON report atomically to ``--out``
(default ``runs/eval/<bench>-<model-slug>.json``)::

    {bench, scores, behaviour, per_task: [...], notes, config, model, git_commit,
     started_at, finished_at, seconds}

Behaviour statistics, over the bench's trajectories: ``mean_steps`` (agent actions per episode),
``tool_calls_per_step``, ``first_step_tokens`` (generated tokens of the first action) and
``repeated_calls_per_task`` (calls whose name + arguments already appeared earlier in the same
trajectory).
"""
from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from schemas import Trajectory
from stages.benches import BENCHES
from stages.envs import EnvError, check_episode_rules
from stages.core.exec import isolation
from stages.core.models.backbone import DEFAULT_MODEL
from stages.core.run.outputs import PartialResults, check_overwrite, partial_path
from stages.core.run.printing import titled_table
from stages.core.run.progress import StageProgress
from stages.core.run.provenance import git_commit
from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS
from stages.settings import Device, EpisodeBatch, PrefixCacheTokens, Rules, RunDType, UnsafeExec

BenchName = Literal[tuple(BENCHES.names())]  # the names of the bench registry


class EvaluateConfig(BaseModel):
    """Settings of one `lopd evaluate` run: the flags, each described by its field.

    ``protocol`` fills the decoding settings left None (:func:`apply_protocol`); settings given
    explicitly win. ``composer`` conditions ``model`` through
    :class:`stages.engines.latent.LatentEngine` (Table 3's "base + composer" row); ``engine``
    ``vllm`` serves the model folder by vLLM on a GPU, no transformers copy loaded. ``device`` /
    ``dtype``: :func:`stages.core.models.backbone.resolve_device_dtype`.
    """

    model_config = ConfigDict(extra="forbid")

    bench: BenchName = Field(json_schema_extra={"metavar": "BENCH"}, description=(
        "Required unless --compare: bfcl-v3, bfcl-single (held-out single-turn), humaneval-plus, mbpp-plus, acebench, "
        "envscaler, lopd-bed (lopd's study bed, held-out phrasings), lopd-bed-values (new values in train phrasings), "
        "lopd-bed-transfer (its transfer environments), livecodebench."))
    model: str = Field(DEFAULT_MODEL, description=(
        "Model to evaluate: smollm2-135m, an HF id or a local path (e.g. runs/lopd/final/student)."))
    device: Device = None
    dtype: RunDType = None
    limit: int | None = Field(default=None, ge=1, description=(
        "At most N tasks; bfcl-v3: N per category, of its 4 (base, miss_func, miss_param, long_context), so "
        "--limit 1 runs 4 tasks. (default: all)"))
    out: str | None = Field(None, description=(
        "Report JSON path (default runs/eval/<bench>-<model>[-composer-<composer>].json); a report of other settings "
        "there is refused, not replaced. With --compare: write the comparison there, JSON for .json, else CSV."))
    data_dir: str | None = Field(None, description=(
        "Benchmark data folder/file (or HF dataset id for livecodebench). (default: the bench's packaged data)"))
    release: Literal["v5", "v6"] = Field("v6", description="LiveCodeBench release window: v5 or v6.")
    language: Literal["en", "zh"] = Field("en", description=(
        "acebench: the language of --data-dir, en (ACEBench's data_en) or zh (data_zh: its Chinese prompts and "
        "Chinese agent platforms)."))
    protocol: Literal["greedy", "paper"] = Field("greedy", description=(
        "Decoding protocol: greedy (temperature 0, the bench's budget and step cap) or paper (Table 5 of the LOPD "
        "paper: temperature 0.7, top-p 0.95, top-k 20, its budgets and step caps). Flags below override it."))
    temperature: float | None = Field(default=None, ge=0.0, description="Override the protocol's decoding temperature.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Override the protocol's nucleus mass.")
    top_k: int | None = Field(default=None, ge=0, description="Override the protocol's top-k (0 = off).")
    max_new_tokens: int | None = Field(default=None, ge=1, description="Override the bench's tokens per action.")
    max_turns: int | None = Field(default=None, ge=1, validation_alias=AliasChoices("max_turns", "max_steps"),
                                  json_schema_extra={"flag": ["--max-turns", "--max-steps"]}, description=(
                                      "Override the bench's action cap per episode (--max-steps: older spelling)."))
    episode_rules: Rules = None
    batch_size: EpisodeBatch = 8
    workers: int = Field(default=2, ge=1, description="evalplus evaluator processes.")
    prefix_cache_tokens: PrefixCacheTokens = PREFIX_CACHE_TOKENS
    seed: int = Field(0, description="Sampling seed.")
    engine: Literal["hf", "vllm"] = Field("hf", description=(
        "Rollout engine: hf (transformers) or vllm (vLLM on a CUDA GPU, pip install '.[vllm]'; no reference_nll, "
        "not with --composer)."))
    unsafe_exec: UnsafeExec = False
    composer: str | None = Field(None, description=(
        "Composer folder (coldstart/distill output; needs --store): condition the frozen --model on latents of "
        "experiences retrieved from --store, placed as the composer was trained (the paper's base + composer row)."))
    store: str | None = Field(None, description=(
        "Indexed experience store the --composer's experiences come from (successful train-split rows of other "
        "tasks)."))
    user_model: str | None = Field(None, description=(
        "acebench: the model that plays the user of the multi-turn tasks (default: --model); envscaler: the user of "
        "the conversational tasks (default: none, those tasks are left out)."))
    resume: bool = Field(False, json_schema_extra={"flag": "--resume"}, description=(  # stages.core.run.outputs
        "Continue an interrupted evaluation: the tasks finished before (kept in OUT.partial.jsonl as each ends) are "
        "not played again."))

    @model_validator(mode="after")
    def _store_with_composer(self) -> EvaluateConfig:
        if self.composer and not self.store:
            raise ValueError("--composer needs --store: the indexed experience store its latents are retrieved from")
        if self.composer and self.engine != "hf":
            raise ValueError("--composer generates with latents through the hf engine: drop --engine vllm")
        return self


def model_slug(model: str) -> str:
    """A file-name-safe form of a model id or path (``runs/lopd/final`` -> ``runs-lopd-final``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-.") or "model"


# settings that do not change an evaluation's result: a report of other settings is never replaced
SAME_RESULT = ("out", "batch_size", "workers", "prefix_cache_tokens", "device", "unsafe_exec", "resume")


def default_out(config: EvaluateConfig) -> Path:
    """``runs/eval/<bench>-<model>[-composer-<composer>].json``."""
    composer = f"-composer-{model_slug(config.composer)}" if config.composer else ""
    return Path(f"runs/eval/{config.bench}-{model_slug(config.model)}{composer}.json")


def repeated_calls(traj: Trajectory) -> int:
    """Tool calls of ``traj`` that repeat an earlier call of its episode: the same tool with the same
    arguments (compared as sorted-key JSON)."""
    seen: set[tuple[str, str]] = set()
    repeats = 0
    for turn in traj.turns:
        for call in turn.tool_calls:
            key = (call.name, json.dumps(call.args, sort_keys=True))
            repeats += key in seen
            seen.add(key)
    return repeats


def behaviour_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """Mean steps, tool calls per step, first-step tokens and repeated identical calls per task."""
    if not trajs:
        return {"mean_steps": 0.0, "tool_calls_per_step": 0.0, "first_step_tokens": 0.0, "repeated_calls_per_task": 0.0}
    steps = sum(t.num_steps for t in trajs)
    return {
        "mean_steps": steps / len(trajs),
        "tool_calls_per_step": sum(t.num_tool_calls for t in trajs) / max(steps, 1),
        "first_step_tokens": sum(t.turns[0].action_tokens if t.turns else 0 for t in trajs) / len(trajs),
        "repeated_calls_per_task": sum(map(repeated_calls, trajs)) / len(trajs),
    }


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(path)


def run(config: EvaluateConfig, console: Console | None = None, engine: Any = None,
        tokenizer: Any = None) -> dict[str, Any]:
    """Evaluate ``config.model`` on ``config.bench``; returns the report (also written and printed).

    Args:
        config: the run settings.
        console: where the progress bar and tables go (default: a new rich Console).
        engine, tokenizer: a ready rollout engine (:class:`stages.engines.RolloutEngine`) and the
            tokenizer that renders and tokenizes its prompts; when None the model is loaded with
            :func:`stages.core.models.backbone.load_policy` into an ``hf`` engine.

    Raises:
        EnvError: missing or malformed bench data (the message says which flag to pass).
        RuntimeError: the evalplus evaluator failed.
    """
    from stages.engines import SamplingParams
    from stages.engines.rollout import RolloutStats, play

    if engine is None:
        from stages.core.models.backbone import DEFAULT_MODEL, resolve_model
        from stages.engines import check_engine

        check_engine(config.engine)
        if config.model != DEFAULT_MODEL:  # a missing folder is refused before any library loads
            resolve_model(config.model)
        if config.composer:  # a folder that holds no composer checkpoint, refused before torch
            from stages.core.models.composer_config import read_composer_config

            read_composer_config(config.composer)
    isolation.prepare(config.bench, config.unsafe_exec)
    console = console or Console()
    config = apply_protocol(config)
    bench = BENCHES[config.bench]
    check_episode_rules(bench.env, config.episode_rules, bench=config.bench)
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    prepared = bench.prepare(config)
    out = Path(config.out or default_out(config))
    settings = config.model_dump(mode="json")
    check_overwrite(out, settings, SAME_RESULT)  # never replaces a report of other settings
    partial = PartialResults(partial_path(out), settings, resume=config.resume, ignore=SAME_RESULT)
    params = SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                            max_new_tokens=config.max_new_tokens, seed=config.seed)
    console.print(f"[bold]evaluate[/] {config.bench}: {len(prepared.tasks)} task{'' if len(prepared.tasks) == 1 else 's'}, model={config.model}, "
                  f"protocol {config.protocol}: temperature={params.temperature}, top_p={params.top_p}, "
                  f"top_k={params.top_k}, max_new_tokens={params.max_new_tokens}, max_turns={config.max_turns}")
    for note in prepared.notes:
        console.print(f"  note: {note}")
    if engine is None and config.composer:
        engine, tokenizer = latent_engine(config, {t.env for t in prepared.tasks})
    elif engine is None:
        from stages.core.models.backbone import load_policy, load_tokenizer, resolve_model
        from stages.engines import make_engine

        if config.engine == "vllm":  # vLLM loads the weights itself
            model, tokenizer = resolve_model(config.model), load_tokenizer(config.model)
        else:
            model, tokenizer = load_policy(config.model, dtype=config.dtype, device=config.device)
        engine = make_engine(config.engine, model, tokenizer, batch_size=config.batch_size,
                             prefix_cache_tokens=config.prefix_cache_tokens)
    order = {t.task_id: i for i, t in enumerate(prepared.tasks)}
    trajs = [Trajectory.model_validate(row["trajectory"]) for row in partial.rows.values()]
    if trajs:
        console.print(f"  resuming: {len(trajs)} of {len(prepared.tasks)} tasks finished before ({partial.path})")
    stats = RolloutStats()
    with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("success {task.fields[success]:.3f} (mean reward {task.fields[reward]:.3f})"), TextColumn("{task.fields[actions]} actions"),
                  TimeElapsedColumn(), console=console) as bar:
        job = bar.add_task(config.bench, total=len(prepared.tasks), completed=len(trajs), reward=0.0, success=0.0,
                           actions=0)
        todo = [t for t in prepared.tasks if t.task_id not in partial.rows]
        for traj in play(engine, tokenizer, prepared.env_factory, todo, samples_per_task=1, params=params,
                         policy_id=config.model, run_id=f"evaluate-{config.bench}", git_commit=git_commit(),
                         max_concurrent=config.batch_size, stats=stats,
                         on_step=lambda s: bar.update(job, actions=s.actions)):
            trajs.append(traj)
            partial.add(traj.task_id, {"trajectory": traj.model_dump(mode="json"),
                                       "experiences": getattr(engine, "retrieved", {}).get(traj.task_id)})
            bar.update(job, advance=1, reward=sum(t.reward for t in trajs) / len(trajs),
                       success=sum(t.success for t in trajs) / len(trajs))  # = pass@1 / accuracy of one-shot benches
    trajs.sort(key=lambda t: order.get(t.task_id, len(order)))
    scores, extras = bench.score(config, prepared, trajs)
    if getattr(engine, "retrieved", None) is not None:  # latent-conditioned: what each task saw
        engine.retrieved.update({k: r["experiences"] or [] for k, r in partial.rows.items() if k not in engine.retrieved})
        for task_id, ids in engine.retrieved.items():
            extras.setdefault(task_id, {})["experiences"] = ids
        prepared.notes.append(engine.retrieval_note())
        console.print(f"  {prepared.notes[-1]}")
        if engine.unconditioned:
            prepared.notes.append(f"{engine.unconditioned} prompt(s) rendered anew mid-episode were "
                                  "generated without latents")
    if bench.reference_nll and hasattr(engine, "model") and not config.composer:
        nll = reference_nll(engine.model, getattr(engine, "adapter", None), tokenizer, prepared, trajs,
                            getattr(engine, "prefix_cache", None))
        if nll:
            scores["reference_nll"] = sum(nll.values()) / len(nll)
        for task_id, value in nll.items():
            extras.setdefault(task_id, {})["reference_nll"] = value
    elif bench.reference_nll and config.engine == "vllm":
        prepared.notes.append("reference_nll not computed: the vllm engine holds no transformers model")
    if stats.context_overflows:
        prepared.notes.append(f"{stats.context_overflows} task(s) ended at the model's context window, scored 0 "
                              "(info.stopped 'context window'): lower --max-new-tokens or --max-turns")
    finished = datetime.now(timezone.utc)
    report = {
        "bench": config.bench,
        "scores": scores,
        "behaviour": behaviour_stats(trajs),
        "per_task": [_task_row(t, extras.get(t.task_id, {})) for t in trajs],
        "notes": prepared.notes,
        "fixtures": prepared.fixtures,
        "rules": prepared.rules,
        "config": config.model_dump(),
        "model": config.model,
        "git_commit": git_commit(),
        "started_at": started.isoformat(),
        "finished_at": finished.isoformat(),
        "seconds": time.perf_counter() - t0,
        "generated_tokens": stats.generated_tokens,
        "context_overflows": stats.context_overflows,
        **_cache_counts(engine),
    }
    _write_atomic(out, report)
    partial.finish()
    console.print(report_table(report))
    console.print(f"report written to {out}")
    return report


def latent_engine(config: EvaluateConfig, envs: set[str]) -> tuple[Any, Any]:
    """The frozen ``config.model`` with ``config.composer`` and a retriever over ``config.store``
    (checked to serve tasks of ``envs``).

    Raises:
        ValueError: the composer was trained on another backbone (before any model loads).
        StoreError: the store does not exist, has no embeddings (run ``lopd index``) or no
            experience for any of ``envs`` (:func:`stages.core.data.retrieval.check_serves`).
    """
    from stages.core.data.retrieval import Retriever, check_serves
    from stages.core.data.store import ExperienceStore
    from stages.core.models.assembly import load_composer
    from stages.core.models.backbone import load_policy, resolve_model
    from stages.core.models.composer_config import read_composer_config
    from stages.engines.latent import LatentEngine

    cfg = read_composer_config(config.composer)
    if cfg["backbone_id"] not in (config.model, resolve_model(config.model)):
        raise ValueError(f"composer in {config.composer} was trained on backbone {cfg['backbone_id']}, "
                         f"got --model {config.model}")
    retriever = Retriever(ExperienceStore.open(config.store, create=False))
    check_serves(retriever.store, envs, who=f"--composer {config.composer}")
    model, tokenizer = load_policy(config.model, dtype=config.dtype, device=config.device)
    composer = load_composer(model, config.composer, trainable=False, backbone_id=cfg["backbone_id"])
    composer.backbone.eval()
    return LatentEngine(composer.backbone, tokenizer, composer, retriever, placement=cfg["placement"],
                        batch_size=config.batch_size), tokenizer


def reference_nll(model: Any, adapter: str | None, tokenizer: Any, prepared: Any, trajs: list[Trajectory],
                  prefix_cache: Any = None) -> dict[str, float]:
    """Per task: the mean negative log-likelihood (nats per token) of its verified reference action
    under the evaluated model, teacher-forced after the exact prompt the model was given.

    A graded held-out measure that moves before accuracy does: a model that never answers in the
    call format scores 0 on every task, yet training that makes the right call more likely lowers
    this number. The prompt is the trajectory's recorded first-turn ``context_ids``; the target is
    the environment's reference action tokenized as a reference rollout is (its text, then the eos
    id, so the model is also scored on ending its turn there).

    Args:
        model: the causal LM the bench was played with (peft or plain); ``adapter`` the peft
            adapter it generated with (None: the model as it is).
        tokenizer: its tokenizer; prepared: the bench's tasks and environment factory;
        trajs: the played trajectories (one per task).
        prefix_cache: the engine's :class:`stages.engines.prefix_cache.PrefixCache` (None: none);
            a prompt whose keys and values it still holds from the generation is not encoded
            again (a 100-task bfcl-single evaluation: seconds instead of minutes on a CPU).

    Returns:
        ``{task_id: nll}``; tasks without a reference, a recorded prompt or any reference token
        are left out.
    """
    import torch
    from transformers import DynamicCache

    from stages.core.losses.lopd import sampled_token_logprobs
    from stages.core.models.composer import adapter_scope

    tasks = {t.task_id: t for t in prepared.tasks}
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    rows: list[tuple[str, list[int], list[int]]] = []
    env = prepared.env_factory()
    try:
        for traj in trajs:
            task = tasks.get(traj.task_id)
            if task is None or not traj.turns or not traj.turns[0].context_ids:
                continue
            try:
                refs = env.reference_actions(task)
            except (EnvError, ValueError):  # a task without a usable reference is not scored
                continue
            target = tokenizer(refs[0], add_special_tokens=False)["input_ids"] + eos if refs else []
            if target:
                rows.append((traj.task_id, list(traj.turns[0].context_ids), target))
    finally:
        env.close()
    out: dict[str, float] = {}
    device, was_training = next(model.parameters()).device, model.training
    model.eval()  # called from inside training too: no dropout, mode restored below
    with torch.no_grad(), adapter_scope(model, adapter):
        for task_id, prompt, target in rows:
            ids_T = torch.tensor(prompt + target)
            # the prompt's keys and values from the generation (never its last token: its logits are needed)
            n, layers = prefix_cache.match(ids_T[:len(prompt) - 1]) if prefix_cache is not None else (0, [])
            past = DynamicCache([(k[None], v[None]) for k, v in layers], config=model.config) if n else None
            logits_TV = model(input_ids=ids_T[None, n:].to(device), cache=past, use_cache=past is not None).logits[0]
            start = len(prompt) - 1 - n  # logits at t predict the token at t + 1
            logp_1R = sampled_token_logprobs(logits_TV[None, start:start + len(target)],
                                             torch.tensor([target], device=device))
            out[task_id] = float(-logp_1R.mean())
    model.train(was_training)
    return out


def _cache_counts(engine: Any) -> dict[str, int]:
    """Prompt tokens the engine's prefix cache served and those it had to encode (none: {})."""
    cache = getattr(engine, "prefix_cache", None)
    return {} if cache is None else {"prompt_tokens_cached": cache.hit_tokens, "prompt_tokens_encoded": cache.miss_tokens}


PAPER_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "top_k": 20}
"""Decoding of every benchmark in B.3 / Table 5 of the LOPD paper."""
PAPER_BUDGETS = {"envscaler": (40_960, 30), "bfcl-v3": (40_960, 30), "bfcl-single": (40_960, 1),
                 "acebench": (40_960, 20), "livecodebench": (16_384, 1), "humaneval-plus": (16_384, 1),
                 "mbpp-plus": (16_384, 1)}
"""Per bench (generation budget in tokens, step cap) of Table 5 (bfcl-single: BFCL's budget, one step)."""


def apply_protocol(config: EvaluateConfig) -> EvaluateConfig:
    """``config`` with every decoding setting it leaves None filled from its ``protocol``.

    ``greedy``: temperature 0, top-p 1, top-k 0 (off), the bench's own token budget and step
    cap (:data:`stages.benches.BENCHES`). ``paper``: :data:`PAPER_SAMPLING` and
    :data:`PAPER_BUDGETS`. Thinking mode is whatever the model's chat template does by default
    (Qwen3's: on, as in the paper). The filled settings are what the report records.

    Raises:
        ValueError: ``paper`` on a bench the paper does not evaluate (lopd's study bed) when the
            token budget or the step cap is not given.
    """
    bench = BENCHES[config.bench]
    if config.protocol == "paper":
        if config.bench not in PAPER_BUDGETS and (config.max_new_tokens is None or config.max_turns is None):
            raise ValueError(f"--protocol paper: the LOPD paper gives no token budget or step cap for {config.bench} "
                             f"(it has them for {', '.join(PAPER_BUDGETS)}); give --max-new-tokens and --max-turns, "
                             "or use --protocol greedy")
        budget, steps = PAPER_BUDGETS.get(config.bench, (config.max_new_tokens, config.max_turns))
        filled = {**PAPER_SAMPLING, "max_new_tokens": budget, "max_turns": steps}
    else:
        filled = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": bench.max_new_tokens,
                  "max_turns": bench.max_turns}
    return config.model_copy(update={k: v for k, v in filled.items() if getattr(config, k) is None})


def _task_row(t: Trajectory, extra: dict[str, Any]) -> dict[str, Any]:
    info = json.loads(t.info)
    info.pop("tests", None)
    return {"task_id": t.task_id, "reward": t.reward, "success": t.success, "steps": t.num_steps,
            "tool_calls": t.num_tool_calls, "repeated_calls": repeated_calls(t),
            "first_step_tokens": t.turns[0].action_tokens if t.turns else 0,
            **extra, "info": info,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in t.messages]}  # the transcript


def report_table(report: dict[str, Any]) -> Table:
    """Scores and behaviour statistics of one report as a two-column rich table."""
    rules = f"; {report['rules']}" if report.get("rules") else ""
    table = titled_table(f"{report['bench']} - {report['model']}", caption=f"{len(report['per_task'])} tasks{rules}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in report["scores"].items():
        table.add_row(key, f"{value:.3f}")
    for key, value in report["behaviour"].items():  # the precision of the --compare table
        table.add_row(f"[dim]{key}[/]", f"{value:.3f}")
    return table
