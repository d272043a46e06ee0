"""The multi-turn rollout loop, with a scripted engine and a toy environment (no model needed)."""
from __future__ import annotations

import json

import pytest

from schemas import Message, Task, ToolCall
from stages.engines import Generation, SamplingParams, row_seed
from stages.engines.rollout import OVERFLOW_WARNINGS, RolloutStats, play
from stages.envs import StepResult
from tests.tiny import tiny_tokenizer


class CounterEnv:
    """Reward 1 once the agent has called inc() `target` times and then answers in plain text."""

    name = "counter"

    def __init__(self, max_turns: int = 30, fail_reset: bool = False, fail_step: bool = False):
        self.max_turns = max_turns
        self.fail_reset, self.fail_step = fail_reset, fail_step
        self.closed = False

    def reset(self, task: Task) -> list[Message]:
        if self.fail_reset:
            raise RuntimeError("cannot start")
        self.count, self.target = 0, task.meta["target"]
        return [Message(role="system", content="count"), Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        if self.fail_step:
            raise RuntimeError("boom")
        if action.startswith("inc"):
            self.count += 1
            call = ToolCall(name="inc")
            return StepResult([Message(role="tool", name="inc", content=str(self.count))], tool_calls=[call])
        ok = self.count == self.target
        return StepResult([], reward=1.0 if ok else 0.0, done=True, info={"success": ok, "count": self.count})

    def reference_actions(self, task: Task) -> list[str]:
        return ["inc()"] * task.meta["target"] + ["done"]

    def close(self) -> None:
        self.closed = True


class ScriptedEngine:
    """Answers each prompt by how many tool responses it already contains."""

    def __init__(self, incs: int):
        self.incs, self.calls = incs, []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.calls.append((len(prompts), params.seeds))
        tok = tiny_tokenizer()
        out = []
        for p in prompts:
            done = tok.decode(p).count("<tool_response>")
            text = "inc()" if done < self.incs else "done"
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out.append(Generation(text=text, token_ids=ids, logprobs=[-1.0] * len(ids), num_tokens=len(ids),
                                  finish_reason="eos"))
        return out


def _tasks(n: int, target: int = 2) -> list[Task]:
    return [Task(task_id=f"t{i}", env="counter", split="train", prompt=f"count to {target}",
                 metadata=json.dumps({"target": target})) for i in range(n)]


def _play(engine, envs, tasks, **kw):
    made = []

    def factory():
        made.append(envs())
        return made[-1]

    params = SamplingParams(temperature=0.0, max_new_tokens=4, seed=kw.pop("seed", 5))
    out = list(play(engine, tiny_tokenizer(), factory, tasks, params=params, policy_id="p",
                    run_id="r", **kw))
    return out, made


def test_multi_turn_episode_records_turns_and_reward():
    trajs, envs = _play(ScriptedEngine(incs=2), CounterEnv, _tasks(3), samples_per_task=2, max_concurrent=4)
    assert len(trajs) == 6 and {t.task_id for t in trajs} == {"t0", "t1", "t2"}
    for t in trajs:
        assert t.reward == 1.0 and t.success
        assert [turn.action for turn in t.turns] == ["inc()", "inc()", "done"]
        assert t.num_steps == 3 and t.num_tool_calls == 2
        assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert json.loads(t.info)["count"] == 2
    assert all(e.closed for e in envs) and len(envs) == 6
    # ids are unique within the run and the same when the run is played again
    again, _ = _play(ScriptedEngine(incs=2), CounterEnv, _tasks(3), samples_per_task=2, max_concurrent=4)
    assert len({t.trajectory_id for t in trajs}) == 6
    assert sorted(t.trajectory_id for t in again) == sorted(t.trajectory_id for t in trajs)


def test_wrong_policy_gets_zero_and_each_turn_gets_its_row_seed():
    engine = ScriptedEngine(incs=1)
    trajs, _ = _play(engine, CounterEnv, _tasks(2), samples_per_task=1, seed=10)
    assert [t.reward for t in trajs] == [0.0, 0.0] and not any(t.success for t in trajs)
    # row_seed(seed, task position, sample, turn)
    assert [seeds for _, seeds in engine.calls] == [[row_seed(10, 0, 0, 0), row_seed(10, 1, 0, 0)],
                                                   [row_seed(10, 0, 0, 1), row_seed(10, 1, 0, 1)]]


def test_step_cap_ends_episode_without_reward():
    stats = RolloutStats()
    trajs, _ = _play(ScriptedEngine(incs=100), lambda: CounterEnv(max_turns=4), _tasks(1),
                     samples_per_task=1, stats=stats)
    assert trajs[0].num_steps == 4 and trajs[0].reward == 0.0
    assert json.loads(trajs[0].info)["stopped"] == "step cap reached"
    assert stats.episodes == 1 and stats.generated_tokens == sum(len(t.token_ids) for t in trajs[0].turns) > 4


@pytest.mark.parametrize("kind", ["fail_reset", "fail_step"])
def test_environment_failure_fails_the_episode_not_the_run(kind):
    trajs, _ = _play(ScriptedEngine(incs=2), lambda: CounterEnv(**{kind: True}), _tasks(2), samples_per_task=2)
    assert len(trajs) == 4 and len({t.trajectory_id for t in trajs}) == 4
    for t in trajs:
        assert t.reward == 0.0 and not t.success
        assert "failed" in json.loads(t.info)["error"]


def test_batch_stays_full():
    engine = ScriptedEngine(incs=2)
    _play(engine, CounterEnv, _tasks(5), samples_per_task=1, max_concurrent=2)
    assert max(n for n, _ in engine.calls) == 2
    assert sum(n for n, _ in engine.calls) == 15  # 5 episodes x 3 actions


def test_reference_mode_plays_reference_actions_through_the_env():
    trajs, _ = _play(None, CounterEnv, _tasks(2, target=3), samples_per_task=1, reference=True)
    for t in trajs:
        assert [turn.action for turn in t.turns] == ["inc()"] * 3 + ["done"]
        assert t.reward == 1.0 and json.loads(t.info)["count"] == 3


def _long_task(words: int) -> Task:
    return Task(task_id="long", env="counter", split="train", prompt="count to 2" + " please" * words,
                metadata=json.dumps({"target": 2}))


def test_a_prompt_past_the_context_window_ends_its_episode_scored_0_and_the_run_goes_on():
    """The engine's window: a task whose opening prompt overflows ends before any call, one
    warning line names it, its token count, the window and the flags; the others play on."""
    full, _ = _play(ScriptedEngine(incs=2), CounterEnv, _tasks(1), samples_per_task=1)
    last_prompt = len(full[0].turns[-1].context_ids) + sum(len(t.context_ids) + len(t.token_ids)
                                                           for t in full[0].turns[:-1])
    engine = ScriptedEngine(incs=2)
    engine.context_window = last_prompt + 4  # max_new_tokens 4: a whole normal episode just fits
    stats = RolloutStats()
    with pytest.warns(RuntimeWarning) as caught:
        trajs, envs = _play(engine, CounterEnv, [*_tasks(2), _long_task(200)], samples_per_task=1, stats=stats)
    by_id = {t.task_id: t for t in trajs}
    assert set(by_id) == {"t0", "t1", "long"} and all(e.closed for e in envs)
    assert by_id["t0"].reward == by_id["t1"].reward == 1.0
    long = by_id["long"]
    info = json.loads(long.info)
    assert long.reward == 0.0 and not long.success and long.turns == []
    assert info["stopped"] == "context window" and info["context_window"] == last_prompt + 4
    assert stats.context_overflows == 1 and stats.episodes == 3
    (warning,) = [str(w.message) for w in caught]
    assert warning == (f"task long (sample 0): the prompt of turn 1 is {info['context_tokens']} tokens, with "
                       f"--max-new-tokens 4 over the model's context window of {last_prompt + 4}: episode ended, "
                       "scored 0 (the prompt alone fills it: a --model with a longer context)")
    assert info["context_tokens"] + 4 > last_prompt + 4 and "\n" not in warning


def test_a_context_that_outgrows_the_window_mid_episode_keeps_its_turns():
    full, _ = _play(ScriptedEngine(incs=2), CounterEnv, _tasks(1), samples_per_task=1)
    first = len(full[0].turns[0].context_ids)
    stats = RolloutStats()
    with pytest.warns(RuntimeWarning, match=r"the prompt of turn 2 is .* scored 0 \(lower --max-new-tokens or "
                                            r"--max-turns, or a --model with a longer context\)") as caught:
        trajs, _ = _play(ScriptedEngine(incs=2), CounterEnv, _tasks(7), samples_per_task=1, stats=stats,
                         context_window=first + 4)  # turn 1 fits, turn 2 does not
    assert [t.num_steps for t in trajs] == [1] * 7 and all(t.reward == 0.0 for t in trajs)
    assert all(json.loads(t.info)["stopped"] == "context window" for t in trajs)
    assert stats.context_overflows == 7  # counted, though only the first few are warned about
    assert len(caught) == OVERFLOW_WARNINGS and "(further overflows are only counted)" in str(caught[-1].message)


def test_the_hf_engine_s_window_is_the_model_s_positions():
    from stages.engines.hf import HFRolloutEngine
    from tests.tiny import tiny_model

    tok = tiny_tokenizer()
    model = tiny_model(tok)
    assert HFRolloutEngine(model, tok).context_window == model.config.max_position_embeddings == 8192


def test_an_opening_prompt_that_fits_but_not_its_token_budget_names_max_new_tokens():
    full, _ = _play(ScriptedEngine(incs=2), CounterEnv, _tasks(1), samples_per_task=1)
    first = len(full[0].turns[0].context_ids)
    with pytest.warns(RuntimeWarning, match=r"turn 1 is .* scored 0 \(lower --max-new-tokens, or a --model with a "
                                            r"longer context\)$"):
        trajs, _ = _play(ScriptedEngine(incs=2), CounterEnv, _tasks(1), samples_per_task=1, context_window=first + 2)
    assert trajs[0].turns == [] and json.loads(trajs[0].info)["context_tokens"] == first
