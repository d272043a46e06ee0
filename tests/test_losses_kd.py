"""Full-vocabulary distillation losses (stages/core/losses/kd.py) against naive float64 loops."""
from __future__ import annotations

import math

import pytest
import torch

from stages.core.losses.kd import forward_kl, generalized_jsd


def _naive(student_BTV, teacher_BTV, mask_BT, beta, reduction, temperature=1.0):
    """Loops over rows, positions and vocabulary entries, in float64 Python arithmetic."""
    B, T, V = student_BTV.shape
    per_row, tokens = [], []
    for b in range(B):
        row = []
        for t in range(T):
            if not mask_BT[b, t]:
                continue
            s = [float(x) / temperature for x in student_BTV[b, t]]
            q = [float(x) / temperature for x in teacher_BTV[b, t]]
            zs = math.log(sum(math.exp(x) for x in s))
            zt = math.log(sum(math.exp(x) for x in q))
            ps = [math.exp(x - zs) for x in s]
            pt = [math.exp(x - zt) for x in q]
            if beta == 0.0:
                d = sum(pt[v] * math.log(pt[v] / ps[v]) for v in range(V))
            elif beta == 1.0:
                d = sum(ps[v] * math.log(ps[v] / pt[v]) for v in range(V))
            else:
                m = [beta * pt[v] + (1 - beta) * ps[v] for v in range(V)]
                d = (beta * sum(pt[v] * math.log(pt[v] / m[v]) for v in range(V))
                     + (1 - beta) * sum(ps[v] * math.log(ps[v] / m[v]) for v in range(V)))
            row.append(d)
            tokens.append(d)
        if row:
            per_row.append(sum(row) / len(row))
    if reduction == "token":
        return sum(tokens) / max(len(tokens), 1)
    return sum(per_row) / max(len(per_row), 1)


def _inputs(B=3, T=5, V=11, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(B, T, V, generator=g) * 2).to(dtype)
    t = (torch.randn(B, T, V, generator=g) * 2).to(dtype)
    mask = torch.rand(B, T, generator=g) > 0.4
    mask[0, 1] = True
    mask[2] = False  # a row without any supervised token
    return s, t, mask


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("reduction", ["sequence", "token"])
def test_matches_naive_loops(beta, reduction):
    s, t, mask = _inputs()
    for chunk in (1, 2, 256):  # chunking changes nothing
        loss, m = generalized_jsd(s, t, mask, beta, reduction=reduction, chunk_size=chunk)
        assert loss.dtype == torch.float64
        assert float(loss) == pytest.approx(_naive(s, t, mask, beta, reduction), rel=1e-10, abs=1e-12)
        assert m["kd_loss"] == pytest.approx(float(loss))
        assert m["forward_kl"] == pytest.approx(_naive(s, t, mask, 0.0, reduction), rel=1e-10)
        assert m["reverse_kl"] == pytest.approx(_naive(s, t, mask, 1.0, reduction), rel=1e-10)
        assert m["num_tokens"] == int(mask.sum())


def test_temperature_divides_both_logits():
    s, t, mask = _inputs(seed=4)
    loss, _ = generalized_jsd(s, t, mask, 0.5, temperature=1.7)
    assert float(loss) == pytest.approx(_naive(s, t, mask, 0.5, "sequence", temperature=1.7), rel=1e-10)


def test_forward_kl_is_torch_distributions_kl_and_jsd_endpoints():
    s, t, mask = _inputs(seed=1)
    kl_BT = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=t),
                                              torch.distributions.Categorical(logits=s))
    rev_BT = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=s),
                                               torch.distributions.Categorical(logits=t))
    for reduction in ("sequence", "token"):
        fwd, _ = forward_kl(s, t, mask, reduction=reduction)
        if reduction == "token":
            expected, rev_expected = kl_BT[mask].mean(), rev_BT[mask].mean()
        else:
            rows = [b for b in range(mask.shape[0]) if mask[b].any()]
            expected = torch.stack([kl_BT[b][mask[b]].mean() for b in rows]).mean()
            rev_expected = torch.stack([rev_BT[b][mask[b]].mean() for b in rows]).mean()
        assert torch.allclose(fwd, expected, rtol=1e-12)
        assert torch.allclose(generalized_jsd(s, t, mask, 0.0, reduction=reduction)[0], expected, rtol=1e-12)
        assert torch.allclose(generalized_jsd(s, t, mask, 1.0, reduction=reduction)[0], rev_expected, rtol=1e-12)


def test_equal_distributions_give_zero():
    s, _, mask = _inputs(seed=2)
    for beta in (0.0, 0.5, 1.0):
        loss, m = generalized_jsd(s, s.clone() + 3.0, mask, beta)  # a shift leaves the softmax unchanged
        assert abs(float(loss)) < 1e-12 and abs(m["reverse_kl"]) < 1e-12


