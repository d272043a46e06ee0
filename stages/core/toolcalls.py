"""Parse tool calls out of a model's action text, and write calls back in BFCL's Python style.

Three formats are recognised, in this order of precedence:

(a) Hermes / Qwen chat-template blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (one or many; a missing closing tag at the end of the text, ``"parameters"`` instead of
    ``"arguments"`` and arguments given as a JSON string are tolerated);
(b) the BFCL prompting format, a Python list of keyword-argument calls
    ``[func(a=1, b="x"), mod.other(c=[1, 2])]`` (read with :mod:`ast`, never evaluated; the
    brackets may be omitted when the whole text is calls);
(c) a bare JSON object ``{"name": ..., "arguments": ...}`` or a JSON list of them.

Reasoning blocks (``<think>...</think>``) and Markdown code fences are ignored. Text that holds no
call yields ``[]``; text that clearly tries to call a tool but cannot be read raises
:class:`ToolCallParseError`.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

from schemas import ToolCall

__all__ = ["ToolCallParseError", "parse_tool_calls", "format_python_call", "format_python_calls"]

_NAME = re.compile(r"[A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)*")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"```[\w+-]*")
_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
_PY_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PY_BARE_START = re.compile(r"[A-Za-z_][\w.]*\(")
_JSON_START = re.compile(r"(?:\[\s*)?\{\s*\"name\"\s*:")
_JSON_LITERALS = {"true": True, "false": False, "null": None}


class ToolCallParseError(ValueError):
    """The action text tries to call a tool but the call cannot be read; the message says why."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Extract the tool calls from a model action.

    Args:
        text: the raw generated text (may contain think blocks, code fences, prose).

    Returns:
        The calls in order of appearance; ``[]`` when the text contains no call.

    Raises:
        ToolCallParseError: a call is attempted (``<tool_call>`` tag, ``[name(`` list, or a
            ``{"name": ...}`` object) but its syntax or structure is invalid.
    """
    text = _strip_thinking(text)
    if "<tool_call>" in text:
        return _parse_tagged(text)
    text = _FENCE.sub("\n", text).strip()
    starts = [(m.start(), kind) for kind, m in (("json", _JSON_START.search(text)), ("python", _PY_LIST_START.search(text))) if m]
    if not starts and _PY_BARE_START.match(text):  # calls without the list brackets
        try:
            tree = ast.parse(f"[{text}]", mode="eval")
        except SyntaxError:  # prose that happens to start like a call
            return []
        return _calls_from_list(tree, 0)
    if not starts:
        return []
    pos, kind = min(starts)
    return _parse_json_at(text, pos) if kind == "json" else _parse_python(text, pos)


def format_python_call(call: ToolCall) -> str:
    """One call in BFCL's executable style, e.g. ``cd(folder='docs')`` (values via ``repr``)."""
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in call.args.items())})"


def format_python_calls(calls: list[ToolCall]) -> str:
    """Calls in BFCL's prompting style: ``[f(a=1), g(b='x')]``."""
    return "[" + ", ".join(format_python_call(c) for c in calls) + "]"


def _strip_thinking(text: str) -> str:
    text = _THINK.sub("", text)
    if "</think>" in text:  # opening tag was part of the prompt (Qwen3 templates)
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:  # unfinished reasoning: nothing after it is an action
        text = text.split("<think>", 1)[0]
    return text


def _make_call(obj: Any, where: str) -> ToolCall:
    if not isinstance(obj, dict) or "name" not in obj:
        raise ToolCallParseError(f"{where}: expected an object with a 'name' field, got {json.dumps(obj)[:80]}")
    name = obj["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolCallParseError(f"{where}: invalid function name {name!r}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            raise ToolCallParseError(f"{where}: arguments of {name!r} are a string but not JSON ({err.msg})") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ToolCallParseError(f"{where}: arguments of {name!r} must be an object, got {type(args).__name__}")
    return ToolCall(name=name, arguments=json.dumps(args))


def _parse_tagged(text: str) -> list[ToolCall]:
    calls = []
    for i, block in enumerate(_TOOL_BLOCK.findall(text), start=1):
        body = _FENCE.sub("", block).strip()
        where = f"<tool_call> block {i}"
        if not body:
            raise ToolCallParseError(f"{where} is empty")
        try:
            obj, _ = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as err:
            raise ToolCallParseError(f"{where}: invalid JSON ({err.msg} at char {err.pos})") from None
        calls.extend(_make_call(o, where) for o in (obj if isinstance(obj, list) else [obj]))
    return calls


def _parse_json_at(text: str, pos: int) -> list[ToolCall]:
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, pos)
    except json.JSONDecodeError as err:
        raise ToolCallParseError(f"JSON tool call at char {pos}: invalid JSON ({err.msg} at char {err.pos})") from None
    items = obj if isinstance(obj, list) else [obj]
    return [_make_call(o, f"JSON tool call {i}") for i, o in enumerate(items, start=1)]


def _parse_python(text: str, pos: int) -> list[ToolCall]:
    """Read the Python call list starting at ``text[pos] == '['`` up to the ``]`` that closes it."""
    error = None
    for m in re.finditer(r"\]", text[pos:]):
        try:
            return _calls_from_list(ast.parse(text[pos : pos + m.end()], mode="eval"), pos)
        except SyntaxError as err:
            error = error or err
    msg = error.msg if error else "no closing ']'"
    raise ToolCallParseError(f"Python call list at char {pos}: syntax error ({msg}); expected [func(arg=value, ...)]")


def _calls_from_list(tree: ast.Expression, pos: int) -> list[ToolCall]:
    if not isinstance(tree.body, (ast.List, ast.Tuple)):
        raise ToolCallParseError(f"Python call list at char {pos}: expected a list of calls")
    return [_call_from_ast(node, i) for i, node in enumerate(tree.body.elts, start=1)]


def _call_from_ast(node: ast.expr, index: int) -> ToolCall:
    where = f"call {index}"
    if not isinstance(node, ast.Call):
        raise ToolCallParseError(f"{where}: expected func(arg=value, ...), got {ast.unparse(node)[:60]!r}")
    name = _dotted_name(node.func)
    if name is None:
        raise ToolCallParseError(f"{where}: function must be a (dotted) name, got {ast.unparse(node.func)[:60]!r}")
    if node.args:
        raise ToolCallParseError(f"{where} ({name}): positional arguments are not supported; use keyword arguments")
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ToolCallParseError(f"{where} ({name}): **kwargs unpacking is not supported")
        args[kw.arg] = _literal(kw.value, f"{where} ({name}), argument {kw.arg!r}")
    try:
        return ToolCall(name=name, arguments=json.dumps(args))
    except (TypeError, ValueError) as err:
        raise ToolCallParseError(f"{where} ({name}): arguments are not JSON-serialisable ({err})") from None


def _dotted_name(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _literal(node: ast.expr, where: str) -> Any:
    """A JSON-compatible value from a literal expression (numbers, strings, lists, dicts, ...)."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, (bytes, complex)) and node.value is not ...:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, where)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(e, where) for e in node.elts]
    if isinstance(node, ast.Dict) and None not in node.keys:
        keys = [_literal(k, where) for k in node.keys]
        if all(isinstance(k, (str, int, float, bool)) or k is None for k in keys):
            return dict(zip(keys, (_literal(v, where) for v in node.values)))
    if isinstance(node, ast.Name) and node.id in _JSON_LITERALS:
        return _JSON_LITERALS[node.id]
    raise ToolCallParseError(f"{where}: value {ast.unparse(node)[:60]!r} is not a literal")
