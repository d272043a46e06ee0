"""The settings of one `lopd coldstart` run (:mod:`stages.coldstart.recipe`), read by its data and loop."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from stages.core.models.backbone import DType
from stages.core.run.tracking import Logger

if TYPE_CHECKING:
    from stages.core.losses.composer_objectives import ObjectiveSettings


class ColdstartConfig(BaseModel):
    """Settings of one `lopd coldstart` run (the CLI flags, validated).

    Attributes:
        experiences: experience store (indexed with `lopd index`).
        out: output folder.
        model: backbone (``smollm2-135m``, HF id or local folder).
        steps, lr, batch_size: AdamW steps (constant lr, no weight decay), targets per step.
        lr_encoder: learning rate of the encoder LoRA psi (None: ``lr``; the compressor always
            trains at ``lr``).
        objective: what the steps after ``reconstruction_steps`` minimise, a registered objective
            (:data:`stages.core.losses.composer_objectives.OBJECTIVES`): ``action-nll``,
            ``contrast`` (needs ``contrast_weight`` > 0) or ``text-kl`` (needs ``text_kl_weight``
            > 0). Not given: ``contrast`` with a contrast weight above 0, ``text-kl`` with a
            text-KL weight above 0, else ``action-nll``.
        reconstruction_steps: the first this many of ``steps`` train the autoencoding objective
            (``reconstruction``: the teacher reproduces each composer input from its latents)
            instead of ``objective``.
        self_retrieval: a training target's own trajectory is its first experience (then the
            first J - 1 retrieved ones); the official recipe's ``allow_self_retrieval``.
        text_kl_weight: the ``text-kl`` objective's weight: each step adds weight x the forward KL
            from the text teacher (the batch's experiences as plain text where the latents go) to
            the latent teacher on the action tokens.
        text_kl_top_m: None: that KL over the full vocabulary, the text teacher run at every step;
            M: over the text teacher's top-M tokens plus a tail bucket, its targets computed once
            per training target and kept in the run folder (``text_teacher/``).
        latent_scale: the latents' initial row norm as a multiple of the mean input-embedding row
            norm (qformer readout; :class:`stages.core.models.composer.Composer`).
        contrast_weight, contrast_margin: the ``contrast`` objective's weight and margin: each
            step adds weight x the latent contrast hinge: a target's NLL with its own experiences'
            latents must be ``contrast_margin`` nats per token below its NLL with another
            target's (needs ``batch_size`` >= 2).
        J, K, depth, lora_rank, max_exp_tokens: composer (experiences per target, latents per
            experience, QFormer block applications, composer LoRA rank, token cap of one experience).
        qformer_shared: one QFormer block applied ``depth`` times (the paper's) or ``depth`` blocks.
        memory_norm: ``layer`` (the encoder's hidden states as they are) or ``token`` (each
            experience's states standardised per feature over its tokens first); registered in
            :data:`stages.core.models.readouts.MEMORY_NORMS`.
        readout: ``qformer`` (a LayerNorm of the updated queries), ``pointer`` (each latent a
            weighted sum of the experience's token embeddings), ``span`` (the embeddings of K
            tokens of the experience from its first action on, plus a gated qformer readout) or
            ``centred`` (the qformer readout plus a learned constant; the part of the latents'
            gradient that the step's experiences share trains the constant alone); registered in
            :data:`stages.core.models.readouts.READOUTS`.
        max_len: token cap of a target conversation (keeps the start, never cuts the prompt).
        placement: where the latents go: ``prefix`` (after the task prompt), ``per-turn``
            (before each action, Eq. 8) or ``framed`` (inside the first user message between
            framing texts, A.4; :mod:`stages.core.latent.framing`).
        heldout_fraction: share of the tasks held out for evaluation.
        exclude_same_task: retrieve no trajectory of the target's own task (module docstring).
        checkpoint_every, eval_every: steps between checkpoints / held-out evaluations.
        seed: seeds the composer init, the task split and the batch order.
        resume: continue from the latest checkpoint in ``out``; only ``steps``,
            ``checkpoint_every``, ``eval_every``, ``max_len``, ``device``, ``dtype`` and the
            spelling of paths may change (:mod:`stages.core.run.runs`).
        env: use only this environment's trajectories (None = all).
        activation_checkpointing: recompute the backbone layers in backward (less memory);
            also accepted as ``grad_checkpointing``.
        grad_clip: gradient-norm clipping of phi (None = off); also accepted as ``max_grad_norm``.
        log: also log every step's metrics row to ``tensorboard`` or ``wandb``
            (:mod:`stages.core.run.tracking`); may change on resume.
        ladder, ladder_targets: at the end, score the ladder of controls on at most
            ``ladder_targets`` held-out targets (0 = all; :mod:`stages.coldstart.ladder`), which
            trains the free-vector control (h) for ``steps`` more steps.
        device, dtype: where the backbone and composer live and the backbone's dtype (None:
            CUDA in bfloat16 when a GPU is visible, else the CPU in float32;
            :func:`stages.core.models.backbone.resolve_device_dtype`).
    """

    model_config = ConfigDict(extra="forbid")

    experiences: str
    out: str
    model: str = "smollm2-135m"
    steps: int = Field(default=200, ge=1)
    lr: float = Field(default=1e-4, gt=0)
    lr_encoder: float | None = Field(default=None, gt=0)
    objective: Literal["action-nll", "contrast", "text-kl"] = "action-nll"
    reconstruction_steps: int = Field(default=0, ge=0)
    self_retrieval: bool = False
    contrast_weight: float = Field(default=0.0, ge=0)
    contrast_margin: float = Field(default=0.05, ge=0)
    text_kl_weight: float = Field(default=0.0, ge=0)
    text_kl_top_m: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=2, ge=1)
    J: int = Field(default=3, ge=1)
    K: int = Field(default=32, ge=1)
    depth: int = Field(default=8, ge=1)
    qformer_shared: bool = True
    memory_norm: Literal["layer", "token"] = "layer"
    readout: Literal["qformer", "pointer", "span", "centred"] = "qformer"
    latent_scale: float = Field(default=1.0, gt=0)
    lora_rank: int = Field(default=8, ge=1)
    max_exp_tokens: int = Field(default=256, ge=1)
    max_len: int = Field(default=1024, ge=2)
    placement: Literal["prefix", "per-turn", "framed"] = "prefix"
    heldout_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    exclude_same_task: bool = True
    checkpoint_every: int = Field(default=50, ge=1)
    eval_every: int = Field(default=50, ge=1)
    seed: int = 0
    resume: bool = False
    env: str | None = None
    activation_checkpointing: bool = Field(
        default=True, validation_alias=AliasChoices("activation_checkpointing", "grad_checkpointing"))
    grad_clip: float | None = Field(default=1.0, gt=0, validation_alias=AliasChoices("grad_clip", "max_grad_norm"))
    ladder: bool = True
    ladder_targets: int = Field(default=32, ge=0)
    device: str | None = None
    dtype: DType | None = None
    log: Logger = "none"

    @model_validator(mode="before")
    @classmethod
    def _objective_of_weights(cls, data):
        """An objective not given (or None, a flag left out) follows the weights (runs before the field existed)."""
        if isinstance(data, dict) and data.get("objective") is None:
            weighted = [name for name, field in OBJECTIVE_WEIGHTS.items() if (data.get(field) or 0) > 0]
            data = {**data, "objective": weighted[0] if len(weighted) == 1 else "action-nll"}
        return data

    @model_validator(mode="after")
    def _one_extra_objective(self) -> ColdstartConfig:
        if self.contrast_weight > 0 and self.text_kl_weight > 0:
            raise ValueError("--contrast-weight and --text-kl-weight are separate objectives: set one of them")
        for name, field in OBJECTIVE_WEIGHTS.items():
            flag = "--" + field.replace("_", "-")
            if getattr(self, field) > 0 and self.objective != name:
                raise ValueError(f"{flag} weighs the {name} objective, not --objective {self.objective}")
            if self.objective == name and getattr(self, field) == 0:
                raise ValueError(f"--objective {name} needs {flag} above 0")
        if self.text_kl_top_m is not None and self.objective != "text-kl":
            raise ValueError("--text-kl-top-m sets the text-kl objective's KL: it needs --text-kl-weight above 0")
        if self.objective == "contrast" and self.batch_size < 2:
            raise ValueError("--contrast-weight needs --batch-size 2 or more (another target's latents "
                             "come from the same batch)")
        if self.reconstruction_steps >= self.steps:
            raise ValueError(f"--reconstruction-steps {self.reconstruction_steps} leaves none of --steps {self.steps} "
                             "to the action objective (they count within --steps)")
        return self

    def objective_settings(self) -> ObjectiveSettings:
        """The weights the objectives read."""
        from stages.core.losses.composer_objectives import ObjectiveSettings  # torch: not at flag checking

        return ObjectiveSettings(contrast_weight=self.contrast_weight, contrast_margin=self.contrast_margin,
                                 text_kl_weight=self.text_kl_weight, text_kl_top_m=self.text_kl_top_m)


# the objectives that have a weight setting, and its field (the weight above 0 chooses the objective)
OBJECTIVE_WEIGHTS = {"contrast": "contrast_weight", "text-kl": "text_kl_weight"}
