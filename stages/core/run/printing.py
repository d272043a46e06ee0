"""What a stage prints that must read whole in a narrow console (tests render at 100 columns).

- :func:`titled_table`: a rich table at least as wide as its title, so the title is never
  folded mid-word into a narrower table (a two-column table under a long model path).
- :func:`field_lines`: fields packed into lines of at most ``width`` characters, broken only
  between fields (a distill step's metrics), never inside one.
"""
from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.table import Table


def titled_table(title: str, **kwargs: Any) -> Table:
    """``rich.table.Table(title=title, **kwargs)`` whose width is at least the title's (rich caps
    it at the console's width, where the title then wraps at spaces)."""
    return Table(title=title, min_width=cell_len(title), **kwargs)


def field_lines(fields: list[str], width: int, indent: str = "  ") -> str:
    """``fields`` joined by spaces into lines of at most ``width`` cells, a new line (after
    ``indent``) before a field that would pass it; a field longer than a line gets a line of its own."""
    lines = [fields[0]] if fields else []
    for field in fields[1:]:
        if cell_len(lines[-1]) + 1 + cell_len(field) > width:
            lines.append(indent + field)
        else:
            lines[-1] += " " + field
    return "\n".join(lines)
