"""Hostile model output: every action is read in bounded work and fails as a parse failure.

Each input here made the old parser raise (RecursionError, MemoryError, ValueError) or run for
more than 20 s (quadratic re-parsing, regex backtracking). Now each gives a ToolCallParseError
(or no call) quickly; the work bound is checked by counting what the Python-list lexer reads,
wall time only by a generous guard.
"""
from __future__ import annotations

import time

import pytest

from schemas import ToolCall
import stages.core.text.pycall_reader as reader
from stages.core.text.toolcalls import (
    MAX_ACTION_CHARS,
    MAX_NESTING,
    ToolCallParseError,
    UnsafeCallError,
    check_python_call,
    format_python_call,
    parse_tool_calls,
)

WALL_GUARD_S = 1.0  # a guard against hangs, not a benchmark (measured times: a few ms each)

HOSTILE = {
    "1000 nested [ in a 2 KB argument": ('[f(a=' + '[' * 1000 + ']' * 1000 + ')]', "nested deeper than 64"),
    "JSON nested 10,000 deep": ('{"name": "f", "arguments": ' + '[' * 10000 + ']' * 10000 + '}', "nested deeper than 64"),
    "tool_call JSON nested 10,000 deep": ('<tool_call>{"name": "f", "arguments": {"a": ' + '[' * 10000 + ']' * 10000
                                          + '}}</tool_call>', "nested deeper than 64"),
    "string arguments nested 10,000 deep": ('{"name": "f", "arguments": "' + '[' * 10000 + ']' * 10000 + '"}',
                                            "nested deeper than 64"),
    "100,000 unary minus": ('[f(a=' + '-' * 100000 + '1)]', "nested deeper than 64"),
    "2**19 closing brackets (1 MiB)": ('[f(a=1' + ' ]' * 2**19, "longer than"),
    "2**16 closing brackets (128 KiB)": ('[f(a=1' + ' ]' * 2**16, "syntax error"),
    "50,000 chained additions": ('[f(a=1' + '+1' * 50000 + ')]', "more than 32768 tokens"),
    "50,000 chained calls": ('[f()' + '()' * 50000 + ']', "more than 32768 tokens"),
    "integer of 5,000 digits in JSON": ('{"name": "f", "arguments": {"a": ' + '1' * 5000 + '}}', "invalid JSON"),
    "integer of 5,000 digits in a list": ('[f(a=' + '1' * 5000 + ')]', "invalid number"),
    "unterminated escaped string": ('[f(a="' + '\\"' * 50000, "unterminated string"),
    "dotted name of 1,000 parts": ('[' + 'a.' * 1000 + 'f(x=1)]', "dotted parts"),
}


class CountingLexer(reader.Lexer):
    """The reader's lexer, recording every token it reads."""

    spans: list[tuple[int, int]] = []

    def _read(self):
        tok = super()._read()
        CountingLexer.spans.append((tok.start, tok.end))
        return tok


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_is_a_quick_parse_failure(name, monkeypatch):
    text, fragment = HOSTILE[name]
    CountingLexer.spans = []
    monkeypatch.setattr(reader, "Lexer", CountingLexer)
    start = time.perf_counter()
    with pytest.raises(ToolCallParseError) as err:
        parse_tool_calls(text)
    elapsed = time.perf_counter() - start
    assert fragment in str(err.value)
    # Work bound: at most MAX_TOKENS tokens, and no character lexed twice (no re-parsing from the start).
    spans = CountingLexer.spans
    assert len(spans) <= reader.MAX_TOKENS + 1
    assert len(set(spans)) == len(spans), "a token was lexed twice"
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "the lexer moved backwards"
    assert elapsed < WALL_GUARD_S, f"{name}: {elapsed:.2f} s"


def test_limits_are_documented_constants():
    assert MAX_NESTING == reader.MAX_NESTING == 64
    assert MAX_ACTION_CHARS == 262_144
    with pytest.raises(ToolCallParseError, match="longer than"):
        parse_tool_calls("x" * (MAX_ACTION_CHARS + 1))
    assert parse_tool_calls("x" * MAX_ACTION_CHARS) == []  # at the limit: read as usual


