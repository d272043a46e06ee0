"""Policy-gradient losses of GRPO and Skill-SD (stages/core/losses/pg.py) against naive float64
references written here with plain loops (no vectorisation), plus hand-computed cases."""
from __future__ import annotations

import math

import pytest
import torch

from stages.core.losses.pg import (
    aggregate, group_advantages, k3_kl, ppo_clip_loss, sampled_token_sdl, token_logprobs,
)

B, T, V = 3, 5, 6


def _naive_logp(logits, ids, temperature=1.0):
    """log softmax(logits / T)[id] per position, one scalar op at a time (autograd-able)."""
    out = [[None] * logits.shape[1] for _ in range(logits.shape[0])]
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            total = 0.0
            for v in range(logits.shape[2]):
                total = total + torch.exp(logits[b, t, v] / temperature)
            out[b][t] = logits[b, t, int(ids[b, t])] / temperature - torch.log(total)
    return out


def _naive_reduce(values, mask, aggregation, denominator=None):
    """Loop version of the three aggregations (masked positions only)."""
    total, count, rows, row_means = 0.0, 0, 0, 0.0
    for b in range(len(values)):
        row_sum, row_n = 0.0, 0
        for t in range(len(values[b])):
            if mask[b][t]:
                total, count = total + values[b][t], count + 1
                row_sum, row_n = row_sum + values[b][t], row_n + 1
        if row_n:
            rows, row_means = rows + 1, row_means + row_sum / row_n
    if aggregation == "token-mean":
        return total / (denominator or max(count, 1))
    if aggregation == "seq-mean":
        return row_means / (denominator or max(rows, 1))
    return total / denominator


def _random_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[0, 0] = True
    old = torch.log_softmax(torch.randn(B, T, V, generator=g, dtype=torch.float64), -1).gather(
        -1, ids.unsqueeze(-1)).squeeze(-1)
    old[~mask] = float("nan")  # no behaviour log-prob off the action tokens
    return logits, ids, mask, old


def test_token_logprobs_match_naive_at_temperature():
    logits, ids, _, _ = _random_case()
    got = token_logprobs(logits, ids, temperature=0.7, chunk_size=2)
    naive = _naive_logp(logits, ids, 0.7)
    for b in range(B):
        for t in range(T):
            assert float(got[b, t]) == pytest.approx(float(naive[b][t]), abs=1e-12)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, ids, temperature=0.0)


@pytest.mark.parametrize("aggregation,denominator", [("token-mean", None), ("seq-mean", None),
                                                     ("constant", 40.0), ("token-mean", 17.0)])
def test_ppo_clip_matches_naive_reference(aggregation, denominator):
    logits, ids, mask, old = _random_case(1)
    adv = torch.tensor([1.3, -0.7, 0.4], dtype=torch.float64)
    eps_lo, eps_hi = 0.2, 0.28
    a = logits.clone().requires_grad_(True)
    loss, m = ppo_clip_loss(token_logprobs(a, ids), old, adv, mask, eps_lo=eps_lo, eps_hi=eps_hi,
                            aggregation=aggregation, denominator=denominator)
    loss.backward()
    n = logits.clone().requires_grad_(True)
    logp = _naive_logp(n, ids)
    values, clipped = [[0.0] * T for _ in range(B)], 0
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                ratio = torch.exp(logp[b][t] - float(old[b, t]))
                bounded = torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi)
                values[b][t] = -torch.minimum(ratio * float(adv[b]), bounded * float(adv[b]))
                r = float(ratio.detach())
                clipped += (r < 1 - eps_lo and adv[b] < 0) or (r > 1 + eps_hi and adv[b] > 0)
    ref = _naive_reduce(values, mask.tolist(), aggregation, denominator)
    ref.backward()
    assert float(loss) == pytest.approx(float(ref), abs=1e-12)
    assert torch.allclose(a.grad, n.grad, atol=1e-12)
    assert m["clip_frac"] == pytest.approx(clipped / int(mask.sum()))
    assert clipped > 0  # the random ratios do reach the clip range


