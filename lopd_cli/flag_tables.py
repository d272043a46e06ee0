"""The flag tables of the stage pages (``docs/stages/<command>.md``), made from the commands
themselves: one row per option, its spellings, its default and its help, as ``lopd <command>
--help`` shows them (a stage's flags come from its settings model, :mod:`lopd_cli.options`), so
a default or a help text is written once, in the code.

Each page holds its table between ``<!-- flags:<command> -->`` and ``<!-- /flags -->``;
``python -m lopd_cli.flag_tables`` rewrites them (``--check``: exit 1 naming the pages that
differ, writing nothing).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any
import typer

PAGES = Path(__file__).resolve().parents[1] / "docs" / "stages"
END = "<!-- /flags -->"


def _default_in_help(text: str) -> tuple[str, str | None]:
    """``(help without it, default)`` for a help that names its default as ``(default: X)`` or
    ``(default X)`` (parentheses inside X nest); ``(text, None)`` for one that does not."""
    start = text.find("(default")
    if start < 0:
        return text, None
    depth = 0
    for end in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            break
    default = re.sub(r"^default:?\s*", "", text[start + 1:end])
    head, tail = text[:start].rstrip(), text[end + 1:].lstrip()
    return (head + tail if tail[:1] in (".", ";", ",", "") else f"{head} {tail}"), default


def _default_text(option: Any) -> str:
    """An option's default as a table cell: the spelling in effect of an on/off pair, ``on`` or
    ``off`` of a plain flag, the value in backticks (floats as ``%g``); blank for none."""
    value = option.default
    if option.is_flag and option.secondary_opts:
        return f"`{option.opts[0] if value else option.secondary_opts[0]}`"
    if option.is_flag:
        return "on" if value else "off"
    if value is None or value == [] or value == ():
        return ""
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _cell(text: str) -> str:
    """Text as a markdown table cell: ``|`` and ``<`` escaped (``<model>`` would read as HTML)."""
    return text.replace("|", "\\|").replace("<", "\\<")


def _flags_text(option: Any) -> str:
    """An option's spellings in backticks: ``--a``, an on/off pair ``--a/--no-a``, older and short
    spellings after a comma."""
    pairs = [f"{on}/{off}" for on, off in zip(option.opts, option.secondary_opts)]
    spellings = pairs + list(option.opts[len(pairs):])
    return ", ".join(f"`{s}`" for s in spellings)


def flag_table(command: Any) -> str:
    """The markdown table of ``command``'s options (its arguments are not flags), in its order:
    ``| flag | default | meaning |``; a help that names its default (``(default: X)``) gives the
    default column X."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for option in command.params:
        if option.param_type_name != "option":  # typer may carry its own click: no isinstance
            continue
        meaning, default = _default_in_help(option.help or "")
        rows.append(f"| {_flags_text(option)} | {_cell(default if default is not None else _default_text(option))} "
                    f"| {_cell(meaning)} |")
    return "\n".join(rows)


def commands() -> dict[str, Any]:
    """The ``lopd`` commands that have a flag table: all but the ``store`` group."""
    from lopd_cli.main import app

    return {name: c for name, c in typer.main.get_command(app).commands.items()
            if not hasattr(c, "commands")}


def with_tables(page: str, tables: dict[str, str]) -> str:
    """``page`` with each ``<!-- flags:<name> -->`` ... ``<!-- /flags -->`` block holding
    ``tables[name]``.

    Raises:
        ValueError: a block names a command without a table, or has no end marker.
    """
    def block(match: re.Match) -> str:
        name = match.group(1)
        if name not in tables:
            raise ValueError(f"<!-- flags:{name} -->: no command {name!r} (known: {', '.join(sorted(tables))})")
        return f"<!-- flags:{name} -->\n{tables[name]}\n{END}"

    if page.count("<!-- flags:") != page.count(END):
        raise ValueError(f"a <!-- flags:NAME --> block without its {END}")
    return re.sub(r"<!-- flags:([\w-]+) -->.*?" + re.escape(END), block, page, flags=re.S)


def write(pages: Path = PAGES, check: bool = False) -> list[Path]:
    """Rewrite the flag tables of the pages in ``pages``; the pages whose tables changed (with
    ``check``, the ones that would, nothing written)."""
    tables = {name: flag_table(command) for name, command in commands().items()}
    changed = []
    for page in sorted(pages.glob("*.md")):
        text = page.read_text()
        new = with_tables(text, tables)
        if new != text:
            changed.append(page)
            if not check:
                page.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    """``python -m lopd_cli.flag_tables [--check]``."""
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    changed = write(check=check)
    for page in changed:
        print(f"{page}: {'flag table out of date' if check else 'flag table rewritten'}")
    return 1 if check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