def test_gradient_reaches_the_student_only_and_never_masked_positions():
    s, t, mask = _inputs(seed=3)
    for beta in (0.0, 0.5):
        s_req = s.clone().requires_grad_(True)
        t_req = t.clone().requires_grad_(True)
        loss, _ = generalized_jsd(s_req, t_req, mask, beta, chunk_size=2)
        loss.backward()
        assert t_req.grad is None  # the teacher is a fixed target
        assert torch.count_nonzero(s_req.grad[~mask]) == 0
        assert torch.count_nonzero(s_req.grad[mask].abs().sum(-1)) == int(mask.sum())
        # the analytic gradient of the forward KL w.r.t. student logits is p_S - p_T (per token / count)
    s_req = s.clone().requires_grad_(True)
    forward_kl(s_req, t, mask, reduction="token")[0].backward()
    expected = (torch.softmax(s, -1) - torch.softmax(t, -1)) / mask.sum()
    assert torch.allclose(s_req.grad[mask], expected[mask], atol=1e-12)


def test_step_denominators_make_micro_batches_sum_to_the_step():
    s, t, mask = _inputs(B=4, seed=5)
    mask[2, 0] = True
    for reduction in ("sequence", "token"):
        whole, _ = forward_kl(s, t, mask, reduction=reduction)
        n_seq, n_tok = int(mask.any(1).sum()), int(mask.sum())
        parts = sum(forward_kl(s[lo:lo + 2], t[lo:lo + 2], mask[lo:lo + 2], reduction=reduction,
                               num_sequences=n_seq, num_tokens=n_tok)[0] for lo in (0, 2))
        assert torch.allclose(parts, whole, rtol=1e-12)


def test_nothing_supervised_gives_zero_with_zero_gradient_and_half_precision_upcasts():
    s, t, mask = _inputs(seed=6)
    s_req = s.clone().requires_grad_(True)
    loss, m = forward_kl(s_req, t, torch.zeros_like(mask))
    loss.backward()
    assert loss.item() == 0.0 and m["num_tokens"] == 0 and torch.count_nonzero(s_req.grad) == 0
    half, _ = forward_kl(s.to(torch.bfloat16), t.to(torch.bfloat16), mask)
    assert half.dtype == torch.float32 and math.isfinite(float(half))


def test_only_one_chunk_of_vocabulary_work_is_kept_for_the_backward():
    B, T, V, chunk = 2, 40, 500, 8
    s = torch.randn(B, T, V, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.numel()) or x, lambda x: x):
        loss, _ = generalized_jsd(s, torch.randn(B, T, V), torch.ones(B, T, dtype=torch.bool), 0.5,
                                  chunk_size=chunk)
    assert saved and max(saved) <= chunk * V  # no [B*T x V] softmax waits for the backward
    loss.backward()
    assert s.grad.shape == (B, T, V)


def test_errors():
    s, t, mask = _inputs()
    with pytest.raises(ValueError, match="beta must lie in"):
        generalized_jsd(s, t, mask, 1.5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        generalized_jsd(s, t, mask, temperature=0.0)
    with pytest.raises(ValueError, match="both be \\(B, T, V\\)"):
        forward_kl(s, t[:, :-1], mask)
    with pytest.raises(ValueError, match="reduction must be"):
        forward_kl(s, t, mask, reduction="batch")
    with pytest.raises(ValueError, match="mask shape"):
        forward_kl(s, t, mask[:, :-1])
    with pytest.raises(ValueError, match="chunk_size"):
        forward_kl(s, t, mask, chunk_size=0)


def test_beta_near_an_endpoint_scales_that_endpoints_kl_down_as_the_option_help_says():
    """``-o beta=...``'s help (ReferenceOptions.beta): between the endpoints the loss is at most
    the binary entropy of beta, and near 0 / 1 about beta(1-beta) times the nearer endpoint's KL,
    its gradient as much or less."""
    from stages.methods.options import ReferenceOptions

    help_text = ReferenceOptions.model_fields["beta"].description
    assert "beta(1-beta)" in help_text and "binary entropy" in help_text and "1/100" in help_text
    torch.manual_seed(0)
    student, teacher, mask = torch.randn(2, 8, 50), torch.randn(2, 8, 50), torch.ones(2, 8, dtype=torch.bool)

    def loss_grad(beta):
        x = student.clone().requires_grad_(True)
        loss = generalized_jsd(x, teacher, mask, beta)[0]
        loss.backward()
        return loss.item(), x.grad.norm().item()

    for beta, end in ((0.01, 0.0), (0.99, 1.0)):
        (loss, grad), (end_loss, end_grad) = loss_grad(beta), loss_grad(end)
        scale = beta * (1 - beta)
        assert loss <= -beta * math.log(beta) - (1 - beta) * math.log(1 - beta)
        assert 0.9 * scale < loss / end_loss < 1.05 * scale
        assert 0.5 * scale < grad / end_grad < 1.05 * scale
