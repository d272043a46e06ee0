"""Flags shared by several `lopd` commands, and how a command's flags become settings.

- Shared typer options (``--config``, ``--device``, ``--dtype``, the rollout flags of collect and
  evaluate): declared once here, used as parameter defaults in :mod:`lopd_cli.main`.
- :func:`given_flags`: the flags a command line gave, by setting name, apart from the command's
  defaults (the precedence itself is :func:`stages.settings.resolve`).
- :class:`MethodOptionsCommand`: a command that also takes the default distill method's own
  options (LOPD's ``Options`` model, :mod:`stages.methods.lopd`) as flags, made from that model
  when the command is first parsed or shown, so an option is declared once, in the model; its
  help with ``--method X`` lists method X's options (:func:`method_options_help`).
"""
from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Sequence
from typing import Any, Literal, Optional, Union, get_args, get_origin

import typer
from typer.core import TyperCommand

from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS

CONFIG_HELP = "TOML/YAML/JSON file of option names (as in the flags, with _) and values; flags given override it."
UNSAFE_EXEC_HELP = ("Run model-written code even where it cannot be isolated (no bubblewrap): "
                    "only for code you trust on a machine you can lose.")
DEVICE_HELP = "Torch device of the models: cpu, cuda or cuda:N. (default: cuda when available, else cpu)"
DTYPE_HELP = ("Parameter dtype: float32, bfloat16, float16 (float64 for tests). "
              "(default: bfloat16 on cuda, float32 on cpu)")
ALLOW_OVERLAP_HELP = ("Train on tasks that an evaluation benchmark scores (refused by default: e.g. HumanEval "
                      "problems as training data contaminate a HumanEval+ result).")

# typer copies an option's declaration for each command that uses it as a default
CONFIG = typer.Option(None, "--config", help=CONFIG_HELP)
DEVICE = typer.Option(None, "--device", help=DEVICE_HELP)
DTYPE = typer.Option(None, "--dtype", metavar="[float32|bfloat16|float16|float64]", help=DTYPE_HELP)
UNSAFE_EXEC = typer.Option(False, "--unsafe-exec", help=UNSAFE_EXEC_HELP)
# rollout flags of `lopd collect` and `lopd evaluate`
EPISODE_BATCH = typer.Option(8, "--batch-size", help="Episodes generated together.")
PREFIX_CACHE = typer.Option(PREFIX_CACHE_TOKENS, "--prefix-cache-tokens", help=(
    "Keep the KV cache of up to N tokens of earlier prompts and completions, so a multi-turn prompt "
    "only encodes what is new (0 = off)."))
SAMPLING_SEED = typer.Option(0, "--seed", help="Sampling seed.")
STORE = typer.Option("runs/store", "--store", help="Experience store directory or URI.")
STORE_REQUIRED = typer.Option(..., "--store", help="Experience store directory or URI.")
STORE_TABLE = typer.Option("trajectories", "--table", help="Table: trajectories or embeddings.")
RESUME_RUN = typer.Option(False, "--resume", help="Continue from the latest checkpoint in --out (its saved settings apply; flags given and --config override).")
DATA_DIR = typer.Option(None, "--data-dir", help="Read the environment's task files from here.")
# the experiment logger of the training stages (distill, coldstart, sft): stages.core.run.tracking
LOG_HELP = ("Also log every step to: none, tensorboard (OUT/tensorboard) or wandb (offline in OUT/wandb unless "
            "WANDB_API_KEY or WANDB_MODE is set); needs pip install -e '.[tensorboard]' / '.[wandb]'; may change "
            "on --resume.")
