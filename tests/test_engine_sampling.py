"""Per-row sampling (stages.engines.hf._RowSampler, row seeds): a row's sampled tokens depend on
its row seed, its prompt and the weights only (not on the rows batched beside it, the engine's
mini-batching, the prefix cache or the split of a rollout over calls), and the draws follow the
warped distribution. Uses the tiny in-process model."""
from __future__ import annotations

import hashlib

import pytest
import torch

from stages.engines import Generation, SamplingParams, row_seed, row_seeds
from stages.engines.hf import HFRolloutEngine, _RowSampler
from stages.engines.rollout import play
from tests.test_engines import assert_same, ids, model, teacher_forced, tok  # noqa: F401 (fixtures)
from tests.test_rollout import CounterEnv, _tasks

SEEDS = [101, 202, 303]
SAMPLED = [
    SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12),
    SamplingParams(temperature=1.0, top_p=0.9, top_k=0, max_new_tokens=12),
    SamplingParams(temperature=1.0, top_p=1.0, top_k=5, max_new_tokens=12),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=12),
]


@pytest.mark.parametrize("params", SAMPLED, ids=["T1", "T1-top-p", "T1-top-k", "T0.7-top-k-top-p"])
def test_a_rows_tokens_depend_on_its_seed_not_on_its_batch(model, tok, ids, params):
    params = params.model_copy(update={"seeds": SEEDS})
    whole = HFRolloutEngine(model, tok, batch_size=8).generate(ids, params)
    assert len({tuple(g.token_ids) for g in whole}) == 3
    for batch_size, cache in ((1, 0), (2, 0), (2, 10_000)):
        assert_same(HFRolloutEngine(model, tok, batch_size=batch_size, prefix_cache_tokens=cache).generate(ids, params),
                    whole)
    alone = HFRolloutEngine(model, tok, batch_size=8)
    assert_same([alone.generate([p], params.model_copy(update={"seeds": [s]}))[0] for p, s in zip(ids, SEEDS)], whole)
    order = [2, 0, 1]  # other neighbours, other positions in the batch
    shuffled = alone.generate([ids[i] for i in order], params.model_copy(update={"seeds": [SEEDS[i] for i in order]}))
    assert_same(shuffled, [whole[i] for i in order])
    # the same prompt under another seed samples other tokens
    other = alone.generate(ids, params.model_copy(update={"seeds": [s + 1 for s in SEEDS]}))
    assert [g.token_ids for g in other] != [g.token_ids for g in whole]
    for prompt, gen in zip(ids, whole):  # the recorded log-probs: log_softmax(raw / T) at the sampled ids
        torch.testing.assert_close(torch.tensor(gen.logprobs), teacher_forced(model, prompt, gen, params.temperature),
                                   atol=1e-4, rtol=0)


def test_seed_alone_gives_prompt_i_the_row_seed_seed_plus_i(model, tok, ids):
    params = SAMPLED[0].model_copy(update={"seed": 40})
    assert row_seeds(params, 3) == [40, 41, 42] and row_seeds(SAMPLED[0], 3) is None
    engine = HFRolloutEngine(model, tok, batch_size=2)
    assert_same(engine.generate(ids, params), engine.generate(ids, SAMPLED[0].model_copy(update={"seeds": [40, 41, 42]})))
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        engine.generate(ids, SAMPLED[0].model_copy(update={"seeds": [1, 2]}))


def _frequencies(logits_V: torch.Tensor, params: SamplingParams, rows: int = 200, steps: int = 100) -> torch.Tensor:
    """Share of each token among rows x steps draws of ``_RowSampler`` over the same logits (each
    row its own seed, each step the next draw of every row's stream)."""
    sampler = _RowSampler(params, [row_seed(7, r, 0, 0) for r in range(rows)])
    scores_BV = logits_V.expand(rows, -1).clone()
    counts_V = torch.zeros_like(logits_V, dtype=torch.float64)
    for _ in range(steps):
        picked_BV = sampler(torch.zeros(rows, 1, dtype=torch.long), scores_BV)
        assert (picked_BV == 0).sum(1).eq(1).all() and torch.isneginf(picked_BV).sum(1).eq(len(logits_V) - 1).all()
        counts_V += torch.bincount(picked_BV.argmax(1), minlength=len(logits_V)).double()
    return counts_V / (rows * steps)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draws_follow_the_tempered_distribution(temperature):
    """20,000 draws of a 2-token distribution: each share within 5 binomial standard errors
    (p = 0.73 at T 1, 0.88 at T 0.5: 0.016 and 0.011)."""
    logits_V = torch.tensor([1.0, 0.0])
    want_V = torch.softmax(logits_V.double() / temperature, 0)
    got_V = _frequencies(logits_V, SamplingParams(temperature=temperature, top_p=1.0))
    tolerance = 5 * float((want_V[0] * want_V[1] / 20_000).sqrt())
    torch.testing.assert_close(got_V, want_V, atol=tolerance, rtol=0)


def test_draws_follow_the_truncated_distribution():
    """top-k 2 and top-p 0.75 (which keeps the two likeliest of 0.5 / 0.3 / 0.2) never draw the
    third token; the two kept are drawn 5:3 (0.625 / 0.375, within 5 standard errors)."""
    logits_V = torch.tensor([0.5, 0.3, 0.2]).log()
    for params in (SamplingParams(temperature=1.0, top_p=1.0, top_k=2), SamplingParams(temperature=1.0, top_p=0.75)):
        got_V = _frequencies(logits_V, params)
        tolerance = 5 * (0.625 * 0.375 / 20_000) ** 0.5
        torch.testing.assert_close(got_V, torch.tensor([0.625, 0.375, 0.0], dtype=torch.float64), atol=tolerance, rtol=0)


def test_row_seeds_are_distinct_and_stable():
    keys = [(s, t, g, turn) for s in (0, 1) for t in range(3) for g in range(3) for turn in range(3)]
    seeds = [row_seed(*k) for k in keys]
    assert len(set(seeds)) == len(keys) and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [row_seed(*k) for k in keys]


class SeedEchoEngine:
    """Answers every prompt with ``inc <its row seed>`` (the counter environment goes on)."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return [Generation(text=f"inc {s}", token_ids=[self.tok.eos_token_id], logprobs=[-1.0], num_tokens=1,
                           finish_reason="eos") for s in params.seeds]


def test_play_gives_each_turn_its_row_seed_however_the_tasks_are_split_and_batched(tok):
    """Three tasks x two samples x three turns, played in one call (6 at once) or split into
    [t0] + [t1, t2] (``task_offset`` 1, one at a time): turn t of sample g of the task at
    position p is sampled under row_seed(seed, p, g, t) either way."""
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=9)
    tasks = _tasks(3, target=2)
    want = {_trajectory_id(t.task_id, g): [f"inc {row_seed(9, p, g, turn)}" for turn in range(3)]
            for p, t in enumerate(tasks) for g in range(2)}
    for parts, concurrent in (([(0, 3)], 6), ([(0, 1), (1, 3)], 1)):
        got = {}
        for lo, hi in parts:
            for traj in play(SeedEchoEngine(tok), tok, lambda: CounterEnv(max_turns=3), tasks[lo:hi], samples_per_task=2,
                             params=params, policy_id="p", run_id="r", max_concurrent=concurrent, task_offset=lo):
                got[traj.trajectory_id] = [turn.action for turn in traj.turns]
        assert got == want


def _trajectory_id(task_id: str, sample: int) -> str:
    return hashlib.sha1(f"r\0{task_id}\0{sample}".encode()).hexdigest()[:32]
