"""Read BFCL's Python call lists ``[f(a=1), mod.g(b=[1, "x"])]`` from hostile text, in linear time.

A hand-written reader of the one subset of Python that tool calls use: a list of calls with
keyword arguments whose values are literals (strings, numbers, ``True``/``False``/``None`` and
``true``/``false``/``null``, lists, tuples, sets, dicts, signed numbers). It replaces
``ast.parse``, which on model output could recurse past the interpreter's limit (a thousand
nested ``[``), run out of parser stack (``-`` repeated 100,000 times) or, re-tried at every ``]``,
take quadratic time. Here every character is tokenised once, left to right (:class:`Lexer`),
nesting of brackets, unary signs and dotted names is capped at :data:`MAX_NESTING` and the
tokens of one list at :data:`MAX_TOKENS`. Values are built from single tokens only: numbers with
``int``/``float``, strings directly or, when they hold escapes, with :func:`ast.literal_eval` of
that one token (which never evaluates code).

Errors follow Python's order: a syntax error anywhere (:class:`PySyntaxError`) wins over a
structural one (:class:`PyCallError`: positional argument, non-literal value, ...), which is
reported once the list has been read to its closing ``]``; nesting past the cap is a
:class:`PyCallError` at once. :mod:`stages.core.text.toolcalls` turns both into its
``ToolCallParseError``.
"""
from __future__ import annotations

import ast
import keyword
import re
from typing import Any, NamedTuple

__all__ = ["MAX_NESTING", "MAX_TOKENS", "Lexer", "PyCallError", "PySyntaxError", "read_call_list"]

MAX_NESTING = 64
"""Deepest nesting read: brackets, unary signs and dotted-name parts in a Python call list,
brackets in JSON. Tool arguments nest a few levels; the cap keeps every reader far below Python's
recursion limit."""
MAX_TOKENS = 32_768
"""Most tokens read from one Python call list (a list of 16,000 numbers, or any number of long
strings, fits). Past it the list is a failure: it bounds the interpreted work of one action."""

_SKIP = re.compile(r"(?:[ \t\r\n\f]++|#[^\n]*+|\\\r?\n)*+")
_TOKEN = re.compile(r"""
    (?P<str>(?:[rRbBuUfF]{1,2})?(?:'''|\"\"\"|'|"))
  | (?P<num>0[xX](?:_?[0-9a-fA-F])++|0[oO](?:_?[0-7])++|0[bB](?:_?[01])++
        |(?:\d(?:_?\d)*+(?:\.(?:\d(?:_?\d)*+)?)?|\.\d(?:_?\d)*+)(?:[eE][+-]?\d(?:_?\d)*+)?[jJ]?)
  | (?P<name>[^\W\d]\w*+)
  | (?P<op>\*\*|==|!=|<=|>=|:=|->|//|<<|>>|[-+*/%@&|^~<>()\[\]{},:;=.!])
""", re.VERBOSE)
_STRING_BODY = {  # possessive: an unterminated string fails after one scan, no backtracking
    "'": re.compile(r"(?:[^'\\\n]|\\.)*+'", re.DOTALL),
    '"': re.compile(r'(?:[^"\\\n]|\\.)*+"', re.DOTALL),
    "'''": re.compile(r"(?:[^'\\]|\\.|'(?!''))*+'''", re.DOTALL),
    '"""': re.compile(r'(?:[^"\\]|\\.|"(?!""))*+"""', re.DOTALL),
}
_OPEN, _CLOSE = {"(": ")", "[": "]", "{": "}"}, {")", "]", "}"}
_DELIMITERS = {",", ")", "]", "}", ":"}
_JSON_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}
_NOT_LITERAL = object()  # placeholder for a value already reported as not a literal


class PyCallError(ValueError):
    """The call list is readable Python syntax but not a list of keyword calls with literal values."""


class PySyntaxError(PyCallError):
    """The call list is not even valid syntax (unbalanced, unterminated, unexpected token)."""


class Token(NamedTuple):
    """One token: ``kind`` is ``str``, ``num``, ``name``, ``op`` or ``end``; ``start:end`` its span."""

    kind: str
    start: int
    end: int
    text: str


