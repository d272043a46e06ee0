"""Batch building for the latent teacher (stages/core/latent/contexts.py) on the tiny tokenizer."""
from __future__ import annotations

import json

import pytest
import torch

from schemas import Message, ToolCall, Trajectory, Turn
from stages.core.text.chat import tokenize_for_training
from stages.core.latent.contexts import (
    LatentBatch,
    build_batch,
    encode_experiences,
    composer_text,
    retrieve_experiences,
    shift_for_loss,
)
from stages.core.data.rows import trajectory_tools
from tests.tiny import tiny_tokenizer

TOOLS = [{"name": "get_weather", "description": "weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def traj(tid: str, task_id: str = "t0", *, prompt: str = "What is the weather in Paris?",
         turns: int = 1, reward: float = 1.0, tools: list | None = None) -> Trajectory:
    messages = [Message(role="system", content="You are a helpful assistant."),
                Message(role="user", content=prompt)]
    tlist = []
    for i in range(turns):
        action = f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "Paris{i}"}}}}</tool_call>'
        call = ToolCall(name="get_weather", arguments=json.dumps({"city": f"Paris{i}"}))
        messages += [Message(role="assistant", content=action, tool_calls=[call]),
                     Message(role="tool", content=f"sunny {i}", name="get_weather")]
        tlist.append(Turn(action=action, tool_calls=[call], observation=f"sunny {i}", action_tokens=9))
    info = json.dumps({"tools": tools}) if tools is not None else "{}"
    return Trajectory(trajectory_id=tid, task_id=task_id, env="bfcl", split="train", prompt=prompt,
                      policy="tiny", messages=messages, turns=tlist, reward=reward,
                      success=reward >= 1.0, num_steps=turns, num_tool_calls=turns, run_id="r",
                      info=info)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_composer_text():
    text = composer_text(traj("a", turns=2, reward=1.0))
    assert text.splitlines()[0] == "Task: What is the weather in Paris?"
    assert text.count("Action: <tool_call>") == 2 and "Observation: sunny 1" in text
    assert text.endswith("Outcome: reward=1.00")


def test_encode_experiences_shapes_and_padding_rows(tok):
    exps = [traj("e1", turns=2), traj("e2", prompt="What is 2+2?")]
    ids, mask = encode_experiences(tok, "What is the weather in Paris?", exps, J=4, max_exp_tokens=500)
    assert ids.shape == mask.shape and ids.shape[0] == 4
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    # right-padded, no all-padding row
    lengths = mask.sum(1)
    assert bool((lengths > 0).all())
    assert torch.equal(mask, torch.arange(ids.shape[1]) < lengths.unsqueeze(1))
    # rows 2 and 3 hold the task alone: identical, shorter, and decode to the task text
    assert torch.equal(ids[2], ids[3]) and lengths[2] < lengths[1]
    assert tok.decode(ids[2, : lengths[2]]) == "Current task: What is the weather in Paris?"
    # row 0 starts with the task and contains the experience
    row0 = tok.decode(ids[0, : lengths[0]])
    assert row0.startswith("Current task: What is the weather in Paris?") and "Paris1" in row0
    assert bool((ids[~mask] == tok.pad_token_id).all())


def test_encode_experiences_truncation_keeps_start(tok):
    full, _ = encode_experiences(tok, "What is 2+2?", [traj("e1", turns=3)], J=1, max_exp_tokens=10_000)
    cut, cut_mask = encode_experiences(tok, "What is 2+2?", [traj("e1", turns=3)], J=1, max_exp_tokens=12)
    assert cut.shape == (1, 12) and bool(cut_mask.all())
    assert torch.equal(cut[0], full[0, :12])
    # more experiences than J: only the first J are used
    ids, _ = encode_experiences(tok, "x", [traj("e1"), traj("e2", turns=2)], J=1, max_exp_tokens=10_000)
    assert ids.shape[0] == 1


