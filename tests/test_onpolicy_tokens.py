"""On-policy means on-policy: training rows hold exactly the ids the policy saw and sampled.

Decode-free checks on multi-turn episodes with tool calls (the tiny in-process model), truncated
actions, a store written by release 0.1 (no token ids) that still opens and trains, and a toy
method added through the registry (issue: method/engine seams).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from schemas import Message, Task, ToolCall
from stages.core.data.rows import trajectory_sequences, training_rows
from stages.core.data.store import ExperienceStore
from stages.core.latent.privileged import privileged_prefix
from stages.core.losses.lopd import masked_nll
from stages.core.models.student import student_logits
from stages.core.text.chat import action_spans
from stages.distill.recipe import DistillConfig, Distiller
from stages.engines import Generation, SamplingParams, make_engine
from stages.engines.rollout import play
from stages.envs import StepResult, register
from stages.methods import Method, get_method, known_methods
from stages.methods import register as register_method
from tests.test_distill import _hash_embedder, assets, make_config, metrics  # noqa: F401 (fixtures)
from tests.tiny import tiny_model, tiny_tokenizer

ENV = "toy-tools"
OLD_STORE = Path(__file__).parent / "fixtures" / "store_release_0_1"
WEATHER = ToolCall(name="get_weather", arguments='{"city": "Paris"}')


@register(ENV)
class ToolEnv:
    """Three actions: a tool result, then a user follow-up, then reward 1."""

    name = ENV

    def __init__(self, data_dir=None, max_turns: int = 30):
        self.max_turns, self.turn = max_turns, 0

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        return [Task(task_id=f"{split}-{i}", env=ENV, split=split, prompt=f"Weather in city {i}?")
                for i in range(3)][:limit]

    def reset(self, task: Task) -> list[Message]:
        self.turn = 0
        return [Message(role="system", content="You are a helpful assistant."),
                Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        self.turn += 1
        if self.turn == 1:
            return StepResult(observation=[Message(role="tool", name="get_weather", content="sunny, 21")],
                              tool_calls=[WEATHER])
        if self.turn == 2:
            return StepResult(observation=[Message(role="user", content="And tomorrow?")])
        return StepResult(observation=[], reward=1.0, done=True, info={"success": True})

    def close(self) -> None:
        pass


class Recorder:
    """An engine that remembers each prompt's ids and the generation it returned."""

    def __init__(self, engine):
        self.engine, self.seen = engine, {}

    def generate(self, prompt_ids, params):
        out = self.engine.generate(prompt_ids, params)
        for p, g in zip(prompt_ids, out):  # samples of one task share their first prompt
            self.seen.setdefault(tuple(p), []).append(g)
        return out


