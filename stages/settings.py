"""One settings path for every stage: a stage's config values from the flags given, a config
file and a resumed run's saved settings (:func:`resolve`).

Precedence, highest first:

1. the flags given on the command line (``flags``);
2. the ``--config`` file (TOML, YAML or JSON: :func:`stages.core.data.inputs.read_config_file`);
3. with ``resume``, the run folder's saved settings ``OUT/config.json`` (:mod:`stages.core.run.runs`);
4. the command's defaults (``defaults``), then the config model's own field defaults.

Keys are field names of the stage's config model. An older spelling of a field in a file (a
name its ``AliasChoices`` accepts, e.g. ``max_steps`` for ``max_turns``) is renamed with a
note; a key the stage does not know, or a table, is a one-line error naming the file, the key,
the closest known name and the stage's options. A value of the file that fails validation is
named as the file's key (:func:`validated`). The CLI (:mod:`lopd_cli`) only maps its flags to
these keys.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, Field, ValidationError

from stages.core.data.inputs import read_config_file
from stages.envs.envscaler_rules import EpisodeRules
from stages.core.models.backbone import DType
from stages.core.registry import did_you_mean
from stages.core.run import runs
from stages.core.run.tracking import Logger

DEFAULT_STORE = "runs/store"  # the experience store of every stage that reads or writes one

# Settings several stages share, declared once: their type and description (the help of their
# `lopd` flag, lopd_cli.options.field_flags); a stage's field gives the default.
Device = Annotated[str | None, Field(description=(
    "Torch device of the models: cpu, cuda or cuda:N. (default: cuda when available, else cpu)"))]
RunDType = Annotated[DType | None, Field(description=(
    "Parameter dtype: float32, bfloat16, float16 (float64 for tests). (default: bfloat16 on cuda, float32 on cpu)"))]
Log = Annotated[Logger, Field(description=(
    "Also log every step to: none, tensorboard (OUT/tensorboard) or wandb (offline in OUT/wandb unless "
    "WANDB_API_KEY or WANDB_MODE is set); needs pip install -e '.[tensorboard]' / '.[wandb]'; may change "
    "on --resume."))]
ResumeRun = Annotated[bool, Field(json_schema_extra={"flag": "--resume"}, description=(
    "Continue from the latest checkpoint in --out (its saved settings apply; flags given and --config override)."))]
Rules = Annotated[EpisodeRules | None, Field(description=(
    "official | lenient | exact: the episode rules of envscaler, lopd-bed and acebench (official: the benchmark's "
    "own scoring; lenient: tool errors and extra calls do not end or void an episode; exact, lopd-bed only: the "
    "final state must equal the reference actions' state, an extra change or a refused call scores 0). Recorded "
    "in the run's config, manifest and report. (default: the environment's, official; exact for lopd-bed)"))]
UnsafeExec = Annotated[bool, Field(json_schema_extra={"flag": "--unsafe-exec"}, description=(
    "Run model-written code even where it cannot be isolated (no bubblewrap): only for code you trust on a "
    "machine you can lose."))]
AllowOverlap = Annotated[bool, Field(description=(
    "Train on tasks that an evaluation benchmark scores (refused by default: e.g. HumanEval problems as "
    "training data contaminate a HumanEval+ result)."))]
PrefixCacheTokens = Annotated[int, Field(ge=0, description=(
    "Keep the KV cache of up to N tokens of earlier prompts and completions, so a multi-turn prompt only "
    "encodes what is new (0 = off)."))]
EpisodeBatch = Annotated[int, Field(ge=1, description="Episodes generated together.")]


def _print_note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def older_names(model_cls: type[BaseModel]) -> dict[str, str]:
    """``{older spelling: field name}`` of the fields of ``model_cls`` that accept one
    (``AliasChoices`` besides the field's own name), e.g. ``{"max_steps": "max_turns"}``."""
    return {alias: name for name, field in model_cls.model_fields.items()
            if isinstance(field.validation_alias, AliasChoices)
            for alias in field.validation_alias.choices if isinstance(alias, str) and alias != name}


def accepted_names(model_cls: type[BaseModel]) -> set[str]:
    """The field names of ``model_cls`` and the older spellings its ``AliasChoices`` accept."""
    return set(model_cls.model_fields) | set(older_names(model_cls))


def read_settings(path: str | Path, model_cls: type[BaseModel], stage: str,
                  known: Iterable[str] | None = None, note: Callable[[str], None] = _print_note) -> dict[str, Any]:
    """The values of config file ``path`` by field name of ``model_cls`` (older spellings renamed,
    each with one ``note``).

    Args:
        stage: the command's name, for messages (``collect``).
        known: the keys the stage accepts (None: any key; the config model then judges them).

    Raises:
        ValueError: unreadable file (:func:`read_config_file`), a table that is no field of
            ``model_cls`` (the settings belong at the top level), a key not in ``known`` (the
            message names the file, the key, the closest option and the options), or a field
            given twice (under its name and an older spelling).
    """
    older = older_names(model_cls)
    known = None if known is None else set(known)
    values: dict[str, Any] = {}
    for key, value in read_config_file(path).items():
        name = older.get(key, key)
        if isinstance(value, dict) and name not in model_cls.model_fields:
            raise ValueError(f"{path}: unknown table [{key}]: lopd {stage} reads its settings from the top level "
                             f"of the file, not from a table")
        if known is not None and name not in known:
            raise ValueError(f"{path}: unknown option {key!r} for lopd {stage}: {did_you_mean(key, known)}"
                             f"options: {', '.join(sorted(known))}")
        if name in values:
            raise ValueError(f"{path}: {name!r} is given twice (as {name!r} and as an older name)")
        if name != key:
            note(f"{path}: {key!r} is the older name of {name!r}")
        values[name] = value
    return values


def error_text(error: Mapping[str, Any]) -> str:
    """One item of ``ValidationError.errors()`` as a short line: the message of our own
    validators as raised, else pydantic's message with the value given (cut to 60 characters);
    a value outside a fixed set (``Literal``) gets the closest choice first
    (``"did you mean 'bfloat16'? Input should be 'float32', 'bfloat16', ... (got 'bf16')"``)."""
    if error["type"] == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if error["type"] == "missing":  # its input is all the values given: no news
        return error["msg"]
    given = repr(error.get("input"))
    given = given if len(given) <= 60 else given[:57] + "..."
    hint = ""
    if error["type"] == "literal_error":  # ctx["expected"] is pydantic's "'a', 'b' or 'c'"
        hint = did_you_mean(error.get("input"), re.findall(r"'([^']*)'", error.get("ctx", {}).get("expected", "")))
    return f"{hint}{error['msg']} (got {given})"


def validated(model_cls: type[BaseModel], values: Mapping[str, Any], *, flags: Mapping[str, Any],
              config_file: str | None, aliases: Mapping[str, str] | None = None) -> BaseModel:
    """``model_cls(**values)``, where a value of the config file that fails validation is named
    as the file's key.

    Args:
        flags: the settings given as flags (their errors stay pydantic's, for the CLI to name
            the flag).
        aliases: ``{older spelling: field}`` a file may use besides ``model_cls``'s own (e.g.
            the method options' ``lambda`` for ``lam``).

    Raises:
        ValueError: ``"FILE: key 'steps': Input should be a valid integer, ... (got 'three')"``
            when the first failing value came from ``config_file`` and no flag.
        ValidationError: any other invalid value.
    """
    try:
        return model_cls(**values)
    except ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else None
        if config_file is None or name is None or name in flags:
            raise
        spellings = {**older_names(model_cls), **(aliases or {})}
        written = [key for key in read_config_file(config_file) if spellings.get(key, key) == name]
        if not written:  # the value came from a resumed run's saved settings or a default
            raise
        raise ValueError(f"{config_file}: key {written[0]!r}: {error_text(first)}") from None


def saved_settings(out: str | Path) -> dict[str, Any]:
    """The settings a run in folder ``out`` was started with (its ``config.json``), {} when there
    is none. A saved ``options`` mapping (distill's method options) is flattened: options are
    given as settings of their own.

    Raises:
        ValueError: an unreadable ``config.json`` (:func:`stages.core.run.runs.saved_config`).
    """
    saved = dict(runs.saved_config(Path(out)) or {})
    options = saved.pop("options", None) or {}
    return {**saved, **options}


def merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """The layers' values in one mapping: a later layer wins over an earlier one."""
    values: dict[str, Any] = {}
    for layer in layers:
        values.update(layer)
    return values


def resolve(model_cls: type[BaseModel], stage: str, flags: Mapping[str, Any], config_file: str | None = None, *,
            defaults: Mapping[str, Any] | None = None, resume: bool = False, out_key: str = "out",
            known: Iterable[str] | None = None, note: Callable[[str], None] = _print_note,
            read: Callable[[str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """A stage's settings by field name: ``flags`` > ``config_file`` > with ``resume`` the
    saved ``OUT/config.json`` > ``defaults`` (module docstring). Validation is the caller's
    (``model_cls(**values)``), so a stage can fill derived settings first.

    Args:
        model_cls: the stage's config model (its older field spellings are accepted in files).
        stage: the command's name, for messages.
        flags: the flags given (never their defaults), by field name.
        defaults: the command's defaults for fields not given anywhere else.
        resume: take the run folder's saved settings as the base (folder: ``out_key``'s value).
        known: keys the file may hold (default: the flags' and defaults' names; pass the
            model's fields and more where a stage takes other keys).
        read: reads the config file (default :func:`read_settings` with ``known``; a stage
            whose files hold more, e.g. distill's method options, passes its own).

    Raises:
        ValueError: see :func:`read_settings` and :func:`saved_settings`.
    """
    defaults = dict(defaults or {})
    if known is None:
        known = set(flags) | set(defaults)
    if read is None:
        def read(path: str) -> dict[str, Any]:
            return read_settings(path, model_cls, stage, known, note)
    from_file = read(config_file) if config_file else {}
    saved: dict[str, Any] = {}
    if resume:
        out = merge(defaults, from_file, flags).get(out_key)
        saved = saved_settings(out) if out is not None else {}
    return merge(defaults, saved, from_file, flags)
