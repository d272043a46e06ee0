"""Parse tool calls out of a model's action text, and write calls back in BFCL's Python style.

Three formats are recognised, in this order of precedence:

(a) Hermes / Qwen chat-template blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (one or many; a missing closing tag at the end of the text, ``"parameters"`` instead of
    ``"arguments"`` and arguments given as a JSON string are tolerated);
(b) the BFCL prompting format, a Python list of keyword-argument calls
    ``[func(a=1, b="x"), mod.other(c=[1, 2])]`` (read by a small reader of that subset of Python
    syntax, never evaluated; the brackets may be omitted when the whole text is calls);
(c) a bare JSON object ``{"name": ..., "arguments": ...}`` or a JSON list of them.

Reasoning (``<think>...</think>``, :func:`strip_thinking`) is dropped first; think tags inside a
tagged call's JSON are kept (values), elsewhere they are read as reasoning. Markdown code
fences around a call are skipped; fences inside a string value are kept. Text that holds no
call yields ``[]``; text that clearly tries to call a tool but cannot be read raises
:class:`ToolCallParseError`, the one failure of :func:`parse_tool_calls`.

Model output is hostile input. Reading it takes time linear in its length (every character is
scanned a bounded number of times, no re-parsing), nesting is bounded by :data:`MAX_NESTING` and
length by :data:`MAX_ACTION_CHARS`; past either the result is a :class:`ToolCallParseError`, never
a ``RecursionError`` or ``MemoryError``. :func:`format_python_call` writes calls for BFCL's
executor, which ``eval``s them, so it builds the text only from checked parts.
"""
from __future__ import annotations

import ast
import json
import keyword
import math
import re
from collections.abc import Collection
from typing import Any

from schemas import ToolCall
from stages.core.text.pycall_reader import MAX_NESTING, PyCallError, PySyntaxError, read_call_list

__all__ = ["MAX_ACTION_CHARS", "MAX_NESTING", "ToolCallParseError", "UnsafeCallError", "parse_tool_calls",
           "format_python_call", "format_python_calls", "check_python_call", "strip_thinking",
           "unknown_schema_types"]

MAX_ACTION_CHARS = 262_144
"""Longest action text :func:`parse_tool_calls` reads (characters, 256 Ki). Model actions are a few
thousand characters; a longer text is a parse failure (no model output needs more, and it bounds
the work a single action can cost)."""

_NAME = re.compile(r"[A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)*")
# A code fence's opening: three backticks and a language tag when one comes before a line break.
_FENCE_OPEN = re.compile(r"```(?:[\w+-]*+(?=\s))?")
_TAG_OPEN = "<tool_call>"
# What may sit between ``<tool_call>`` and its JSON: blanks and code fences.
_TAG_BODY_START = re.compile(r"\s*+(?:```[\w+-]*+\s*+)*+")
# Where a tagged call's block ends once its JSON is read: the closing tag, or the next call's tag.
_TAG_BLOCK_END = re.compile(r"</tool_call>|(?=<tool_call>)")
_THINK_MARKER = re.compile(r"</?think>|<tool_call>")
_PY_LIST_START = re.compile(r"\[\s*+[A-Za-z_][\w.]*+\s*+\(")
_PY_BARE_START = re.compile(r"[A-Za-z_][\w.]*+\(")
_JSON_START = re.compile(r"(?:\[\s*+)?\{\s*+\"name\"\s*+:")
# One JSON string (an unterminated one runs to the end, so the scan never backtracks) or a bracket.
_JSON_SCAN = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)
_JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})


class ToolCallParseError(ValueError):
    """The action text tries to call a tool but the call cannot be read; the message says why."""


class UnsafeCallError(ValueError):
    """A call cannot be written as executable Python from checked parts; the message says why."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Extract the tool calls from a model action.

    Args:
        text: the raw generated text (may contain think blocks, code fences, prose).

    Returns:
        The calls in order of appearance; ``[]`` when the text contains no call.

    Raises:
        ToolCallParseError: a call is attempted (``<tool_call>`` tag, ``[name(`` list, or a
            ``{"name": ...}`` object) but its syntax or structure is invalid; or the text is longer
            than :data:`MAX_ACTION_CHARS`, or nested deeper than :data:`MAX_NESTING`. No other
            exception escapes for any ``str`` input.
    """
    if len(text) > MAX_ACTION_CHARS:
        raise ToolCallParseError(f"action of {len(text)} characters is longer than the {MAX_ACTION_CHARS} read")
    try:
        return _parse(text)
    except ToolCallParseError:
        raise
    except (RecursionError, MemoryError, OverflowError, ValueError) as err:  # last guard; the limits should prevent it
        raise ToolCallParseError(f"action could not be read within the parser's limits ({type(err).__name__})") from None


