"""Each distinct composer input of an update encoded once (stages/core/latent/shared.py): the
same loss values and gradients as a composer forward per row, for a toy composer in float64
(graph kept, and recomputed chunk by chunk) and for whole LOPD distill steps on the tiny model."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from stages.core.latent.shared import SharedLatents
from stages.distill.recipe import Distiller
from stages.methods import lopd as lopd_method
from tests.test_distill import _hash_embedder, assets, make_config, metrics  # noqa: F401 (fixtures)


class ToyComposer(nn.Module):
    """(ids_NJL, mask_NJL) -> (N, J*K, d): masked mean of embeddings, K learned projections."""

    def __init__(self, vocab: int = 50, d: int = 4, K: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, d).double()
        self.proj = nn.Linear(d, K * d).double()
        self.K, self.d = K, d

    def forward(self, ids_NJL: torch.Tensor, mask_NJL: torch.Tensor) -> torch.Tensor:
        e = self.embed(ids_NJL) * mask_NJL[..., None]
        pooled = e.sum(2) / mask_NJL.sum(2, keepdim=True).clamp(min=1)  # (N, J, d)
        N, J = pooled.shape[:2]
        return torch.tanh(self.proj(pooled)).reshape(N, J * self.K, self.d)


def _inputs(seed: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (2, L), generator=g)
    mask = torch.ones(2, L, dtype=torch.bool)
    mask[1, L - 1:] = False
    return ids, mask


@pytest.mark.parametrize("chunk", [4, 1])  # 4: the graph kept; 1: recomputed per distinct input
def test_shared_latents_give_the_per_row_gradient(chunk):
    rows = [object() for _ in range(6)]
    encoded = [_inputs(i // 3, 5 + i // 3) for i in range(6)]  # two tasks x three rollouts
    weights = torch.linspace(0.5, 2.0, 6, dtype=torch.float64)

    def loss_of(c_BQd: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        return (weights[lo:hi, None, None] * c_BQd.pow(2)).sum()

    naive = ToyComposer()
    for lo, hi in ((0, 2), (2, 4), (4, 6)):  # per micro-batch, every row encoded
        ids = torch.stack([torch.nn.functional.pad(encoded[i][0], (0, 6 - encoded[i][0].shape[1])) for i in range(lo, hi)])
        mask = torch.stack([torch.nn.functional.pad(encoded[i][1], (0, 6 - encoded[i][1].shape[1])) for i in range(lo, hi)])
        loss_of(naive(ids, mask), lo, hi).backward()

    shared_composer = ToyComposer()
    shared = SharedLatents(shared_composer, None, rows, encoded, chunk, trainable=True, pad_token_id=0, device="cpu")
    assert shared.distinct == 2
    for lo, hi in ((0, 2), (2, 4), (4, 6)):
        c_phi, c_phi0 = shared.take(rows[lo:hi])
        assert not c_phi0.requires_grad and torch.equal(c_phi0, c_phi.detach())  # no anchor: the latents
        loss_of(c_phi, lo, hi).backward()
    assert all(p.grad is None for p in shared_composer.parameters())  # nothing before the composer backward
    shared.backward()
    for a, b in zip(naive.parameters(), shared_composer.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)


def test_a_frozen_composer_builds_no_graph_and_takes_no_gradient():
    rows = [object(), object()]
    composer, anchor = ToyComposer(), ToyComposer(K=3)
    with torch.no_grad():
        anchor.proj.weight.mul_(0.5)
    shared = SharedLatents(composer, anchor, rows, [_inputs(0, 4)] * 2, 2, trainable=False, pad_token_id=0, device="cpu")
    c_phi, c_phi0 = shared.take(rows)
    assert shared.distinct == 1 and not c_phi.requires_grad
    assert not torch.allclose(c_phi, c_phi0)  # the anchor's own latents
    shared.backward()
    assert all(p.grad is None for p in composer.parameters())
    with pytest.raises(KeyError):
        shared.take([object()])


@pytest.mark.parametrize("micro_batch", [4, 1])
def test_lopd_steps_equal_with_and_without_shared_latents(assets, tmp_path, monkeypatch, micro_batch):
    """Two LOPD steps of 2 tasks x 2 rollouts (the rollouts of a task share their experiences):
    metrics and final weights of the student and composer equal the per-micro-batch path."""
    def run(name: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
        trainer = Distiller(make_config(assets, tmp_path, name, steps=2, micro_batch=micro_batch, checkpoint_every=2))
        trainer.fit()
        weights = {f"student.{n}": p.detach().clone() for n, p in trainer.student.model.named_parameters()
                   if p.requires_grad}
        weights.update({f"composer.{i}": p.detach().clone() for i, p in enumerate(trainer.method.composer_params)})
        return metrics(trainer.out), weights

    seen = []
    original = lopd_method.LOPD.begin_update

    def counting(self, rows, extras):
        original(self, rows, extras)
        seen.append((len(rows), self.shared.distinct))

    monkeypatch.setattr(lopd_method.LOPD, "begin_update", counting)
    shared_rows, shared_weights = run("shared")
    assert seen == [(4, 2), (4, 2)]  # 4 rows, 2 distinct composer inputs per update
    monkeypatch.setattr(lopd_method.LOPD, "begin_update", lambda self, rows, extras: None)  # every row encoded
    plain_rows, plain_weights = run("plain")
    for a, b in zip(plain_rows, shared_rows):
        for key in ("loss", "reverse_kl", "Delta", "anchor", "latent_norm", "grad_norm_student", "grad_norm_composer"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert any(r["grad_norm_composer"] > 0 for r in shared_rows)  # the composer did learn
    for name, value in plain_weights.items():  # after two Adam steps at lr 1e-2, which divide by each
        # gradient's running scale: float32 rounding (another summation order) in a near-zero gradient
        # moves a weight by up to ~1e-5
        torch.testing.assert_close(shared_weights[name], value, rtol=1e-3, atol=2e-5, msg=lambda m: f"{name}: {m}")
