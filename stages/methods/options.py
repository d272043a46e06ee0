"""The options of each `lopd distill` method: one pydantic model per method, by the method's name
(:data:`METHOD_OPTIONS`), importable without torch. The CLI makes the distill flags from them and
checks a command line against them before any model library loads; each method's class declares
its ``Options`` from here (:mod:`stages.methods`). A run's options are resolved against their files
once, when its settings are built (:meth:`MethodOptions.resolve`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from typing_extensions import Self

from stages.core.losses import DEFAULT_CHUNK_SIZE, KDReduction
from stages.core.models.composer_config import CONFIG_FILE, read_composer_config

TeacherKind = Literal["frozen", "ema", "current"]


class MethodOptions(BaseModel):
    """Base of a method's options: unknown keys are an error; :meth:`resolve` fills what depends
    on files."""

    model_config = ConfigDict(extra="forbid")

    def resolve(self) -> Self:
        """The options with the values that depend on files filled and checked (a checkpoint's
        values), before the run's settings are frozen or compared on resume: these options
        (default), or a copy. Idempotent.

        Raises:
            ValueError: an option that does not fit its file (one line naming the file and field).
        """
        return self

    @classmethod
    def file_defaults(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Defaults that files named in ``values`` (the run's settings by name, before
        validation) give these options, below every value given: {} (default)."""
        return {}


class ReferenceOptions(MethodOptions):
    """Options shared by the reference-context methods (sdft, opsd): the verified reference in
    the teacher's context, a divergence between teacher and student on the student's tokens."""

    demo_tokens: int = Field(1024, ge=1, description="Token budget of the rendered reference.")
    max_observation_chars: int = Field(300, ge=0, description="An environment answer longer than this is not shown.")
    teacher: TeacherKind = Field("frozen", description="Teacher weights: frozen (the initial student), ema, or current.")
    ema_rate: float = Field(0.01, ge=0.0, le=1.0, description="EMA rate per optimizer step (teacher=ema only).")
    beta: float = Field(0.0, ge=0.0, le=1.0, description="0 = forward KL(T || S), 1 = reverse KL(S || T) (each "
                        "endpoint is its own loss, not a limit); between: OPSD's generalised JSD, at most the binary "
                        "entropy of beta (0.056 nats at 0.01 or 0.99), and near 0 or 1 about beta(1-beta) times the "
                        "nearer endpoint's KL, its gradient as much or less: 0.99 trains with ~1/100 of reverse "
                        "KL's loss and gradient, not like reverse KL.")
    loss_temperature: float = Field(1.0, gt=0.0, description="Divides both logits in the loss.")
    reduction: KDReduction = Field("sequence", description="sequence: token-mean per sequence, then the mean over "
                                   "sequences; token: pooled over the step's tokens.")
    chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1, description="Positions per full-vocabulary chunk of the loss.")


