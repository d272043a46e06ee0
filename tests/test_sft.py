"""`lopd sft` on the tiny model and a tiny store: row selection, the NLL objective, training,
resume and the final folder."""
from __future__ import annotations

import io
import json
import re

import pytest
import torch
from rich.console import Console

from stages import sft
from stages.core.data.rows import pad_rows, training_rows
from stages.core.data.store import ExperienceStore, StoreError
from stages.core.models.backbone import load_policy
from stages.sft import SftConfig
from tests.test_coldstart import PAIRS, make_traj, one_thread, tiny_dir  # noqa: F401 (fixtures)
from tests.tiny import tiny_tokenizer


def _row(tid: str, a: int, b: int, *, policy: str, split: str = "warmup", success: bool = True):
    return make_traj(tid, a, b, success=success).model_copy(update={"policy": policy, "split": split})


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("sft") / "store"
    rows = [_row(f"ref-{i}", a, b, policy="reference") for i, (a, b) in enumerate(PAIRS)]
    rows += [_row(f"own-{i}", a, b, policy="tiny") for i, (a, b) in enumerate(PAIRS[:3])]
    rows += [_row("fail-0", 1, 2, policy="tiny", success=False), _row("train-0", 3, 4, policy="reference", split="train")]
    ExperienceStore.open(path).append(rows)
    return str(path)


def cfg(tmp_path, store_path, tiny_dir, name="out", **kw) -> SftConfig:
    base = dict(store=store_path, out=str(tmp_path / name), model=tiny_dir, steps=6, batch_size=2, lr=3e-3,
                checkpoint_every=2, seed=0, device="cpu", dtype="float32")
    return SftConfig(**{**base, **kw})


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("source, split, expected", [
    ("reference", "warmup", {f"ref-{i}" for i in range(len(PAIRS))}),
    ("student", "warmup", {"own-0", "own-1", "own-2"}),
    ("any", "train", {"train-0"}),
])
def test_rows_are_selected_by_split_source_and_success(tmp_path, store_path, tiny_dir, source, split, expected):
    store = ExperienceStore.open(store_path, create=False)
    picked = sft.select(store, cfg(tmp_path, store_path, tiny_dir, source=source, split=split))
    assert {t.trajectory_id for t in picked} == expected
    assert [t.trajectory_id for t in picked] == sorted(expected)


def test_no_row_or_no_store_is_one_clear_error(tmp_path, store_path, tiny_dir):
    with pytest.raises(StoreError, match=r"no successful rows \(split 'test', source any, reward >= 1.0\) to "
                                         r"fine-tune on; successful rows by split: train 1, warmup 11: pick one "
                                         r"with --split \(e.g. --split warmup\)$"):
        sft.run(cfg(tmp_path, store_path, tiny_dir, split="test"))
    with pytest.raises(StoreError, match="no successful rows .*split 'test'.*: collect them first"):  # none anywhere
        sft.run(cfg(tmp_path, store_path, tiny_dir, split="test", from_run="no-such-run"))
    with pytest.raises(StoreError, match="no experience store"):
        sft.run(cfg(tmp_path, str(tmp_path / "missing"), tiny_dir))
    assert not (tmp_path / "out").exists()  # nothing written by a run that could not start


def test_objective_is_the_token_mean_nll_of_action_tokens_only(store_path, tiny_dir):
    tokenizer = tiny_tokenizer()
    model = load_policy(tiny_dir, device="cpu", dtype="float32")[0]
    trajs = ExperienceStore.open(store_path, create=False).query(split="warmup", success=True)[:2]
    rows, _ = training_rows(tokenizer, trajs)
    batch = pad_rows(tokenizer, rows)
    loss, m = sft.nll_step(model, batch)
    ids_BT, attn_BT, mask_BT = batch[:3]
    logp_BTV = torch.log_softmax(model(input_ids=ids_BT, attention_mask=attn_BT.long()).logits.double(), -1)
    naive = [-logp_BTV[b, t - 1, ids_BT[b, t]] for b in range(len(rows)) for t in range(1, ids_BT.shape[1])
             if mask_BT[b, t]]
    assert m["num_tokens"] == len(naive) == int(mask_BT[:, 1:].sum())
    assert float(loss.detach()) == pytest.approx(float(sum(naive) / len(naive)), rel=1e-5)


def test_training_lowers_nll_writes_a_loadable_student_and_resumes_identically(tmp_path, store_path, tiny_dir):
    straight = sft.run(cfg(tmp_path, store_path, tiny_dir, name="a"))
    rows = metrics(tmp_path / "a")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert sum(r["nll"] for r in rows[-2:]) < sum(r["nll"] for r in rows[:2])
    tuned, base = load_policy(str(straight), device="cpu")[0], load_policy(tiny_dir, device="cpu")[0]
    assert any(not torch.equal(p, q) for p, q in zip(tuned.parameters(), base.parameters()))

    sft.run(cfg(tmp_path, store_path, tiny_dir, name="b", steps=4))
    with pytest.raises(ValueError, match="--resume"):
        sft.run(cfg(tmp_path, store_path, tiny_dir, name="b", steps=6))
    log = io.StringIO()  # a log file: no terminal
    resumed = sft.run(cfg(tmp_path, store_path, tiny_dir, name="b", steps=6, resume=True), console=Console(file=log))
    assert [r["nll"] for r in metrics(tmp_path / "b")] == pytest.approx([r["nll"] for r in rows], rel=1e-6)
    assert re.search(r"sft resuming run sft-\w+ after step 4 of 6 \(checkpoint .*step-4\)", log.getvalue())
    assert re.search(r"^sft: 4/6 \(67%\).*\n(.*\n)*sft: 6/6 \(100%\), nll \d", log.getvalue(), re.M)  # plain lines
    again = load_policy(str(resumed), device="cpu")[0]
    for p, q in zip(tuned.parameters(), again.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_lora_student_is_merged_into_a_plain_folder(tmp_path, store_path, tiny_dir):
    final = sft.run(cfg(tmp_path, store_path, tiny_dir, steps=2, lora_rank=4, lr=1e-2))
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
    tuned, base = load_policy(str(final), device="cpu")[0], load_policy(tiny_dir, device="cpu")[0]
    assert any(not torch.equal(p, q) for p, q in zip(tuned.parameters(), base.parameters()))
