"""The cold start's registered parts: objectives (stages.core.losses.composer_objectives), readouts and
memory norms (stages.core.models.readouts). A new one is a registered entry plus an allowed value."""
from __future__ import annotations

import json
import typing

import pytest
import torch

from stages.coldstart import recipe as coldstart
from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.composer_teacher import composer_loss
from stages.core.latent.contexts import build_batch
from stages.core.losses.composer_objectives import OBJECTIVES, ObjectiveSettings
from stages.core.losses.lopd import masked_nll
from stages.core.models.composer import Composer
from stages.core.models.readouts import MEMORY_NORMS, READOUTS, QFormerReadout
from tests.test_coldstart import cfg, one_thread, store_path, tiny_dir  # noqa: F401 (fixtures)
from tests.test_coldstart_ladder import two_env_trajs
from tests.test_index import HashEmbedder
from tests.tiny import tiny_model, tiny_tokenizer


def _allowed(annotation) -> set[str]:
    """The values of a Literal annotation, also inside ``Literal[...] | None``."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return set(args)
    return set().union(*(_allowed(a) for a in args if a is not type(None)))


def test_every_allowed_value_is_registered():
    fields = ColdstartConfig.model_fields
    assert _allowed(fields["objective"].annotation) == {"action-nll", "contrast", "text-kl"}
    assert _allowed(fields["objective"].annotation) <= set(OBJECTIVES)
    assert set(typing.get_args(fields["readout"].annotation)) == set(READOUTS)
    assert set(typing.get_args(fields["memory_norm"].annotation)) == set(MEMORY_NORMS)
    with pytest.raises(ValueError, match="unknown readout 'nope'.*known: qformer, pointer, span, centred"):
        READOUTS["nope"]


def test_the_objective_follows_its_weight_and_refuses_a_mismatch():
    assert ColdstartConfig(experiences="s", out="o").objective == "action-nll"
    assert ColdstartConfig(experiences="s", out="o", text_kl_weight=1.0).objective == "text-kl"
    assert ColdstartConfig(experiences="s", out="o", contrast_weight=1.0, objective=None).objective == "contrast"
    with pytest.raises(ValueError, match="--objective text-kl needs --text-kl-weight above 0"):
        ColdstartConfig(experiences="s", out="o", objective="text-kl")
    with pytest.raises(ValueError, match="--contrast-weight weighs the contrast objective, not --objective action-nll"):
        ColdstartConfig(experiences="s", out="o", objective="action-nll", contrast_weight=1.0)


def _toy(teacher, settings):
    """A toy objective: the action NLL with the latents scaled by 2."""
    return masked_nll(*teacher.scored(2 * teacher.latents()))


def test_a_registered_toy_objective_trains_a_cold_start(tmp_path, store_path, tiny_dir, monkeypatch):  # noqa: F811
    monkeypatch.setitem(OBJECTIVES._entries, "toy", _toy)
    tok = tiny_tokenizer()
    composer = Composer(tiny_model(tok), J=2, K=3, depth=1, lora_rank=2, adapter_name="c_toy", max_exp_tokens=40)
    trajs = two_env_trajs()
    batch = build_batch(tok, trajs[:2], [[trajs[3], trajs[4]], [trajs[5]]], J=2, max_exp_tokens=40)
    loss, _ = composer_loss("toy", composer, batch, "prefix")
    plain, _ = composer_loss("action-nll", composer, batch, "prefix")
    assert float(loss) != pytest.approx(float(plain))
    # the recipe takes the objective by name (the allowed value would join ColdstartConfig.objective)
    config = cfg(tmp_path, store_path, tiny_dir, steps=3, ladder=False).model_copy(update={"objective": "toy"})
    run = coldstart.Coldstart(config, embedder=HashEmbedder())
    run.train()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    batch_of_step = run.data.batch([run.targets.train[i] for i in [0, 1]], heldout=False, device="cpu")
    assert len(rows) == 3 and all(r["grad_norm"] > 0 for r in rows)
    assert composer_loss("toy", run.composer, batch_of_step, "prefix", ObjectiveSettings())[0].requires_grad


class _Doubled(QFormerReadout):
    """A toy readout: the qformer readout times 2."""

    name = "doubled"

    def latents(self, module, q_NKd, h_NLd, mask_NL, emb):
        return 2 * super().latents(module, q_NKd, h_NLd, mask_NL, emb)


def test_a_registered_toy_readout_is_a_composer_readout(monkeypatch):
    monkeypatch.setitem(READOUTS._entries, "doubled", _Doubled())
    tok = tiny_tokenizer()
    ids = torch.tensor([[[5, 6, 7], [8, 9, 0]]])
    mask = torch.tensor([[[True, True, True], [True, True, False]]])
    latents = {}
    for readout in ("qformer", "doubled"):
        torch.manual_seed(0)
        composer = Composer(tiny_model(tok), J=2, K=3, depth=1, lora_rank=2, readout=readout, max_exp_tokens=40)
        with torch.no_grad():
            latents[readout] = composer(ids, mask)
    torch.testing.assert_close(latents["doubled"], 2 * latents["qformer"])
