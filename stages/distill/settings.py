"""Settings of `lopd distill`: the validated run config, config files, ``--option`` pairs and
how flags, a config file and a resumed run's saved settings combine (:func:`settings`)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SerializeAsAny, model_validator

from stages.core.models.backbone import DEFAULT_MODEL
from stages.methods import known_methods, method_options
from stages.methods.options import MethodOptions
from stages.envs import env_names
from stages.core.registry import did_you_mean
from stages.settings import (DEFAULT_STORE, AllowOverlap, Device, Log, ResumeRun, Rules, RunDType, accepted_names, older_names,
                             read_settings, resolve, validated)

# Keys of older config files that :class:`DistillConfig` converts (``tensorboard = true``: log = "tensorboard").
OLDER_KEYS = frozenset({"tensorboard"})


class DistillConfig(BaseModel):
    """Settings of one `lopd distill` run: the flags, each described by its field.

    Common settings are fields; the method's own options (``lopd``: composer, margin, J, K, M,
    lambda, ...) are given flat as well (``DistillConfig(method="lopd", margin=0.05, ...)``, or
    keys of a config file) and validated into ``options``, an instance of the method's
    ``Options`` model (:mod:`stages.methods.options`; saved in ``config.json`` as a mapping); a
    key that is neither is an error naming the method's options. Options that depend on files
    (LOPD's, on the composer) are filled by :meth:`resolved`, which :func:`settings` calls: a
    run is handed resolved settings. ``max_turns`` is also accepted
    as ``max_steps`` in config files; ``device`` / ``dtype`` stay None in the frozen config, so a
    resumed run picks its machine's (:func:`stages.core.models.backbone.resolve_device_dtype`).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    env: str = Field(description=("Training environment: bfcl, code, envscaler, lopd-bed (lopd's bundled study bed), "
                                  "acebench, livecodebench, taco."))
    store: str = Field(DEFAULT_STORE, description=(
        "Indexed experience store (grows during training); refused when missing, unless --new-store."))
    out: str = Field("runs/lopd", description="Run folder.")
    method: str = Field("lopd", description="Training method: lopd, lopd-text, grpo, sdft, opsd, sdpo, skill-sd "
                                            "(stages/methods).")
    options: SerializeAsAny[MethodOptions]  # the method's Options (filled by the validator below)
    model: str = Field(DEFAULT_MODEL, description="Student/teacher backbone.")
    engine: str = Field("hf", json_schema_extra={"metavar": "[hf|vllm]"}, description="Rollout engine: hf or vllm.")
    device: Device = None
    dtype: RunDType = None
    data_dir: str | None = Field(None, description="Environment task files. (default: the environment's packaged data)")
    lr: float = Field(1e-5, gt=0.0, description="Learning rate.")
    steps: int = Field(10, ge=1, description="Training steps.")
    tasks_per_step: int = Field(2, ge=1, description="Tasks per step (B).")
    group_size: int = Field(2, ge=1, description="Rollouts per task (G).")
    max_turns: int = Field(30, ge=1, validation_alias=AliasChoices("max_turns", "max_steps"),
                           description="Environment step cap per episode.")
    episode_rules: Rules = None
    max_new_tokens: int = Field(256, ge=1, description="Tokens per action.")
    temperature: float = Field(0.7, ge=0.0, description="Rollout sampling temperature.")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Rollout nucleus mass.")
    top_k: int = Field(0, ge=0, description="Rollout top-k, 0 = off (the paper samples with 20, B.2).")
    seed: int = Field(0, description="Seed of the initialisation, the task order and the rollouts' sampling.")
    student_lora_rank: int = Field(8, ge=0, description=(
        "Student LoRA rank; 0 = full fine-tuning (then a frozen teacher copy is kept)."))
    max_len: int | None = Field(None, ge=2, description=(
        "Token cap of a training sequence; a sequence whose prompt alone fills it is skipped and counted. "
        "(default: none)"))
    micro_batch: int = Field(4, ge=1, description=(
        "Training sequences per forward/backward (gradients accumulate exactly)."))
    rollout_batch: int = Field(8, ge=1, description="Episodes generated together.")
    compile_decode: bool = Field(False, description=(
        "hf engine on a GPU: compile the decoding forward (torch.compile; about 4x faster calls once compiled, but "
        "each new batch or length bucket compiles again for a minute or more: for one-turn rollouts at a fixed "
        "batch); may change on --resume."))
    activation_checkpointing: bool = Field(False, validation_alias=AliasChoices(
        "activation_checkpointing", "grad_checkpointing"), description=(
        "Recompute activations in backward: less memory, slower steps."))
    embedder: str | None = Field(None, description=(
        "Embedder of new rollouts (lopd, the method that retrieves; the other methods append them unembedded for "
        "`lopd index`). (default: the store's)"))
    checkpoint_every: int = Field(5, ge=1, description=(
        "Steps between checkpoints (one is also written after step 1 and after the last)."))
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept (the newest).")
    log: Log = "none"
    grad_clip: float = Field(1.0, ge=0.0, validation_alias=AliasChoices("grad_clip", "max_grad_norm"),
                             description="Gradient-norm clipping, 0 = off.")
    run_id: str | None = Field(None, description="Run name in the store. (default: the saved one, else random)")
    resume: ResumeRun = False
    allow_overlap: AllowOverlap = False  # stages.leakage
    new_store: bool = Field(False, json_schema_extra={"flag": "--new-store"}, description=(
        "Start an empty experience store at --store when none is there (else a missing store is refused)."))
    shard: Literal["none", "fsdp"] = Field("none", description=(  # stages.core.run.sharding
        "none, or fsdp: shard a fully fine-tuned student (--student-lora-rank 0) over the --nproc / torchrun "
        "processes (FSDP2; lopd and grpo, hf engine)."))

    @model_validator(mode="before")
    @classmethod
    def _method_options(cls, data: Any) -> Any:
        """Move the method's own keys into ``options`` and validate them with its Options."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "tensorboard" in data:  # OLDER_KEYS: the older spelling of log = "tensorboard" (runs saved before it too)
            if data.pop("tensorboard") and "log" not in data:
                data["log"] = "tensorboard"
                warnings.warn('the setting "tensorboard = true" is deprecated: use log = "tensorboard"',
                              FutureWarning, stacklevel=2)
        name = data.get("method", cls.model_fields["method"].default)
        options_cls = method_options(name)
        common = accepted_names(cls)
        options = data.pop("options", None) or {}
        options = options.model_dump() if isinstance(options, BaseModel) else dict(options)
        options.update({k: data.pop(k) for k in list(data) if k not in common})
        known = accepted_names(options_cls)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(unknown_option_message(unknown[0], name, common))
        data["options"] = options_cls.model_validate(options)
        return data

    def flat(self) -> dict[str, Any]:
        """Common settings and method options in one mapping (how they are given)."""
        return {**self.model_dump(exclude={"options"}), **self.options.model_dump()}

    def resolved(self) -> DistillConfig:
        """These settings with the method's options resolved against their files
        (:meth:`stages.methods.options.MethodOptions.resolve`: LOPD's K checked against the
        composer, ``max_exp_tokens`` filled from it).

        Raises:
            ValueError: an option that does not fit its file, or a file missing (named).
        """
        return self.model_copy(update={"options": self.options.resolve()})


def option_defaults(options_cls: type[BaseModel]) -> str:
    """``"eps_lo=0.2, ppo_epochs=1, composer (required)"``: a method's options (its options model
    ``options_cls``) with their defaults, or ``"none"``. An option is named as its flag spells it
    (LOPD's ``lam``: ``lambda``)."""
    shown = []
    for name, field in options_cls.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        spelled = str(extra.get("flag", name)).split("/")[0].lstrip("-").replace("-", "_")
        shown.append(f"{spelled} (required)" if field.is_required() else f"{spelled}={field.default!r}")
    return ", ".join(shown) or "none"


def unknown_option_message(key: str, method: str, common: set[str]) -> str:
    """One line for an option ``key`` that neither method ``method`` nor the common settings have:
    the closest name (a misspelt option or setting, or another method's option) and the method's
    options with their defaults."""
    options_cls = method_options(method)
    elsewhere = [name for name in known_methods() if name != method
                 and key in accepted_names(method_options(name))]
    # another method's exact option first, then this method's closest name ('beta' for lopd is
    # OPSD/SDFT's beta, and close to lopd's beta0)
    hint = ((f"{key!r} is an option of --method {', '.join(elsewhere)}; " if elsewhere else "")
            + did_you_mean(key, accepted_names(options_cls) | common))
    return (f"unknown option {key!r} for method {method!r}: {hint}"
            f"options of {method}: {option_defaults(options_cls)}")


def load_config(path: str | Path) -> dict:
    """A distill config file by setting name (:func:`stages.settings.read_settings`; any key, as
    the method's options are judged by :class:`DistillConfig`), with the paper's name ``lambda``
    for the anchor weight renamed to the field name ``lam``.

    Raises:
        ValueError: see :func:`read_settings`; or both ``lambda`` and ``lam`` given.
    """
    data = read_settings(path, DistillConfig, "distill")
    if "lambda" in data:
        if "lam" in data:
            raise ValueError(f"{path}: give the anchor weight once, as `lambda` or as `lam`")
        data["lam"] = data.pop("lambda")
    return data


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["ppo_epochs=2", "summarizer=Qwen/Qwen3-4B"]`` -> ``{"ppo_epochs": 2, "summarizer": ...}``.

    A value is read as JSON (numbers, true/false, null, lists) and else kept as a string.

    Raises:
        ValueError: an item without ``=`` or with an empty key.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def settings(flags: dict[str, Any], config_file: str | None = None, resume: bool = False) -> DistillConfig:
    """The run's settings from CLI flags, an optional config file and the run's saved settings.

    Precedence (:func:`stages.settings.resolve`): flags given (not None) > ``config_file`` >
    with ``resume`` the saved ``OUT/config.json`` (method options flattened) > the defaults the
    method's options read from their files (:meth:`MethodOptions.file_defaults`: lopd, the
    composer's J and K) > the defaults of :class:`DistillConfig`'s fields and the method's.
    Returns them validated and resolved (:meth:`DistillConfig.resolved`).

    Raises:
        ValueError: unreadable config file, a key of it that is no setting nor option of the
            method (checked first; the file named), a missing required setting (``env``; the
            method's own, e.g. ``composer`` for lopd), an unknown option, an invalid value of
            the file (its key named, :func:`stages.settings.validated`), an option that does not
            fit its file (lopd: a composer folder without ``composer_config.json``, another K).
    """
    given = {k: v for k, v in flags.items() if v is not None}
    from_file = load_config(config_file) if config_file else {}
    out = DistillConfig.model_fields["out"].default  # where --resume looks without --out
    values = resolve(DistillConfig, "distill", given, config_file, defaults={"out": out}, resume=resume,
                     read=lambda _: from_file)
    method = values.get("method", DistillConfig.model_fields["method"].default)
    try:
        options_cls = method_options(method)
    except ValueError as err:
        if "method" in from_file and "method" not in given:
            raise ValueError(f"{config_file}: key 'method': {err}") from None
        raise
    for older, name in {**older_names(DistillConfig), **older_names(options_cls)}.items():
        if older in given:  # a flag in an older spelling (-o lambda=0.2): above the file's value either way
            if name in given:
                raise ValueError(f"{name} is given twice, as {older!r} and as {name!r}: give it once")
            values[name], given[name] = values.pop(older), given.pop(older)
    common = accepted_names(DistillConfig)
    in_table = from_file.get("options") if isinstance(from_file.get("options"), dict) else {}
    for key in [*from_file, *in_table]:  # top-level keys and those of an [options] table
        if key not in common | accepted_names(options_cls) | OLDER_KEYS:
            raise ValueError(f"{config_file}: {unknown_option_message(key, method, common)}")
    if "env" not in values:
        raise ValueError(f"--env is required ({', '.join(env_names())}), as a flag or in the --config file")
    for name, field in options_cls.model_fields.items():
        if field.is_required() and name not in values:
            made = (field.json_schema_extra or {}).get("made_by") if isinstance(field.json_schema_extra, dict) else None
            raise ValueError(f"--{name} is required by method {method!r} (as a flag or in the --config file)"
                             + (f"; {made}" if made else ""))
    values.update({k: v for k, v in options_cls.file_defaults(values).items() if k not in values})
    values["resume"] = resume
    return validated(DistillConfig, values, flags=given, config_file=config_file,
                     aliases=older_names(options_cls)).resolved()
