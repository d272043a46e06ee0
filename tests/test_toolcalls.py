"""Tool-call parsing: Hermes tags, BFCL Python lists, bare JSON; errors and plain text."""
from __future__ import annotations

import json

import pytest

from schemas import ToolCall
from stages.core.text.toolcalls import (ToolCallParseError, format_python_call, format_python_calls, parse_tool_calls,
                                        strip_thinking)


def _pairs(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, c.args) for c in calls]


def test_hermes_single_and_multiple_blocks():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {"tz": "CET", "precise": true}}</tool_call>'
    )
    assert _pairs(parse_tool_calls(text)) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET", "precise": True})]


def test_hermes_tolerates_missing_close_parameters_and_string_arguments():
    text = (
        '<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}'
    )
    assert _pairs(parse_tool_calls(text)) == [("a", {"x": 1}), ("b", {"y": [1, 2]})]


def test_hermes_block_without_arguments_and_code_fence():
    text = '<tool_call>\n```json\n{"name": "ls"}\n```\n</tool_call>'
    assert _pairs(parse_tool_calls(text)) == [("ls", {})]
    assert _pairs(parse_tool_calls('<tool_call>\n```\n```json\n{"name": "ls"}\n```\n</tool_call>')) == [("ls", {})]


def test_hermes_string_values_keep_closing_tags_and_fences():
    # A chat template writes argument values verbatim, so a value may hold the closing tag or a fence.
    text = ('<tool_call>{"name": "write", "arguments": {"text": "</tool_call>", "code": "```py\\nx```"}}</tool_call>\n'
            '<tool_call>{"name": "ls", "arguments": {"path": "<tool_call>"}}')
    assert _pairs(parse_tool_calls(text)) == [("write", {"text": "</tool_call>", "code": "```py\nx```"}),
                                              ("ls", {"path": "<tool_call>"})]


def test_python_list_with_literals_dotted_names_and_trailing_text():
    text = '[math.factorial(number=5), plot(xs=[1, -2.5, 3], opts={"color": "red", "w": (1, 2)}, show=True, n=None)] done'
    assert _pairs(parse_tool_calls(text)) == [
        ("math.factorial", {"number": 5}),
        ("plot", {"xs": [1, -2.5, 3], "opts": {"color": "red", "w": [1, 2]}, "show": True, "n": None}),
    ]


def test_python_list_in_code_fence_after_think_block():
    text = "<think>maybe [wrong(a=1)]?</think>\n```python\n[cd(folder='docs'), ls(a=true)]\n```"
    assert _pairs(parse_tool_calls(text)) == [("cd", {"folder": "docs"}), ("ls", {"a": True})]


def test_python_list_brackets_inside_string_values():
    assert _pairs(parse_tool_calls("[echo(content='a ] b [x(', n=[[1], [2]])]")) == [
        ("echo", {"content": "a ] b [x(", "n": [[1], [2]]})
    ]


def test_python_calls_without_brackets():
    assert _pairs(parse_tool_calls("cd(folder='a'), pwd()")) == [("cd", {"folder": "a"}), ("pwd", {})]


def test_untagged_calls_keep_fences_inside_string_values():
    # Only the fence around the calls is skipped; a value that holds one (a README, a code cell) is kept.
    assert _pairs(parse_tool_calls('```json\n{"name": "write", "arguments": {"text": "```py\\nx\\n```"}}\n```')) == [
        ("write", {"text": "```py\nx\n```"})]
    assert _pairs(parse_tool_calls("```python\n[write(text='```sh\\nls\\n```')]\n```")) == [
        ("write", {"text": "```sh\nls\n```"})]
    assert _pairs(parse_tool_calls("```python\nwrite(text='a ``` b'), ls()\n```")) == [
        ("write", {"text": "a ``` b"}), ("ls", {})]
    assert _pairs(parse_tool_calls("```pwd()```")) == [("pwd", {})]


def test_bare_json_object_and_list():
    assert _pairs(parse_tool_calls('Sure: {"name": "f", "arguments": {"k": "v"}} ok')) == [("f", {"k": "v"})]
    text = '```json\n[{"name": "f", "arguments": {}}, {"name": "g", "parameters": {"z": 0}}]\n```'
    assert _pairs(parse_tool_calls(text)) == [("f", {}), ("g", {"z": 0})]


