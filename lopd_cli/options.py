"""How a `lopd` command's flags are made from its stage's settings model, and how the flags given
become settings.

- :class:`SettingsCommand` (made by :func:`settings_command`): a command whose flags are the
  fields of its stage's pydantic settings model (:func:`field_flags`: name, type, default and
  help from the field), made when the command is first parsed or shown, so a setting's default
  and help are declared once, in the model; the settings module is imported only then (no torch:
  a refused command line stays fast).
- :class:`MethodOptionsCommand`: `lopd distill`'s, which also takes the default method's own
  options (LOPD's ``Options`` model, :mod:`stages.methods.options`) as flags; its help with
  ``--method X`` lists method X's options (:func:`method_options_help`).
- :func:`given_flags`: the flags a command line gave, by setting name, apart from the command's
  defaults (the precedence itself is :func:`stages.settings.resolve`).
"""
from __future__ import annotations

import importlib
import inspect
import json
import re
import types
from collections.abc import Sequence
from typing import Any, Literal, Optional, Union, get_args, get_origin

import typer
from typer.core import TyperCommand

# `lopd store` takes the store without a default
STORE_REQUIRED = typer.Option(..., "--store", help="Experience store directory or URI.")
STORE_TABLE = typer.Option("trajectories", "--table", help="Table: trajectories or embeddings.")
CONFIG = typer.Option(None, "--config", help="TOML/YAML/JSON file of option names (as in the flags, with _) and "
                      "values; flags given override it; an older name is accepted with a note.")


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
    """The typer type of a settings field: ``X | None`` -> ``Optional[X]``; a type typer cannot
    parse (a ``Literal``, a list) is read as a string, which the model then validates."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return Optional[annotation if annotation in (bool, int, float, str) else str]


def _choices(annotation: Any) -> list[str]:
    """The values of a ``Literal`` field, also inside ``Literal[...] | None``."""
    if get_origin(annotation) is Literal:
        return [str(a) for a in get_args(annotation)]
    if get_origin(annotation) in (Union, types.UnionType):
        return [c for a in get_args(annotation) for c in _choices(a)]
    return []


def option_help(field: Any, fallback: str, as_value: bool = False) -> str:
    """The help of an option (a pydantic ``FieldInfo``) given as ``-o KEY=VALUE``: its
    description (``fallback`` without one), its default appended unless the description names
    it or the field is required, written as ``-o KEY=VALUE`` takes it with ``as_value`` (JSON:
    ``true``, ``null``; floats to 6 significant digits)."""
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


def field_flags(model: type, skip: Sequence[str] = (), fallback: str = "") -> list:
    """Click options for the fields of pydantic model or dataclass ``model`` (but ``skip``), named like the
    fields, in the model's order. Per field: the flag ``--<name with ->`` (a bool:
    ``--<name>/--no-<name>``), or the spelling(s) of ``json_schema_extra["flag"]`` (a string or
    a list: ``["--max-turns", "--max-steps"]``); the field's type (a ``Literal``'s values as the
    metavar ``[a|b]``, or ``json_schema_extra["metavar"]``); its default (None for a required
    field: the model names it missing), shown unless the help names it; the help is the field's
    description (``fallback`` with ``{name}`` filled in without one).
    """
    parameters = []
    fields = model.model_fields if hasattr(model, "model_fields") else model.__pydantic_fields__
    for name, field in fields.items():
        if name in skip:
            continue
        kind = _flag_type(field.annotation)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        dashed = "--" + name.replace("_", "-")
        flag = extra.get("flag") or (f"{dashed}/--no-{dashed[2:]}" if kind == Optional[bool] else dashed)
        choices = _choices(field.annotation)
        text = field.description or fallback.format(name=name)
        option = typer.Option(None if field.is_required() else field.get_default(call_default_factory=True),
                              *([flag] if isinstance(flag, str) else flag), help=text,
                              metavar=extra.get("metavar") or (f"[{'|'.join(choices)}]" if choices else None),
                              show_default="(default" not in text)
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=option))

    def command(**values: Any) -> None:
        """Carries the options' declarations; typer reads its signature."""

    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    holder = typer.Typer(rich_markup_mode=None, add_completion=False)
    holder.command()(command)
    return list(typer.main.get_command(holder).params)


class SettingsCommand(TyperCommand):
    """A command whose flags, beside its own parameters, are the fields of its stage's settings
    model (``settings``: ``"module:Model"``; the fields in ``skip`` are no flags; see
    :func:`field_flags`). They are made on first use of ``params`` (parsing or help: only then is
    the settings module imported), come in ``ctx.params`` by field name, and are not passed to
    the callback, which reads them from ``ctx.params`` (:func:`given_flags`)."""

    settings = ""
    skip: tuple[str, ...] = ()

    def settings_model(self) -> type:
        """The settings model named by ``settings``."""
        module, name = self.settings.split(":")
        return getattr(importlib.import_module(module), name)

    def made_flags(self) -> list:
        """The flags made from the settings model."""
        return field_flags(self.settings_model(), self.skip)

    @property
    def params(self) -> list:
        if self._all_params is None:  # one list: click appends to it and pops from it in place
            made = self.made_flags()
            twice = {p.name for p in made} & {p.name for p in self._own_params}
            if twice:
                raise ValueError(f"settings of {self.settings} named like parameters of the command: {sorted(twice)}")
            self._made_names = {p.name for p in made}
            self._all_params = [*self._own_params, *made]
        return self._all_params

    @params.setter
    def params(self, value: list) -> None:
        self._own_params = list(value)
        self._all_params = None
        self._made_names: set[str] = set()

    def invoke(self, ctx: Any) -> Any:
        """Run the callback with the command's own parameters only."""
        if self.callback is None:
            return None
        return ctx.invoke(self.callback, **{k: v for k, v in ctx.params.items() if k not in self._made_names})


def settings_command(settings: str, skip: Sequence[str] = ()) -> type[SettingsCommand]:
    """A :class:`SettingsCommand` class whose flags are the fields of ``settings``
    (``"module:Model"``) but ``skip``."""
    return type("SettingsCommand", (SettingsCommand,), {"settings": settings, "skip": tuple(skip)})


class MethodOptionsCommand(SettingsCommand):
    """`lopd distill`: the flags of its settings (:class:`stages.distill.settings.DistillConfig`)
    and of the default method's own options (its ``Options`` model, :mod:`stages.methods.options`:
    no torch, so a refused command line stays fast). With ``--method X`` (X not the default) its
    help ends with X's own options (given as ``-o KEY=VALUE``); only that help imports method X."""

    settings = "stages.distill.settings:DistillConfig"
    skip = ("options",)  # the method's options: flags of their own, below

    def made_flags(self) -> list:
        """The settings' flags, then the default method's options'."""
        from stages.methods import method_options

        made = super().made_flags()
        method = self.settings_model().model_fields["method"].default
        options = field_flags(method_options(method), fallback=f"{method}: {{name}}.")
        twice = {p.name for p in options} & {p.name for p in made}
        if twice:
            raise ValueError(f"options of method {method!r} named like settings of the command: {sorted(twice)}")
        return [*made, *options]

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
        if not method or method == self.settings_model().model_fields["method"].default:
            return
        intro, rows = method_options_help(method)  # an unknown method was refused in parse_args
        with formatter.section(f"Options of method {method} (pass as -o KEY=VALUE)"):
            if intro:
                formatter.write_text(intro)
                formatter.write_paragraph()
            formatter.write_dl(rows)