class Lexer:
    """Tokens of ``text`` from ``pos`` on, each character read once (``pos`` only moves forward).

    Args:
        text: the whole action text; pos: where to start.
    """

    def __init__(self, text: str, pos: int) -> None:
        self.text, self.pos = text, pos
        self.count = 0  # tokens read so far
        self.last_end = pos  # end of the last consumed token
        self._ahead: list[Token] = []  # tokens read but not yet consumed (at most two)

    def peek(self, k: int = 0) -> Token:
        """The ``k``-th next token (0: the next one), not consumed.

        Raises:
            PySyntaxError: an unterminated string literal or a character Python has no token for.
        """
        while len(self._ahead) <= k:
            self._ahead.append(self._read())
        return self._ahead[k]

    def next(self) -> Token:
        """The next token, consumed (errors as :meth:`peek`)."""
        tok = self.peek()
        del self._ahead[0]
        self.last_end = tok.end
        return tok

    def _read(self) -> Token:
        self.count += 1
        if self.count > MAX_TOKENS:
            raise PyCallError(f"more than {MAX_TOKENS} tokens in one call list")
        text = self.text
        start = _SKIP.match(text, self.pos).end()
        if start >= len(text):
            self.pos = start
            return Token("end", start, start, "")
        m = _TOKEN.match(text, start)
        if m is None:
            raise PySyntaxError(f"invalid character {text[start]!r} at char {start}")
        end = m.end()
        if m.lastgroup == "str":
            body = _STRING_BODY[m.group().lstrip("rRbBuUfF")].match(text, end)
            if body is None:
                raise PySyntaxError(f"unterminated string literal at char {start}")
            end = body.end()
        self.pos = end
        return Token(m.lastgroup, start, end, text[start:end])


def read_call_list(text: str, pos: int, bare: bool) -> list[tuple[str, dict[str, Any]]]:
    """Read the call list that starts at ``text[pos]`` (``[`` unless ``bare``).

    Args:
        text: the action text.
        pos: index of the opening ``[`` (or of the first call when ``bare``).
        bare: the calls are not in brackets and must run to the end of ``text``.

    Returns:
        ``[(function name, {argument: value}), ...]``; text after the closing ``]`` is ignored.

    Raises:
        PySyntaxError: invalid syntax (message contains "syntax error").
        PyCallError: valid syntax but not keyword calls with literal values, or nesting deeper
            than :data:`MAX_NESTING`.
    """
    return _Reader(text, pos, bare).read()


