"""How `lopd` reports what went wrong: errors a user can fix as one red ``error:`` line and exit
code 2 (:func:`friendly`), Python warnings as one ``warning:`` line (:func:`one_line_warning`),
Ctrl-C as how to continue, another trainer's name of an option as the command's own flag
(:class:`HintingGroup`). Imports nothing heavy: a refused command line stays fast."""
from __future__ import annotations

import functools
import re
import sys
from typing import Callable

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

err_console = Console(stderr=True)


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A Python warning as one ``warning:`` line on stderr (no source file and line of code)."""
    err_console.print(f"[yellow]warning:[/] {escape(str(message))}", soft_wrap=True)


# lopd's own error classes a user can fix, by (module, class): a class counts only once its module
# is imported (an error of a module never imported cannot have been raised), so that a refusal
# loads no module of its own (the store's module loads lancedb)
_LOPD_ERRORS = (("stages.core.data.store", "StoreError"), ("stages.envs.base", "EnvError"),
                ("stages.core.exec.isolation", "IsolationUnavailable"))


def _expected_errors() -> tuple[type[BaseException], ...]:
    """The errors :func:`friendly` turns into one line: pydantic's, missing files, bad values and
    lopd's own (:data:`_LOPD_ERRORS`)."""
    own = tuple(getattr(sys.modules[module], name) for module, name in _LOPD_ERRORS if module in sys.modules)
    return (ValidationError, FileNotFoundError, ValueError, *own)


def friendly(fn: Callable) -> Callable:
    """Turn the errors a user can fix into one red line and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _expected_errors() as err:
            if isinstance(err, ValidationError):
                from stages.settings import error_text

                first = err.errors()[0]
                where = _flag_of(kwargs, ".".join(map(str, first["loc"])))
                msg = f"invalid option {where}: {error_text(first)}" if where else error_text(first)
            else:
                msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            # soft_wrap: the error stays one line (rich would break it at the terminal width)
            err_console.print(f"[red]error:[/] {escape(msg)}", soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:  # Ctrl-C: what to do next instead of a silent exit
            err_console.print(f"interrupted{_resume_hint(kwargs)}", soft_wrap=True)
            raise typer.Exit(130) from None

    return wrapper


def _param(kwargs: dict, name: str):
    """The click parameter ``name`` of the command called with ``kwargs``, or None."""
    command = getattr(kwargs.get("ctx"), "command", None)  # getattr: typer passes its click's Context, no typer.Context
    return next((p for p in command.params if p.name == name), None) if command is not None else None


def _resume_hint(kwargs: dict) -> str:
    """For a command with ``--resume``: how to continue, from that flag's own help (its first sentence)."""
    flag = _param(kwargs, "resume")
    if flag is None or not flag.help:
        return ""
    what = re.sub(r" \([^)]*\)", "", flag.help).split(". ")[0].rstrip(".")  # its first sentence, no asides
    return f": rerun the same command with --resume to continue ({what[0].lower()}{what[1:]})"


def _flag_of(kwargs: dict, name: str) -> str:
    """How an error names setting ``name`` of a command called with ``kwargs``: as the command's
    flag of that name (``lam``: ``--lambda``), else as given."""
    param = _param(kwargs, name)
    if param is not None and param.opts[0].startswith("--"):
        return param.opts[0]
    return "--" + name.replace("_", "-") if name in kwargs else name


def usual_flag(option: str, params: list) -> str | None:
    """The flag of ``params`` (a click command's) that other trainers' option ``option`` names
    (:data:`stages.core.registry.USUAL_NAMES`): ``--learning-rate`` -> ``--lr``,
    ``--num-generations`` -> ``--group-size``, or a value of an option whose metavar lists it:
    ``--bf16`` -> ``--dtype bfloat16``. None when there is none."""
    from stages.core.registry import USUAL_NAMES

    usual = USUAL_NAMES.get(option.lstrip("-").replace("-", "_").lower())
    options = [p for p in params if p.param_type_name == "option"]
    for param in options:
        if param.name == usual:
            return next((o for o in param.opts if o.startswith("--")), param.opts[0])
    for param in options:
        if usual and usual in re.findall(r"[\w.-]+", param.metavar or ""):
            return f"{param.opts[0]} {usual}"
    return None


class HintingGroup(TyperGroup):
    """`lopd`'s command group: an unknown option of a command that is another trainer's name of
    one of its own (:func:`usual_flag`) is answered with that flag (``No such option:
    --learning-rate (Possible options: --lr)``) instead of click's closest spelling."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as err:  # click's NoSuchOption, of the click typer runs on (its own copy, or click)
            if type(err).__name__ == "NoSuchOption" and getattr(err, "ctx", None) is not None:
                flag = usual_flag(err.option_name, err.ctx.command.params)
                if flag:
                    err.possibilities = [flag]  # click writes them after its message
            raise