def _parse(text: str) -> list[ToolCall]:
    text = strip_thinking(text)
    if "<tool_call>" in text:
        return _parse_tagged(text)
    text = text.strip()
    starts = [(m.start(), kind) for kind, m in (("json", _JSON_START.search(text)), ("python", _PY_LIST_START.search(text))) if m]
    if not starts:  # calls without the list brackets make up the whole text, perhaps inside one code fence
        text = _unfenced(text)
        if not _PY_BARE_START.match(text):
            return []
        try:
            return _python_calls(text, 0, bare=True)
        except PySyntaxError:  # prose that happens to start like a call
            return []
    pos, kind = min(starts)
    return _parse_json_at(text, pos) if kind == "json" else _python_calls(text, pos, bare=False)


def format_python_call(call: ToolCall, params: Collection[str] | None = None) -> str:
    """One call in BFCL's executable style, e.g. ``cd(folder='docs')``, built only from checked parts.

    BFCL's executor ``eval``s this text, so nothing model-controlled enters it unchecked: the
    function name must be a dotted Python identifier (no keyword, no dunder part), each argument
    name a plain identifier (no keyword, no dunder) and, when ``params`` is given, one of them;
    each value a JSON value (``str``, ``int``, finite ``float``, ``bool``, ``None``, lists, dicts with
    string keys; nested at most :data:`MAX_NESTING` deep) written with ``repr``. The text is then
    re-read with :func:`check_python_call` and must give back the same name and arguments.

    Args:
        call: the parsed call.
        params: the function's declared parameter names; ``None`` accepts any identifier.

    Returns:
        The call text.

    Raises:
        UnsafeCallError: a name, argument name or value fails a check (the message says which).
    """
    args = call.args
    if not isinstance(args, dict):
        raise UnsafeCallError(f"arguments of {call.name[:60]!r} must be an object")
    _check_function_name(call.name)
    for name, value in args.items():
        _check_arg_name(name, call.name, params)
        _check_json_value(value, f"argument {name!r} of {call.name!r}")
    text = f"{call.name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    if check_python_call(text, params) != (call.name, [], args):
        raise UnsafeCallError(f"call of {call.name!r} does not read back as written")
    return text


def format_python_calls(calls: list[ToolCall]) -> str:
    """Calls in BFCL's prompting style: ``[f(a=1), g(b='x')]`` (each as :func:`format_python_call`).

    Raises:
        UnsafeCallError: a call fails the checks of :func:`format_python_call`.
    """
    return "[" + ", ".join(format_python_call(c) for c in calls) + "]"


def check_python_call(text: str, params: Collection[str] | None = None,
                      positional: bool = False) -> tuple[str, list[Any], dict[str, Any]]:
    """Check that ``text`` is exactly one call ``name(literal, ..., kw=literal, ...)`` and nothing else.

    For call strings about to be ``eval``'d (BFCL's executor and checker): the function is a dotted
    name whose parts are identifiers (no keyword, no dunder), there are no ``*``/``**``
    arguments, argument names pass the checks of :func:`format_python_call` (declared in
    ``params`` when given) and every value is a literal (:func:`ast.literal_eval`).

    Args:
        text: the call text.
        params: declared parameter names; ``None`` accepts any identifier.
        positional: accept positional literal arguments (BFCL's ground truth uses them).

    Returns:
        ``(function name, [positional values], {argument: value})``.

    Raises:
        UnsafeCallError: anything else (syntax, structure, a non-literal value, a bad name).
    """
    if len(text) > MAX_ACTION_CHARS:
        raise UnsafeCallError(f"call text of {len(text)} characters is too long")
    try:
        node = ast.parse(text, mode="eval").body
        if not isinstance(node, ast.Call) or (node.args and not positional):
            raise UnsafeCallError(f"{text[:80]!r} is not one call with keyword arguments")
        name = _dotted_name(node.func)
        if name is None:
            raise UnsafeCallError(f"{text[:80]!r}: the function must be a dotted name")
        _check_function_name(name)
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise UnsafeCallError(f"{text[:80]!r}: * arguments are not allowed")
        if params is not None and len(node.args) > len(params):
            raise UnsafeCallError(f"{text[:80]!r}: more positional arguments than {name!r} has parameters")
        args = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise UnsafeCallError(f"{text[:80]!r}: ** arguments are not allowed")
            _check_arg_name(kw.arg, name, params)
            args[kw.arg] = ast.literal_eval(kw.value)
        return name, [ast.literal_eval(a) for a in node.args], args
    except UnsafeCallError:
        raise
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as err:
        raise UnsafeCallError(f"{text[:80]!r} is not a call with literal arguments ({type(err).__name__})") from None


