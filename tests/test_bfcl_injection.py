"""BFCL multi-turn: model text never reaches BFCL's eval() except as checked literals.

BFCL's executor and checker eval call strings. Before the fix, a JSON argument name was written
into that string unchecked, so ``{"x=__import__('os').system(...), folder": ...}`` ran a shell
command in the lopd process. Each probe here would create a marker file if anything ran; each
must instead be answered with an error tool message and leave the episode going.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.envs import make_env
from stages.envs.bfcl_multi import api_signatures, check_call_string, multi_turn_verdict

pytest.importorskip("bfcl", reason="nvidia-bfcl (import name bfcl) is not installed")


@pytest.fixture()
def episode():
    env = make_env("bfcl", categories=["base"], max_turns=100)
    task = env.tasks("test", limit=1)[0]  # GorillaFileSystem and friends; starts in a folder with 'document'
    env.reset(task)
    yield env, task
    env.close()


def _hermes(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _name_probes(marker: Path) -> dict[str, str]:
    """Actions whose function or argument NAME carries code: each must be rejected unexecuted."""
    code = f"__import__('os').system('echo injected > {marker}')"
    return {
        "name with call and comma (the reported probe)": json.dumps(
            {"name": "cd", "arguments": {f"x={code}, folder": "document"}}),
        "name with ( and )": _hermes("cd", {f"folder=({code})": "document"}),
        "name with =": _hermes("cd", {f"folder={code}#": "document"}),
        "name with ;": _hermes("cd", {f"folder='a');{code};print(": "x"}),
        "name with newline": _hermes("cd", {f"folder='a')\n{code}\nprint(x": "y"}),
        "dunder name": _hermes("cd", {"__class__": "document"}),
        "dunder name with code": _hermes("cd", {f"__class__={code}, folder": "document"}),
        "undeclared parameter": _hermes("cd", {"path": "document"}),
        "keyword as parameter": _hermes("cd", {"lambda": "document"}),
        "function name dunder": _hermes("__import__", {"name": "os"}),
    }


def _value_probes(marker: Path) -> dict[str, str]:
    """Actions whose VALUES are strings holding code: passed as data, the tool itself errors."""
    code = f"__import__('os').system('echo injected > {marker}')"
    return {
        "quoted code": _hermes("cd", {"folder": f"'); {code}; ('"}),
        "double-quoted code": _hermes("cd", {"folder": f'"); {code}; ("'}),
        "nested code strings": _hermes("cd", {"folder": ["')", {"k": f"\"); {code}; (\""}]}),
        "code in a method-like string": _hermes("cd", {"folder": f"ls({code})"}),
        "python list with code in a string": f"[cd(folder={code!r})]",
    }


def test_code_in_names_is_rejected_unexecuted_with_an_error_observation(episode, tmp_path):
    env, _ = episode
    marker = tmp_path / "INJECTED"
    for label, action in _name_probes(marker).items():
        result = env.step(action)
        assert not marker.exists(), f"{label}: code ran"
        assert not result.done and len(result.observation) == 1, label
        message = result.observation[0]
        assert message.role == "tool" and message.content.startswith("Error during execution: "), label
        assert any(reason in message.content for reason in ("is not a Python identifier", "has no parameter",
                                                            "is not available")), f"{label}: {message.content}"
    assert env._multi.answer == [[]]  # nothing rejected was recorded for BFCL's checker to replay


def test_code_in_values_stays_a_string(episode, tmp_path):
    env, _ = episode
    marker = tmp_path / "INJECTED"
    for label, action in _value_probes(marker).items():
        result = env.step(action)
        assert not marker.exists(), f"{label}: code ran"
        assert not result.done and len(result.observation) == 1, label
        content = result.observation[0].content
        assert "error" in content.lower(), f"{label}: {content[:200]}"  # the tool's own error: no such folder
        if label != "nested code strings":  # the code came back as (part of) the folder name it looked for
            assert "No such directory" in content and "__import__('os')" in content, label
    recorded = [s for turn in env._multi.answer for step in turn for s in step]
    assert len(recorded) == len(_value_probes(marker)) and all(s.startswith("cd(folder=") for s in recorded)
    assert not marker.exists()


def test_an_unreadable_call_is_a_parse_error_not_an_exception(episode):
    env, _ = episode
    result = env.step(_hermes("cd(folder='document')#", {}))  # an invalid JSON function name: a parse error
    assert not result.done and "invalid function name" in result.info["parse_error"]


def test_rejected_calls_do_not_stop_valid_calls_in_the_same_action(episode):
    env, _ = episode
    result = env.step(_hermes("cd", {"bogus": "x"}) + _hermes("cd", {"folder": "document"}) + _hermes("pwd", {}))
    contents = [m.content for m in result.observation]
    assert "'cd' has no parameter 'bogus'" in contents[0]
    assert "document" in contents[1] and "Error" not in contents[1]
    assert "document" in contents[2]
    assert env._multi.answer[-1] == [["cd(folder='document')", "pwd()"]]


def test_hostile_nesting_through_env_step_is_a_failed_step_not_an_exception(episode):
    env, task = episode
    for action in ['[cd(folder=' + '[' * 1000 + ']' * 1000 + ')]',
                   '{"name": "cd", "arguments": ' + '[' * 10000 + ']' * 10000 + '}',
                   '[cd(folder=' + '-' * 100000 + '1)]']:
        env.reset(task)
        result = env.step(action)
        assert "nested deeper" in result.info["parse_error"] and not result.done
    single = make_env("bfcl", categories=["simple"])
    single.reset(single.tasks("train", limit=1)[0])
    result = single.step('[f(a=' + '[' * 1000 + ']' * 1000 + ')]')
    assert result.done and result.reward == 0.0 and result.info["error_type"] == "ast_decoder:decoder_failed"


def test_checker_rejects_strings_that_are_not_checked_literal_calls():
    signatures = api_signatures(("GorillaFileSystem",))
    assert signatures["cd"] == frozenset({"folder"})
    check_call_string("cd(folder='a')", signatures)
    check_call_string("cd('a')", signatures)  # BFCL's ground truth uses positional literals
    for bad in ["cd(x=__import__('os').getcwd(), folder='a')", "cd(folder='a', bogus=1)",
                "cd(__class__=1)", "open(file='x')", "cd(folder='a'); exit()", "cd('a', 'b')"]:
        with pytest.raises(ValueError, match="rejected"):
            check_call_string(bad, signatures)


def test_verdict_refuses_an_answer_with_unchecked_code(tmp_path):
    task = make_env("bfcl", categories=["base"]).tasks("test", limit=1)[0]
    marker = tmp_path / "INJECTED"
    answer = [[[f"cd(x=__import__('os').system('touch {marker}'), folder='document')"]]]
    answer += [[] for _ in task.meta["ground_truth"][1:]]
    with pytest.raises(ValueError, match="rejected"):
        multi_turn_verdict(task, answer)
    assert not marker.exists()