@pytest.mark.parametrize("depth, ok", [(MAX_NESTING - 1, True), (MAX_NESTING + 5, False)])
def test_nesting_just_under_the_limit_still_parses(depth, ok):
    python = '[f(a=' + '[' * depth + ']' * depth + ')]'
    json_call = '{"name": "f", "arguments": {"a": ' + '[' * (depth - 2) + ']' * (depth - 2) + '}}'
    for text in (python, json_call):
        if ok:
            assert len(parse_tool_calls(text)) == 1
        else:
            with pytest.raises(ToolCallParseError, match="nested deeper"):
                parse_tool_calls(text)


def test_think_flood_is_linear():
    # The old regex scanned to the end for every unclosed <think>: quadratic, > 20 s here.
    start = time.perf_counter()
    assert parse_tool_calls("</think>" + "<think>" * 30000) == []
    assert parse_tool_calls("<think>" * 30000 + "[f(a=1)]") == []
    assert time.perf_counter() - start < WALL_GUARD_S


def test_code_in_values_is_data_never_run(tmp_path):
    marker = tmp_path / "ran"
    payload = f"__import__('os').system('touch {marker}')"
    texts = [
        f"[f(a={payload})]",
        f"[f(a=f'{{{payload}}}')]",
        f'[f(a=({payload} for x in [1]))]',
        f"{payload}",
        f'<tool_call>{{"name": "f", "arguments": "{payload}"}}</tool_call>',
    ]
    for text in texts:
        try:
            parse_tool_calls(text)
        except ToolCallParseError:
            pass
    assert not marker.exists()
    call = parse_tool_calls(f"[f(a={payload!r})]")[0]  # as a string it is just a value
    assert call.args == {"a": payload}


@pytest.mark.parametrize("name", ["x=1), g(", "a b", "a;b", "a\nb", "__class__", "class", "1a", "", "a.b"])
def test_format_rejects_argument_names_that_are_not_identifiers(name):
    with pytest.raises(UnsafeCallError, match="argument name"):
        format_python_call(ToolCall(name="cd", arguments=f'{{"{name}": 1}}'.replace("\n", "\\n")))


@pytest.mark.parametrize("name", ["os.system(1)#", "__import__", "a.__class__", "import", "f-g", "a..b", "a b"])
def test_format_rejects_function_names_that_are_not_dotted_names(name):
    with pytest.raises(UnsafeCallError, match="function name"):
        format_python_call(ToolCall(name=name, arguments='{"a": 1}'))


def test_format_checks_declared_parameters_and_values():
    assert format_python_call(ToolCall(name="cd", arguments='{"folder": "a\'); x(\'"}'), {"folder"}) == \
        'cd(folder="a\'); x(\'")'
    with pytest.raises(UnsafeCallError, match="has no parameter 'path'"):
        format_python_call(ToolCall(name="cd", arguments='{"path": "a"}'), {"folder"})
    with pytest.raises(UnsafeCallError, match="not a finite number"):
        format_python_call(ToolCall(name="cd", arguments='{"folder": Infinity}'))
    deep = "[" * (MAX_NESTING + 2) + "]" * (MAX_NESTING + 2)
    with pytest.raises(UnsafeCallError, match="nested deeper"):
        format_python_call(ToolCall(name="cd", arguments=f'{{"folder": {deep}}}'))


@pytest.mark.parametrize("text", [
    "cd(folder=__import__('os').getcwd())", "cd(folder='a') or exit()", "cd(**{'folder': 'a'})",
    "cd(*['a'])", "cd(__class__=1)", "(lambda: 1)()", "cd(folder='a'); exit()", "cd.__globals__(a=1)",
    "cd(folder=[x for x in ()])",
])
def test_check_python_call_rejects_anything_but_literal_calls(text):
    with pytest.raises(UnsafeCallError):
        check_python_call(text, positional=True)


def test_check_python_call_reads_literal_calls():
    assert check_python_call("mv(source='a', destination=[1, {'k': None}])") == \
        ("mv", [], {"source": "a", "destination": [1, {"k": None}]})
    assert check_python_call("cd('docs')", positional=True) == ("cd", ["docs"], {})
    with pytest.raises(UnsafeCallError):
        check_python_call("cd('docs')")
