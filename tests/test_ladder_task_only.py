"""Rung (h') of the composer ladder, the task-only composer (stages.coldstart.ladder.task_only), on the tiny model."""
from __future__ import annotations

import pytest
import torch

from stages.coldstart.composer import new_composer
from stages.coldstart.data import ColdstartData
from stages.coldstart.ladder import task_only
from stages.coldstart.ladder.task_only import (LR_FACTORS, TASK_ONLY, TASK_ONLY_ADAPTER, _Blanked, kept,
                                               task_only_of, train_task_only)
from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.composer_teacher import composer_loss
from stages.core.run.runs import coldstart_stream
from tests.test_coldstart import one_thread  # noqa: F401 (its autouse fixture)
from tests.test_coldstart_ladder import _StubRetriever, two_env_trajs
from tests.tiny import tiny_model, tiny_tokenizer


class _NoRetriever:
    def retrieve(self, *a, **k):
        raise AssertionError("a blanked batch retrieves nothing")


def task_rows(tok, trajs, max_exp_tokens: int) -> set[tuple[int, ...]]:
    """The token ids of each target's task-only composer input row."""
    return {tuple(tok(f"Current task: {t.prompt.strip()}")["input_ids"][:max_exp_tokens]) for t in trajs}


def rows_of(ids_BJL, mask_BJL) -> list[tuple[int, ...]]:
    return [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(ids_BJL.flatten(0, 1), mask_BJL.flatten(0, 1))]


def small(tmp_path, **kw) -> ColdstartConfig:
    base = dict(experiences="x", out=str(tmp_path), J=2, K=2, depth=1, lora_rank=2, steps=2, batch_size=2, lr=1e-2,
                max_exp_tokens=96, activation_checkpointing=False)
    return ColdstartConfig(**{**base, **kw})


def test_a_blanked_batch_holds_each_targets_task_text_alone_and_retrieves_nothing(tmp_path):
    tok, trajs = tiny_tokenizer(), two_env_trajs()
    config = small(tmp_path, J=3)
    blank = ColdstartData(_NoRetriever(), tok, config, set()).batch(trajs[:3], heldout=False, device="cpu", blank=True)
    full = ColdstartData(_StubRetriever(trajs), tok, config, set()).batch(trajs[:3], heldout=False, device="cpu")
    for b, target in enumerate(trajs[:3]):
        assert set(rows_of(blank.exp_ids_BJL[b:b + 1], blank.exp_mask_BJL[b:b + 1])) == task_rows(tok, [target], 96)
    assert int(blank.exp_mask_BJL.sum()) == 3 * sum(len(r) for r in task_rows(tok, trajs[:3], 96))
    assert int(full.exp_mask_BJL.sum()) > int(blank.exp_mask_BJL.sum())  # the experiences' tokens are gone
    for name in ("input_ids_BT", "attn_mask_BT", "action_mask_BT", "insert_at_B"):  # the targets are the same
        assert torch.equal(getattr(full, name), getattr(blank, name))


def test_the_task_only_composer_reads_blanked_rows_while_the_text_teacher_reads_the_experiences(tmp_path):
    tok, trajs = tiny_tokenizer(), two_env_trajs()[:4]
    config = small(tmp_path, steps=3, text_kl_weight=1.0)
    data = ColdstartData(_StubRetriever(two_env_trajs()), tok, config, set())
    composer = new_composer(tiny_model(tok), config, tok, adapter_name=TASK_ONLY_ADAPTER)
    step0 = [trajs[i] for i in coldstart_stream(4, config.seed, 0, 2)]
    full = data.batch(step0, heldout=False, device="cpu")
    blank = data.batch(step0, heldout=False, device="cpu", blank=True)
    with torch.no_grad():
        expected = float(composer_loss("text-kl", _Blanked(composer, blank), full, "prefix", config.objective_settings())[0])
        text_teacher_blanked = float(composer_loss("text-kl", composer, blank, "prefix", config.objective_settings())[0])
    assert expected != pytest.approx(text_teacher_blanked)  # the teacher's view differs: this test can tell them apart
    seen, forward = [], composer.forward
    composer.forward = lambda ids_BJL, mask_BJL: seen.extend(rows_of(ids_BJL, mask_BJL)) or forward(ids_BJL, mask_BJL)
    before = [p.detach().clone() for p in composer.trainable_parameters()]
    losses = train_task_only(composer, data, trajs, config, 1e-2, None)
    assert len(losses) == 3 and losses[0] == pytest.approx(expected, rel=1e-5)
    assert seen and set(seen) <= task_rows(tok, trajs, 96)
    assert any(not torch.equal(b, p) for b, p in zip(before, composer.trainable_parameters()))


