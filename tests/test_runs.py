"""Run-folder rules: resume checks, frozen config, metrics, seeded data order (no model needed)."""
from __future__ import annotations

import json
import os
import random

import pytest
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from stages.core.run import runs


class Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")

    store: str
    out: str
    lr: float = 0.01
    steps: int = 3
    max_len: int | None = 1024
    checkpoint_every: int = 5
    tensorboard: bool = False
    grad_clip: float = Field(1.0, validation_alias=AliasChoices("grad_clip", "max_grad_norm"))
    resume: bool = False


def started(tmp_path, **kw) -> Cfg:
    """A config whose run has started in tmp_path/out (config.json, manifest, one metrics row)."""
    config = Cfg(store="store", out=str(tmp_path / "out"), **kw)
    runs.freeze_config(tmp_path / "out", "distill", "distill-1", config)
    runs.append_metrics(tmp_path / "out" / runs.METRICS_FILE, {"step": 1, "loss": 1.0})
    return config


def open_again(tmp_path, config: Cfg, **update):
    return runs.open_run(tmp_path / "out", "distill", config.model_copy(update={"resume": True, **update}),
                         resume=True, may_change=runs.RESUMABLE | {"tensorboard"}, path_fields=("store", "out"))


def test_fresh_folder_and_refusal_without_resume(tmp_path):
    fresh = runs.open_run(tmp_path / "out", "distill", Cfg(store="s", out="o"), resume=False)
    assert (fresh.resuming, fresh.saved, fresh.changes) == (False, None, [])
    assert not (tmp_path / "out").exists()  # nothing written
    config = started(tmp_path)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["stage"] == "distill"
    assert Cfg.model_validate_json((tmp_path / "out" / "config.json").read_text()) == config
    with pytest.raises(ValueError, match="already holds a distill run: pass --resume"):
        runs.open_run(tmp_path / "out", "distill", config, resume=False)
    with pytest.raises(ValueError, match="holds a distill run, not a coldstart run"):
        runs.open_run(tmp_path / "out", "coldstart", config, resume=True)


def test_resume_refusal_names_file_and_field(tmp_path):
    config = started(tmp_path)
    with pytest.raises(ValueError, match=r"out/config.json: field 'lr' is 0.01, the resumed run asks for 0.5 "
                                         r"\(only checkpoint_every, device, dtype, keep_checkpoints, max_len, resume, "
                                         r"steps, tensorboard may change\)$"):
        open_again(tmp_path, config, lr=0.5)
    with pytest.raises(ValueError, match="field 'store' is 'store'"):  # another store, not a respelling
        open_again(tmp_path, config, store="other")


def test_resume_of_a_folder_without_a_run_notes_that_a_new_run_starts(tmp_path):
    config = Cfg(store="s", out=str(tmp_path / "out"), resume=True)
    fresh = runs.open_run(tmp_path / "out", "distill", config, resume=True)
    assert not fresh.resuming
    assert runs.start_note(fresh, resume=True) == f"note: nothing to resume in {tmp_path / 'out'}: starting a new run"
    assert runs.start_note(fresh, resume=False) is None
    assert runs.start_note(open_again(tmp_path, started(tmp_path)), resume=True) is None  # a run to continue
    said = []
    runs.start_run(tmp_path / "other", "distill", config, ["lr"], resume=True, say=said.append)
    assert said == [f"note: nothing to resume in {tmp_path / 'other'}: starting a new run"]


def test_allowed_changes_are_reported_in_one_line(tmp_path, monkeypatch):
    config = started(tmp_path)
    monkeypatch.chdir(tmp_path)
    same = open_again(tmp_path, config, store=str(tmp_path / "store"), out="out")  # respelled paths
    assert same.resuming and same.changes == []
    changed = open_again(tmp_path, config, max_len=2048, steps=7, tensorboard=True)
    assert changed.changes == [("steps", 3, 7), ("max_len", 1024, 2048), ("tensorboard", False, True)]
    assert runs.describe_changes(changed.changes) == \
        "resume: changed steps 3 -> 7, max_len 1024 -> 2048, tensorboard False -> True"


def test_saved_config_read_through_aliases_and_defaults(tmp_path):
    config = started(tmp_path)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    saved["max_grad_norm"] = saved.pop("grad_clip")  # an older spelling
    del saved["tensorboard"]  # a field added since (its default applies)
    (tmp_path / "out" / "config.json").write_text(json.dumps(saved))
    assert open_again(tmp_path, config).changes == []
    (tmp_path / "out" / "config.json").write_text(json.dumps({**saved, "bogus": 1}))
    with pytest.raises(ValueError, match="config.json: not a valid Cfg"):
        open_again(tmp_path, config)
    (tmp_path / "out" / "config.json").write_text("{cut")
    with pytest.raises(ValueError, match="config.json: unreadable run config"):
        open_again(tmp_path, config)


