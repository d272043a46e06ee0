"""EnvScaler's conversational episodes (stages.envs.envscaler_conv): a scripted user plays the
user; the tiny model plays agent and user once."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.envs import EnvError, envscaler_conv, make_env
from stages.envs.envscaler_conv import CONV_NOTE, OPENING, STOP, parse_user_reply
from stages.envs.envscaler_data import FIXTURES_DIR

TASKS = Path(__file__).parent / "fixtures" / "envscaler_conv_tasks.jsonl"
CONV_IDS = {"conv-lib-001", "conv-lib-002", "conv-cal-001"}


def call(name: str, **args) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


class ScriptedUser:
    """A user that says its lines in order (then ###STOP### forever) and records what it heard."""

    def __init__(self, lines: list[str]):
        self.lines, self.heard = list(lines), []

    def opening(self) -> str:
        return self.lines.pop(0)

    def reply(self, agent_message: str) -> str:
        self.heard.append(agent_message)
        return self.lines.pop(0) if self.lines else STOP


def env_with(monkeypatch, lines: list[str], **kwargs):
    """An envscaler env on the conversational fixture whose users are ScriptedUser(lines); returns
    (env, the tasks by id, the started users)."""
    users: list[tuple[str, ScriptedUser]] = []

    def start(model, prompt):
        users.append((prompt, ScriptedUser(lines)))
        return users[-1][1]

    monkeypatch.setattr(envscaler_conv, "start_user", start)
    env = make_env("envscaler", envs_file=FIXTURES_DIR / "environments.jsonl", tasks_file=TASKS,
                   user_model="scripted", **kwargs)
    tasks = {t.task_id: t for split in ("train", "test") for t in env.tasks(split)}
    return env, tasks, users


def test_user_message_flow_and_stop_scores_the_state(monkeypatch):
    env, tasks, users = env_with(monkeypatch, ["I'd like to borrow a book.", "It's Dune, for member M-100.", STOP])
    task = tasks["conv-lib-001"]
    assert task.meta["conversational"] and task.meta["user_model"] == "scripted"
    messages = env.reset(task)
    prompt, user = users[0]
    assert "{task}" not in prompt and task.prompt in prompt  # the task fills the row's template
    assert messages[0].content.endswith(CONV_NOTE) and "Task Completed" not in messages[0].content
    assert messages[1].role == "user" and messages[1].content == "I'd like to borrow a book."
    asked = env.step("Which book, and for which member?")  # no tool call: goes to the user
    assert not asked.done and asked.observation[0].role == "user"
    assert asked.observation[0].content == "It's Dune, for member M-100."
    assert user.heard == ["Which book, and for which member?"]
    found = env.step(call("search_books", query="Dune"))
    assert not found.done and found.observation[0].role == "tool"
    assert not env.step(call("checkout_book", member_id="M-100", book_id="B-2")).done
    end = env.step(call("chat_with_user", content="Done: Dune is checked out to M-100."))
    assert end.done and end.reward == 1.0 and end.info["end"] == "user_stop" and end.info["success"]
    assert user.heard[-1] == "Done: Dune is checked out to M-100."


def test_task_completed_is_a_message_and_stop_before_the_work_scores_the_untouched_state(monkeypatch):
    env, tasks, _ = env_with(monkeypatch, ["Hi, I need to borrow Dune.", "Thanks!", STOP])
    env.reset(tasks["conv-lib-001"])
    first = env.step("Task Completed")  # no agent action ends a conversational episode
    assert not first.done and first.observation[0].content == "Thanks!"
    end = env.step("Anything else?")
    assert end.done and end.info["end"] == "user_stop" and not end.info["success"]
    assert end.reward == round(end.info["passed"] / end.info["total"], 4) < 1.0  # checks on the initial state


def test_partial_reward_is_rounded_share_of_checks(monkeypatch):
    env, tasks, _ = env_with(monkeypatch, ["Book a design review, please.", STOP])
    task = tasks["conv-cal-001"]
    env.reset(task)
    end = env.step("Booked?")
    total = task.meta["num_checks"]
    assert end.done and end.reward == round(end.info["passed"] / total, 4)


def test_step_cap_of_40_scores_zero(monkeypatch):
    env, tasks, _ = env_with(monkeypatch, ["Hello."] + ["Go on."] * 100)
    assert env.conv_max_turns == 40
    env.reset(tasks["conv-lib-001"])
    env.step(call("checkout_book", member_id="M-100", book_id="B-2"))  # the right state, never stopped
    for step in range(2, 40):
        assert not env.step(f"Question {step}?").done
    end = env.step("Question 40?")
    assert end.done and end.reward == 0.0 and end.info["end"] == "step_cap" and end.info["steps"] == 40


def test_lenient_step_cap_scores_the_state(monkeypatch):
    env, tasks, _ = env_with(monkeypatch, ["Hello."] + ["Go on."] * 10, episode_rules="lenient", conv_max_turns=2)
    env.reset(tasks["conv-lib-001"])
    env.step(call("checkout_book", member_id="M-100", book_id="B-2"))
    end = env.step("All done?")
    assert end.done and end.info["end"] == "step_cap" and end.reward == 1.0


def test_raising_tool_and_empty_reply_score_zero(monkeypatch):
    env, tasks, _ = env_with(monkeypatch, ["Hello."] + ["Go on."] * 10)
    env.reset(tasks["conv-lib-001"])
    end = env.step(call("checkout_book", member="M-100", book_id="B-2"))  # wrong keyword: raises
    assert end.done and end.reward == 0.0 and end.info["end"] == "tool_error"
    env.reset(tasks["conv-lib-001"])
    end = env.step("<think>hmm</think>")
    assert end.done and end.reward == 0.0 and end.info["end"] == "empty_reply"


def test_without_a_user_model_conversational_tasks_are_skipped_and_refused(monkeypatch):
    env = make_env("envscaler", envs_file=FIXTURES_DIR / "environments.jsonl", tasks_file=TASKS)
    ids = {t.task_id for split in ("train", "test") for t in env.tasks(split)}
    assert ids == {"lib-003"}
    _, tasks, _ = env_with(monkeypatch, [STOP])
    assert set(tasks) == CONV_IDS | {"lib-003"} and "conversational" not in tasks["lib-003"].meta
    with pytest.raises(EnvError, match="conversational task and needs a user model"):
        env.reset(tasks["conv-lib-001"])


def test_parse_user_reply():
    assert parse_user_reply("# Thought: done\n# Reply: ###STOP###") == STOP
    assert parse_user_reply("blah ###STOP### blah") == STOP
    assert parse_user_reply("# Thought:\nI want Dune.\n# Reply:\nCan I borrow Dune?") == "Can I borrow Dune?"
    assert parse_user_reply("no format") is None


def test_tiny_model_as_user(tmp_path, monkeypatch):
    """One conversational episode with the tiny model as the user (scripted agent actions): the user
    opens, the agent's message reaches it with the [Agent] prefix, the step cap ends the episode."""
    from tests.tiny import save_tiny

    monkeypatch.setattr(envscaler_conv, "start_user", lambda m, p: envscaler_conv.EnvScalerUser(m, p, max_new_tokens=8))
    tiny = str(save_tiny(tmp_path / "tiny"))
    env = make_env("envscaler", envs_file=FIXTURES_DIR / "environments.jsonl", tasks_file=TASKS,
                   user_model=tiny, conv_max_turns=2)
    task = next(t for split in ("train", "test") for t in env.tasks(split) if t.task_id == "conv-lib-001")
    env.reset(task)
    assert env._user.messages[:2] == [{"role": "system", "content": env.data.tasks[task.task_id].user_prompt},
                                      {"role": "user", "content": OPENING}]
    first = env.step("Which book would you like?")
    assert first.done or first.observation[0].role == "user"
    if not first.done:
        assert env._user.messages[-2]["content"] == "[Agent] Which book would you like?"
        assert env.step("Anything else?").done  # the step cap


def test_evaluate_with_the_tiny_model_as_agent_and_user(tmp_path, monkeypatch):
    """lopd evaluate --bench envscaler --user-model: the conversational tasks are played (tiny model
    as agent and user) and the user model is named in the report's rules; without it they are left out."""
    import shutil

    from rich.console import Console

    from stages.evaluate import EvaluateConfig, run
    from tests.tiny import save_tiny

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(FIXTURES_DIR / "environments.jsonl", data / "environments.jsonl")
    shutil.copy(TASKS, data / "tasks.jsonl")
    monkeypatch.setattr(envscaler_conv, "start_user", lambda m, p: envscaler_conv.EnvScalerUser(m, p, max_new_tokens=8))
    tiny = str(save_tiny(tmp_path / "tiny"))
    quiet = Console(file=open("/dev/null", "w"))
    plain = make_env("envscaler", data_dir=data)
    played = make_env("envscaler", data_dir=data, user_model=tiny)
    assert plain.tasks("test") == [] and [t.task_id for t in played.tasks("test")] == ["conv-lib-002"]
    report = run(EvaluateConfig(bench="envscaler", data_dir=str(data), model=tiny, user_model=tiny,
                                max_new_tokens=4, out=str(tmp_path / "r.json")), quiet)
    assert f"simulated user of the conversational tasks: {tiny}" in report["rules"]
    assert 0.0 <= report["scores"]["mean_reward"] <= 1.0


def test_conversation_option_plays_every_task_with_the_default_user_prompt(monkeypatch):
    env, tasks, users = env_with(monkeypatch, ["Hi.", STOP], conversation=True)
    assert tasks["lib-003"].meta["conversational"]
    env.reset(tasks["lib-003"])
    prompt = users[0][0]
    assert tasks["lib-003"].prompt in prompt and "{task}" not in prompt and "# Reply:" in prompt and STOP in prompt
    assert env.step("How can I help?").done