def test_ppo_clip_hand_computed_both_sides():
    # four tokens: ratio 1.5/A=+1 (high clip), 0.5/A=-1 (low clip), 1.5/A=-1 and 0.5/A=+1 (unclipped)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]], dtype=torch.float64)).requires_grad_(True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    losses, grads, metrics = [], [], []
    for i, a in enumerate([1.0, -1.0, -1.0, 1.0]):
        mask = torch.zeros(1, 4, dtype=torch.bool)
        mask[0, i] = True
        loss, m = ppo_clip_loss(logp, old, torch.tensor([a], dtype=torch.float64), mask, eps_lo=0.2, eps_hi=0.2)
        (g,) = torch.autograd.grad(loss, logp)
        losses.append(float(loss))
        grads.append(float(g[0, i]))
        metrics.append(m)
    assert losses == pytest.approx([-1.2, 0.8, 1.5, -0.5])
    assert grads == pytest.approx([0.0, 0.0, 1.5, -0.5])  # d(-rho A)/dlogp = -rho A where unclipped
    assert [m["clip_frac_high"] for m in metrics] == [1.0, 0.0, 0.0, 0.0]
    assert [m["clip_frac_low"] for m in metrics] == [0.0, 1.0, 0.0, 0.0]


def test_group_advantages_zero_variance_and_std():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2])
    adv, zero = group_advantages(rewards, groups, eps=1e-6)
    assert zero.tolist() == [True, False, True]  # all equal; mixed; a group of one
    s = math.sqrt(0.5)  # unbiased std of {0, 1}
    assert adv.tolist() == pytest.approx([0.0, 0.0, -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 0.0])
    plain, _ = group_advantages(rewards, groups, scale_std=False)
    assert plain.tolist() == pytest.approx([0.0, 0.0, -0.5, 0.5, 0.0])
    # a zero-variance group contributes nothing: zero loss and zero gradient
    logp = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    loss, _ = ppo_clip_loss(logp, logp.detach() - 0.1, adv[:2].double(), torch.ones(2, 3, dtype=torch.bool))
    loss.backward()
    assert float(loss) == 0.0 and bool((logp.grad == 0).all())