def test_metrics_append_read_and_truncate(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert runs.truncate_metrics(path, 3) == 0 and runs.read_metrics(path) == []
    for step in range(1, 6):
        runs.append_metrics(path, {"step": step, "loss": 1.0 / step})
    with path.open("a") as f:
        f.write('{"step": 6, "lo')  # a line cut short by a kill
    assert runs.truncate_metrics(path, 3) == 3
    assert [r["step"] for r in runs.read_metrics(path)] == [1, 2, 3]
    assert path.read_text().endswith("\n") and not (tmp_path / "metrics.tmp").exists()
    with path.open("a") as f:
        f.write('{"step": 4, "lo')
    assert runs.truncate_metrics(path, 10) == 3  # the torn line goes even when no step is dropped


def distill_tasks_for(n: int, seed: int, cursor: int, count: int) -> list[int]:
    """distill.Distiller.tasks_for's order as written there (the reference)."""
    out = []
    for pos in range(cursor, cursor + count):
        order = list(range(n))
        random.Random(f"{seed}-{pos // n}").shuffle(order)
        out.append(order[pos % n])
    return out


def coldstart_batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """coldstart.batch_indices's order as it was written there (the reference)."""
    out = []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch, k = divmod(pos, n)
        perm = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        out.append(perm[k])
    return out


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_seeded_streams_reproduce_both_stages_orders(n):
    for seed in (0, 3):
        for start in range(0, 3 * n + 2):
            assert runs.seeded_stream(n, seed, start, 4) == distill_tasks_for(n, seed, start, 4)
        for step in range(6):
            assert runs.coldstart_stream(n, seed, step * 3, 3) == coldstart_batch_indices(n, 3, step, seed)
    stream = runs.seeded_stream(n, 1, 0, 3 * n)
    assert all(sorted(stream[e * n:(e + 1) * n]) == list(range(n)) for e in range(3))
    with pytest.raises(ValueError, match="n=0"):
        runs.seeded_stream(0, 1, 0, 1)


def test_streams_differ():  # why coldstart keeps its own: one stream would change its batches
    assert runs.seeded_stream(7, 0, 0, 7) != runs.coldstart_stream(7, 0, 0, 7)


def test_out_respelled_with_symlink(tmp_path):
    config = started(tmp_path)
    os.symlink(tmp_path / "out", tmp_path / "link")
    assert open_again(tmp_path, config, out=str(tmp_path / "link")).changes == []


def test_a_damaged_checkpoint_file_is_one_line_naming_it(tmp_path):
    """A truncated optimizer or RNG file (a full disk, a killed copy) reads as one ValueError
    naming the file; an error that is no loading failure passes through unchanged."""
    import torch

    from stages.core.run import checkpoint as ckpt

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    folder = ckpt.write_checkpoint(tmp_path, 1, lambda d: torch.save(optimizer.state_dict(), d / ckpt.OPTIMIZER_FILE),
                                   {"step": 1}, keep=1)
    for name in (ckpt.OPTIMIZER_FILE, ckpt.RNG_FILE):
        path = folder / name
        path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match=f"^{folder / ckpt.OPTIMIZER_FILE}: cannot load optimizer state \\(") as err:
        with ckpt.readable(folder / ckpt.OPTIMIZER_FILE, "optimizer state"):
            optimizer.load_state_dict(torch.load(folder / ckpt.OPTIMIZER_FILE, weights_only=True))
    assert "\n" not in str(err.value)
    assert str(err.value).endswith(f"; move {folder} out of {folder.parent} to resume from the checkpoint before it")
    with pytest.raises(ValueError, match=f"^{folder / ckpt.RNG_FILE}: cannot load RNG states"):
        ckpt.restore_rng(folder)
    with pytest.raises(KeyError):
        with ckpt.readable(folder, "anything"):
            raise KeyError("not a loading failure")


def test_a_resumed_run_s_manifest_keeps_its_first_start_and_lists_the_resumes(tmp_path, monkeypatch):
    """A rerun with --resume (even one with nothing left to do) must not overwrite when and at which
    commit the run was made: the first start stays, each later one is listed."""
    from pydantic import BaseModel

    from schemas import RunManifest
    from stages.core.run import provenance

    class Settings(BaseModel):
        steps: int = 3

    path = tmp_path / "manifest.json"
    monkeypatch.setattr(provenance, "git_commit", lambda: "aaa")
    first = provenance.write_manifest(path, "sft", "sft-1", Settings())
    monkeypatch.setattr(provenance, "git_commit", lambda: "bbb")
    provenance.write_manifest(path, "sft", "sft-1", Settings())
    again = RunManifest.model_validate_json(path.read_text())
    assert (again.git_commit, again.created_at) == ("aaa", first.created_at)
    assert len(again.resumes) == 1 and again.resumes[0].endswith(" bbb")
    provenance.write_manifest(path, "sft", "sft-2", Settings())  # another run in the folder: a fresh manifest
    assert RunManifest.model_validate_json(path.read_text()).git_commit == "bbb"