def test_build_batch_shapes_and_insert_at(tok):
    trajs = [traj("a", turns=1, tools=TOOLS), traj("b", turns=3, tools=TOOLS)]
    exps = [[traj("e1"), traj("e2")], [traj("e3")]]
    batch = build_batch(tok, trajs, exps, J=2, max_exp_tokens=64)
    assert isinstance(batch, LatentBatch)
    B, T = batch.input_ids_BT.shape
    assert B == 2 and batch.attn_mask_BT.shape == batch.action_mask_BT.shape == (B, T)
    assert batch.attn_mask_BT.dtype == batch.action_mask_BT.dtype == torch.bool
    assert batch.exp_ids_BJL.shape[:2] == (2, 2) and batch.exp_mask_BJL.shape == batch.exp_ids_BJL.shape
    assert batch.exp_mask_BJL.any(-1).all()
    assert batch.trajectory_ids == ["a", "b"]
    assert batch.rewards_B.tolist() == [1.0, 1.0]
    for b, t in enumerate(trajs):
        ids, mask = tokenize_for_training(tok, t.messages, TOOLS)
        n = len(ids)
        assert torch.equal(batch.input_ids_BT[b, :n], ids)
        assert torch.equal(batch.action_mask_BT[b, :n], mask)
        assert int(batch.attn_mask_BT[b].sum()) == n
        assert not batch.action_mask_BT[b, n:].any()
        p = int(batch.insert_at_B[b])
        # insert_at = first action token; everything before it is prompt
        assert bool(batch.action_mask_BT[b, p]) and not batch.action_mask_BT[b, :p].any()
        assert batch.action_starts[b][0] == p
        # the first action begins exactly after the generation prompt of the initial state
        assert tok.decode(batch.input_ids_BT[b, :p]).endswith("<|im_start|>assistant\n")
        assert tok.decode(batch.input_ids_BT[b, p:p + 8]).startswith("<tool_call>")
    assert len(batch.action_starts[0]) == 1 and len(batch.action_starts[1]) == 3
    assert batch.num_action_tokens == int(batch.action_mask_BT.sum())


def test_tools_from_info_or_argument(tok):
    with_info = traj("a", tools=TOOLS)
    assert trajectory_tools(with_info) == TOOLS and trajectory_tools(traj("b")) == []
    from_info = build_batch(tok, [with_info], [[]], J=1, max_exp_tokens=32)
    explicit = build_batch(tok, [traj("a")], [[]], J=1, max_exp_tokens=32, tools=[TOOLS])
    none = build_batch(tok, [traj("a")], [[]], J=1, max_exp_tokens=32)
    assert torch.equal(from_info.input_ids_BT, explicit.input_ids_BT)
    assert none.input_ids_BT.shape[1] < from_info.input_ids_BT.shape[1]  # tools block missing
    assert "get_weather" in tok.decode(from_info.input_ids_BT[0, : int(from_info.insert_at_B[0])])


def test_truncation_keeps_start_and_errors(tok):
    t = traj("long", turns=3)
    full = build_batch(tok, [t], [[]], J=1, max_exp_tokens=32)
    p = int(full.insert_at_B[0])
    cut = build_batch(tok, [t], [[]], J=1, max_exp_tokens=32, max_len=p + 5)
    assert cut.input_ids_BT.shape == (1, p + 5)
    assert torch.equal(cut.input_ids_BT[0], full.input_ids_BT[0, : p + 5])
    assert torch.equal(cut.action_mask_BT[0], full.action_mask_BT[0, : p + 5])
    assert cut.action_starts == [[p]] and int(cut.insert_at_B[0]) == p
    # one action token left is fine; none left is an error naming the trajectory
    build_batch(tok, [t], [[]], J=1, max_exp_tokens=32, max_len=p + 1)
    with pytest.raises(ValueError, match="trajectory long: the prompt alone"):
        build_batch(tok, [t], [[]], J=1, max_exp_tokens=32, max_len=p)


def test_build_batch_errors(tok):
    with pytest.raises(ValueError, match="no trajectories"):
        build_batch(tok, [], [], J=1, max_exp_tokens=8)
    with pytest.raises(ValueError, match="experience lists"):
        build_batch(tok, [traj("a")], [], J=1, max_exp_tokens=8)
    no_action = traj("a").model_copy(update={"messages": [Message(role="user", content="hi")]})
    with pytest.raises(ValueError, match="trajectory a: no action tokens"):
        build_batch(tok, [no_action], [[]], J=1, max_exp_tokens=8)