class Scripted:
    """An engine that returns scripted generations (turn 1 cut at the length, turn 2 ends with eos)."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def generate(self, prompt_ids, params):
        self.calls += 1
        body = self.tok("get the weather", add_special_tokens=False)["input_ids"]
        if self.calls == 1:
            return [Generation("get the", body[:3], [-0.5] * 3, 3, "length") for _ in prompt_ids]
        ids = body + [self.tok.eos_token_id]
        return [Generation("get the weather", ids, [-0.1] * len(ids), len(ids), "eos") for _ in prompt_ids]


def _play(engine, tok, max_new_tokens=10, samples=2):
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=3)
    return list(play(engine, tok, lambda: ToolEnv(), ToolEnv().tasks("train"), samples_per_task=samples,
                     params=params, policy_id="tiny", run_id="r"))


def test_supervised_ids_are_the_sampled_ids_and_contexts_what_the_engine_saw():
    tok = tiny_tokenizer()
    engine = Recorder(make_engine("hf", tiny_model(tok), tok, batch_size=4))
    trajs = _play(engine, tok)
    assert len(trajs) == 6 and all(len(t.turns) == 3 for t in trajs)
    assert all(t.messages[2].tool_calls == [WEATHER] for t in trajs)
    for t in trajs:
        (ids_T, mask_T, logp_T, _), = trajectory_sequences(tok, t)
        ids = ids_T.tolist()
        spans = action_spans(mask_T)
        assert len(spans) == 3
        for turn, (start, end) in zip(t.turns, spans):
            gens = engine.seen[tuple(ids[:start])]  # the exact prompt ids the engine was given
            gen = next(g for g in gens if g.token_ids == turn.token_ids)
            gens.remove(gen)
            assert ids[start:end] == gen.token_ids
            assert logp_T[start:end].tolist() == gen.logprobs  # float64: the recorded values exactly
            assert turn.logprobs == pytest.approx(gen.logprobs) and len(turn.logprobs) == len(turn.token_ids)
            assert turn.finish_reason == gen.finish_reason
        assert int(mask_T.sum()) == sum(len(turn.token_ids) for turn in t.turns)
        assert torch.isnan(logp_T[~mask_T]).all() and not torch.isnan(logp_T[mask_T]).any()


def test_privileged_prefix_is_the_students_prompt_plus_the_context():
    tok = tiny_tokenizer()
    rows, _ = training_rows(tok, _play(Scripted(tok), tok, samples=1))
    for row in rows:
        start = action_spans(row.mask_T)[0][0]
        assert privileged_prefix(tok, row) == row.ids_T[:start].tolist()
        text = tok.decode(privileged_prefix(tok, row, system="REFERENCE PLAN", user="A DEMO"))
        system, user = text.split("<|im_start|>user")[:2]
        assert "REFERENCE PLAN" in system and "A DEMO" in user and row.trajectory.prompt in user


def test_ids_of_another_tokenizer_are_not_used():
    tok = tiny_tokenizer()
    traj = _play(Scripted(tok), tok, samples=1)[0]
    (ids_T, _, logp_T, _), = trajectory_sequences(tok, traj)
    assert traj.tokenizer and not torch.isnan(logp_T).all()
    other = traj.model_copy(update={"tokenizer": "another-model"})  # e.g. reference rows of another model
    (ids2_T, mask2_T, logp2_T, _), = trajectory_sequences(tok, other)
    assert torch.isnan(logp2_T).all() and len(action_spans(mask2_T)) == len(traj.turns)


def test_truncated_actions_carry_no_supervised_end_of_turn_token():
    tok = tiny_tokenizer()
    trajs = _play(Scripted(tok), tok, samples=1)
    eos = tok.eos_token_id
    for t in trajs:
        (ids_T, mask_T, logp_T, _), = trajectory_sequences(tok, t)
        spans = action_spans(mask_T)
        cut, ended = t.turns[0], t.turns[1]
        assert (cut.finish_reason, ended.finish_reason) == ("length", "eos")
        assert ids_T[spans[0][0]:spans[0][1]].tolist() == cut.token_ids and eos not in cut.token_ids
        assert ids_T[spans[0][1]].item() == eos and not mask_T[spans[0][1]]  # template marker: context
        assert ids_T[spans[1][1] - 1].item() == eos and mask_T[spans[1][1] - 1]  # sampled: supervised
        assert ids_T[spans[1][1]].item() != eos  # not repeated after the sampled one
        supervised_eos = [i for i in range(len(ids_T)) if mask_T[i] and ids_T[i] == eos]
        assert len(supervised_eos) == sum(turn.finish_reason == "eos" for turn in t.turns)


def test_too_long_prompt_is_skipped_and_counted():
    tok = tiny_tokenizer()
    trajs = _play(Scripted(tok), tok, samples=1)
    firsts = [action_spans(trajectory_sequences(tok, t)[0][1])[0][0] for t in trajs]
    rows, skipped = training_rows(tok, trajs, max_len=min(firsts))
    assert rows == [] and skipped == [t.trajectory_id for t in trajs]
    rows, skipped = training_rows(tok, trajs, max_len=max(firsts) + 2)
    assert skipped == [] and all(len(r.ids_T) == max(firsts) + 2 for r in rows)
    assert [int(r.mask_T.sum()) for r in rows] == [max(firsts) + 2 - f for f in firsts]
    with pytest.raises(ValueError, match="the prompt alone is"):
        training_rows(tok, trajs, max_len=min(firsts), skip_too_long=False)


def test_store_of_release_0_1_opens_upgrades_and_trains(assets, tmp_path):
    store_dir = tmp_path / "old-store"
    shutil.copytree(OLD_STORE, store_dir)
    with pytest.warns(UserWarning, match="upgraded table 'trajectories' \\(4 rows\\)"):
        store = ExperienceStore.open(store_dir)
    old = store.query()
    assert len(old) == 4 and all(not turn.token_ids and turn.finish_reason == "" for t in old for turn in t.turns)
    assert len(store.versions()) == 3  # the upgrade is one more version; the old ones stay
    tok = tiny_tokenizer()
    (ids_T, mask_T, _, _), = trajectory_sequences(tok, old[0])  # re-tokenized from the text
    assert len(action_spans(mask_T)) == 2
    trainer = Distiller(make_config(assets, tmp_path, "old", store=str(store_dir), steps=1))
    trainer.fit()
    row = metrics(trainer.out)[0]
    assert row["action_tokens"] > 0 and row["grad_norm_student"] > 0
    reopened = ExperienceStore.open(store_dir)  # no second upgrade; new rows keep their ids
    new = reopened.query(run_id="lopd-test")
    assert len(new) == 4 and all(turn.token_ids and turn.context_ids for t in new for turn in t.turns)


@register_method("toy-sft")
class ToySFT(Method):
    """Plain SFT on the student's own successful rollouts: the whole method is this class."""

    metrics = ("nll",)

    def loss(self, rows, extras, weight):
        ok = [r for r in rows if r.trajectory.success]
        ids = torch.nn.utils.rnn.pad_sequence([r.ids_T for r in rows], batch_first=True)
        attn = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r.mask_T) for r in rows], batch_first=True)
        mask = torch.nn.utils.rnn.pad_sequence([r.mask_T & r.trajectory.success for r in rows], batch_first=True)
        logits = student_logits(self.student.model, ids, attn, adapter=self.student.adapter)
        nll, m = masked_nll(logits[:, :-1], ids[:, 1:], mask[:, 1:])
        return weight * nll, {"nll": weight * m["nll"] if ok else 0.0}


