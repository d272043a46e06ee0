"""The centred readout (readout="centred"): the shared part of the latents' gradient trains a constant only."""
from __future__ import annotations

import copy

import torch

from stages.core.models.assembly import load_composer
from stages.core.models.composer import Composer, add_lora_adapter, save_composer
from stages.core.models.readouts import centre_gradient
from tests.test_composer import D, J, K, experiences, setup  # noqa: F401 (fixture)


def centred_composer(initial) -> Composer:
    torch.manual_seed(1)
    return Composer(add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8), J=J, K=K, depth=2,
                    memory_norm="token", readout="centred", lora_rank=4, lora_alpha=8, max_exp_tokens=16)


def test_centre_gradient_keeps_the_value_and_removes_the_rows_mean_gradient():
    """Hand-computed: rows x (3, 1, 2) and upstream gradients g; the value passes, the gradient is g - mean(g)."""
    x = torch.tensor([[[1.0, 2.0]], [[3.0, -1.0]], [[0.5, 0.0]]], requires_grad=True)
    g = torch.tensor([[[3.0, 0.0]], [[0.0, 3.0]], [[0.0, 0.0]]])
    y = centre_gradient(x)
    torch.testing.assert_close(y, x, atol=0, rtol=0)
    (y * g).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[[2.0, -1.0]], [[-1.0, 2.0]], [[-1.0, -1.0]]]))
    one = torch.ones(1, 1, 2, requires_grad=True)
    (centre_gradient(one) * 5).sum().backward()
    torch.testing.assert_close(one.grad, torch.full((1, 1, 2), 5.0))  # a single row passes as it is


def test_centred_readout_values_gradients_and_checkpoint(setup, tmp_path):
    """Forward: the qformer readout plus the constant, row by row (no row depends on the others).
    Backward against a naive reference: the blocks, queries and LoRA get the gradient of the rows'
    centred upstream gradient, the constant the sum of all rows'. A loss every row shares (a
    constant prompt's objective) trains the constant and nothing behind the readout. Save and load
    keep the values."""
    initial, _ = setup
    composer = centred_composer(initial)
    comp = composer.compressor
    with torch.no_grad():
        comp.latent_bias.copy_(torch.randn(K, D))
    ids, mask = experiences()
    ids_NL, mask_NL = ids.reshape(-1, 7), mask.reshape(-1, 7)
    latents_NKd = composer.encode(ids_NL, mask_NL)
    with torch.no_grad():
        for n in range(ids_NL.shape[0]):  # each row alone: the same value
            torch.testing.assert_close(composer.encode(ids_NL[n:n + 1], mask_NL[n:n + 1])[0], latents_NKd[n])
        comp.readout = "qformer"
        torch.testing.assert_close(composer.encode(ids_NL, mask_NL) + comp.latent_bias, latents_NKd)
        comp.readout = "centred"

    gen = torch.Generator().manual_seed(5)
    g_NKd = torch.randn(latents_NKd.shape, generator=gen)  # the upstream gradient of a row-specific loss
    behind = [p for n, p in composer.named_parameters() if p.requires_grad and "latent_bias" not in n]
    got = torch.autograd.grad((latents_NKd * g_NKd).sum(), behind + [comp.latent_bias])
    comp.readout = "qformer"  # naive reference: the plain readout, fed the centred gradient by hand
    plain_NKd = composer.encode(ids_NL, mask_NL)
    comp.readout = "centred"
    want = torch.autograd.grad(plain_NKd, behind, grad_outputs=g_NKd - g_NKd.mean(dim=0, keepdim=True))
    for a, b in zip(got[:-1], want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[-1], g_NKd.sum(dim=0))
    assert any(a.abs().sum() > 0 for a in got[:-1])

    shared_Kd = torch.randn(K, D, generator=gen)  # the same objective for every row
    grads = torch.autograd.grad((composer.encode(ids_NL, mask_NL) * shared_Kd).sum(), behind + [comp.latent_bias],
                                allow_unused=True)
    assert all(g is None or g.abs().max() < 1e-5 for g in grads[:-1])
    torch.testing.assert_close(grads[-1], shared_Kd * ids_NL.shape[0])

    with torch.no_grad():
        ref = composer(ids, mask)
    out = save_composer(composer, tmp_path / "centred", {"backbone_id": "tiny-llama"})
    loaded = load_composer(copy.deepcopy(initial), out, trainable=False, backbone_id="tiny-llama")
    assert loaded.compressor.readout == "centred"
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), ref, atol=0, rtol=0)