def test_think_tags_inside_a_tagged_call_are_kept_and_calls_inside_reasoning_are_not_read():
    # Think tags inside the JSON of a tagged call outside reasoning are its values, kept as written.
    value = {"t": "<think>x</think>", "u": "</think>", "v": "<think>"}
    text = f"<think>plan</think>\n<tool_call>{json.dumps({'name': 'write', 'arguments': value})}</tool_call>"
    assert _pairs(parse_tool_calls(text)) == [("write", value)]
    assert _pairs(parse_tool_calls('<think>I could <tool_call>{"name": "no"}</tool_call></think>'
                                   '<tool_call>{"name": "yes"}</tool_call>')) == [("yes", {})]
    # the prompt opened the reasoning: up to the last </think> outside a call's JSON is reasoning
    text = ('I could <tool_call>{"name": "no"}</tool_call>, end with </think> hmm</think>\n'
            '<tool_call>{"name": "yes", "arguments": {"t": "</think>"}}</tool_call>')
    assert _pairs(parse_tool_calls(text)) == [("yes", {"t": "</think>"})]
    assert _pairs(parse_tool_calls("I end with </think> then [no(a=1)].\n</think>\n\n[yes(a=2)]")) == [("yes", {"a": 2})]
    assert _pairs(parse_tool_calls('I need a <tool_call> block.\n</think>\n<tool_call>{"name": "yes"}</tool_call>')) == [
        ("yes", {})]
    # reasoning after a call, and a tag inside reasoning, are reasoning
    assert _pairs(parse_tool_calls('<tool_call>{"name": "yes"}</tool_call>\n<think>also <tool_call> no?</think>')) == [
        ("yes", {})]
    assert _pairs(parse_tool_calls("<think>use <tool_call> here</think>\n<think>or [no(a=1)]</think>\n[yes(a=2)]")) == [
        ("yes", {"a": 2})]
    assert strip_thinking("a</think>b<think>c</think>d<think>e") == "bd"


def test_think_prefix_from_template_and_unfinished_thinking():
    assert _pairs(parse_tool_calls("reasoning [no(a=1)]</think>[yes(a=2)]")) == [("yes", {"a": 2})]
    assert parse_tool_calls("<think>I should call [f(a=1)] but") == []


@pytest.mark.parametrize(
    "text",
    ["The answer is 42.", "", "Lists like [1, 2, 3] are fine.", "Hello (world)", "I cannot do that [sorry]."],
)
def test_plain_text_has_no_calls(text):
    assert parse_tool_calls(text) == []


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<tool_call>{name: f}</tool_call>", "invalid JSON"),
        ("<tool_call></tool_call>", "empty"),
        ('<tool_call>{"arguments": {}}</tool_call>', "'name'"),
        ('<tool_call>{"name": "os.system(1)"}</tool_call>', "invalid function name"),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>', "not JSON"),
        ("[f(a=1)", "syntax error"),
        ("[f('positional')]", "positional"),
        ("[f(a=some_variable)]", "not a literal"),
        ("[f(a=g(b=1))]", "not a literal"),
        ("[f(**kw)]", "kwargs"),
        ("[f(a=1), 3]", "expected func"),
        ("[f()(a=1)]", "(dotted) name"),
        ('{"name": "f", "arguments": {', "invalid JSON"),
    ],
)
def test_malformed_calls_raise_with_useful_message(text, fragment):
    with pytest.raises(ToolCallParseError) as err:
        parse_tool_calls(text)
    assert fragment in str(err.value)


def test_format_python_calls_round_trips():
    calls = [ToolCall(name="mv", arguments='{"source": "a b.txt", "n": -1.5, "flags": [true, null]}'), ToolCall(name="pwd")]
    text = format_python_calls(calls)
    assert text == "[mv(source='a b.txt', n=-1.5, flags=[True, None]), pwd()]"
    assert format_python_call(calls[1]) == "pwd()"
    assert parse_tool_calls(text) == calls