LOG = typer.Option("none", "--log", metavar="[none|tensorboard|wandb]", help=LOG_HELP)
# collect, distill and evaluate: environments with two sets of rules (envscaler, lopd-bed, acebench)
EPISODE_RULES = typer.Option(None, "--episode-rules", metavar="[official|lenient|exact]", help=(
    "official | lenient | exact: the episode rules of envscaler, lopd-bed and acebench (official: the benchmark's "
    "own scoring; lenient: tool errors and extra calls do not end or void an episode; exact, lopd-bed only: the "
    "final state must equal the reference actions' state, an extra change or a refused call scores 0). Recorded "
    "in the run's config, manifest and report. (default: the environment's, official; exact for lopd-bed)"))


def given_options(ctx: typer.Context, skip: tuple[str, ...] = ()) -> list[str]:
    """The command and the options given on its command line, as flags again (e.g. to run the
    same command in torchrun's processes)."""
    argv = [ctx.info_name]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)  # compared by name: typer may carry its own click
        if param.name in skip or source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        value = ctx.params[param.name]
        if getattr(param, "is_flag", False) and isinstance(value, bool):
            argv.append(param.opts[0] if value else param.secondary_opts[0])
        elif getattr(param, "multiple", False):
            argv += [x for v in value for x in (param.opts[0], str(v))]
        else:
            argv += [param.opts[0], str(value)]
    return argv


def given_flags(ctx: typer.Context, exclude: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(given, defaults)``: the command's option values by name, split into those given on the
    command line (or by environment) and those left at the command's default; ``--config`` and
    the names in ``exclude`` are in neither."""
    given: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for name, value in ctx.params.items():
        if name in ("config", *exclude):
            continue
        source = ctx.get_parameter_source(name)  # compared by name: typer may carry its own click
        default = source is None or source.name in ("DEFAULT", "DEFAULT_MAP")
        (defaults if default else given)[name] = value
    return given, defaults


def _flag_type(annotation: Any) -> Any:
    """The typer type of an option field: ``X | None`` -> ``Optional[X]``; a type typer cannot
    parse (a ``Literal``, a list) is read as a string, which the model then validates."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return Optional[annotation if annotation in (bool, int, float, str) else str]


def option_help(field: Any, fallback: str, as_value: bool = False) -> str:
    """The help of an option (a pydantic ``FieldInfo``): its description (``fallback`` without
    one), its default appended unless the description names it or the field is required; with
    ``as_value`` the default is written as ``-o KEY=VALUE`` takes it (JSON: ``true``, ``null``;
    floats to 6 significant digits)."""
    text = field.description or fallback
    if "(default" not in text and not field.is_required():
        default = field.default
        if as_value:
            default = f"{default:.6g}" if isinstance(default, float) else (
                default if isinstance(default, str) else json.dumps(default, default=str))
        text = f"{text} (default {default})".strip()
    return text


def _type_text(annotation: Any) -> str:
    """An option's type as help text: ``int``, ``float | None``, a Literal's values as ``a | b``."""
    if get_origin(annotation) is Literal:
        return " | ".join(str(a) for a in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        return " | ".join(_type_text(a) for a in get_args(annotation))
    if annotation is type(None):
        return "None"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def method_options_help(method: str) -> tuple[str, list[tuple[str, str]]]:
    """``(intro, rows)`` of method ``method``'s own options for ``lopd distill --method X --help``:
    the docstrings of the ``Options`` model and of the options models it extends (reST roles
    dropped), and per field ``(name: type, help)`` (see :func:`option_help`;
    a field without a description shows its default only).

    Raises:
        ValueError: unknown method (the message lists the known ones).
    """
    from stages.methods import method_options

    model = method_options(method)
    rows = [(f"{name}: {_type_text(field.annotation)}", option_help(field, "", as_value=True))
            for name, field in model.model_fields.items()]
    docs = [inspect.cleandoc(c.__doc__) for c in model.__mro__
            if c.__doc__ and hasattr(c, "model_fields") and c.__module__.startswith("stages.")]
    intro = re.sub(r":\w+:`~?([^`]*)`", r"\1", "\n\n".join(docs)).replace("``", "`")
    return intro, rows


def _method_named(args: Sequence[str]) -> str | None:
    """The value of the last ``--method X`` / ``--method=X`` in a command line, else None."""
    found = None
    for i, arg in enumerate(args):
        if arg == "--method" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--method="):
            found = arg.split("=", 1)[1]
    return found


def option_flags(options_model: type, method: str) -> list:
    """Typer options for the fields of a method's ``Options`` model, each with default None
    (not given): the flag ``--<name with ->`` (a bool: ``--<name>/--no-<name>``), or the field's
    ``json_schema_extra["flag"]`` spelling; the help is the field's description (``"<method>:
    <name>."`` without one) with its default appended unless the description names it or the
    field is required.

    Returns: the click parameters of the options, named like the fields.
    """
    parameters = []
    for name, field in options_model.model_fields.items():
        kind = _flag_type(field.annotation)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        dashed = "--" + name.replace("_", "-")
        flag = extra.get("flag") or (f"{dashed}/--no-{dashed[2:]}" if kind == Optional[bool] else dashed)
        text = option_help(field, f"{method}: {name}.")
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                            default=typer.Option(None, flag, help=text)))

    def command(**values: Any) -> None:
        """Carries the options' declarations; typer reads its signature."""

    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    holder = typer.Typer(rich_markup_mode=None, add_completion=False)
    holder.command()(command)
    return list(typer.main.get_command(holder).params)