class _Reader:
    def __init__(self, text: str, pos: int, bare: bool) -> None:
        self.text, self.pos, self.bare = text, pos, bare
        self.lex = Lexer(text, pos)
        self.error: str | None = None  # first structural error; raised once the syntax is known good

    def read(self) -> list[tuple[str, dict[str, Any]]]:
        try:
            calls = self._list()
        except PySyntaxError as err:
            raise PySyntaxError(f"Python call list at char {self.pos}: syntax error ({err}); "
                                "expected [func(arg=value, ...)]") from None
        if self.error:
            raise PyCallError(self.error)
        return calls

    # -- structure ------------------------------------------------------------------------------
    def _list(self) -> list[tuple[str, dict[str, Any]]]:
        end = "end" if self.bare else "]"
        if not self.bare:
            self._expect("[")
        calls = []
        while not self._at(end):
            calls.append(self._call(len(calls) + 1))
            if not self._at(end):
                self._expect(",")
        self.lex.next()
        return calls

    def _call(self, index: int) -> tuple[str, dict[str, Any]]:
        where = f"call {index}"
        start = self.lex.peek()
        parts = []
        while self.lex.peek().kind == "name" and not keyword.iskeyword(self.lex.peek().text):
            parts.append(self.lex.next().text)
            if len(parts) > MAX_NESTING:
                raise PyCallError(f"{where}: function name has more than {MAX_NESTING} dotted parts")
            if not self._at("."):
                break
            self.lex.next()
        name = ".".join(parts)
        if not parts or not self._at("("):
            self._skip(0)
            return self._fail(f"{where}: expected func(arg=value, ...), got {self._snippet(start.start)!r}", ("", {}))
        self.lex.next()
        args: dict[str, Any] = {}
        while not self._at(")"):
            tok = self.lex.peek()
            if tok.kind == "op" and tok.text == ",":
                raise PySyntaxError(f"expected an argument at char {tok.start}")
            if tok.kind == "op" and tok.text in ("*", "**"):
                self._skip(0)
                self._fail(f"{where} ({name}): " + ("**kwargs unpacking is not supported" if tok.text == "**"
                           else "positional arguments are not supported; use keyword arguments"))
            elif tok.kind == "name" and not keyword.iskeyword(tok.text) and self._at("=", 1):
                self.lex.next()
                self.lex.next()
                args[tok.text] = self._element(1, f"{where} ({name}), argument {tok.text!r}")
            else:
                self._skip(0)
                self._fail(f"{where} ({name}): positional arguments are not supported; use keyword arguments")
            if not self._at(")"):
                self._expect(",")
        self.lex.next()
        self._no_juxtaposition()
        if not self._at_delimiter():  # f()(a=1), f().g(), f() + 1: valid Python, not a call of a name
            self._skip(0)
            self._fail(f"{where}: function must be a (dotted) name, got {self._snippet(start.start)!r}")
        return name, args

    # -- values ---------------------------------------------------------------------------------
    def _element(self, depth: int, where: str) -> Any:
        """One value up to the next delimiter; a non-literal is recorded and skipped."""
        start = self.lex.peek().start
        value = self._literal(depth, where)
        if value is not _NOT_LITERAL:
            self._no_juxtaposition()
        if value is _NOT_LITERAL or not self._at_delimiter():
            self._skip(depth)
            if self.lex.peek().start == start:
                raise PySyntaxError(f"expected a value at char {start}")
            return self._fail(f"{where}: value {self._snippet(start)!r} is not a literal")
        return value

    def _literal(self, depth: int, where: str) -> Any:
        if depth > MAX_NESTING:
            raise PyCallError(f"{where}: nested deeper than {MAX_NESTING} levels")
        tok = self.lex.peek()
        if tok.kind == "str":
            return self._strings()
        if tok.kind == "num":
            return _number(self.lex.next().text)
        if tok.kind == "name":
            return _JSON_NAMES.get(self.lex.next().text, _NOT_LITERAL) if tok.text in _JSON_NAMES else _NOT_LITERAL
        if tok.kind == "op" and tok.text in ("-", "+"):
            self.lex.next()
            value = self._literal(depth + 1, where)
            if type(value) not in (int, float):
                return _NOT_LITERAL
            return -value if tok.text == "-" else value
        if tok.kind == "op" and tok.text in _OPEN:
            return self._display(depth, where)
        return _NOT_LITERAL

    def _strings(self) -> Any:
        """Adjacent string literals, concatenated; bytes and f-strings are not literals."""
        parts = []
        while self.lex.peek().kind == "str":
            parts.append(_string(self.lex.next().text))
        return "".join(parts) if all(type(p) is str for p in parts) else _NOT_LITERAL

    def _display(self, depth: int, where: str) -> Any:
        """A list ``[...]``, tuple ``(...)`` (or parenthesised value), set or dict ``{...}``."""
        opener = self.lex.next().text
        closer = _OPEN[opener]
        items: list[Any] = []
        keys: list[Any] = []
        is_dict = is_tuple = False
        while not self._at(closer):
            item = self._element(depth + 1, where)
            if opener == "{" and (is_dict or not items) and self._at(":"):
                self.lex.next()
                is_dict = True
                keys.append(item)
                item = self._element(depth + 1, where)
            elif is_dict:
                raise PySyntaxError(f"expected ':' in a dict at char {self.lex.peek().start}")
            items.append(item)
            if not self._at(closer):
                self._expect(",")
                is_tuple = True
        self.lex.next()
        if opener == "(" and len(items) == 1 and not is_tuple:
            return items[0]  # (value) is the value itself
        if opener == "{" and not items:
            return {}
        if is_dict:
            if any(k is not _NOT_LITERAL and type(k) not in (str, int, float, bool) and k is not None for k in keys):
                return self._fail(f"{where}: dict keys must be strings, numbers, booleans or None")
            return dict(zip(keys, items))
        return items

    # -- helpers --------------------------------------------------------------------------------
    def _at(self, op: str, k: int = 0) -> bool:
        tok = self.lex.peek(k)
        return tok.kind == op if op == "end" else tok.kind == "op" and tok.text == op

    def _at_delimiter(self) -> bool:
        tok = self.lex.peek()
        return tok.kind == "end" or tok.kind == "op" and tok.text in _DELIMITERS

    def _no_juxtaposition(self) -> None:
        """After a complete value or call: a name, string, number or ``=`` there is invalid syntax
        (``f(a=1) then``, ``[1 2]``); an operator or a keyword such as ``if`` may be valid Python."""
        tok = self.lex.peek()
        if (tok.kind in ("num", "str") or tok.kind == "name" and not keyword.iskeyword(tok.text)
                or tok.kind == "op" and tok.text in ("=", ":=", ";")):
            raise PySyntaxError(f"unexpected {tok.text[:20]!r} at char {tok.start}")

    def _expect(self, op: str) -> None:
        tok = self.lex.next()
        if not (tok.kind == "op" and tok.text == op):
            got = "end of text" if tok.kind == "end" else repr(tok.text[:20])
            raise PySyntaxError(f"expected {op!r} at char {tok.start}, got {got}")

    def _skip(self, depth: int) -> None:
        """Consume one expression we do not read: balanced tokens up to a delimiter at this level.

        Two operands in a row (``how you``, ``) x``) are invalid syntax, as in Python.
        """
        stack: list[str] = []
        after_operand = False
        while True:
            tok = self.lex.peek()
            if tok.kind == "end":
                return
            operand = tok.kind in ("num", "str") or tok.kind == "name" and not keyword.iskeyword(tok.text)
            if operand and after_operand and not (tok.kind == "str" and prev.kind == "str"):
                raise PySyntaxError(f"unexpected {tok.text[:20]!r} at char {tok.start}")
            if tok.kind == "op":
                if tok.text in _OPEN:
                    stack.append(_OPEN[tok.text])
                    if depth + len(stack) > MAX_NESTING:
                        raise PyCallError(f"value at char {tok.start}: nested deeper than {MAX_NESTING} levels")
                elif tok.text in _CLOSE:
                    if not stack:
                        return
                    if stack.pop() != tok.text:
                        raise PySyntaxError(f"unmatched {tok.text!r} at char {tok.start}")
                elif not stack and tok.text in _DELIMITERS:
                    return
            after_operand = operand or tok.kind == "op" and tok.text in _CLOSE
            prev = self.lex.next()

    def _snippet(self, start: int) -> str:
        return self.text[start : min(self.lex.last_end, start + 60)].strip()

    def _fail(self, message: str, value: Any = _NOT_LITERAL) -> Any:
        self.error = self.error or message
        return value


