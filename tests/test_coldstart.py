"""`lopd coldstart` on the tiny model and a tiny indexed store (CPU, a few seconds per run)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from schemas import Message, ToolCall, Trajectory, Turn
from stages.coldstart import data as coldstart_data
from stages.coldstart.ladder import heldout
from stages.coldstart import recipe as coldstart
from stages.coldstart.recipe import ColdstartConfig
from stages.coldstart.data import split_tasks
from stages.core.data.retrieval import index_new
from stages.core.data.store import ExperienceStore, StoreError
from stages.core.latent.contexts import build_batch
from stages.core.models import backbone
from stages.core.models.assembly import load_composer
from stages.core.models.composer import Composer, base_parameters, save_composer
from stages.core.run.runs import coldstart_stream
from tests.test_index import HashEmbedder
from tests.tiny import save_tiny, tiny_tokenizer

PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (8, 3)]


def make_traj(tid: str, a: int, b: int, success: bool = True) -> Trajectory:
    """A two-action ChatML-friendly conversation: tool call, tool result, final answer."""
    prompt = f"What is {a}+{b}? Use the add tool."
    call = ToolCall(name="add", arguments=json.dumps({"a": a, "b": b}))
    action1 = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    answer = a + b if success else a + b + 1
    action2 = f"The answer is {answer}."
    messages = [Message(role="system", content="You are a helpful assistant."),
                Message(role="user", content=prompt),
                Message(role="assistant", content=action1, tool_calls=[call]),
                Message(role="tool", content=str(a + b), name="add"),
                Message(role="assistant", content=action2)]
    turns = [Turn(action=action1, tool_calls=[call], observation=str(a + b), action_tokens=20),
             Turn(action=action2, action_tokens=6)]
    return Trajectory(trajectory_id=tid, task_id=f"add-{a}-{b}", env="toy", split="train", prompt=prompt,
                      policy="tiny", messages=messages, turns=turns, reward=1.0 if success else 0.0,
                      success=success, num_steps=2, num_tool_calls=1, run_id="r",
                      info=json.dumps({"tools": []}))  # short prompts keep the test fast


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: intra-op threads only add sync overhead (5x slower on a busy 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cs") / "store"
    store = ExperienceStore.open(path)
    rows = [make_traj(f"t{i}-{g}", a, b) for i, (a, b) in enumerate(PAIRS) for g in range(2)]
    rows.append(make_traj("fail-0", 1, 2, success=False))
    store.append(rows)
    index_new(store, HashEmbedder())
    return str(path)


def cfg(tmp_path, store_path, tiny_dir, name="out", **kw) -> ColdstartConfig:
    base = dict(experiences=store_path, out=str(tmp_path / name), model=tiny_dir, steps=6, lr=3e-3,
                batch_size=2, J=2, K=4, depth=1, lora_rank=4, max_exp_tokens=96, max_len=1024,
                heldout_fraction=0.25, checkpoint_every=2, eval_every=3, seed=0)
    base.update(kw)
    return ColdstartConfig(**base)


def run(config: ColdstartConfig):
    return coldstart.run(config, embedder=HashEmbedder())


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_split_and_batches_are_deterministic():
    tasks = {f"t{i}" for i in range(10)}
    train, held = split_tasks(tasks, 0.2, seed=0)
    assert len(held) == 2 and train | held == tasks and not train & held
    assert split_tasks(tasks, 0.2, seed=0) == (train, held)
    assert split_tasks(tasks, 0.2, seed=1) != (train, held)
    assert split_tasks({"a", "b"}, 0.01, 0)[1] and split_tasks({"a"}, 0.5, 0) == ({"a"}, set())
    seen = coldstart_stream(5, 3, 0, 10)
    assert sorted(seen[:5]) == sorted(seen[5:]) == list(range(5))  # each epoch is a permutation
    assert coldstart_stream(5, 3, 6, 2) == seen[6:8] == coldstart_stream(5, 3, 6, 2)


def test_training_lowers_nll_and_keeps_backbone(tmp_path, store_path, tiny_dir, monkeypatch):
    held = {}
    real_load = backbone.load_policy

    def capture(name, **kw):
        model, tok = real_load(name, **kw)
        held["model"] = model
        held["before"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        return model, tok

    monkeypatch.setattr(backbone, "load_policy", capture)
    # whole training set in every batch: the per-step losses are comparable
    config = cfg(tmp_path, store_path, tiny_dir, steps=8, batch_size=12, lr=1e-2, activation_checkpointing=False)
    report = run(config)
    rows = metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert set(rows[0]) >= {"step", "loss", "nll", "grad_norm", "lr", "seconds", "tokens"}
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.1
    assert all(r["grad_norm"] > 0 for r in rows)
    # backbone bit-identical, only phi changed
    assert report.backbone_unchanged
    after = dict(base_parameters(held["model"]))
    for name, before in held["before"].items():
        if name in after:
            assert torch.equal(after[name], before), name
    # held-out evaluation: four numbers, reported and written
    h = report.heldout
    assert h is not None and h.tokens > 0 and h.trajectories == report.heldout_trajectories
    assert h.nll_untrained is not None and h.nll_other_experiences is not None
    assert json.loads((tmp_path / "out" / "heldout.json").read_text())["nll_trained"] == h.nll_trained
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert "heldout_nll" in rows[2]  # eval_every=3
    # the final evaluation is on the curve too (lopd report plots it)
    assert (rows[-1]["heldout_nll"], rows[-1]["heldout_nll_no_latents"], rows[-1]["heldout_nll_untrained"],
            rows[-1]["heldout_nll_other_experiences"]) == (h.nll_trained, h.nll_no_latents, h.nll_untrained,
                                                           h.nll_other_experiences)


def test_checkpoints_and_round_trip(tmp_path, store_path, tiny_dir):
    config = cfg(tmp_path, store_path, tiny_dir, steps=6, checkpoint_every=2)
    report = run(config)
    out = tmp_path / "out"
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step-4", "step-6"]  # last two kept, no temp folders left
    for name in ckpts:
        assert {"composer", "compressor.safetensors", "composer_config.json", "optimizer.pt", "rng.pt",
                "state.json"} <= {p.name for p in (out / "checkpoints" / name).iterdir()}
    assert ColdstartConfig.model_validate_json((out / "config.json").read_text()) == config
    tok = tiny_tokenizer()
    from stages.core.models.backbone import load_policy

    exps_batch = build_batch(tok, [make_traj("x", 3, 5)], [[make_traj("e1", 1, 2), make_traj("e2", 4, 4)]],
                             J=2, max_exp_tokens=96)

    def latents(composer):
        with torch.no_grad():
            return composer(exps_batch.exp_ids_BJL, exps_batch.exp_mask_BJL)

    final = load_composer(load_policy(tiny_dir)[0], out / "final", trainable=True, backbone_id=report.backbone_id)
    c_final = latents(final)
    # the last checkpoint holds the same phi; a fresh composer differs
    torch.manual_seed(123)
    fresh = Composer(load_policy(tiny_dir)[0], J=2, K=4, depth=1, lora_rank=4, lora_alpha=8, max_exp_tokens=96)
    assert not torch.equal(latents(fresh), c_final)
    last = load_composer(load_policy(tiny_dir)[0], out / "checkpoints" / "step-6", trainable=True,
                         backbone_id=report.backbone_id)
    assert torch.equal(latents(last), c_final)
    # save / load round trip: identical latents
    save_composer(final, tmp_path / "again", {"backbone_id": report.backbone_id})
    again = load_composer(load_policy(tiny_dir)[0], tmp_path / "again", trainable=True, backbone_id=report.backbone_id)
    assert torch.equal(latents(again), c_final)


def test_resume_is_bit_identical(tmp_path, store_path, tiny_dir):
    keys = ("step", "loss", "nll", "grad_norm", "lr", "tokens", "heldout_nll")
    full = run(cfg(tmp_path, store_path, tiny_dir, name="full", steps=6, checkpoint_every=4))
    # an "interrupted" run: it wrote metrics up to step 6 but only checkpoint step-4 survived
    run(cfg(tmp_path, store_path, tiny_dir, name="cut", steps=6, checkpoint_every=4))
    cut = tmp_path / "cut"
    shutil.rmtree(cut / "checkpoints" / "step-6")
    shutil.rmtree(cut / "final")
    with pytest.raises(ValueError, match="already holds a coldstart run"):
        run(cfg(tmp_path, store_path, tiny_dir, name="cut", steps=6, checkpoint_every=4))
    with pytest.raises(ValueError, match=r"cut/config.json: field 'lr' is 0.003, the resumed run asks for 0.001"):
        run(cfg(tmp_path, store_path, tiny_dir, name="cut", steps=6, checkpoint_every=4, lr=1e-3, resume=True))
    resumed = run(cfg(tmp_path, store_path, tiny_dir, name="cut", steps=6, checkpoint_every=4, resume=True))
    assert resumed.start_step == 4
    a, b = metrics(tmp_path / "full"), metrics(cut)
    assert [r["step"] for r in b] == list(range(1, 7))
    assert [{k: r.get(k) for k in keys} for r in a] == [{k: r.get(k) for k in keys} for r in b]
    assert resumed.heldout == full.heldout
    # resuming a finished run trains nothing and keeps its final composer and held-out report
    final_files = {f: f.stat().st_mtime_ns for f in (cut / "final").rglob("*") if f.is_file()}
    again = run(cfg(tmp_path, store_path, tiny_dir, name="cut", steps=6, checkpoint_every=4, resume=True))
    assert again.start_step == 6 and again.heldout == resumed.heldout
    assert {f: f.stat().st_mtime_ns for f in (cut / "final").rglob("*") if f.is_file()} == final_files
    assert len(metrics(cut)) == 6
    # extending a finished run continues from its last checkpoint and trains what a fresh longer run
    # trains (batches are seeded by step, the lr is constant)
    longer = run(cfg(tmp_path, store_path, tiny_dir, name="full", steps=7, checkpoint_every=4, resume=True))
    fresh = run(cfg(tmp_path, store_path, tiny_dir, name="seven", steps=7, checkpoint_every=4))
    assert longer.start_step == 6 and [r["step"] for r in metrics(tmp_path / "full")] == list(range(1, 8))
    assert [{k: r.get(k) for k in keys} for r in metrics(tmp_path / "full")] == \
        [{k: r.get(k) for k in keys} for r in metrics(tmp_path / "seven")]
    assert longer.heldout == fresh.heldout


def test_target_never_among_its_experiences(tmp_path, store_path, tiny_dir, monkeypatch):
    seen = []
    real = coldstart_data.build_batch  # training batches there, held-out ones in heldout

    def spy(tok, trajectories, experiences, **kw):
        seen.extend(zip(trajectories, experiences))
        return real(tok, trajectories, experiences, **kw)

    monkeypatch.setattr(coldstart_data, "build_batch", spy)
    monkeypatch.setattr(heldout, "build_batch", spy)
    config = cfg(tmp_path, store_path, tiny_dir, steps=4, batch_size=3, placement="per-turn")
    report = run(config)
    train_tasks, held_tasks = split_tasks({f"add-{a}-{b}" for a, b in PAIRS}, 0.25, 0)
    assert len(seen) >= 12 + report.heldout_trajectories
    for target, exps in seen:
        assert exps, "every target gets experiences (the store has other successes)"
        assert target.trajectory_id not in {e.trajectory_id for e in exps}
        assert target.task_id not in {e.task_id for e in exps}  # exclude_same_task
        assert all(e.success for e in exps)
        if target.task_id in train_tasks:  # held-out tasks never enter training
            assert not {e.task_id for e in exps} & held_tasks


def test_errors(tmp_path, store_path, tiny_dir):
    store = ExperienceStore.open(tmp_path / "few")
    store.append([make_traj("only", 1, 2), make_traj("bad", 3, 4, success=False)])
    index_new(store, HashEmbedder())
    with pytest.raises(StoreError, match="1 successful train trajectories.*at least 2"):
        run(cfg(tmp_path, str(tmp_path / "few"), tiny_dir))
    with pytest.raises(StoreError, match="only 0 successful trajectories fit max_len=20"):
        run(cfg(tmp_path, store_path, tiny_dir, name="short", max_len=20))
    with pytest.raises(Exception, match="extra"):
        ColdstartConfig(experiences="x", out="y", bogus=1)
    with pytest.raises(ValueError, match="--reconstruction-steps 5 leaves none of --steps 5 to the action objective"):
        ColdstartConfig(experiences="x", out="y", steps=5, reconstruction_steps=5)
    assert ColdstartConfig(experiences="x", out="y", steps=5, reconstruction_steps=4).reconstruction_steps == 4


def test_resources_are_guarded_before_work(tmp_path, store_path, tiny_dir, monkeypatch):
    n = ExperienceStore.open(store_path).count(success=True)
    with pytest.raises(ValueError, match=rf"--J 500: store .* holds {n} successful train trajectories, "
                                         rf"so at most {n - 1} other ones"):
        run(cfg(tmp_path, store_path, tiny_dir, name="j500", J=500))
    assert not (tmp_path / "j500" / "config.json").exists()
    import psutil

    class Tiny:  # as if 1 MB were free: the step's estimate cannot fit
        available = 2**20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny())
    with pytest.raises(ValueError, match=r"coldstart: one step needs about .* GB .* lower --J, --max-exp-tokens"):
        run(cfg(tmp_path, store_path, tiny_dir, name="mem"))
    assert not (tmp_path / "mem" / "config.json").exists()


def test_too_little_data_warns_and_the_summary_says_how_many_steps_it_averages(tmp_path, store_path, tiny_dir):
    """8 tasks x 2 successes: 25% held out leaves 2 held-out tasks and 12 targets; a batch of 16
    sees the same targets every step. Both get a warning; after 2 steps the summary's final loss
    is the mean of those 2 steps, and says so; the progress bar ends on the same number."""
    import io

    from rich.console import Console

    out = io.StringIO()
    report = coldstart.run(cfg(tmp_path, store_path, tiny_dir, steps=2, batch_size=16, eval_every=2),
                           console=Console(file=out, width=300), embedder=HashEmbedder())
    text = out.getvalue()
    assert report.train_trajectories == 12 and report.heldout_tasks == 2
    assert "warning: 12 training trajectories for --batch-size 16" in text
    assert "warning: 2 held-out task(s)" in text
    assert report.final_loss_steps == 2 and "mean of the last 2 steps" in text
    assert f"loss (mean of last 2) {report.final_loss:.3f}" in text


def test_other_task_shift_gives_every_target_another_tasks_experiences():
    shift = heldout.other_task_shift
    assert shift(["a", "a", "b", "b"], [{"x"}] * 4) == 2  # 1 pairs a with a
    assert shift(["a", "b", "c"], [{"c"}, {"x"}, {"x"}]) == 2  # 1 hands a's list to c, which holds c
    assert shift(["a", "a"], [set(), set()]) is None  # one task: no other task's list exists
    assert shift(["a", "b"], [{"b"}, {"a"}]) is None  # each list holds the other target's task


def test_heldout_other_experiences_is_the_trained_composer_on_moved_lists(tmp_path, store_path, tiny_dir):
    """(d) equals (c) when every target's experiences are the same list (moving them changes
    nothing), and differs when they differ; a single task leaves (d) out."""
    from stages.core.models.backbone import load_policy

    report = run(cfg(tmp_path, store_path, tiny_dir, steps=2, heldout_fraction=0.0))
    composer = load_composer(load_policy(tiny_dir)[0], report.final, trainable=False, backbone_id=report.backbone_id)
    tok = tiny_tokenizer()
    trajs = [make_traj(f"h{i}", a, b) for i, (a, b) in enumerate([(50, 1), (51, 2), (52, 3)])]
    pool = [make_traj(f"e{i}", a, b) for i, (a, b) in enumerate([(60, 4), (61, 5), (62, 6), (63, 7)])]
    kw = dict(J=2, max_exp_tokens=96, max_len=1024, batch_size=2)
    same = heldout.evaluate_heldout(composer, tok, trajs, [pool[:2]] * 3, **kw)
    assert same.nll_other_experiences == pytest.approx(same.nll_trained, abs=1e-6)
    moved = heldout.evaluate_heldout(composer, tok, trajs, [pool[:2], pool[2:], pool[1:3]], **kw)
    assert moved.nll_other_experiences is not None and moved.nll_other_experiences != moved.nll_trained
    one_task = [make_traj(f"s{i}", 50, 1) for i in range(2)]
    assert heldout.evaluate_heldout(composer, tok, one_task, [pool[:2]] * 2, **kw).nll_other_experiences is None


def test_the_progress_bar_ends_before_the_final_heldout_scoring(tmp_path, store_path, tiny_dir):
    """A plain log (no terminal) shows the last step done before the final held-out scoring's lines, not
    a bar stuck one step short whose ETA grows while the scoring (the ladder: minutes) runs."""
    import io

    from rich.console import Console

    from stages.coldstart.recipe import run as run_with_console

    log = io.StringIO()
    run_with_console(cfg(tmp_path, store_path, tiny_dir, steps=2, eval_every=100), console=Console(file=log, width=100),
                     embedder=HashEmbedder())
    text = log.getvalue()
    assert "coldstart: 2/2 (100%)" in text and "held-out NLL:" in text
    assert text.index("coldstart: 2/2 (100%)") < text.index("held-out NLL:")
