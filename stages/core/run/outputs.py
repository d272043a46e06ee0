"""A result file that is never silently replaced by one of other settings, and the partial
results of an interrupted loop that ``--resume`` continues (`lopd evaluate`).

- :func:`check_overwrite`: a file at the output path that holds a result of other settings
  (its ``config``) is refused, naming the settings that differ; one of the same settings is
  replaced (the same evaluation again).
- :class:`PartialResults`: ``OUT.partial.jsonl``, a header line with the settings, then one JSON
  line per finished item (written and flushed as each finishes, so a Ctrl-C or a kill keeps
  them). ``--resume`` reads them back (a line cut short by a kill is dropped) when the settings
  match; the file is removed once the result file is written.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def differing(saved: dict[str, Any], current: dict[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """``"key: old -> new"`` of every setting both hold that differs, ``ignore`` left out."""
    skipped = set(ignore)
    return [f"{k}: {saved[k]!r} -> {current[k]!r}" for k in current
            if k in saved and k not in skipped and saved[k] != current[k]]


def check_overwrite(out: Path, settings: dict[str, Any], ignore: Iterable[str] = ()) -> None:
    """Refuse to replace the result file ``out`` when it holds a result of other settings.

    Args:
        settings: the new result's settings (the file's ``config`` is compared with them).
        ignore: settings that do not change the result (batch size, device, the path itself).

    Raises:
        ValueError: ``"runs/eval/x.json holds an evaluation of other settings (composer: None ->
            'c'): give another --out, or remove it"``; also when ``out`` is no JSON object with a
            ``config`` (the file is not lopd's result).
    """
    if not out.is_file():
        return
    try:
        saved = json.loads(out.read_text())
        saved = saved.get("config") if isinstance(saved, dict) else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        saved = None
    if not isinstance(saved, dict):
        raise ValueError(f"{out} exists and is no lopd report: give another --out, or remove it")
    changed = differing(saved, settings, ignore)
    if changed:
        raise ValueError(f"{out} holds an evaluation of other settings ({'; '.join(changed)}): "
                         "give another --out, or remove it")


def partial_path(out: Path) -> Path:
    """``runs/eval/x.json`` -> ``runs/eval/x.partial.jsonl``."""
    return out.with_name(out.stem + ".partial.jsonl")


class PartialResults:
    """The finished items of an interrupted loop (module docstring).

    Args:
        path: the partial file (:func:`partial_path`).
        settings: the loop's settings (the header; compared on resume).
        resume: continue the items in ``path``; else ``path`` must not hold any.
        ignore: settings a resumed loop may change.

    Attributes:
        rows: ``{key: row}`` of the items finished before (empty unless resuming).

    Raises:
        ValueError: without ``resume``, ``path`` holds finished items; with it, they were made
            with other settings (named), or the header is unreadable.
    """

    def __init__(self, path: Path, settings: dict[str, Any], *, resume: bool, ignore: Iterable[str] = ()):
        self.path, self.rows = Path(path), {}
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        if len(lines) > 1 and not resume:
            raise ValueError(f"{self.path} holds {len(lines) - 1} finished task(s) of an interrupted run: "
                             "pass --resume to continue it, or remove the file to start over")
        if lines and resume:
            try:
                saved = json.loads(lines[0])["settings"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{self.path}: unreadable header line: remove the file to start over") from None
            changed = differing(saved, settings, ignore)
            if changed:
                raise ValueError(f"{self.path}: the interrupted run had other settings ({'; '.join(changed)}): "
                                 "rerun it with them, or remove the file to start over")
            for line in lines[1:]:
                try:
                    item = json.loads(line)
                    self.rows[item["key"]] = item["row"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut short by a kill
        self._settings = settings
        self._file = None  # opened at the first item: a run refused before any leaves no file behind
        if self.rows:
            self._open()

    def _open(self) -> None:
        """(Re)write the file: the settings header and the items finished so far; keep it open."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [json.dumps({"settings": self._settings}, default=str)]
        kept += [json.dumps({"key": k, "row": r}, default=str) for k, r in self.rows.items()]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)
        self._file = self.path.open("a")

    def add(self, key: str, row: dict[str, Any]) -> None:
        """Record finished item ``key`` (one line, flushed at once)."""
        self.rows[key] = row
        if self._file is None:
            self._open()  # writes the header and this item
            return
        self._file.write(json.dumps({"key": key, "row": row}, default=str) + "\n")
        self._file.flush()

    def finish(self) -> None:
        """The result is written: remove the partial file."""
        if self._file is not None:
            self._file.close()
        self.path.unlink(missing_ok=True)