def _number(token: str) -> Any:
    """The value of a number token (``int(token, 0)`` / ``float``); imaginary numbers are not literals.

    Raises:
        PySyntaxError: not a valid Python number (``012``) or an integer past Python's digit limit.
    """
    lowered = token.lower()
    if lowered.endswith("j"):
        return _NOT_LITERAL
    try:
        if lowered.startswith(("0x", "0o", "0b")) or not any(c in lowered for c in ".e"):
            return int(token, 0)
        return float(token)
    except ValueError as err:
        raise PySyntaxError(f"invalid number {token[:40]!r} ({str(err)[:60]})") from None


def _string(token: str) -> Any:
    """The value of one string token; bytes and f-strings are not literals.

    A body without backslashes or carriage returns (or a raw one without carriage returns) is the
    value itself; otherwise :func:`ast.literal_eval` reads the single token (it never runs code).

    Raises:
        PySyntaxError: an invalid escape sequence.
    """
    body_start = len(token) - len(token.lstrip("rRbBuUfF"))
    prefix = token[:body_start].lower()
    if "b" in prefix or "f" in prefix:
        return _NOT_LITERAL
    quote = 3 if token.startswith(("'''", '"""'), body_start) else 1
    body = token[body_start + quote : len(token) - quote]
    if "\r" not in body and ("r" in prefix or "\\" not in body):
        return body
    try:
        return ast.literal_eval(token)
    except SyntaxError as err:
        raise PySyntaxError(f"invalid string literal at {token[:40]!r} ({err.msg})") from None
    except (ValueError, TypeError, MemoryError, RecursionError):  # e.g. a NUL character (Python 3.11)
        return _NOT_LITERAL