def unknown_schema_types(schema: Any, known: Collection[str] = _JSON_TYPES) -> list[str]:
    """Where a tool's parameter schema uses a ``type`` outside ``known``.

    Walks ``properties`` and ``items`` (iteratively, so any depth is fine). A missing ``type`` is
    not reported; a list of types (JSON Schema unions) is checked member by member.

    Args:
        schema: a function's ``parameters`` object (JSON Schema, or BFCL's Gorilla dialect).
        known: accepted type names; default: the JSON Schema types.

    Returns:
        ``"path: 'type'"`` strings, e.g. ``["orientation: 'quaternion'", "points[]: 'vec3'"]``.
    """
    found, stack = [], [("", schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        for t in kind if isinstance(kind, list) else [] if kind is None else [kind]:
            if not isinstance(t, str) or t not in known:
                found.append(f"{path or '(parameters)'}: {t!r}")
        props = node.get("properties")
        if isinstance(props, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in reversed(props.items()))
        if isinstance(node.get("items"), dict):
            stack.append((f"{path}[]", node["items"]))
    return found


def strip_thinking(text: str) -> str:
    """Drop the reasoning of a model action: ``<think>...</think>`` blocks, everything before a
    ``</think>`` that closes no block of the text (the prompt opened it: Qwen3 templates; the last
    such one counts), and everything from an unfinished ``<think>`` on. Think tags inside the JSON
    of a ``<tool_call>`` block outside reasoning are part of the call's values, kept as written.

    One forward pass (each tagged call's JSON is read once; after a block that is not a JSON call,
    later tags are read as plain text): linear time, never raises.
    """
    kept, seg, pos, think_at, read_calls = [], 0, 0, -1, True
    while marker := _THINK_MARKER.search(text, pos):
        pos = marker.end()
        if think_at >= 0:  # inside a block: only its end counts
            if marker.group() == "</think>":
                think_at, seg = -1, pos
        elif marker.group() == "<think>":
            kept.append(text[seg:marker.start()])
            think_at = marker.start()
        elif marker.group() == "</think>":  # the prompt opened the block: everything before was reasoning
            kept, seg = [], pos
        elif read_calls:  # a tagged call: tags inside its JSON are values
            try:
                call, end = _decode_json(text, _TAG_BODY_START.match(text, pos).end(), "<tool_call> block")
            except ToolCallParseError:
                call = None
            if isinstance(call, (dict, list)):
                pos = end
            else:
                read_calls = False
    return "".join(kept) if think_at >= 0 else "".join(kept) + text[seg:]


def _check_json_nesting(text: str, start: int, where: str) -> None:
    """Raise unless the JSON value at ``text[start]`` nests at most :data:`MAX_NESTING` deep (one pass)."""
    depth = 0
    for m in _JSON_SCAN.finditer(text, start):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise ToolCallParseError(f"{where}: JSON nested deeper than {MAX_NESTING} levels")
        elif c in "]}":
            depth -= 1
            if depth <= 0:
                return


def _decode_json(text: str, start: int, where: str) -> tuple[Any, int]:
    """The JSON value at ``text[start]`` and the index just past it; raises ToolCallParseError."""
    _check_json_nesting(text, start, where)
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as err:
        raise ToolCallParseError(f"{where}: invalid JSON ({err.msg} at char {err.pos})") from None
    except ValueError as err:  # e.g. an integer past Python's digit limit
        raise ToolCallParseError(f"{where}: invalid JSON ({str(err)[:80]})") from None


def _make_call(obj: Any, where: str) -> ToolCall:
    if not isinstance(obj, dict) or "name" not in obj:
        raise ToolCallParseError(f"{where}: expected an object with a 'name' field, got {json.dumps(obj)[:80]}")
    name = obj["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolCallParseError(f"{where}: invalid function name {str(name)[:80]!r}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _decode_json(args, 0, f"{where}: arguments of {name!r} are a string but not JSON;")[0] if args.strip() else {}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ToolCallParseError(f"{where}: arguments of {name!r} must be an object, got {type(args).__name__}")
    return ToolCall(name=name, arguments=json.dumps(args))


def _unfenced(text: str) -> str:
    """``text`` without the code fence that opens and/or closes it (fences elsewhere are kept)."""
    if opening := _FENCE_OPEN.match(text):
        text = text[opening.end():]
    return text.removesuffix("```").strip()


def _parse_tagged(text: str) -> list[ToolCall]:
    """The calls of ``<tool_call>`` blocks. Each block's JSON is read from where it starts, so a
    ``</tool_call>`` inside a string value does not cut the call short; the cursor only moves
    forward, so each character is read a bounded number of times."""
    calls = []
    pos, i = 0, 0
    while (opened := text.find(_TAG_OPEN, pos)) != -1:
        i += 1
        where = f"<tool_call> block {i}"
        start = _TAG_BODY_START.match(text, opened + len(_TAG_OPEN)).end()
        if start == len(text) or text.startswith("</tool_call>", start) or text.startswith(_TAG_OPEN, start):
            raise ToolCallParseError(f"{where} is empty")
        obj, end = _decode_json(text, start, where)
        calls.extend(_make_call(o, where) for o in (obj if isinstance(obj, list) else [obj]))
        block_end = _TAG_BLOCK_END.search(text, end)
        pos = block_end.end() if block_end else len(text)
    return calls


def _parse_json_at(text: str, pos: int) -> list[ToolCall]:
    obj, _ = _decode_json(text, pos, f"JSON tool call at char {pos}")
    items = obj if isinstance(obj, list) else [obj]
    return [_make_call(o, f"JSON tool call {i}") for i, o in enumerate(items, start=1)]


def _python_calls(text: str, pos: int, bare: bool) -> list[ToolCall]:
    """Calls of the Python call list at ``text[pos]`` (see :func:`stages.core.text.pycall_reader.read_call_list`).

    Raises:
        PySyntaxError: invalid syntax, only when ``bare`` (the caller then sees prose, not calls).
        ToolCallParseError: any other failure.
    """
    try:
        pairs = read_call_list(text, pos, bare)
    except PySyntaxError as err:
        if bare:
            raise
        raise ToolCallParseError(str(err)) from None
    except PyCallError as err:
        raise ToolCallParseError(str(err)) from None
    try:
        return [ToolCall(name=name, arguments=json.dumps(args)) for name, args in pairs]
    except (TypeError, ValueError) as err:
        raise ToolCallParseError(f"arguments are not JSON-serialisable ({str(err)[:80]})") from None


def _check_function_name(name: Any) -> None:
    parts = name.split(".") if isinstance(name, str) else [None]
    for part in parts:
        if not isinstance(part, str) or not part.isidentifier() or keyword.iskeyword(part) or part.startswith("__"):
            raise UnsafeCallError(f"function name {str(name)[:80]!r} is not a dotted Python name")


def _check_arg_name(name: Any, function: str, params: Collection[str] | None) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__"):
        raise UnsafeCallError(f"argument name {str(name)[:80]!r} of {function!r} is not a Python identifier")
    if params is not None and name not in params:
        raise UnsafeCallError(f"{function!r} has no parameter {name!r}")


def _check_json_value(value: Any, where: str) -> None:
    """Raise unless ``value`` is a plain JSON value (exact types, finite floats, bounded depth)."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_NESTING:
            raise UnsafeCallError(f"{where}: nested deeper than {MAX_NESTING} levels")
        kind = type(v)
        if v is None or kind in (str, int, bool):
            continue
        if kind is float:
            if not math.isfinite(v):
                raise UnsafeCallError(f"{where}: {v!r} is not a finite number")
        elif kind is list:
            stack.extend((e, depth + 1) for e in v)
        elif kind is dict and all(type(k) is str for k in v):
            stack.extend((e, depth + 1) for e in v.values())
        else:
            raise UnsafeCallError(f"{where}: a {kind.__name__} is not a JSON value")


def _dotted_name(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))
