"""The placement registry (:mod:`stages.core.latent.placements`): lookup, batch fields, where the latents go
at generation, and the shared latent-teacher forward on a batch."""
from __future__ import annotations

import pytest
import torch

from stages.core.latent.contexts import build_batch
from stages.core.latent.placements import PLACEMENTS, Framed, PerTurn, Prefix, get_placement
from stages.core.latent.teacher import latent_teacher_logits, teacher_logits
from stages.engines.latent import LatentEngine
from tests.test_framing import _rows
from tests.tiny import tiny_model, tiny_tokenizer


def test_lookup_by_name_and_unknown_names_list_the_known_ones():
    assert list(PLACEMENTS) == ["prefix", "per-turn", "framed"]
    assert isinstance(get_placement("prefix"), Prefix) and isinstance(get_placement("per-turn"), PerTurn)
    assert isinstance(get_placement("framed"), Framed)
    with pytest.raises(ValueError, match=r"unknown placement 'suffix' \(known: prefix, per-turn, framed\)"):
        get_placement("suffix")
    with pytest.raises(ValueError, match="known: prefix, per-turn, framed"):
        teacher_logits(torch.nn.Linear(1, 1).requires_grad_(False), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2),
                       torch.zeros(1, 0, 1), placement="suffix")
    with pytest.raises(ValueError, match="known: prefix, per-turn, framed"):
        LatentEngine(None, None, None, None, placement="suffix")


def test_batch_fields():
    assert get_placement("prefix").batch_fields == ("insert_at_B",)
    assert get_placement("per-turn").batch_fields == ("action_starts",)
    assert get_placement("framed").batch_fields == ("frame_ids", "insert_at_B")
    assert [p.needs_frame_ids for p in PLACEMENTS.values()] == [False, False, True]


def test_where_the_latents_go_at_generation():
    opening, later = [1, 2, 3], [1, 2, 3, 4, 5]
    for name in ("prefix", "per-turn"):
        assert get_placement(name).opening(None, [], [], "bfcl", opening) == (opening, [])
    # prefix: after the opening prompt; the episode's later ids follow the latents
    assert get_placement("prefix").prompt_parts(later, 3, opening, []) == (opening, [4, 5])
    # per-turn: at the end of every prompt
    assert get_placement("per-turn").prompt_parts(later, 3, opening, []) == (later, [])
    # framed: inside the opening's first user message; later ids follow its tail
    assert get_placement("framed").prompt_parts(later, 3, [7], [8, 9]) == ([7], [8, 9, 4, 5])


@pytest.mark.parametrize("name", ["prefix", "per-turn", "framed"])
def test_the_batch_forward_equals_the_keyword_forward(name):
    tok = tiny_tokenizer()
    model = tiny_model(tok).requires_grad_(False)
    rows = _rows(tok)
    batch = build_batch(tok, rows, [[] for _ in rows], J=1, max_exp_tokens=8,
                        framed=get_placement(name).needs_frame_ids)
    torch.manual_seed(0)
    latents_BNd = torch.randn(len(rows), 3, model.get_input_embeddings().weight.shape[1])
    with torch.no_grad():
        by_batch = latent_teacher_logits(model, batch, latents_BNd, name)
        by_keywords = teacher_logits(model, batch.input_ids_BT, batch.attn_mask_BT, latents_BNd, batch.insert_at_B,
                                     placement=name, action_starts=batch.action_starts, frame_ids=batch.frame_ids)
    assert torch.equal(by_batch, by_keywords)