class MethodOptionsCommand(TyperCommand):
    """A command that also takes the options of the default distill method as flags (see
    :func:`option_flags`). They are made on first use of ``params`` from the method's options
    model (:mod:`stages.methods.options`: no torch, so a refused command line stays fast; the
    other commands import no method at all), come in ``ctx.params`` by field name, and
    are not passed to the callback, which reads them from ``ctx.params``. With ``--method X``
    (X not the default) its help ends with X's own options (given as ``-o KEY=VALUE``); only
    that help imports method X."""

    @property
    def params(self) -> list:
        if self._all_params is None:  # one list: click appends to it and pops from it in place
            from stages.distill.settings import DistillConfig
            from stages.methods import method_options

            method = DistillConfig.model_fields["method"].default
            flags = option_flags(method_options(method), method)
            twice = {p.name for p in flags} & {p.name for p in self._own_params}
            if twice:
                raise ValueError(f"options of method {method!r} named like settings of the command: {sorted(twice)}")
            self._method_names = {p.name for p in flags}
            self._all_params = [*self._own_params, *flags]
        return self._all_params

    @params.setter
    def params(self, value: list) -> None:
        self._own_params = list(value)
        self._all_params = None
        self._method_names: set[str] = set()

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Note the ``--method`` of the command line before click parses it (``--help`` is eager:
        it prints before ``--method`` is processed)."""
        method = ctx.meta["lopd.method"] = _method_named(args)
        if method and any(a in ctx.help_option_names for a in args):  # an unknown method: its error alone
            from stages.methods import known_methods

            if method not in known_methods():
                ctx.fail(f"--method {method}: unknown method (known: {', '.join(known_methods())})")
        return super().parse_args(ctx, args)

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        """The epilog, then with ``--method X`` (not the default) a section of X's own options."""
        super().format_epilog(ctx, formatter)
        method = ctx.meta.get("lopd.method")
        from stages.distill.settings import DistillConfig

        if not method or method == DistillConfig.model_fields["method"].default:
            return
        intro, rows = method_options_help(method)  # an unknown method was refused in parse_args
        with formatter.section(f"Options of method {method} (pass as -o KEY=VALUE)"):
            if intro:
                formatter.write_text(intro)
                formatter.write_paragraph()
            formatter.write_dl(rows)

    def invoke(self, ctx: Any) -> Any:
        """Run the callback with the command's own options only."""
        if self.callback is None:
            return None
        return ctx.invoke(self.callback, **{k: v for k, v in ctx.params.items() if k not in self._method_names})
