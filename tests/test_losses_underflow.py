"""Divergences at the edge of float32: a log-probability of -191 is representable although its
probability underflows, so the rows keep its exact value (a floor at log(tiny) = -87.3 capped
them there); a tail of only -inf log-probs (a masked vocabulary) gives finite gradients.
References are the float64 bucket divergences computed directly."""
from __future__ import annotations

import math

import pytest
import torch

from stages.core.losses.head import LMHead, head_topm_tail_reverse_kl
from stages.core.losses.kd import forward_kl, generalized_jsd
from stages.core.losses.lopd import kl_rows, topm_tail_reverse_kl
from stages.core.losses.sdpo import sdpo_topk_loss

GAP = 191.0  # nats: exp(-191) underflows float32 (tiny = exp(-87.3)), -191 itself does not


def _identity_heads(V: int) -> tuple[LMHead, LMHead]:
    eye = torch.eye(V)
    return LMHead(eye, None), LMHead(eye.clone(), None)


def _reference_reverse_kl(s_V: torch.Tensor, t_V: torch.Tensor, top: list[int]) -> float:
    """KL(S~ || T~) over the teacher's top ids + a tail bucket, in float64, from logits (V,)."""
    s, t = torch.log_softmax(s_V.double(), -1), torch.log_softmax(t_V.double(), -1)
    rest = [v for v in range(s_V.shape[0]) if v not in top]
    s_b = torch.cat([s[top], s[rest].logsumexp(-1, keepdim=True)])
    t_b = torch.cat([t[top], t[rest].logsumexp(-1, keepdim=True)])
    return float((s_b.exp() * (s_b - t_b)).sum())


def test_kl_rows_keep_representable_log_probs():
    p = torch.tensor([[0.0, float("-inf")]])  # all mass on bucket 0
    q = torch.tensor([[-GAP, 0.0]])  # q_0 = e^-191: underflows as a probability, not as a log
    assert float(kl_rows(p, q)) == pytest.approx(GAP, rel=1e-6)  # main: 87.34
    assert float(kl_rows(q, p)) < float("inf")  # q has mass where p is -inf: still finite


def test_top_m_tail_reverse_kl_exact_where_the_teachers_mass_underflows():
    """The student's mass sits in the tail bucket, where the teacher has e^-191 (logits and hidden states)."""
    V, M = 6, 2
    s_V = torch.tensor([-5.0, -5.0, 0.0, 0.0, -3.0, -3.0])
    t_V = torch.tensor([0.0, -1.0, -GAP, -GAP, -GAP, -GAP])
    exact = _reference_reverse_kl(s_V, t_V, [0, 1])
    assert exact > 150
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, _ = topm_tail_reverse_kl(s_V.view(1, 1, V), t_V.view(1, 1, V), mask, M=M)
    assert float(loss) == pytest.approx(exact, rel=1e-5)  # main: 87.3-ish
    s_h = s_V.view(1, 1, V).clone().requires_grad_(True)
    t_h = t_V.view(1, 1, V).clone().requires_grad_(True)
    head_loss, _ = head_topm_tail_reverse_kl(s_h, t_h, mask, *_identity_heads(V), M=M)
    assert float(head_loss) == pytest.approx(exact, rel=1e-5)
    head_loss.backward()
    s_l = s_V.view(1, 1, V).clone().requires_grad_(True)
    t_l = t_V.view(1, 1, V).clone().requires_grad_(True)
    topm_tail_reverse_kl(s_l, t_l, mask, M=M)[0].backward()
    for h, logits in ((s_h, s_l), (t_h, t_l)):  # the head path's closed form = autograd on logits
        assert torch.isfinite(h.grad).all() and torch.allclose(h.grad, logits.grad, atol=1e-5, rtol=1e-4)


def test_forward_kl_exact_where_the_students_mass_underflows():
    """SDFT / OPSD: KL(T || S) with the teacher's mass on a token the student gives e^-191."""
    V = 4
    s_V = torch.tensor([-GAP, 0.0, 0.0, 0.0])
    t_V = torch.tensor([0.0, -30.0, -30.0, -30.0])
    t64, s64 = torch.log_softmax(t_V.double(), -1), torch.log_softmax(s_V.double(), -1)
    exact = float((t64.exp() * (t64 - s64)).sum())
    assert exact > 150
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, _ = forward_kl(s_V.view(1, 1, V), t_V.view(1, 1, V), mask)
    assert float(loss) == pytest.approx(exact, rel=1e-5)  # main: 87.3-ish
    s_h = s_V.view(1, 1, V).clone().requires_grad_(True)
    head_loss, _ = generalized_jsd(s_h, t_V.view(1, 1, V), mask, 0.0, heads=_identity_heads(V))
    assert float(head_loss) == pytest.approx(exact, rel=1e-5)
    head_loss.backward()
    s_l = s_V.view(1, 1, V).clone().requires_grad_(True)
    forward_kl(s_l, t_V.view(1, 1, V), mask)[0].backward()
    assert torch.allclose(s_h.grad, s_l.grad, atol=1e-6)
    p_s, p_t = torch.softmax(s_V.double(), -1), torch.softmax(t_V.double(), -1)
    assert torch.allclose(s_l.grad.view(V).double(), p_s - p_t, atol=1e-6)  # d KL(T||S)/dz = p_S - p_T


def test_a_teacher_tail_of_only_minus_inf_gives_finite_gradients():
    V, M = 6, 2
    s = torch.randn(2, 3, V, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    t_V = torch.tensor([0.0, -1.0] + [float("-inf")] * (V - 2))  # a masked vocabulary: only 2 tokens
    t = t_V.expand(2, 3, V).clone().requires_grad_(True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, _ = topm_tail_reverse_kl(s, t, mask, M=M)
    loss.backward()  # main: NaN gradients (the tail's logsumexp over -inf only)
    assert torch.isfinite(loss) and torch.isfinite(s.grad).all() and torch.isfinite(t.grad).all()


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_sdpo_with_a_teacher_tail_of_only_minus_inf_gives_finite_gradients(alpha):
    V = 6
    s = torch.tensor([[[3.0, 2.0, -1.0, -1.0, -2.0, -2.0]]], requires_grad=True)  # student top-2: ids 0, 1
    t = torch.tensor([[[0.0, -1.0] + [float("-inf")] * (V - 2)]])  # SDPO's teacher takes no gradient
    mask, ids = torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, 1, dtype=torch.long)
    loss, _ = sdpo_topk_loss(s, t, ids, mask, None, k=2, alpha=alpha)
    loss.backward()
    assert math.isfinite(float(loss)) and torch.isfinite(s.grad).all()
