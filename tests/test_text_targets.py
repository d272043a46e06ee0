"""The text teacher's top-M targets kept per training target (stages/core/latent/text_targets.py) and
the ``text-kl`` objective over them (``text_kl_top_m``)."""
from __future__ import annotations

import shutil

import pytest
import torch
from pydantic import ValidationError

from stages.core.latent.composer_teacher import composer_loss
from stages.core.latent.contexts import build_batch, shift_for_loss
from stages.core.latent.teacher import text_teacher_logits
from stages.core.latent.text_targets import TextTargets
from stages.core.losses.composer_objectives import ObjectiveSettings
from stages.core.losses.topm_kl import teacher_top_m
from stages.core.models.composer import Composer
from tests.test_coldstart import cfg, metrics, run, store_path, tiny_dir  # noqa: F401 (fixtures)
from tests.test_coldstart_ladder import two_env_trajs
from tests.tiny import tiny_model, tiny_tokenizer


def _setup(framed: bool = True, other: bool = False):
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    composer = Composer(tiny_model(tok), J=2, K=3, depth=1, lora_rank=2, adapter_name="c_tt", max_exp_tokens=200)
    trajs = two_env_trajs()
    exps = [[trajs[3], trajs[4]], [trajs[5]]] if not other else [[trajs[4], trajs[3]], [trajs[5]]]
    return composer, build_batch(tok, trajs[:2], exps, J=2, max_exp_tokens=200, framed=framed)


def test_targets_are_the_text_teachers_top_m_and_are_read_back_from_disk(tmp_path):
    composer, batch = _setup()
    logits, _, mask = shift_for_loss(text_teacher_logits(composer.backbone, batch, "framed"), batch)
    want = teacher_top_m(logits[mask.bool()], 5)
    kept = TextTargets(tmp_path, "w0", 5)
    got = kept.of_batch(composer.backbone, batch, "framed")
    assert kept.computed == 2 and len(list((tmp_path / "w0").glob("*.safetensors"))) == 2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    again = TextTargets(tmp_path, "w0", 5)  # a resumed run: read from disk, no teacher forward
    for g, w in zip(again.of_batch(composer.backbone, batch, "framed"), want):
        torch.testing.assert_close(g, w)
    assert again.computed == 0
    # other experiences, another M, another placement or other weights: computed anew
    _, moved = _setup(other=True)
    kept.of_batch(composer.backbone, moved, "framed")
    assert kept.computed == 3  # row 1's experiences are unchanged
    TextTargets(tmp_path, "w0", 6).of_batch(composer.backbone, batch, "framed")
    other_weights = TextTargets(tmp_path, "w1", 5)
    other_weights.of_batch(composer.backbone, batch, "framed")
    assert other_weights.computed == 2
    # a torn file is computed again, not trusted
    for f in (tmp_path / "w0").glob("*.safetensors"):
        f.write_bytes(b"torn")
    fresh = TextTargets(tmp_path, "w0", 5)
    for g, w in zip(fresh.of_batch(composer.backbone, batch, "framed"), want):
        torch.testing.assert_close(g, w)
    assert fresh.computed == 2


def test_top_m_over_the_whole_vocabulary_is_the_full_text_kl():
    composer, batch = _setup()
    V = composer.backbone.get_input_embeddings().weight.shape[0]
    full, fm = composer_loss("text-kl", composer, batch, "framed", ObjectiveSettings(text_kl_weight=0.5))
    full.backward()
    grads = [p.grad.clone() for p in composer.compressor.parameters()]
    composer.zero_grad()
    top, tm = composer_loss("text-kl", composer, batch, "framed", ObjectiveSettings(text_kl_weight=0.5, text_kl_top_m=V))
    top.backward()
    assert tm["text_kl"] == pytest.approx(fm["text_kl"], rel=1e-4) and float(top) == pytest.approx(float(full), rel=1e-4)
    for g, p in zip(grads, composer.compressor.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-6)
    composer.zero_grad()
    small, sm = composer_loss("text-kl", composer, batch, "framed", ObjectiveSettings(text_kl_weight=0.5, text_kl_top_m=3))
    assert 0 < sm["text_kl"] < fm["text_kl"]  # merging the tail can only lower the KL


def test_the_setting_belongs_to_the_text_kl_objective(tmp_path, store_path, tiny_dir):  # noqa: F811
    with pytest.raises(ValidationError, match="--text-kl-top-m"):
        cfg(tmp_path, store_path, tiny_dir, text_kl_top_m=8)


def test_a_cold_start_with_kept_targets_trains_as_when_it_computes_them(tmp_path, store_path, tiny_dir):  # noqa: F811
    """A resumed run reads the kept targets back from disk and trains exactly what the run that
    computed them trained; at most one target file per training target."""
    keys = ("step", "loss", "nll", "text_kl", "grad_norm")
    common = dict(steps=6, checkpoint_every=3, text_kl_weight=1.0, text_kl_top_m=8, placement="framed", ladder=False)
    first = run(cfg(tmp_path, store_path, tiny_dir, name="a", **common))
    targets = list((tmp_path / "a" / "text_teacher").rglob("*.safetensors"))
    assert 0 < len(targets) <= first.train_trajectories
    cut = tmp_path / "b"
    run(cfg(tmp_path, store_path, tiny_dir, name="b", **common))
    for gone in ("checkpoints/step-6", "final"):
        shutil.rmtree(cut / gone)
    run(cfg(tmp_path, store_path, tiny_dir, name="b", resume=True, **common))
    a, b = metrics(tmp_path / "a"), metrics(cut)
    assert [{k: r.get(k) for k in keys} for r in a] == [{k: r.get(k) for k in keys} for r in b]
    assert all(r["text_kl"] > 0 for r in a)
