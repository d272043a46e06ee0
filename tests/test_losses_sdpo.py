"""SDPO's loss (stages.core.losses.sdpo) against a naive float64 reference written with loops,
and hand-computed cases: the student's top-k + tail by hand, p = q, the importance clip at 2,
masked positions, gradient to the student only, an empty batch."""
from __future__ import annotations

import math

import pytest
import torch

from stages.core.losses.sdpo import sdpo_topk_loss


def naive(s_BTV, t_BTV, ids_BT, mask_BT, old_BT, *, k, alpha=1.0, add_tail=True, is_clip=2.0,
          temperature=1.0, loss_temperature=1.0, reduction="token"):
    """Loop-by-loop float64 reference of SDPO's official loss (no vectorisation); the top-k and the
    divergence on both logits divided by ``loss_temperature`` (upstream: the sampling temperature)."""
    B, T, V = s_BTV.shape
    per_row: list[list[float]] = [[] for _ in range(B)]
    for b in range(B):
        for t in range(T):
            if not bool(mask_BT[b][t]):
                continue
            s = [float(x) for x in s_BTV[b][t]]
            q = [float(x) for x in t_BTV[b][t]]
            zs = math.log(sum(math.exp(x / loss_temperature) for x in s))
            zt = math.log(sum(math.exp(x / loss_temperature) for x in q))
            ps = [math.exp(x / loss_temperature - zs) for x in s]
            pt = [math.exp(x / loss_temperature - zt) for x in q]
            top = sorted(range(V), key=lambda i: -ps[i])[:min(k, V)]
            S = [ps[i] for i in top]
            Tq = [pt[i] for i in top]
            if len(top) < V:
                if add_tail:
                    S.append(1.0 - sum(S))
                    Tq.append(1.0 - sum(Tq))
                else:
                    S = [x / sum(S) for x in S]
                    Tq = [x / sum(Tq) for x in Tq]
            if alpha == 1.0:
                d = sum(S[i] * (math.log(S[i]) - math.log(Tq[i])) for i in range(len(S)))
            elif alpha == 0.0:
                d = sum(Tq[i] * (math.log(Tq[i]) - math.log(S[i])) for i in range(len(S)))
            else:
                M = [(1 - alpha) * S[i] + alpha * Tq[i] for i in range(len(S))]
                kl_s = sum(S[i] * (math.log(S[i]) - math.log(M[i])) for i in range(len(S)))
                kl_t = sum(Tq[i] * (math.log(Tq[i]) - math.log(M[i])) for i in range(len(S)))
                d = (1 - alpha) * kl_s + alpha * kl_t
            a = int(ids_BT[b][t])
            zst = math.log(sum(math.exp(x / temperature) for x in s))
            logp = s[a] / temperature - zst
            old = float(old_BT[b][t])
            w = 1.0 if math.isnan(old) or is_clip is None else min(math.exp(logp - old), is_clip)
            per_row[b].append(w * d)
    if reduction == "token":
        values = [v for row in per_row for v in row]
        return sum(values) / max(len(values), 1)
    means = [sum(row) / len(row) for row in per_row if row]
    return sum(means) / max(len(means), 1)