class LOPDOptions(MethodOptions):
    """LOPD's options (defaults = the paper's; official code for lambda, eta_beta).

    ``composer`` is the cold-start composer folder (``lopd coldstart``'s ``final/``); ``K``
    must equal its K. ``lam`` is the anchor weight lambda (``lambda`` in config files).
    ``composer_lr`` None = the run's ``lr``; ``max_exp_tokens`` None = the composer's value
    (512 if it has none); ``freeze_composer`` is the paper's frozen-composer ablation.
    ``exclude_same_task`` (as `lopd coldstart`): retrieve no experience of the
    trajectory's own task. The paper's teacher sees "a reference example from a different task";
    with the task's own verified answer in the store the teacher would see what OPSD's teacher
    sees. On the bed study (docs/results/bed-cpu, seed 0) the two settings trained to the same
    held-out outcomes on all 500 evaluated tasks, so excluding costs nothing measured there.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # descriptions: the help of the `lopd distill` flags (lopd_cli.options.field_flags)
    composer: str = Field(description="lopd: cold-start composer folder (lopd coldstart's final/).",
                          json_schema_extra={"made_by": "`lopd coldstart --experiences STORE --out DIR` makes one "
                                                        "(then --composer DIR/final)"})
    margin: float = Field(0.05, ge=0.0, description="Privileged margin m (0 = the no-margin ablation).")
    J: int = Field(3, ge=1, description="Retrieved experiences per task (not given: the composer's J, else the default).")
    K: int = Field(32, ge=1, description="Latent tokens per experience (must match the composer; not given: the composer's K).")
    M: int = Field(20, ge=1, description="Teacher top-M tokens in the KL (plus a tail bucket).")
    lam: float = Field(0.2, ge=0.0, validation_alias=AliasChoices("lam", "lambda"), json_schema_extra={"flag": "--lambda"},
                       description="Anchor weight lambda.")
    eta_beta: float = Field(0.5, ge=0.0, description="Dual step size of beta.")
    beta0: float = Field(0.0, ge=0.0, description="lopd: initial dual variable beta.")
    composer_lr: float | None = Field(None, gt=0.0, description="lopd: learning rate of the composer. (default: --lr)")
    freeze_composer: bool = Field(False, json_schema_extra={"flag": "--freeze-composer/--train-composer"},
                                  description="Freeze the composer (the paper's ablation).")
    max_exp_tokens: int | None = Field(None, ge=1, description=(
        "lopd: token budget per (task, experience) pair. (default: the composer's)"))
    exclude_same_task: bool = Field(True, json_schema_extra={"flag": "--exclude-same-task/--allow-same-task"},
                                    description=("lopd: never retrieve an experience of the trajectory's own task, "
                                                 "as coldstart does."))

    @classmethod
    def file_defaults(cls, values: dict[str, Any]) -> dict[str, int]:
        """``{"J": ..., "K": ...}`` of the composer checkpoint folder ``values["composer"]`` (what
        it was trained with); {} when it has no readable ``composer_config.json`` (:meth:`resolve`
        names the missing file)."""
        try:
            saved = read_composer_config(values["composer"])
        except ValueError:
            return {}
        return {k: saved[k] for k in ("J", "K") if isinstance(saved.get(k), int)}

    def resolve(self) -> LOPDOptions:
        """K checked against the composer checkpoint; ``max_exp_tokens`` None filled from it (512
        when it has none).

        Raises:
            ValueError: the composer folder holds no ``composer_config.json`` (naming the command
                that makes one), or K differs from the composer's (naming the file and field).
        """
        cfg = read_composer_config(self.composer)
        if cfg.get("K") != self.K:
            raise ValueError(f"{Path(self.composer) / CONFIG_FILE}: field 'K' is {cfg.get('K')}, but the run asks "
                             f"for K={self.K} (K must match the cold-start composer)")
        return self.model_copy(update={"max_exp_tokens": self.max_exp_tokens or cfg.get("max_exp_tokens") or 512})


class LOPDTextOptions(MethodOptions):
    """LOPD-text's options: LOPD's retrieval and KL, with no composer (:mod:`stages.methods.lopd_text`).

    ``max_exp_tokens`` caps each composer input row (task text plus one experience) that the
    teacher reads as text; ``placement`` is where that text goes (a latent placement's name).
    """

    J: int = Field(3, ge=1, description="Retrieved experiences per task, shown to the teacher as text.")
    M: int = Field(20, ge=1, description="Teacher top-M tokens in the KL (plus a tail bucket).")
    max_exp_tokens: int = Field(512, ge=1, description="Token budget per (task, experience) text row.")
    placement: Literal["prefix", "per-turn", "framed"] = Field(
        "framed", description="Where the experiences' text goes in the teacher's input (where LOPD's latents go).")
    exclude_same_task: bool = Field(True, description="Never retrieve an experience of the trajectory's own task.")


class GRPOOptions(MethodOptions):
    """GRPO's options (defaults = B.1 of the LOPD paper where it says; otherwise kl_coef 0, scale_std on, token-mean)."""

    eps_lo: float = Field(0.2, ge=0.0, lt=1.0, description="PPO clip below: the ratio is clipped at 1 - eps_lo.")
    eps_hi: float = Field(0.2, ge=0.0, description="PPO clip above: the ratio is clipped at 1 + eps_hi (DAPO: 0.28).")
    ppo_epochs: int = Field(1, ge=1, description="Optimizer passes over each step's rollouts.")
    scale_std: bool = Field(True, description="Divide the group-relative advantage by the group's reward std "
                                              "(false: Dr.GRPO).")
    adv_eps: float = Field(1e-6, gt=0.0, description="Added to the group std before dividing.")
    kl_coef: float = Field(0.0, ge=0.0, description="Weight of the k3 KL to the initial policy (0: no reference "
                                                    "forward at all).")
    aggregation: Literal["token-mean", "seq-mean", "constant"] = Field(
        "token-mean", description="Loss over tokens: mean over all tokens, mean per sequence then over "
                                  "sequences, or token sum / (rows x loss_constant) (Dr.GRPO).")
    loss_constant: int | None = Field(None, ge=1, description="The constant of aggregation 'constant' "
                                                              "(None: --max-new-tokens).")
    drop_zero_var: bool = Field(False, description="Leave groups whose rewards are all equal out of the loss "
                                                   "(DAPO).")
    rollout_correction: Literal["off", "token-tis"] = Field(
        "off", description="token-tis: weight each token's loss by min(pi_old / pi_engine, rollout_correction_cap), "
                           "the engine's recorded log-probs as the behaviour policy (verl's rollout correction).")
    rollout_correction_cap: float = Field(2.0, gt=0.0, description="Truncation of the rollout correction's weight.")


class SkillSDOptions(GRPOOptions):
    """Skill-SD's options: GRPO's (eps_hi 0.28 here, B.1) plus the skill bank and the SDL term."""

    eps_hi: float = Field(0.28, ge=0.0, description="PPO clip above: the ratio is clipped at 1 + eps_hi (B.1: 0.28).")
    sdl_coef: float = Field(0.001, ge=0.0, description="Weight of the self-distillation term beside the PPO loss.")
    sdl_ratio_clip: float | None = Field(None, gt=0.0, description="Clip of the importance ratio of the "
                                         "self-distillation term (None: unclipped).")
    ucb_c: float = Field(math.sqrt(2.0), ge=0.0, description="Exploration constant c of the UCB1 choice of a "
                         "task's skill.")
    summarizer: str | None = Field(None, description="Who writes the skill summaries: None = the current student "
                                   "through the rollout engine, else a local folder or HF id.")
    summary_rollouts: int = Field(4, ge=1, description="Rollouts of the task shown to the summariser (the newest).")
    summary_max_tokens: int = Field(192, ge=1, description="Token limit of one skill summary (greedy).")
    summary_prompt_tokens: int = Field(1536, ge=64, description="Token cap of the summariser's prompt.")
    max_skills: int = Field(4, ge=1, description="Skills a task's bank holds at most; later visits only choose.")
    skill_source: Literal["step", "store"] = Field("step", description="step: skills may come from this step's "
                                                   "group; store: only from rollouts already stored (module "
                                                   "docstring).")


class SDFTOptions(ReferenceOptions):
    """SDFT's options: :class:`ReferenceOptions` with B.1's EMA teacher (rate 0.01) and the
    forward KL, token-mean per sequence."""

    teacher: TeacherKind = Field("ema", description="Teacher weights: frozen, ema (B.1), or current.")
    ema_rate: float = Field(0.01, ge=0.0, le=1.0, description="EMA rate per optimizer step (teacher=ema only).")


class OPSDOptions(ReferenceOptions):
    """OPSD's options: :class:`ReferenceOptions` with B.1's frozen teacher and forward KL
    (beta 0), pooled over tokens; ``ema_rate`` (upstream 0.001) only applies to ``teacher=ema``."""

    teacher: TeacherKind = Field("frozen", description="Teacher weights: frozen (B.1), ema, or current.")
    ema_rate: float = Field(0.001, ge=0.0, le=1.0, description="EMA rate per optimizer step (teacher=ema only; "
                            "upstream 0.001).")
    reduction: KDReduction = Field("token", description="token: pooled over the step's tokens; sequence: "
                                   "token-mean per sequence, then the mean over sequences.")


class SDPOOptions(MethodOptions):
    """SDPO's options (defaults: B.1 of the LOPD paper; upstream values noted per option)."""

    k: int = Field(20, ge=1, description="Student top-k support of the divergence (upstream yaml 100).")
    ema_rate: float = Field(0.05, ge=0.0, le=1.0, description="Teacher EMA rate per step.")
    success_threshold: float = Field(1.0, ge=0.0, le=1.0, description="The reward a sibling rollout needs to be "
                                     "shown as a solution (upstream yaml 0.5, TRL 1.0).")
    feedback: Literal["observation", "env", "none"] = Field("env", description="The teacher's context for a failed "
                                                            "attempt with no successful sibling: env = its last non-empty "
                                                            "observation, else the checker's error details; observation = "
                                                            "the observation text only; none = siblings only (B.1).")
    max_context_chars: int = Field(4000, ge=1, description="Characters kept of the teacher's extra context.")
    rollout_correction: Literal["off", "token-tis"] = Field(
        "off", description="token-tis: weight each token by min(pi_old / pi_engine, is_clip), the engine's recorded "
                           "log-probs as the behaviour policy (verl's rollout correction); off: pi_old is the "
                           "training forward (ratio 1).")
    is_clip: float | None = Field(2.0, gt=0.0, description="Truncation of the rollout correction's weight "
                                                            "(None: no weight).")
    alpha: float = Field(1.0, ge=0.0, le=1.0, description="1 = reverse KL (B.1), 0.5 = the upstream JSD.")
    add_tail: bool = Field(True, description="A tail bucket for the mass outside the top-k, else the top-k "
                           "renormalised.")
    reduction: Literal["token", "trajectory"] = Field("token", description="token: upstream token-mean; trajectory: "
                                                      "per-row mean, then the mean over rows.")
    loss_temperature: float | None = Field(None, gt=0.0, description="Divisor of both logits in the top-k and the "
                                           "divergence; None (upstream) = the sampling --temperature (1 when greedy).")


# by method name (the registry's names, stages.methods._MODULES)
METHOD_OPTIONS: dict[str, type[MethodOptions]] = {
    "lopd": LOPDOptions, "lopd-text": LOPDTextOptions, "grpo": GRPOOptions, "sdft": SDFTOptions, "opsd": OPSDOptions, "sdpo": SDPOOptions,
    "skill-sd": SkillSDOptions,
}
