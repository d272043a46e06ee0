"""EnvScaler episode rules: lopd's ``official`` rules replayed against a transcription of the official code.

``official_episode`` below transcribes EnvScaler's evaluation loop (RUC-NLPIR/EnvScaler at 87e6673):
``interact_with_env/agent/task_solve_agent.py`` (``run``, ``step``), ``interact_with_env/envscaler_env/
base_env.py`` (``step``, ``check_vaild_action``, ``calculate_reward``), ``envscaler_env/rl_non_conv_env.py``
(``is_action_terminated``), ``envscaler_env/utils/parse_util.py`` (``parse_response``, ``parse_action``) and
``envscaler_env/utils/env_util.py`` (``init_env_instance``, ``get_state_info``, ``run_check_function``).
It runs the fixture environment in this process (test fixtures, not model code).
"""
from __future__ import annotations

import json
import re
import types
from copy import deepcopy

import pytest

from stages.envs import EnvError, make_env
from stages.envs.envscaler_data import FIXTURES_DIR
from stages.envs.envscaler_rules import official_action
from tests.test_env_envscaler import all_tasks, call


def _rows(name: str) -> dict[str, dict]:
    rows = [json.loads(line) for line in (FIXTURES_DIR / name).read_text().splitlines() if line.strip()]
    return {r.get("task_id") or r["env_id"]: r for r in rows}


def _state(instance) -> dict:  # env_util.get_state_info
    return deepcopy({k: v for k, v in vars(instance).items() if not (k.startswith("__") and k.endswith("__"))})


def _parse_response(text: str):  # parse_util.parse_response
    ok, result = True, {"reasoning_content": None, "tool_calls": None, "content": None}
    text = text.strip()
    think = re.search(r'(?:<|@)think(?:>|@)\s*(.*?)(?:<|@)/think(?:>|@)', text, re.DOTALL | re.IGNORECASE)
    if think:
        result["reasoning_content"] = think.group(1).strip()
    elif re.search(r'(?:<|@)think(?:>|@)', text, re.IGNORECASE):
        ok = False
    calls = list(re.finditer(r'<tool_call>\s*(\{.*?\})\s*</tool_call>', text, re.DOTALL))
    content = None
    if calls:
        match, content = calls[0], calls[0].group(1)
    elif "<tool_call>" in text and "</tool_call>" not in text:
        ok = False
        result["tool_calls"] = [{"error": "Unclosed <tool_call> tag"}]
    if think and content:
        result["content"] = text[think.end():match.start()].strip()
    elif think and not content:
        result["content"] = text[think.end():].strip()
    elif not think and content:
        result["content"] = text[:match.start()].strip()
    else:
        result["content"] = text.strip()
    if content:
        try:
            d = json.loads(content)
            if [f for f in ["name", "arguments"] if f not in d]:
                ok = False
            else:
                result["tool_calls"] = [{"function": d}]
        except json.JSONDecodeError:
            ok = False
    return ok, result


def _parse_action(r: dict):  # parse_util.parse_action
    try:
        if r.get("tool_calls"):
            action = deepcopy(r["tool_calls"][0]["function"])
            if isinstance(action["arguments"], str):
                action["arguments"] = json.loads(action["arguments"])
        elif r.get("content"):
            action = {"name": "chat_with_user", "arguments": {"content": r.get("content")}}
        else:
            return False, {}
        return True, action
    except Exception:
        return False, {}