def _random(B=3, T=5, V=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    t = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.6
    mask[0, 0], mask[2] = True, False  # row 2 has no distilled token
    old = torch.log_softmax(s, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1) + torch.randn(B, T, generator=g,
                                                                                            dtype=torch.float64)
    old[1, :2] = float("nan")  # not recorded: ratio 1
    return s, t, ids, mask, old


@pytest.mark.parametrize("kwargs", [
    dict(k=3), dict(k=1), dict(k=11), dict(k=20), dict(k=4, alpha=0.0), dict(k=4, alpha=0.5),
    dict(k=4, add_tail=False), dict(k=4, is_clip=None), dict(k=4, temperature=0.7),
    dict(k=4, reduction="trajectory"), dict(k=5, is_clip=1.3, alpha=0.3, temperature=1.2),
    dict(k=4, temperature=0.7, loss_temperature=0.7), dict(k=20, temperature=0.7, loss_temperature=0.7),
    dict(k=3, alpha=0.5, add_tail=False, temperature=0.7, loss_temperature=0.7, reduction="trajectory"),
])
def test_matches_the_naive_float64_reference(kwargs):
    s, t, ids, mask, old = _random()
    loss, m = sdpo_topk_loss(s, t, ids, mask, old, chunk_size=2, **kwargs)
    want = naive(s, t, ids, mask, old, **kwargs)
    assert loss.dtype == torch.float64
    assert float(loss) == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert m["num_tokens"] == int(mask.sum()) and m["loss"] == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_loss_temperature_changes_the_support_and_the_divergence():
    """At T = 0.7 the top-k support and the divergence are those of the tempered distributions:
    not the raw logits' (the loss before ``loss_temperature`` existed)."""
    s, t, ids, mask, old = _random(seed=6)
    raw, _ = sdpo_topk_loss(s, t, ids, mask, old, k=3, temperature=0.7)
    tempered, _ = sdpo_topk_loss(s, t, ids, mask, old, k=3, temperature=0.7, loss_temperature=0.7)
    assert float(raw) == pytest.approx(naive(s, t, ids, mask, old, k=3, temperature=0.7), rel=1e-10)
    assert float(tempered) == pytest.approx(naive(s, t, ids, mask, old, k=3, temperature=0.7,
                                                  loss_temperature=0.7), rel=1e-10)
    assert abs(float(tempered) - float(raw)) > 1e-3
    # dividing the logits by T is the same as calling the loss on logits / T
    pre, _ = sdpo_topk_loss(s / 0.7, t / 0.7, ids, mask, old, k=3, temperature=1.0)
    assert float(tempered) == pytest.approx(float(pre), rel=1e-12)
    with pytest.raises(ValueError, match="loss_temperature must be > 0"):
        sdpo_topk_loss(s, t, ids, mask, loss_temperature=0.0)


def test_student_topk_and_tail_by_hand():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    s, t = p.log().view(1, 1, 4), q.log().view(1, 1, 4)
    one = torch.ones(1, 1, dtype=torch.bool)
    ids = torch.zeros(1, 1, dtype=torch.long)
    loss, m = sdpo_topk_loss(s, t, ids, one, k=2)
    # the STUDENT's top-2 = ids 0, 1; buckets S = (0.5, 0.3, 0.2), T = (0.25, 0.25, 0.5)
    want = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    assert float(loss) == pytest.approx(want, rel=1e-12)
    assert m["student_tail_mass"] == pytest.approx(0.2) and m["teacher_tail_mass"] == pytest.approx(0.5)
    # the teacher's top-k would be another support: LOPD-style selection gives a different value
    loss_rev, _ = sdpo_topk_loss(t, s, ids, one, k=2)
    assert float(loss_rev) != pytest.approx(want)
    # without a tail: renormalised top-2, S = (5/8, 3/8), T = (1/2, 1/2)
    flat, _ = sdpo_topk_loss(s, t, ids, one, k=2, add_tail=False)
    assert float(flat) == pytest.approx(5 / 8 * math.log(5 / 4) + 3 / 8 * math.log(3 / 4), rel=1e-12)
    # k >= V: the full reverse KL, as torch.distributions computes it
    full, _ = sdpo_topk_loss(s, t, ids, one, k=4)
    ref = torch.distributions.kl_divergence(torch.distributions.Categorical(probs=p),
                                            torch.distributions.Categorical(probs=q))
    assert float(full) == pytest.approx(float(ref), rel=1e-12)


def test_equal_distributions_give_zero():
    s, _, ids, mask, old = _random(seed=1)
    loss, m = sdpo_topk_loss(s, s.clone(), ids, mask, old, k=3)
    assert abs(float(loss)) < 1e-12 and m["divergence"] == pytest.approx(0.0, abs=1e-12)
    s32 = s.float().requires_grad_(True)
    loss, _ = sdpo_topk_loss(s32, s32.detach().clone(), ids, mask, old.float(), k=3)
    loss.backward()
    assert s32.grad.abs().max() < 1e-6  # p = q is the minimum: no push


def test_importance_ratio_is_clipped_at_two():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    s = p.log().view(1, 1, 4).expand(1, 3, 4).clone()
    t = torch.full((1, 3, 4), 0.0, dtype=torch.float64)
    ids = torch.tensor([[0, 1, 2]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    logp = p.log()[ids[0]].view(1, 3)
    kl, _ = sdpo_topk_loss(s[:, :1], t[:, :1], ids[:, :1], mask[:, :1], k=2)
    # ratios 5 (clipped to 2), 0.5, and NaN old (not recorded) -> 1
    old = torch.stack([logp[0, 0] - math.log(5.0), logp[0, 1] + math.log(2.0), torch.tensor(float("nan"),
                                                                                           dtype=torch.float64)]).view(1, 3)
    loss, m = sdpo_topk_loss(s, t, ids, mask, old, k=2)
    assert float(loss) == pytest.approx(float(kl) * (2.0 + 0.5 + 1.0) / 3, rel=1e-12)
    assert m["is_clip_frac"] == pytest.approx(1 / 3) and m["is_ratio"] == pytest.approx((5 + 0.5 + 1) / 3)
    unclipped, _ = sdpo_topk_loss(s, t, ids, mask, old, k=2, is_clip=None)
    assert float(unclipped) == pytest.approx(float(kl), rel=1e-12)  # no ratio at all
    # on-policy at the sampling temperature: ratio exactly 1
    on = torch.log_softmax(s / 0.7, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    loss_on, m_on = sdpo_topk_loss(s, t, ids, mask, on, k=2, temperature=0.7)
    assert float(loss_on) == pytest.approx(float(kl), rel=1e-12) and m_on["is_ratio"] == pytest.approx(1.0)


def test_masked_positions_get_zero_gradient_and_the_teacher_none():
    s, t, ids, mask, old = _random(seed=2)
    s = s.float().requires_grad_(True)
    t = t.float().requires_grad_(True)
    loss, _ = sdpo_topk_loss(s, t, ids, mask, old.float(), k=3, chunk_size=3)
    loss.backward()
    assert torch.all(s.grad[~mask] == 0)
    assert (s.grad[mask].abs().sum(-1) > 0).all()
    assert t.grad is None  # the teacher is detached: the gradient reaches the student only
    # the ratio is a detached weight: the gradient is w * grad(d), not grad(w * d)
    s2 = s.detach().clone().requires_grad_(True)
    loss2, _ = sdpo_topk_loss(s2, t.detach(), ids, mask, None, k=3)
    loss2.backward()
    assert not torch.allclose(s2.grad, s.grad)


def test_fully_masked_batch_gives_zero_with_a_defined_gradient():
    s, t, ids, _, old = _random(seed=3)
    s = s.requires_grad_(True)
    none = torch.zeros(ids.shape, dtype=torch.bool)
    loss, m = sdpo_topk_loss(s, t, ids, none, old, k=3)
    assert float(loss.detach()) == 0.0 and m["num_tokens"] == 0 and m["divergence"] == 0.0
    loss.backward()
    assert s.grad is not None and torch.all(s.grad == 0)


def test_denominator_makes_micro_batches_add_up():
    s, t, ids, mask, old = _random(seed=4)
    whole, _ = sdpo_topk_loss(s, t, ids, mask, old, k=3)
    n = int(mask.sum())
    parts = [sdpo_topk_loss(s[b:b + 1], t[b:b + 1], ids[b:b + 1], mask[b:b + 1], old[b:b + 1], k=3,
                            denominator=n)[0] for b in range(3)]
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-12)
    rows = int(mask.any(1).sum())
    whole_r, _ = sdpo_topk_loss(s, t, ids, mask, old, k=3, reduction="trajectory")
    parts_r = [sdpo_topk_loss(s[b:b + 1], t[b:b + 1], ids[b:b + 1], mask[b:b + 1], old[b:b + 1], k=3,
                              reduction="trajectory", denominator=rows)[0] for b in range(3)]
    assert float(sum(parts_r)) == pytest.approx(float(whole_r), rel=1e-12)


def test_half_precision_and_bad_arguments():
    s, t, ids, mask, old = _random(seed=5)
    loss, _ = sdpo_topk_loss(s.bfloat16(), t.bfloat16(), ids, mask, old.float(), k=3)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    with pytest.raises(ValueError, match=r"must both be \(B, T, V\)"):
        sdpo_topk_loss(s, t[:, :2], ids, mask)
    with pytest.raises(ValueError, match="token_ids must be"):
        sdpo_topk_loss(s, t, ids[:, :2], mask)
    with pytest.raises(ValueError, match="k must be >= 1"):
        sdpo_topk_loss(s, t, ids, mask, k=0)
    with pytest.raises(ValueError, match=r"alpha must lie in \[0, 1\]"):
        sdpo_topk_loss(s, t, ids, mask, alpha=1.5)
    with pytest.raises(ValueError, match="is_clip must be > 0"):
        sdpo_topk_loss(s, t, ids, mask, is_clip=0.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sdpo_topk_loss(s, t, ids, mask, temperature=0.0)
    with pytest.raises(ValueError, match="reduction must be"):
        sdpo_topk_loss(s, t, ids, mask, reduction="sum")
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 11\)"):
        sdpo_topk_loss(s, t, torch.full_like(ids, 11), mask)
    with pytest.raises(ValueError, match="mask must be bool or hold only 0/1"):
        sdpo_topk_loss(s, t, ids, mask.float() * 2)