def test_a_method_is_one_class_and_one_registry_line(assets, tmp_path):
    assert "toy-sft" in known_methods() and get_method("toy-sft") is ToySFT
    with pytest.raises(ValueError, match=r"unknown method 'nope' \(known: .*lopd.*toy-sft"):
        get_method("nope")
    model_dir, _, store = assets
    shutil.copytree(store, tmp_path / "store")
    common = dict(env="toy-distill", store=str(tmp_path / "store"), out=str(tmp_path / "sft"),
                  model=str(model_dir), lr=1e-2, steps=2, tasks_per_step=2, group_size=2, max_new_tokens=8,
                  temperature=1.0, student_lora_rank=4, micro_batch=2, max_len=256, run_id="sft-test")
    with pytest.raises(ValueError, match="unknown option 'margin' for method 'toy-sft'"):
        DistillConfig(method="toy-sft", margin=0.1, **common)
    config = DistillConfig(method="toy-sft", **common)  # no composer needed
    trainer = Distiller(config)
    before = [p.detach().clone() for p in trainer.student.params]
    trainer.fit()
    rows = metrics(trainer.out)
    assert [r["step"] for r in rows] == [1, 2] and all("nll" in r and "beta" not in r for r in rows)
    assert any(r["success_rate"] > 0 for r in rows)
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.student.params))
    assert (trainer.out / "final" / "student" / "model.safetensors").is_file()
    assert not (trainer.out / "final" / "composer").exists()