def test_shift_for_loss(tok):
    batch = build_batch(tok, [traj("a"), traj("b", turns=2)], [[], []], J=1, max_exp_tokens=8)
    B, T = batch.input_ids_BT.shape
    logits = torch.randn(B, T, 7)
    lg, tgt, mask = shift_for_loss(logits, batch)
    assert lg.shape == (B, T - 1, 7) and tgt.shape == mask.shape == (B, T - 1)
    assert torch.equal(lg, logits[:, :-1]) and torch.equal(tgt, batch.input_ids_BT[:, 1:])
    assert torch.equal(mask, batch.action_mask_BT[:, 1:] & batch.attn_mask_BT[:, 1:])
    # the first action token is scored from the last prompt position
    p = int(batch.insert_at_B[0])
    assert bool(mask[0, p - 1]) and not mask[0, : p - 1].any()
    with pytest.raises(ValueError):
        shift_for_loss(logits[:, :-1], batch)


def test_batch_to_device(tok):
    batch = build_batch(tok, [traj("a")], [[traj("e")]], J=1, max_exp_tokens=8)
    moved = batch.to("cpu")
    assert torch.equal(moved.input_ids_BT, batch.input_ids_BT) and moved.trajectory_ids == ["a"]


class _FakeRetriever:
    def __init__(self):
        self.calls = []

    def retrieve(self, text, J, **kw):
        from stages.core.data.retrieval import Experience
        self.calls.append((text, J, kw))
        return [Experience(traj(f"x{i}"), 1.0, i) for i in range(J)]


def test_retrieve_experiences_arguments():
    r = _FakeRetriever()
    a, b = traj("a", task_id="t1"), traj("b", task_id="t2", prompt="What is 2+2?")
    out = retrieve_experiences(r, [a, b], 2, exclude_same_task=True)
    assert [[e.trajectory_id for e in row] for row in out] == [["x0", "x1"]] * 2
    text, J, kw = r.calls[1]
    assert (text, J) == ("What is 2+2?", 2)
    assert kw == {"success_only": True, "env": "bfcl", "split": None, "exclude_ids": {"b"},
                  "exclude_task_ids": {"t2"}}
    retrieve_experiences(r, [a], 1, split="train")
    assert r.calls[-1][2]["exclude_task_ids"] == set() and r.calls[-1][2]["split"] == "train"


def test_lopd_retrieval_follows_its_exclude_same_task_option():
    """LOPD's teacher context: train-split experiences only; the trajectory's own task is left
    out exactly when ``exclude_same_task`` (coldstart's setting) is on; on by default."""
    from types import SimpleNamespace

    from stages.methods import StepContext
    from stages.methods.lopd import LOPD, LOPDOptions

    r = _FakeRetriever()
    batch = SimpleNamespace(rows=[SimpleNamespace(trajectory=traj("a", task_id="t1"))])
    for flag, tasks in ((True, {"t1"}), (False, set())):
        me = SimpleNamespace(options=LOPDOptions(composer="c", J=2, exclude_same_task=flag))
        assert len(LOPD.prepare(me, batch, StepContext(None, r, None, 1))[0]) == 2
        assert r.calls[-1][2]["exclude_task_ids"] == tasks and r.calls[-1][2]["split"] == "train"
    assert LOPDOptions(composer="c").exclude_same_task is True  # the paper's framing: other tasks only


def test_lookup_tools_falls_back_to_the_environment_tasks():
    from stages.envs import lookup_tools, make_env

    recorded = traj("a", tools=TOOLS)
    unknown = traj("b").model_copy(update={"env": "no-such-env"})
    bfcl = traj("c", task_id="simple_0")  # env "bfcl", no tools in info
    got = lookup_tools([recorded, unknown, bfcl])
    expected = {t.task_id: t.tool_schemas for t in make_env("bfcl").tasks("train")}["simple_0"]
    assert got[0] == TOOLS and got[1] == [] and got[2] == expected and expected
