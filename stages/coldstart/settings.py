"""The settings of one `lopd coldstart` run (:mod:`stages.coldstart.recipe`), read by its data and loop."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from stages.core.models.backbone import DEFAULT_MODEL
from stages.settings import DEFAULT_STORE, Device, Log, ResumeRun, RunDType

if TYPE_CHECKING:
    from stages.core.losses.composer_objectives import ObjectiveSettings


# the composer ladder's rungs (stages/coldstart/ladder/rungs.py: RUNGS names what each scores)
RUNG_NAMES = ("a", "b", "c", "d", "e", "f", "g", "h", "h'", "i")


def rung_list(text: str, flag: str = "--ladder-rungs") -> list[str]:
    """The rung names of a comma-separated ``--ladder-rungs`` / ``--rungs`` value, in ladder order, with
    (a) and (c) (always scored).

    Raises:
        ValueError: an unknown rung (one line naming ``flag`` and the known rungs).
    """
    named = [r.strip() for r in text.split(",") if r.strip()]
    if unknown := [r for r in named if r not in RUNG_NAMES]:
        raise ValueError(f"{flag}: unknown rung(s) {', '.join(unknown)} (known: {', '.join(RUNG_NAMES)})")
    return [r for r in RUNG_NAMES if r in ("a", "c") or r in named]


class ColdstartConfig(BaseModel):
    """Settings of one `lopd coldstart` run: the flags, each described by its field.

    AdamW at a constant ``lr``, no weight decay. ``objective``, ``readout`` and ``memory_norm``
    name registered parts (:data:`stages.core.losses.composer_objectives.OBJECTIVES`,
    :data:`stages.core.models.readouts.READOUTS`, :data:`~stages.core.models.readouts.MEMORY_NORMS`);
    ``max_len`` keeps a conversation's start and never cuts its prompt; ``placement`` ``framed``
    uses the texts of :mod:`stages.core.latent.framing`. On ``resume`` only the settings the
    recipe lists as resumable and the spelling of paths may change (:mod:`stages.core.run.runs`).
    """

    model_config = ConfigDict(extra="forbid")

    experiences: str = Field(DEFAULT_STORE, description=(
        "Indexed experience store (`lopd index`) whose successful trajectories train the composer."))
    out: str = Field("runs/composer0", description="Output folder (checkpoints, metrics.jsonl, final/).")
    model: str = Field(DEFAULT_MODEL, description="Frozen backbone: smollm2-135m, an HF id or a local path.")
    steps: int = Field(default=200, ge=1, description="Optimizer steps.")
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate of the composer.")
    lr_encoder: float | None = Field(default=None, gt=0, description=(
        "Learning rate of the composer's encoder LoRA (default: --lr; the compressor trains at --lr)."))
    # None (not given) follows the weights, as the description says (_objective_of_weights): never None once validated
    objective: Literal["action-nll", "contrast", "text-kl"] | None = Field(None, description=(
        "What the steps after --reconstruction-steps minimise: the action NLL, plus the contrast hinge (contrast) or "
        "the text teacher's KL (text-kl). (default: contrast with --contrast-weight, text-kl with --text-kl-weight, "
        "else action-nll)"))
    reconstruction_steps: int = Field(default=0, ge=0, description=(
        "The first this many of --steps pre-train the composer to autoencode its inputs (the teacher reproduces "
        "each from its latents); the rest train the action objective."))
    self_retrieval: bool = Field(False, description=(
        "A training target's own trajectory is its first experience (the official recipe's allow_self_retrieval); "
        "held-out scoring never does this, except the ladder's oracle rung (f)."))
    contrast_weight: float = Field(default=0.0, ge=0, description=(
        "Add this times a hinge that makes each target's NLL with its own experiences' latents lower than with "
        "another target's by --contrast-margin (0 = off; needs --batch-size 2+)."))
    contrast_margin: float = Field(default=0.05, ge=0, description="The gap (nats per token) --contrast-weight asks for.")
    text_kl_weight: float = Field(default=0.0, ge=0, description=(
        "Add this times the forward KL(text teacher || latent teacher) on the action tokens: the teacher reading "
        "the experiences' latents is asked to predict what it predicts from their plain text (0 = off; not with "
        "--contrast-weight; one more teacher forward per target)."))
    text_kl_top_m: int | None = Field(default=None, ge=1, description=(
        "The text KL over the text teacher's top-M tokens plus a tail bucket, its targets computed once per "
        "training target and kept in OUT/text_teacher/ (default: over the full vocabulary, the text teacher "
        "run every step)."))
    batch_size: int = Field(default=2, ge=1, description="Target trajectories per step.")
    J: int = Field(default=3, ge=1, description="Retrieved experiences per task.")
    K: int = Field(default=32, ge=1, description="Latent tokens per experience.")
    depth: int = Field(default=8, ge=1, description="QFormer block applications.")
    qformer_shared: bool = Field(True, description=(
        "One QFormer block applied --depth times (the paper's) or --depth separate blocks (composers saved "
        "before this option load as separate blocks)."))
    memory_norm: Literal["layer", "token"] = Field("layer", description=(
        "What the compressor reads: the encoder's hidden states as they are (layer) or standardised per feature "
        "over each experience's tokens (token), which removes the component all tokens share."))
    readout: Literal["qformer", "pointer", "span", "centred"] = Field("qformer", description=(
        "How the compressor's queries become latents: a LayerNorm of them (qformer), each a weighted sum of the "
        "experience's token embeddings, pointed at by the query (pointer), or the embeddings of K tokens of the "
        "experience from its first action on plus a learned, gated qformer readout (span), or the qformer readout "
        "plus a learned constant that alone takes the part of the gradient all of a step's experiences share, so "
        "the compressor learns only what differs between them (centred)."))
    latent_scale: float = Field(default=1.0, gt=0, description=(
        "The latents' initial norm as a multiple of the mean token-embedding norm (qformer, span and centred "
        "readouts; pointer latents are embedding mixtures already)."))
    lora_rank: int = Field(default=8, ge=1, description="Rank of the composer encoder's LoRA.")
    max_exp_tokens: int = Field(default=256, ge=1, description="Token budget per (task, experience) pair.")
    max_len: int = Field(default=1024, ge=2, description="Token cap of a target conversation.")
    placement: Literal["prefix", "per-turn", "framed"] = Field("prefix", description=(
        "Latents after the task prompt (prefix), before each action (per-turn, Eq. 8), or inside the first user "
        "message between framing texts (framed, A.4)."))
    heldout_fraction: float = Field(default=0.2, ge=0.0, lt=1.0, description="Share of tasks held out to measure the NLL.")
    exclude_same_task: bool = Field(True, json_schema_extra={"flag": "--exclude-same-task/--allow-same-task"},
                                    description=("Never retrieve a trajectory of the target's own task (it would "
                                                 "hold the answer)."))
    checkpoint_every: int = Field(default=50, ge=1, description="Steps between checkpoints.")
    eval_every: int = Field(default=50, ge=1, description="Steps between held-out evaluations.")
    seed: int = Field(0, description="Seed of init, split and batch order.")
    resume: ResumeRun = False
    env: str | None = Field(None, description="Use only this environment's trajectories (default: all).")
    activation_checkpointing: bool = Field(
        default=True, validation_alias=AliasChoices("activation_checkpointing", "grad_checkpointing"),
        json_schema_extra={"flag": ["--activation-checkpointing/--no-activation-checkpointing",
                                    "--grad-checkpointing/--no-grad-checkpointing"]},
        description=("Recompute backbone activations in backward: less memory, slower steps (--grad-checkpointing: "
                     "older spelling)."))
    grad_clip: float | None = Field(default=1.0, gt=0, validation_alias=AliasChoices("grad_clip", "max_grad_norm"),
                                    json_schema_extra={"flag": ["--grad-clip", "--max-grad-norm"]},
                                    description="Gradient clipping of phi (--max-grad-norm: older spelling).")
    ladder: bool = Field(True, description=(
        "At the end, score the ladder of controls (--ladder-rungs) on held-out targets."))
    ladder_targets: int = Field(default=32, ge=0, description="Held-out targets the ladder scores (a seeded subset; 0 = all).")
    ladder_rungs: str = Field(default=",".join(r for r in RUNG_NAMES if r != "h'"), description=(
        "The ladder's rungs, comma-separated ((a) and (c) are always scored): a no latents, b untrained, c retrieved, "
        "d another task's, e another environment's, f own trajectory, g as text, h free vectors (trains for --steps "
        "more steps), h' task-only composer (trains for 4 x --steps: an lr sweep of three, then the final run; "
        "`lopd ladder` scores it by default), i another environment's as text."))
    device: Device = None
    dtype: RunDType = None
    log: Log = "none"

    @field_validator("ladder_rungs")
    @classmethod
    def _known_rungs(cls, value: str) -> str:
        rung_list(value)  # raises on an unknown rung
        return value

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
