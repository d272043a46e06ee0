"""The top-M + tail forward KL (stages.core.losses.topm_kl) against a naive loop and the full KL."""
from __future__ import annotations

import math

import pytest
import torch

from stages.core.losses.kd import forward_kl
from stages.core.losses.topm_kl import teacher_top_m, top_m_forward_kl


def _logits(seed: int, N: int = 5, V: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, V, generator=g) * 3, torch.randn(N, V, generator=g) * 3


@pytest.mark.parametrize("M", [1, 3, 10])
def test_top_m_kl_matches_a_naive_bucket_loop(M):
    teacher, student = _logits(0)
    kl_N = top_m_forward_kl(student, *teacher_top_m(teacher, M))
    for n in range(teacher.shape[0]):
        p = torch.softmax(teacher[n].double(), -1).tolist()
        q = torch.softmax(student[n].double(), -1).tolist()
        top = sorted(range(len(p)), key=lambda v: -p[v])[:M]
        want = sum(p[v] * math.log(p[v] / q[v]) for v in top)
        p_tail, q_tail = 1 - sum(p[v] for v in top), 1 - sum(q[v] for v in top)
        want += p_tail * math.log(p_tail / q_tail)
        assert float(kl_N[n]) == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert (kl_N >= -1e-6).all()


def test_with_m_equal_to_v_it_is_the_full_kl_and_below_it_otherwise():
    teacher, student = _logits(1)
    student.requires_grad_(True)
    full, _ = forward_kl(student.unsqueeze(0), teacher.unsqueeze(0), torch.ones(1, teacher.shape[0], dtype=torch.bool),
                         reduction="token")
    whole = top_m_forward_kl(student, *teacher_top_m(teacher, teacher.shape[1])).mean()
    assert float(whole) == pytest.approx(float(full), rel=1e-5)
    g_whole, = torch.autograd.grad(whole, student)
    g_full, = torch.autograd.grad(full, student)
    torch.testing.assert_close(g_whole, g_full, rtol=1e-4, atol=1e-6)
    assert float(top_m_forward_kl(student, *teacher_top_m(teacher, 4)).mean()) < float(full)
    _, _, tail = teacher_top_m(teacher, 99)
    assert torch.isneginf(tail).all()
    with pytest.raises(ValueError, match="M must be at least 1"):
        teacher_top_m(teacher, 0)
