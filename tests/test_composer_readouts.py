"""The composer's memory norms and readouts (pointer, span) on a tiny in-process Llama (the tiny
model and its fixtures: tests/test_composer.py)."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from stages.core.models.assembly import load_composer
from stages.core.models.composer import Composer, add_lora_adapter, save_composer
from stages.core.models.readouts import span_positions, standardize_over_tokens
from tests.test_composer import D, J, K, experiences, setup  # noqa: F401 (fixture and helper)


def test_standardize_over_tokens_matches_a_per_row_loop_and_ignores_padding():
    """Each row's features standardised over its own real tokens; padding comes out as zeros and
    what it held changes nothing."""
    gen = torch.Generator().manual_seed(7)
    h_NLd = torch.randn(3, 6, 5, generator=gen) * 4 + 9
    mask_NL = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4])
    out = standardize_over_tokens(h_NLd, mask_NL)
    for n in range(3):
        real = h_NLd[n][mask_NL[n]]  # (len, d)
        ref = (real - real.mean(0)) / torch.sqrt(real.var(0, unbiased=False) + 1e-5)
        torch.testing.assert_close(out[n][mask_NL[n]], ref, atol=1e-5, rtol=0)
        assert out[n][~mask_NL[n]].abs().max().item() == 0 if (~mask_NL[n]).any() else True
    garbage = torch.where(mask_NL.unsqueeze(-1), h_NLd, torch.full_like(h_NLd, 1e4))
    torch.testing.assert_close(standardize_over_tokens(garbage, mask_NL), out, atol=0, rtol=0)
    # a shift or scale of a row's features, common to all its tokens, is gone
    torch.testing.assert_close(standardize_over_tokens(h_NLd * 3 - 50, mask_NL), out, atol=1e-4, rtol=0)


def test_token_memory_norm_reads_only_what_differs_between_tokens(setup, tmp_path):
    """memory_norm="token": an experience whose tokens all have the same hidden state gives the
    latents of the queries alone (the uniform attention over standardised states reads zero), a
    component shared by every token changes nothing, and the setting survives a save and load."""
    initial, _ = setup
    torch.manual_seed(1)
    composer = Composer(add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8), J=J, K=K, depth=2,
                        memory_norm="token", lora_rank=4, lora_alpha=8, max_exp_tokens=16)
    comp = composer.compressor
    mask_NL = torch.ones(2, 5, dtype=torch.bool)
    with torch.no_grad():
        flat = comp((torch.randint(-8, 8, (1, 1, D)) / 8).expand(2, 5, D), mask_NL)  # exact means
        nothing = comp(torch.zeros(2, 5, D), mask_NL)
        torch.testing.assert_close(flat, nothing, atol=1e-5, rtol=0)
        h_NLd = torch.randn(2, 5, D)
        torch.testing.assert_close(comp(h_NLd + 30 * torch.randn(1, 1, D), mask_NL), comp(h_NLd, mask_NL),
                                   atol=1e-4, rtol=0)
        assert (comp(h_NLd, mask_NL) - nothing).abs().max() > 1e-3  # differing tokens do reach the latents
    layer = Composer(add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8), J=J, K=K, depth=2,
                     lora_rank=4, lora_alpha=8, max_exp_tokens=16)
    with torch.no_grad():  # the default reads the shared component
        assert (layer.compressor(h_NLd + 30 * torch.randn(1, 1, D), mask_NL)
                - layer.compressor(h_NLd, mask_NL)).abs().max() > 1e-3
    with pytest.raises(ValueError, match="memory_norm"):
        Composer(copy.deepcopy(initial), J=J, K=K, depth=1, memory_norm="batch")
    ids, mask = experiences()
    with torch.no_grad():
        ref = composer(ids, mask)
    out = save_composer(composer, tmp_path / "tok", {"backbone_id": "tiny-llama"})
    assert json.loads((out / "composer_config.json").read_text())["memory_norm"] == "token"
    loaded = load_composer(copy.deepcopy(initial), out, trainable=False, backbone_id="tiny-llama")
    assert loaded.compressor.memory_norm == "token"
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), ref, atol=0, rtol=0)


def test_pointer_readout_gives_convex_combinations_of_the_experience_token_embeddings(setup, tmp_path):
    """readout="pointer": each latent is a weighted sum of its experience's input embeddings
    (weights >= 0, summing to 1, none on padding); a sharp pointer returns one of the experience's
    token embeddings exactly; the pointer trains; the setting survives a save and load."""
    initial, _ = setup
    torch.manual_seed(1)
    composer = Composer(add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8), J=J, K=K, depth=2,
                        memory_norm="token", readout="pointer", lora_rank=4, lora_alpha=8, max_exp_tokens=16)
    comp = composer.compressor
    emb = composer.backbone.get_input_embeddings().weight  # (V, D)
    ids, mask = experiences()
    ids_NL, mask_NL = ids.reshape(-1, 7), mask.reshape(-1, 7)
    h_NLd = torch.randn(ids_NL.shape[0], 7, D)
    q_NKd = comp.queries.unsqueeze(0).expand(ids_NL.shape[0], -1, -1)
    w_NKL = comp.read.weights(comp, q_NKd, h_NLd, mask_NL)
    assert (w_NKL >= 0).all() and w_NKL.masked_select(~mask_NL.unsqueeze(1)).abs().max() == 0
    torch.testing.assert_close(w_NKL.sum(-1), torch.ones(w_NKL.shape[:2]))
    with torch.no_grad():
        comp.pointer_log_scale.fill_(40.0)  # an argmax pointer
        latents_NKd = composer.encode(ids_NL, mask_NL)
    for n in range(ids_NL.shape[0]):
        own = emb[ids_NL[n][mask_NL[n]]]  # (len, D): the row's real token embeddings
        for k in range(K):
            assert (own - latents_NKd[n, k]).abs().amax(dim=-1).min() < 1e-5
    with torch.no_grad():
        comp.pointer_log_scale.fill_(1.0)
    composer(ids, mask).square().sum().backward()
    for name in ("pointer_q.weight", "pointer_k.weight", "pointer_log_scale", "queries"):
        assert dict(comp.named_parameters())[name].grad.abs().sum() > 0, name
    assert emb.grad is None  # the frozen embeddings are read, never trained
    with pytest.raises(ValueError, match="emb_NLd"):
        comp(h_NLd, mask_NL)
    with pytest.raises(ValueError, match="readout"):
        Composer(copy.deepcopy(initial), J=J, K=K, depth=1, readout="mean")
    with torch.no_grad():
        ref = composer(ids, mask)
    out = save_composer(composer, tmp_path / "ptr", {"backbone_id": "tiny-llama"})
    loaded = load_composer(copy.deepcopy(initial), out, trainable=False, backbone_id="tiny-llama")
    assert (loaded.compressor.readout, loaded.compressor.memory_norm) == ("pointer", "token")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), ref, atol=0, rtol=0)


def test_span_positions_start_at_the_marker_and_stay_inside_the_row():
    ids = torch.tensor([[5, 1, 2, 7, 8, 9, 0, 0], [3, 4, 5, 6, 1, 2, 0, 0], [1, 2, 3, 0, 0, 0, 0, 0], [9, 9, 0, 0, 0, 0, 0, 0]])
    mask = ids > 0
    pos = span_positions(ids, mask, [1, 2], 3)
    # row 0: the marker at 1; row 1: at 4, moved left to end at the last real token; row 2: at 0;
    # row 3: no marker and 2 real tokens, the last one repeated
    assert pos.tolist() == [[1, 2, 3], [3, 4, 5], [0, 1, 2], [0, 1, 1]]
    assert span_positions(ids, mask, [], 2).tolist() == [[0, 1]] * 4


def test_span_readout_starts_as_the_experience_span_and_its_gate_trains(setup, tmp_path):
    """readout="span": at init (gate 0) the latents are exactly the input embeddings of the K tokens
    from the marker on; the gate gets a gradient (the qformer's parameters follow once it is not 0);
    the marker survives a save and load."""
    initial, _ = setup
    torch.manual_seed(1)
    composer = Composer(add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8), J=J, K=K, depth=2,
                        readout="span", span_marker=[7], lora_rank=4, lora_alpha=8, max_exp_tokens=16)
    emb = composer.backbone.get_input_embeddings().weight
    ids, mask = experiences()
    ids_NL, mask_NL = ids.reshape(-1, 7), mask.reshape(-1, 7)
    latents_NKd = composer.encode(ids_NL, mask_NL)
    pos_NK = span_positions(ids_NL, mask_NL, [7], K)
    torch.testing.assert_close(latents_NKd, emb[ids_NL.gather(1, pos_NK)], atol=0, rtol=0)
    latents_NKd.square().sum().backward()
    comp = composer.compressor
    assert comp.span_gate.grad.abs() > 0 and comp.queries.grad.abs().sum() == 0
    with torch.no_grad():
        comp.span_gate.fill_(0.5)
    composer.zero_grad()
    composer.encode(ids_NL, mask_NL).square().sum().backward()
    assert comp.queries.grad.abs().sum() > 0
    with torch.no_grad():
        ref = composer(ids, mask)
    out = save_composer(composer, tmp_path / "span", {"backbone_id": "tiny-llama"})
    loaded = load_composer(copy.deepcopy(initial), out, trainable=False, backbone_id="tiny-llama")
    assert loaded.span_marker == [7] and loaded.compressor.readout == "span"
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), ref, atol=0, rtol=0)