def test_the_task_only_control_is_swept_on_training_tasks_kept_and_trained_again_for_other_settings(tmp_path,
                                                                                                   monkeypatch):
    tok, trajs = tiny_tokenizer(), two_env_trajs()
    config = small(tmp_path)
    run_composer = new_composer(tiny_model(tok), config, tok)  # the run's, adapter "composer"
    data = ColdstartData(_StubRetriever(trajs), tok, config, set())
    trained_on, scored_on = [], []
    train_, nll_ = task_only.train_task_only, task_only.blanked_nll
    monkeypatch.setattr(task_only, "train_task_only", lambda c, d, targets, *a: trained_on.append(targets)
                        or train_(c, d, targets, *a))
    monkeypatch.setattr(task_only, "blanked_nll", lambda c, d, targets, *a: scored_on.append(targets)
                        or nll_(c, d, targets, *a))
    assert kept(tmp_path, config, trajs, True) is None
    with task_only_of(run_composer, data, trajs, config, tmp_path) as first:
        phi = [p.detach().clone() for p in first.composer.trainable_parameters()]
        assert first.composer.adapter_name == TASK_ONLY_ADAPTER
    assert TASK_ONLY_ADAPTER not in run_composer.backbone.peft_config  # deleted on exit
    # the sweep: each lr trains on some training tasks and is scored on the others; the chosen lr on all
    assert len(first.sweep) == len(LR_FACTORS) and first.sweep[f"{first.lr:g}"] == min(first.sweep.values())
    assert first.lr in [pytest.approx(f * config.lr) for f in LR_FACTORS]
    assert len(trained_on) == len(LR_FACTORS) + 1 and trained_on[-1] == trajs and len(scored_on) == len(LR_FACTORS)
    fit, val = {t.task_id for t in trained_on[0]}, {t.task_id for t in scored_on[0]}
    assert fit and val and not fit & val and fit | val == {t.task_id for t in trajs}
    # kept: read back, nothing trains
    assert kept(tmp_path, config, trajs, True) is True
    trained_on.clear()
    with task_only_of(run_composer, data, trajs, config, tmp_path) as again:
        assert all(torch.equal(a, b) for a, b in zip(phi, again.composer.trainable_parameters()))
        assert (again.lr, again.sweep) == (first.lr, first.sweep)
    assert trained_on == []
    # other settings or targets: trained again, and the file then holds the new key
    for other, targets in ((config.model_copy(update={"lr": 3e-3}), trajs), (config, trajs[::-1]),
                           (config.model_copy(update={"lora_rank": 4}), trajs)):
        assert kept(tmp_path, other, targets, True) is False
        with task_only_of(new_composer(tiny_model(tok), other, tok), data, targets, other, tmp_path):
            pass
        assert len(trained_on) == len(LR_FACTORS) + 1 and kept(tmp_path, other, targets, True) is True
        trained_on.clear()
    assert kept(tmp_path, config.model_copy(update={"lora_rank": 4}), trajs, False) is False  # the composer's kind
    assert (tmp_path / TASK_ONLY).is_file()
