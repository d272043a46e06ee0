"""Training methods of `lopd distill`, one module each, registered by name.

A method is a class behind one small interface (:class:`Method`). The loop in
:mod:`stages.distill.recipe` owns everything that is the same for every method (rollouts with the
current student, micro-batching, the optimizer step, the experience memory, checkpoints); the
method owns what differs: its options, the teacher's view of a batch, the loss, what it does
after the optimizer step, and the state it checkpoints.

Adding a method is one new module plus one registry line (:data:`_MODULES`)::

    @register("sft")
    class SelfSFT(Method):
        metrics = ("nll",)
        def loss(self, rows, weight): ...

Its ``Options`` model belongs in :mod:`stages.methods.options` (with its line in ``METHOD_OPTIONS``):
the CLI reads a method's options there (:func:`method_options`) without importing the method,
which loads torch.

Look-up: :func:`get_method` (an unknown name lists the known ones).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from schemas import Trajectory
from stages.core.models.backbone import resolve_device_dtype
from stages.core.registry import Registry
from stages.methods.options import MethodOptions

if TYPE_CHECKING:  # the package loads no torch: the CLI reads the methods' names and options first
    import torch
    from torch import nn

    from stages.core.data.rows import TrainRow
    from stages.core.models.head import LMHead

# Registry line per method module: importing it registers its class.
_MODULES = {"lopd": "stages.methods.lopd",
            "lopd-text": "stages.methods.lopd_text",
            "grpo": "stages.methods.grpo",
            "sdft": "stages.methods.sdft",
            "opsd": "stages.methods.opsd",
            "sdpo": "stages.methods.sdpo",
            "skill-sd": "stages.methods.skill_sd"}
METHODS: Registry[type[Method]] = Registry("method", modules=_MODULES)


class NoOptions(MethodOptions):
    """Options of a method that has none (unknown keys are an error)."""


@dataclass
class Student:
    """The policy being trained, as the loop built it.

    Attributes:
        model: the module whose forward is the student (a peft backbone or a plain model).
        adapter: its LoRA adapter name, or None for full fine-tuning.
        tokenizer: the backbone's tokenizer.
        params: the student's trainable parameters.
        model_name: the ``--model`` value (the frozen initial weights come from it).
    """

    model: nn.Module
    adapter: str | None
    tokenizer: Any
    params: list[nn.Parameter]
    model_name: str


@dataclass
class StepContext:
    """What a method may use while preparing a step. The loop owns the trajectories table; a
    method may keep a table of its own in the store (Skill-SD's skill bank), tagged by step so
    that a resume can drop the rows written after its checkpoint.

    Attributes:
        store: the run's :class:`stages.core.data.store.ExperienceStore` (verified references,
            skill banks ...).
        retriever: a :class:`stages.core.data.retrieval.Retriever` over it, or None while the store
            has no embedding index (always None for a method whose ``retrieves`` is False).
        engine: the run's rollout engine (e.g. to have the backbone write summaries).
        step: the step being trained (1-based).
    """

    store: Any
    retriever: Any
    engine: Any
    step: int


@dataclass
class StepBatch:
    """What a method trains on in one step: the training rows and the whole step's rollouts.

    Attributes:
        rows: training sequences (:func:`stages.core.data.rows.training_rows`), in order.
        trajectories: every rollout of the step (rows come from those with turns), in the
            order they finished; a task's group is its ``group_size`` trajectories with the same
            ``task_id`` (rollouts of one step never share a task id with another group).
        extras: per row, whatever :meth:`Method.prepare` attached (e.g. retrieved experiences).
    """

    rows: list[TrainRow]
    trajectories: list[Trajectory]
    extras: list[Any] = field(default_factory=list)


class Method:
    """One training method of the distill loop (subclass, then :func:`register`).

    Class attributes:
        Options: pydantic model of the method's own options (flags / config keys).
        metrics: names of the values :meth:`loss` and :meth:`after_step` report in each
            metrics row (loss values are summed over micro-batches, so return them already
            multiplied by the micro-batch ``weight``; with several ``update_epochs`` they are
            averaged over the epochs).
        update_epochs: optimizer updates per step on the same rollouts (instance attribute,
            e.g. from an option; default 1).
        needs_composer: whether the method reads a composer checkpoint.
        retrieves: whether :meth:`prepare` reads ``context.retriever``. Only then does the run
            load the store's embedder and embed each step's rollouts as it appends them; for the
            other methods they are appended unembedded (``lopd index``, or the next run of a
            retrieving method on the store, embeds them).
        data_parallel: whether it can train in N processes (:mod:`stages.core.run.distributed`):
            its ``prepare`` must not write the store (rank 0 alone writes it) and must give every
            rank the same result for the same global batch and store.

    Attributes:
        options: the run's options (``config.options``: an instance of the class's ``Options``,
            resolved by :meth:`MethodOptions.resolve`); a subclass annotates it with its own model.
        device, dtype: where every model of the run lives and its parameter dtype (strings,
            ``config.device`` / ``config.dtype`` resolved by
            :func:`stages.core.models.backbone.resolve_device_dtype`); a method loads its own modules
            (teacher copies, reference models) with them and moves each batch to ``device``.

    Args:
        config: the whole :class:`stages.distill.settings.DistillConfig` (common settings and
            ``options``).
        resume_from: the checkpoint folder the run resumes from, or None: a method restores
            what its :meth:`save` wrote there (e.g. an EMA teacher) in its ``__init__``.
        state: the method's :meth:`state` saved in that checkpoint ({} when fresh).
    """

    Options: ClassVar[type[MethodOptions]] = NoOptions
    options: MethodOptions
    metrics: ClassVar[tuple[str, ...]] = ()
    needs_composer: ClassVar[bool] = False
    retrieves: ClassVar[bool] = False
    data_parallel: ClassVar[bool] = True
    name: ClassVar[str] = ""
    update_epochs: int = 1  # optimizer updates per step on the same rollouts (PPO epochs)
    # losses take hidden states and apply the LM head only where they read it; False: full
    # (B, T, V) logits everywhere (the same values, more memory and time; tests compare the two)
    head_at_supervised: ClassVar[bool] = True

    def __init__(self, config: Any, resume_from: Path | None, state: dict) -> None:
        self.options, self.config = config.options, config
        self.device, self.dtype = resolve_device_dtype(config.device, config.dtype)
        self.student = self.build_student(resume_from)

    def output_head(self, model: nn.Module) -> LMHead | None:
        """``model``'s LM head for a loss that applies it only at supervised positions
        (:mod:`stages.core.losses.head`), or None: the full-logits path (a model whose logits are
        not its head on its last hidden state, a sharded head, or ``head_at_supervised`` off)."""
        from stages.core.models.head import output_head

        return output_head(model) if self.head_at_supervised else None

    def build_student(self, resume_from: Path | None) -> Student:
        """The student: a LoRA adapter (or a full copy) on ``config.model``, fresh or restored."""
        from stages.core.models.assembly import load_student

        return Student(*load_student(self.config.model, self.config.student_lora_rank, resume_from,
                                     device=self.device, dtype=self.dtype), self.config.model)

    def check_resources(self, store: Any) -> None:
        """Refuse settings that cannot run before the first step (default: nothing to check).

        Raises:
            ValueError: one line naming the options to change.
        """

    def train_mode(self) -> None:
        """Put the method's own modules in training mode before the step's forwards."""

    def param_groups(self) -> dict[str, tuple[list[nn.Parameter], float]]:
        """Trainable parameters besides the student's: {group name: (params, lr)}."""
        return {}

    def prepare(self, batch: StepBatch, context: StepContext) -> list[Any]:
        """Per row, the privileged context the loss needs (default: nothing)."""
        return [None] * len(batch.rows)

    def begin_update(self, rows: list[TrainRow], extras: list[Any]) -> None:
        """Before the micro-batches of one optimizer update: this process's rows of it and their
        extras (default: nothing; LOPD encodes each distinct composer input once here). Not
        called for a sharded student, whose ranks must run the same collectives."""

    def loss(self, rows: list[TrainRow], extras: list[Any], weight: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch times ``weight`` (its share of the step's rows), and its metrics."""
        raise NotImplementedError

    def end_update(self) -> None:
        """After every micro-batch's backward of an update begun with :meth:`begin_update`, before
        the gradients are reduced over processes and clipped (default: nothing; LOPD's composer
        backward runs here)."""

    def after_step(self, sums: dict[str, float]) -> dict[str, float]:
        """Called after each optimizer step with the summed loss metrics; returns extra metrics."""
        return {}

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state saved in each checkpoint's ``state.json`` (e.g. a dual variable)."""
        return {}

    def save(self, folder: Path) -> None:
        """Write the method's modules into a checkpoint folder (e.g. ``composer/``)."""

    def export(self, folder: Path) -> None:
        """Write what the final folder holds besides the student (e.g. the trained composer)."""


def register(name: str):
    """Class decorator: make a :class:`Method` available as ``--method name``."""
    def deco(cls: type[Method]) -> type[Method]:
        cls.name = name
        return METHODS.add(name, cls)
    return deco


def known_methods() -> list[str]:
    """Names of every method the registry knows."""
    return METHODS.names()


def method_options(name: str) -> type[MethodOptions]:
    """The options model of method ``name`` without importing the method (which loads torch):
    :data:`stages.methods.options.METHOD_OPTIONS`, else (a method registered elsewhere) its class's.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    from stages.methods.options import METHOD_OPTIONS

    return METHOD_OPTIONS[name] if name in METHOD_OPTIONS else get_method(name).Options


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    return METHODS[name]