def official_episode(task_id: str, replies: list[str], max_steps: int = 30) -> float:
    """The total reward EnvScaler's evaluation gives ``replies`` on fixture task ``task_id``."""
    task = _rows("tasks.jsonl")[task_id]
    env = _rows("environments.jsonl")[task["env_id"]]
    module = types.ModuleType("dynamic_env")
    exec(env["env_class_code"], module.__dict__)  # noqa: S102 -- the bundled fixture's class
    cls, init_config = getattr(module, task["env_class_name"]), deepcopy(task["init_config"])
    try:
        instance = cls(init_config) if init_config and isinstance(init_config, dict) else cls({})
    except TypeError:
        instance = cls()
    for key, value in init_config.items():
        setattr(instance, key, value)
    init_state = _state(instance)

    def reward() -> float:  # base_env.calculate_reward + env_util.run_check_function
        results = []
        for item in task["checklist_with_func"]:
            scope = {"__builtins__": __builtins__, "initial_state": deepcopy(init_state)}
            try:
                exec(item["check_func"], scope)  # noqa: S102 -- the bundled fixture's checks
                out = scope["check_func"](_state(instance))
                results.append(out if isinstance(out, bool) else None)
            except Exception:
                results.append(None)
        return round(sum(r for r in results if r is not None) / len(results), 4)

    def env_step(raw: str) -> tuple[float, bool]:  # base_env.step
        ok, struct = _parse_response(raw)
        if not ok:
            return 0.0, False
        ok, action = _parse_action(struct)
        if not ok:
            return 0.0, False
        name, params = action.get("name"), action.get("arguments", {})
        if not (hasattr(instance, name) or name == "chat_with_user"):
            return 0.0, False
        if not isinstance(params, dict) or (name == "chat_with_user" and "content" not in params):
            return 0.0, False
        if name == "chat_with_user":  # rl_non_conv_env.is_action_terminated
            return reward(), True
        try:
            f"{getattr(instance, name)(**params)}"
            return 0.0, False
        except Exception:
            return 0.0, True

    total, steps, terminated, truncated, pending = 0.0, 0, False, False, iter(replies)
    while not terminated and not truncated and steps < max_steps:  # task_solve_agent.run
        raw = next(pending)
        if "</think>" in raw:
            raw = raw.split("</think>")[-1].strip()
        if raw == "":
            r, terminated, truncated = 0, True, True
        else:
            r, terminated = env_step(raw)
        steps += 1
        total += float(r or 0.0)
    return total


def lopd_episode(task_id: str, replies: list[str], rules: str, max_steps: int = 30):
    env = make_env("envscaler", max_turns=max_steps, episode_rules=rules)
    env.reset(all_tasks(env)[task_id])
    try:
        for reply in replies:
            result = env.step(reply)
            if result.done:
                return result
        raise AssertionError("episode did not end")
    finally:
        env.close()


CHECKOUT = call("checkout_book", member_id="M-100", book_id="B-2")
# (case, fixture task, replies, step cap, lopd's reward before the official rules = the lenient rules)
CASES = [
    ("a raising tool (wrong keyword), then a correct retry", "lib-001",
     [call("checkout_book", member="M-100", book_id="B-2"), CHECKOUT, "Task Completed"], 30, 1.0),
    ("correct actions, step cap reached without a final reply", "lib-001",
     [call("search_books", query="Dune"), CHECKOUT], 2, 1.0),
    ("the needed call second in a reply of two", "lib-001",
     [call("search_books", query="Dune") + CHECKOUT, "Task Completed"], 30, 1.0),
    ("an empty reply after the think block", "lib-001", [CHECKOUT, "<think>all done</think>\n"], 30, 1.0),
    ("an unknown tool and a malformed call are observations", "lib-001",
     [call("rm_rf", path="/"), '<tool_call>{"name": "checkout_book", "arguments": {broken}}</tool_call>', CHECKOUT,
      "Task Completed"], 30, 1.0),
    ("a tool call with no closing brace is read as the final reply", "lib-001",
     ['<tool_call>{"name": "checkout_book", "arguments": [</tool_call>', CHECKOUT, "Task Completed"], 30, 1.0),
    ("a chat_with_user tool call is the final reply", "lib-001",
     [CHECKOUT, call("chat_with_user", content="Task Completed"), "Task Completed"], 30, 1.0),
    ("text before the call: the call runs", "lib-001", ["I will check it out. " + CHECKOUT, "Done."], 30, 1.0),
]


@pytest.mark.parametrize("case, task_id, replies, cap, before", CASES, ids=[c[0] for c in CASES])
def test_official_rules_give_the_official_reward(case, task_id, replies, cap, before):
    official = official_episode(task_id, replies, cap)
    result = lopd_episode(task_id, replies, "official", cap)
    assert result.reward == official, (case, result.info)
    assert result.info["episode_rules"] == "official"
    lenient = lopd_episode(task_id, replies, "lenient", cap)
    assert lenient.reward == before and lenient.info["episode_rules"] == "lenient"


def test_the_cases_differ_where_the_issue_says():
    """The official numbers of issue 33 on lib-001: 0.0, 0.0, 0.3333 and 0.0 for the first four cases."""
    assert [official_episode(t, r, cap) for _, t, r, cap, _ in CASES[:4]] == [0.0, 0.0, 0.3333, 0.0]
    ends = [lopd_episode(t, r, "official", cap).info["end"] for _, t, r, cap, _ in CASES[:4]]
    assert ends == ["tool_error", "step_cap", "final_answer", "empty_reply"]


