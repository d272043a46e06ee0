"""Supervised baselines as entries of a `lopd study` (:mod:`stages.study.recipe`): ``method = "sft"``
fine-tunes the starting student on the train split's verified references in its store copy,
``method = "rft"`` (rejection-sampling fine-tuning) first plays the train tasks with the starting
student (the study's generation budget) and fine-tunes on the successes of that collect (`lopd
sft --source student --from-run`). Neither runs the distill loop.

Equal budget: a distill run plays ``steps`` x ``tasks_per_step`` x ``group_size`` rollouts; an
SFT run takes ``steps`` optimizer steps of ``tasks_per_step`` x ``group_size`` sequences, so both
see as many training sequences; an RFT run's collect plays ``steps`` x ``tasks_per_step`` train
tasks ``group_size`` times each (the first tasks of the split, sampled as distill samples), the
same generations. Both train with the study's ``model``, ``lr``, ``student_lora_rank`` (as
``lora_rank``), ``max_len``, ``device`` and ``dtype`` from its ``[distill]`` table; an entry's
``settings`` may set any `lopd sft` setting but those fixed here, and for RFT the sampling
(``temperature``, ``top_p``, ``max_new_tokens``, ``max_turns``). Evaluations run inside the
fine-tuning at every ``eval_every`` sequences, as a distill run's do at every ``eval_every``
generations.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError
from rich.console import Console

from stages import collect, sft
from stages.distill.settings import DistillConfig
from stages.study.layout import StudyConfig, StudyRun, run_dir

SFT_METHODS = {"sft": "reference", "rft": "student"}  # method -> the rows it fine-tunes on
_SAMPLING = ("temperature", "top_p", "max_new_tokens", "max_turns")
_FIXED = ("store", "out", "split", "source", "from_run", "steps", "batch_size", "checkpoint_every", "keep_checkpoints", "seed",
          "resume")


def _shared(config: StudyConfig, key: str, distill_key: str | None = None) -> Any:
    """A ``[distill]`` setting of the study, else distill's default."""
    key_there = distill_key or key
    return config.distill.get(key_there, DistillConfig.model_fields[key_there].default)


def _invalid(run: StudyRun, err: ValidationError) -> ValueError:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return ValueError(f"study run {run.name!r}: {where + ': ' if where else ''}{first['msg']}")


def sft_config(config: StudyConfig, run: StudyRun, seed: int, steps: int, per_step: int) -> sft.SftConfig:
    """The `lopd sft` settings of one (run, seed) of an ``sft``/``rft`` entry.

    Raises:
        ValueError: a setting the entry may not change, or an invalid one (names the run).
    """
    fixed = sorted(set(run.settings) & set(_FIXED))
    if fixed:
        raise ValueError(f"study run {run.name!r}: {fixed[0]} is set by the study (the equal budget, its store)")
    folder = run_dir(config, run, seed)
    values: dict[str, Any] = {"model": _shared(config, "model"), "lr": _shared(config, "lr"),
                              "lora_rank": _shared(config, "student_lora_rank"), "max_len": _shared(config, "max_len"),
                              "device": _shared(config, "device"), "dtype": _shared(config, "dtype")}
    values.update({k: v for k, v in run.settings.items() if k not in _SAMPLING})
    every = config.eval_every // per_step if config.eval_every else steps
    values.update(store=str(folder / "store"), out=str(folder / "train"), split="train",
                  source=SFT_METHODS[run.method], from_run=_collect_id(run, seed) if run.method == "rft" else None,
                  steps=steps, batch_size=per_step, checkpoint_every=every,
                  keep_checkpoints=1, seed=seed, resume=(folder / "train" / "config.json").is_file())
    if run.method == "sft" and any(k in run.settings for k in _SAMPLING):
        raise ValueError(f"study run {run.name!r}: sft samples nothing ({', '.join(_SAMPLING)} are rft settings)")
    try:
        return sft.SftConfig(**values)
    except ValidationError as err:
        raise _invalid(run, err) from None


def _collect_id(run: StudyRun, seed: int) -> str:
    return f"study-{run.name}-seed{seed}-collect"


def collect_config(config: StudyConfig, run: StudyRun, seed: int, steps: int) -> collect.CollectConfig:
    """The `lopd collect` settings of an ``rft`` (run, seed): the starting student plays the
    first ``steps x tasks_per_step`` train tasks ``group_size`` times each, sampled as distill
    samples (the study's ``[distill]`` sampling, or the entry's own)."""
    folder = run_dir(config, run, seed)
    values = {k: run.settings.get(k, _shared(config, k)) for k in _SAMPLING}
    try:
        return collect.CollectConfig(
            env=config.env, store=str(folder / "store"), split="train", model=_shared(config, "model"),
            limit=steps * _shared(config, "tasks_per_step"), samples_per_task=_shared(config, "group_size"),
            data_dir=config.distill.get("data_dir"), device=_shared(config, "device"), dtype=_shared(config, "dtype"),
            seed=seed, run_id=_collect_id(run, seed), resume=True, **values)
    except ValidationError as err:
        raise _invalid(run, err) from None


def train(config: StudyConfig, run: StudyRun, seed: int, budget: tuple[int, int], console: Console,
          evaluate_at: Callable[[int, Any, str | None, Any], None]) -> Path:
    """Train one (run, seed) of an ``sft``/``rft`` entry in its folder (its store copy ready);
    ``evaluate_at(sequences, student, adapter, tokenizer)`` runs at every ``eval_every``
    sequences and at the end. Resumable: a collect skips the tasks it stored, the fine-tuning
    resumes from its checkpoint. Returns the final student's folder.

    Raises:
        ValueError, StoreError: see :func:`sft_config`, :func:`stages.sft.run` (e.g. an RFT
            collect in which the student solved no task).
    """
    steps, per_step = budget
    if run.method == "rft":
        collect.run(collect_config(config, run, seed, steps), console)
    settings = sft_config(config, run, seed, steps, per_step)
    every = settings.checkpoint_every

    def hook(step: int, student: Any, adapter: str | None, tokenizer: Any) -> None:
        if step % every == 0 or step == steps:
            evaluate_at(step * per_step, student, adapter, tokenizer)

    return sft.run(settings, console, on_step=hook)
