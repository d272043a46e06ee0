"""Property tests of the tool-call parser on random and adversarial text (hypothesis).

Properties: parse_tool_calls returns a list of ToolCall or raises ToolCallParseError, never
anything else; the Python-list lexer reads each character at most once (work linear in the text);
valid calls built from random JSON values read back exactly.

The default profile draws the same 150 examples per test on every run (``derandomize``), so that
the test suite passes or fails on the code alone; ``LOPD_HYPOTHESIS=explore`` draws 3000 fresh
random ones per test, to look for new counterexamples before a change to the parser lands.
"""
from __future__ import annotations

import json
import os

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from schemas import ToolCall  # noqa: E402
import stages.core.text.pycall_reader as reader  # noqa: E402
from stages.core.text.toolcalls import (  # noqa: E402
    MAX_NESTING, ToolCallParseError, format_python_call, parse_tool_calls)

# Outside a tagged call, think tags are read as reasoning (also inside string values) and an
# opening tag makes the action a tagged one: values of untagged calls holding them cannot
# round-trip. A tagged call's values may hold anything.
MARKERS = ("<think>", "</think>", "<tool_call>")
FRAGMENTS = ["[", "]", "(", ")", "{", "}", ",", "=", ":", "'", '"', "\\", "#", "\n", " ", "-", "+", ".", "*", "**",
             "f", "a", "cd", "_x", "1", "0x", "1e", "j", "True", "null", "lambda", "not", "<tool_call>",
             "</tool_call>", "<think>", "</think>", "```", "```json", '{"name": "f", "arguments": ', '"name"',
             "[f(", "f(a=", "a=1", "'''", '"""', "r'", "b'", "f'", "\x00", "é", "\u2028"]
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("lopd", max_examples=150, deadline=None, derandomize=True, suppress_health_check=_QUIET)
settings.register_profile("explore", max_examples=3000, deadline=None, suppress_health_check=_QUIET)
settings.load_profile("explore" if os.environ.get("LOPD_HYPOTHESIS") == "explore" else "lopd")


class CountingLexer(reader.Lexer):
    spans: list[tuple[int, int]] = []

    def _read(self):
        tok = super()._read()
        CountingLexer.spans.append((tok.start, tok.end))
        return tok


def _parse_counted(text: str) -> list[ToolCall] | ToolCallParseError:
    CountingLexer.spans = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reader, "Lexer", CountingLexer)
        try:
            result = parse_tool_calls(text)
            assert isinstance(result, list) and all(isinstance(c, ToolCall) for c in result)
        except ToolCallParseError as err:
            result = err
    spans = CountingLexer.spans
    assert len(set(spans)) == len(spans) and len(spans) <= len(text) + 1, "the lexer re-read text"
    return result


@given(st.text(max_size=2000))
def test_random_text_never_raises_anything_else(text):
    _parse_counted(text)


@given(st.lists(st.sampled_from(FRAGMENTS), max_size=300).map("".join))
def test_syntax_soup_never_raises_anything_else(text):
    _parse_counted(text)


@given(st.sampled_from(["[f(a=", "f(a=", '{"name": "f", "arguments": {"a": ', '<tool_call>{"name": "f", "arguments": ',
                        '{"name": "f", "arguments": "']),
       st.lists(st.sampled_from(["[", "(", "{", "-", "+", '{"k": ', "[1, ", "('x', "]), min_size=0, max_size=400),
       st.booleans())
def test_random_nesting_parses_or_fails_on_depth(prefix, openers, close):
    closers = {"[": "]", "(": ")", "{": "}", '{"k": ': "}", "[1, ": "]", "('x', ": ")"}
    body = "".join(openers) + "1" + ("".join(closers.get(o, "") for o in reversed(openers)) if close else "")
    result = _parse_counted(prefix + body + ")]}")
    if len(openers) > MAX_NESTING + 2:  # too deep for any format: never a call
        assert isinstance(result, ToolCallParseError)


@given(st.lists(st.tuples(st.sampled_from(FRAGMENTS + ["[f(a=1)", " ]", "<think>", "[", "-"]),
                          st.integers(min_value=1, max_value=20000)), min_size=1, max_size=4))
def test_adversarial_repetitions_are_read_in_linear_work(parts):
    text = "".join(fragment * count for fragment, count in parts)
    _parse_counted(text)


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy:
    return st.recursive(
        st.none() | st.booleans() | st.integers(min_value=-10**30, max_value=10**30)
        | st.floats(allow_nan=False, allow_infinity=False) | text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=20)


JSON_VALUES = json_values(st.text(max_size=20).filter(lambda t: not any(m in t for m in MARKERS)))
TAGGED_VALUES = json_values(st.text(max_size=20) | st.lists(st.sampled_from(
    [*MARKERS, "</tool_call>", "```", "```json", "x", " ", '"', "\\"]), max_size=6).map("".join))
IDENTIFIERS = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: not s.startswith("__") and s not in {"if", "in", "is", "or", "as", "def", "del", "for", "and", "not",
                                                   "try", "else", "from", "with", "pass", "elif", "while",
                                                   "break", "class", "raise", "yield", "async", "await",
                                                   "global", "lambda", "return", "assert", "except", "import",
                                                   "finally", "continue", "nonlocal"})


@given(st.dictionaries(IDENTIFIERS, JSON_VALUES, max_size=4))
def test_formatted_calls_read_back_exactly(args):
    call = ToolCall(name="mod.func", arguments=json.dumps(args))
    text = "[" + format_python_call(call) + "]"
    assert parse_tool_calls(text) == [call]
    assert parse_tool_calls(f"<tool_call>{json.dumps({'name': call.name, 'arguments': args})}</tool_call>") == [call]


@given(st.lists(st.dictionaries(IDENTIFIERS, TAGGED_VALUES, max_size=4), min_size=1, max_size=3),
       st.sampled_from(["", "<think>plan <tool_call>{}</tool_call></think>\n", "plan</think>", "```json\n"]))
def test_tagged_calls_read_back_exactly_whatever_their_values_hold(calls, before):
    text = before + "\n".join(f"<tool_call>{json.dumps({'name': 'f', 'arguments': args})}</tool_call>" for args in calls)
    assert parse_tool_calls(text) == [ToolCall(name="f", arguments=json.dumps(args)) for args in calls]