def test_k3_matches_naive_and_is_zero_when_equal():
    logits, ids, mask, _ = _random_case(2)
    ref_logp = torch.log_softmax(torch.randn(B, T, V, dtype=torch.float64), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    a = logits.clone().requires_grad_(True)
    loss, m = k3_kl(token_logprobs(a, ids), ref_logp, mask)
    loss.backward()
    n = logits.clone().requires_grad_(True)
    logp = _naive_logp(n, ids)
    values = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                d = float(ref_logp[b, t]) - logp[b][t]
                values[b][t] = torch.exp(d) - d - 1
    ref = _naive_reduce(values, mask.tolist(), "token-mean")
    ref.backward()
    assert float(loss) == pytest.approx(float(ref), abs=1e-12) and float(loss) > 0
    assert torch.allclose(a.grad, n.grad, atol=1e-12)
    same = token_logprobs(logits.clone().requires_grad_(True), ids)
    zero, _ = k3_kl(same, same.detach(), mask)
    (g,) = torch.autograd.grad(zero, same)
    assert float(zero) == 0.0 and bool((g == 0).all())


@pytest.mark.parametrize("ratio_clip", [None, 1.1])
def test_sdl_matches_naive_reference(ratio_clip):
    logits, ids, mask, old = _random_case(3)
    teacher = torch.log_softmax(torch.randn(B, T, V, dtype=torch.float64), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    a = logits.clone().requires_grad_(True)
    loss, m = sampled_token_sdl(token_logprobs(a, ids), teacher, old, mask, ratio_clip=ratio_clip)
    loss.backward()
    n = logits.clone().requires_grad_(True)
    logp = _naive_logp(n, ids)
    values = [[0.0] * T for _ in range(B)]
    gaps = []
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                gap = logp[b][t] - float(teacher[b, t])
                rho = torch.exp(logp[b][t] - float(old[b, t]))
                if ratio_clip is not None:
                    rho = torch.clamp(rho, max=ratio_clip)
                values[b][t] = rho * (torch.exp(-gap) - 1 + gap)
                gaps.append(float(gap))
    ref = _naive_reduce(values, mask.tolist(), "token-mean")
    ref.backward()
    assert float(loss) == pytest.approx(float(ref), abs=1e-12)
    assert torch.allclose(a.grad, n.grad, atol=1e-12)
    assert m["sdl_gap"] == pytest.approx(sum(gaps) / len(gaps))


def test_sdl_hand_computed_and_zero_when_teacher_agrees():
    logp = torch.log(torch.tensor([[0.5]], dtype=torch.float64)).requires_grad_(True)
    teacher = torch.log(torch.tensor([[0.25]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.25]], dtype=torch.float64))  # rho = 2
    loss, m = sampled_token_sdl(logp, teacher, old, torch.ones(1, 1, dtype=torch.bool))
    l = math.log(2)
    assert float(loss) == pytest.approx(2 * (0.5 - 1 + l))
    (g,) = torch.autograd.grad(loss, logp)
    # d/dlogp [e^(logp - old) (e^-(logp - lt) - 1 + logp - lt)] = rho (k + 1 - e^-l) with k the k3 value
    assert float(g) == pytest.approx(2 * ((0.5 - 1 + l) + 1 - 0.5))
    same = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    zero, _ = sampled_token_sdl(same, same.detach(), same.detach() + 0.3, torch.ones(2, 4))
    (g,) = torch.autograd.grad(zero, same)
    assert float(zero) == 0.0 and bool((g == 0).all())


def test_masked_positions_get_zero_gradient():
    logits, ids, mask, old = _random_case(4)
    a = logits.clone().requires_grad_(True)
    logp = token_logprobs(a, ids)
    teacher = logp.detach() - 0.5
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    total = (ppo_clip_loss(logp, old, adv, mask)[0] + k3_kl(logp, teacher, mask)[0]
             + sampled_token_sdl(logp, teacher, old, mask)[0])  # old is NaN off the mask
    total.backward()
    assert torch.isfinite(a.grad).all()
    assert bool((a.grad[~mask] == 0).all()) and bool((a.grad[mask] != 0).any())


def test_micro_batches_with_the_step_denominator_add_up_to_the_whole():
    logits, ids, mask, old = _random_case(5)
    adv = torch.tensor([0.9, -0.3, 0.2], dtype=torch.float64)
    logp = token_logprobs(logits, ids)
    for aggregation, denominator in (("token-mean", float(mask.sum())), ("seq-mean", float(B)),
                                     ("constant", 7.0)):
        whole = ppo_clip_loss(logp, old, adv, mask, aggregation=aggregation, denominator=denominator)[0]
        parts = sum(ppo_clip_loss(logp[s], old[s], adv[s], mask[s], aggregation=aggregation,
                                  denominator=denominator)[0] for s in (slice(0, 1), slice(1, 3)))
        assert float(parts) == pytest.approx(float(whole), abs=1e-12)


def test_aggregate_edge_cases():
    values = torch.randn(2, 3, requires_grad=True)
    empty = aggregate(values, torch.zeros(2, 3, dtype=torch.bool))
    empty.backward()
    assert float(empty) == 0.0 and bool((values.grad == 0).all())
    with pytest.raises(ValueError, match="positive denominator"):
        aggregate(values, torch.ones(2, 3), "constant")
    with pytest.raises(ValueError, match="aggregation must be"):
        aggregate(values, torch.ones(2, 3), "sum")
    with pytest.raises(ValueError, match="0/1"):
        aggregate(values, torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="finite"):
        ppo_clip_loss(values, torch.full((2, 3), float("nan")), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        k3_kl(values, values[:1], torch.ones(2, 3))