@pytest.mark.parametrize("reply, kind", [
    ("", "empty"), ("<think>x</think>", "empty"), ("<think>unclosed", "error"), ("<tool_call>{}", "error"),
    ('<tool_call>{"name": "f"}</tool_call>', "error"), ('<tool_call>{"name": "f", "arguments": "{x"}</tool_call>', "error"),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "error"), ("@think@a@/think@", "error"),
    ('<tool_call>{"name": "chat_with_user", "arguments": {}}</tool_call>', "error"), ("   ", "error"),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "call"), ("Task Completed", "chat"),
])
def test_reply_forms_read_as_the_official_parser_reads_them(reply, kind):
    act = official_action(reply)
    assert act.kind == kind
    if kind == "call":
        assert (act.name, act.arguments) == ("f", {"a": 1})
    if kind != "empty":  # the transcription reads an action exactly when lopd does
        ok, struct = _parse_response(reply)
        ok, action = _parse_action(struct) if ok else (False, {})
        args = action.get("arguments")
        valid = ok and isinstance(args, dict) and (action["name"] != "chat_with_user" or "content" in args)
        assert valid == (kind in ("call", "chat"))


def test_official_observations_are_the_official_texts():
    env = make_env("envscaler")
    env.reset(all_tasks(env)["lib-001"])
    assert env.step(call("rm_rf", path="/")).observation[0].content == "Error: Invalid action"
    bad = env.step("<tool_call>{broken}</tool_call>").observation[0]
    assert bad.role == "user" and bad.content == "Error: Failed to parse response to struct response"
    found = env.step(call("search_books", query="Dune")).observation[0]
    assert found.role == "tool" and found.content.startswith("{'success': True, 'data': [{'book_id': 'B-2'")  # str()
    env.close()


def test_rules_default_by_environment_and_bad_names_are_refused():
    assert make_env("envscaler").episode_rules == "official"
    assert make_env("lopd-bed").episode_rules == "exact"
    assert make_env("lopd-bed", episode_rules="official").episode_rules == "official"
    assert "episode rules: official" in make_env("envscaler").data_source
    with pytest.raises(EnvError, match="episode_rules must be one of official, lenient, got 'strict'"):
        make_env("envscaler", episode_rules="strict")
    with pytest.raises(EnvError, match="episode_rules must be one of official, lenient, got 'exact'"):
        make_env("envscaler", episode_rules="exact")  # EnvScaler data keeps its own rules


def test_episode_rules_flag_is_refused_where_an_environment_has_one_set(tmp_path):
    from typer.testing import CliRunner

    from lopd_cli.main import app
    from stages.collect import CollectConfig

    with pytest.raises(EnvError, match="env 'bfcl' has one set of episode rules; only acebench, envscaler, lopd-bed"):
        make_env("bfcl", episode_rules="lenient")
    for args in (["collect", "--env", "bfcl", "--store", str(tmp_path / "s")],
                 ["evaluate", "--bench", "bfcl-v3", "--out", str(tmp_path / "e.json")]):
        result = CliRunner().invoke(app, [*args, "--episode-rules", "lenient"])
        assert result.exit_code != 0
        where = "--bench bfcl-v3 (environment bfcl)" if args[0] == "evaluate" else "env 'bfcl'"
        assert f"--episode-rules: {where} has one set of episode rules" in result.output
        assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["collect", "--env", "lopd-bed", "--episode-rules", "strict",
                                      "--store", str(tmp_path / "s")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "invalid option --episode-rules: Input should be 'official', 'lenient' or 'exact' (got 'strict')" in result.output
    assert not (tmp_path / "s").exists()
    ruled = CollectConfig(env="lopd-bed", store=str(tmp_path / "s"), episode_rules="official")
    assert ruled.model_dump()["episode_rules"] == "official"


def test_evaluate_plays_the_rules_it_is_given():
    from stages.benches import BENCHES
    from stages.evaluate import EvaluateConfig

    for rules in (None, "official"):
        config = EvaluateConfig(bench="lopd-bed", model="unused", limit=1, episode_rules=rules)
        run = BENCHES["lopd-bed"].prepare(config)
        env = run.env_factory()
        assert env.episode_rules == (rules or "exact")
        assert run.rules == f"lopd-bed episode rules: {rules or 'exact'}"
