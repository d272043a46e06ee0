"""Settings of `lopd distill`: the validated run config, config files, ``--option`` pairs and
how flags, a config file and a resumed run's saved settings combine (:func:`settings`)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from stages.envs.envscaler_rules import EpisodeRules
from stages.core.models.backbone import DType
from stages.core.models.composer_config import CONFIG_FILE
from stages.core.run.tracking import Logger
from stages.methods import known_methods, method_options
from stages.envs import env_names
from stages.core.registry import did_you_mean
from stages.settings import accepted_names, older_names, read_settings, resolve, validated

# Settings a distill run has outside :class:`DistillConfig`'s own defaults (required fields there).
DEFAULTS = {"store": "runs/store", "out": "runs/lopd"}
# Keys of older config files that :class:`DistillConfig` converts (``tensorboard = true``: log = "tensorboard").
OLDER_KEYS = frozenset({"tensorboard"})


class DistillConfig(BaseModel):
    """Settings of one `lopd distill` run (the CLI flags, validated).

    Common settings are fields; the method's own options (``lopd``: composer, margin, J, K, M,
    lambda, ...) are given flat as well (``DistillConfig(method="lopd", margin=0.05, ...)``, or
    keys of a config file) and validated into ``options`` by the method's ``Options`` model; a
    key that is neither is an error naming the method's options. ``student_lora_rank=0`` =
    full fine-tuning; ``new_store`` lets a run start an empty store where ``store`` has none
    (a missing store is refused otherwise); ``max_len`` None = whole sequences (longer ones are cut; a row whose
    prompt alone fills it is skipped and counted); ``micro_batch`` = training rows per
    forward/backward; ``embedder`` None = the store's; ``max_turns`` (``max_steps`` in older
    config files) caps an episode's actions; ``device`` / ``dtype`` None = CUDA in bfloat16 when
    a GPU is visible, else the CPU in float32 (:func:`stages.core.models.backbone.resolve_device_dtype`;
    kept None in the frozen config, so a resumed run picks its machine's).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    env: str
    store: str
    out: str
    method: str = "lopd"
    options: dict[str, Any] = Field(default_factory=dict)
    model: str = "smollm2-135m"
    engine: str = "hf"
    device: str | None = None
    dtype: DType | None = None
    data_dir: str | None = None
    lr: float = Field(1e-5, gt=0.0)
    steps: int = Field(10, ge=1)
    tasks_per_step: int = Field(2, ge=1)
    group_size: int = Field(2, ge=1)
    max_turns: int = Field(30, ge=1, validation_alias=AliasChoices("max_turns", "max_steps"))
    episode_rules: EpisodeRules | None = Field(None, description="Episode rules of an environment that has two sets (envscaler, lopd-bed, acebench): 'official' or 'lenient'; None: the environment's default (official; lenient for lopd-bed).")
    max_new_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int = 0
    student_lora_rank: int = Field(8, ge=0)
    max_len: int | None = Field(None, ge=2)
    micro_batch: int = Field(4, ge=1)
    rollout_batch: int = Field(8, ge=1)
    compile_decode: bool = False
    activation_checkpointing: bool = Field(False, validation_alias=AliasChoices(
        "activation_checkpointing", "grad_checkpointing"))
    embedder: str | None = None
    checkpoint_every: int = Field(5, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    log: Logger = "none"
    grad_clip: float = Field(1.0, ge=0.0, validation_alias=AliasChoices("grad_clip", "max_grad_norm"))
    run_id: str | None = None
    resume: bool = False
    allow_overlap: bool = False  # train on tasks an evaluation benchmark scores (stages.leakage)
    new_store: bool = False  # start an empty store at ``store`` when none is there (else refused)
    shard: Literal["none", "fsdp"] = "none"  # fsdp: shard a fully fine-tuned student (stages.core.run.sharding)

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
        name = data.get("method", "lopd")
        options_cls = method_options(name)
        common = accepted_names(cls)
        options = dict(data.pop("options", None) or {})
        options.update({k: data.pop(k) for k in list(data) if k not in common})
        known = accepted_names(options_cls)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(unknown_option_message(unknown[0], name, common))
        data["options"] = options_cls.model_validate(options).model_dump()
        return data

    def flat(self) -> dict[str, Any]:
        """Common settings and method options in one mapping (how they are given)."""
        values = self.model_dump(exclude={"options"})
        return {**values, **self.options}


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


def composer_shape(composer: str | Path) -> dict[str, int]:
    """``{"J": ..., "K": ...}`` of the composer checkpoint folder ``composer`` (what it was
    trained with); {} when it has no readable ``composer_config.json`` (the run's checks name
    the missing file later)."""
    try:
        saved = json.loads((Path(composer) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: saved[k] for k in ("J", "K") if isinstance(saved, dict) and isinstance(saved.get(k), int)}


def settings(flags: dict[str, Any], config_file: str | None = None, resume: bool = False) -> DistillConfig:
    """The run's settings from CLI flags, an optional config file and the run's saved settings.

    Precedence (:func:`stages.settings.resolve`): flags given (not None) > ``config_file`` >
    with ``resume`` the saved ``OUT/config.json`` (method options flattened) > for a composer
    method (lopd) the composer's J and K (:func:`composer_shape`) > defaults (store
    ``runs/store``, out ``runs/lopd``, then :class:`DistillConfig`'s and the method's).

    Raises:
        ValueError: unreadable config file, a key of it that is no setting nor option of the
            method (checked first; the file named), a missing required setting (``env``; the
            method's own, e.g. ``composer`` for lopd), an unknown option, an invalid value of
            the file (its key named, :func:`stages.settings.validated`).
    """
    given = {k: v for k, v in flags.items() if v is not None}
    from_file = load_config(config_file) if config_file else {}
    values = resolve(DistillConfig, "distill", given, config_file, defaults=DEFAULTS, resume=resume,
                     read=lambda _: from_file)
    method = values.get("method", "lopd")
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
    if "composer" in options_cls.model_fields:  # a composer method (lopd): J and K come from its checkpoint
        values.update({k: v for k, v in composer_shape(values["composer"]).items() if k not in values})
    values["resume"] = resume
    return validated(DistillConfig, values, flags=given, config_file=config_file,
                     aliases=older_names(options_cls))
