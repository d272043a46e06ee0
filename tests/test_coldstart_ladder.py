"""The composer ladder (stages.coldstart.ladder) and the cold start's levers, on the tiny model."""
from __future__ import annotations

import io
import json
import math

import pytest
import torch
from rich.console import Console

from stages.coldstart import recipe as coldstart
from stages import report as report_stage
from stages.coldstart.recipe import ColdstartConfig
from stages.coldstart.ladder.rescore import rescore
from stages.coldstart.settings import RUNG_NAMES, rung_list
from stages.core.latent.composer_teacher import composer_loss
from stages.coldstart.ladder.free_prompt import FreePrompt, train_free_prompt
from stages.coldstart.ladder.rungs import READING, RUNGS, Ladder, ladder_subset, mean_pairwise_cosine, partners, pooled_difference
from stages.core.data.retrieval import index_new
from stages.core.data.store import ExperienceStore
from stages.core.latent.contexts import build_batch
from stages.core.models.composer import Composer
from stages.report import ReportConfig
from tests.test_coldstart import make_traj, one_thread  # noqa: F401 (one_thread: its autouse fixture)
from tests.test_index import HashEmbedder
from tests.tiny import save_tiny, tiny_model, tiny_tokenizer

PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (8, 3), (9, 9), (5, 1)]


def two_env_trajs() -> list:
    """One success per task, tasks alternating between two environments."""
    return [make_traj(f"t{i}", a, b).model_copy(update={"env": f"toy{i % 2}"}) for i, (a, b) in enumerate(PAIRS)]


# ---------------------------------------------------------------------------------------------
# Pure statistics against naive references
# ---------------------------------------------------------------------------------------------


def test_pooled_difference_equal_counts_is_the_paired_mean_and_se():
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(7, generator=g, dtype=torch.float64) * 5, torch.rand(7, generator=g, dtype=torch.float64) * 5
    n = [4] * 7
    diff, se = pooled_difference(x.tolist(), y.tolist(), n)
    per_target = (x - y) / 4  # per-token difference of each target
    assert diff == pytest.approx(float(per_target.mean()))
    assert se == pytest.approx(float(per_target.std(unbiased=True) / math.sqrt(7)))


def test_pooled_difference_weights_by_tokens_and_drops_empty_targets():
    diff, se = pooled_difference([3.0, 1.0, 9.0], [1.0, 1.0, 0.0], [2, 6, 0])
    assert diff == pytest.approx(2.0 / 8)
    # naive ratio-estimator SE: residuals d_i - D n_i over the 2 targets with tokens
    res = [2.0 - 0.25 * 2, 0.0 - 0.25 * 6]
    assert se == pytest.approx(math.sqrt(2 / 1 * sum(r * r for r in res)) / 8)
    assert math.isnan(pooled_difference([1.0], [0.0], [3])[1])
    assert all(math.isnan(v) for v in pooled_difference([1.0], [0.0], [0]))


def test_mean_pairwise_cosine_matches_a_double_loop():
    lat = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    naive = [float(torch.nn.functional.cosine_similarity(lat[r].flatten(), lat[s].flatten(), dim=0))
             for r in range(5) for s in range(5) if r != s]
    assert mean_pairwise_cosine(lat) == pytest.approx(sum(naive) / len(naive))
    assert mean_pairwise_cosine(lat[:1].expand(3, -1, -1)) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        mean_pairwise_cosine(lat[:1])


# ---------------------------------------------------------------------------------------------
# Partners of rungs (d) and (e)
# ---------------------------------------------------------------------------------------------


def test_partners_are_of_another_task_in_the_right_environment():
    trajs = two_env_trajs()
    envs = [t.env for t in trajs]
    exps = [[trajs[(i + 2) % 10]] for i in range(10)]  # each retrieves a same-env neighbour
    both = partners(trajs, exps, envs)
    for i, (same, other) in enumerate(zip(both[True], both[False])):
        assert same is not None and other is not None
        assert envs[same] == envs[i] and envs[other] != envs[i]
        assert trajs[same].task_id != trajs[i].task_id
        assert all(e.task_id != trajs[i].task_id for e in exps[same] + exps[other])
    # one environment only: no partner in another
    assert all(p is None for p in partners(trajs, exps, ["one"] * 10)[False])
    picked = ladder_subset(trajs, exps, envs, 4, seed=0)
    assert len(picked) == 4 and picked == sorted(picked) and picked == ladder_subset(trajs, exps, envs, 4, seed=0)
    assert ladder_subset(trajs, exps, envs, 0, seed=0) == list(range(10))


# ---------------------------------------------------------------------------------------------
# The learned-prompt control (h) and the autoencoding objective
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def tiny():
    tok = tiny_tokenizer()
    return tiny_model(tok), tok


def test_free_prompt_has_no_input_dependence_and_trains(tiny):
    model, tok = tiny
    composer = Composer(model, J=2, K=3, depth=1, lora_rank=2, adapter_name="c_free")
    prompt = FreePrompt(composer.backbone, J=2, K=3, seed=0)
    trajs = two_env_trajs()
    b1 = build_batch(tok, trajs[:2], [[trajs[2]], [trajs[3], trajs[4]]], J=2, max_exp_tokens=40)
    b2 = build_batch(tok, trajs[:2], [[trajs[5], trajs[6]], []], J=2, max_exp_tokens=40)
    out1, out2 = prompt(b1.exp_ids_BJL, b1.exp_mask_BJL), prompt(b2.exp_ids_BJL, b2.exp_mask_BJL)
    assert out1.shape == (2, 6, model.config.hidden_size) and torch.equal(out1, out2) and torch.equal(out1[0], out1[1])
    emb_norm = model.get_input_embeddings().weight.norm(dim=-1).mean()
    assert torch.allclose(prompt.vectors_Nd.norm(dim=-1), emb_norm.expand(6), rtol=1e-4)
    before = prompt.vectors_Nd.detach().clone()
    steps_done = []
    losses = train_free_prompt(prompt, lambda step: b1, steps=6, lr=5e-2, grad_clip=None, placement="prefix",
                               advance=lambda: steps_done.append(1))
    assert len(steps_done) == 6 and losses[-1] < losses[0] and not torch.equal(before, prompt.vectors_Nd)
    assert not any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters()
                   if p is not prompt.vectors_Nd and not p.requires_grad)


def test_reconstruction_nll_matches_a_naive_forward(tiny):
    model, tok = tiny
    composer = Composer(model, J=2, K=3, depth=1, lora_rank=2, adapter_name="c_rec", max_exp_tokens=30)
    trajs = two_env_trajs()
    batch = build_batch(tok, trajs[:2], [[trajs[2], trajs[3]], [trajs[2]]], J=2, max_exp_tokens=40)
    ids_NL, mask_NL = batch.exp_ids_BJL.flatten(0, 1), batch.exp_mask_BJL.flatten(0, 1)
    loss, m = composer_loss("reconstruction", composer, batch, "prefix")
    assert len({tuple(ids[mask.bool()].tolist()) for ids, mask in zip(ids_NL, mask_NL)}) == 3
    # naive: each distinct row alone, [latents ; its tokens] through the frozen model, tokens 1.. scored
    rows = {tuple(ids[mask.bool()][:30].tolist()) for ids, mask in zip(ids_NL, mask_NL)}
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row])
            lat = composer.encode(ids, torch.ones_like(ids, dtype=torch.bool))
            with composer.backbone.disable_adapter():
                emb = composer.backbone.get_input_embeddings()(ids)
                logits = composer.backbone(inputs_embeds=torch.cat([lat, emb], 1)).logits[0]
            logp = torch.log_softmax(logits.float(), -1)
            K = lat.shape[1]
            for i in range(1, len(row)):
                total -= float(logp[K + i - 1, row[i]])
                count += 1
    assert m["num_tokens"] == count
    assert float(loss.detach()) == pytest.approx(total / count, rel=1e-4)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in composer.compressor.parameters())


# ---------------------------------------------------------------------------------------------
# The ladder of a cold-start run
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_env_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("ladder") / "store"
    store = ExperienceStore.open(path)
    store.append(two_env_trajs())
    index_new(store, HashEmbedder())
    return str(path)


def test_coldstart_writes_every_rung_and_a_copying_composer_beats_no_latents(tmp_path, two_env_store, monkeypatch,
                                                                            capsys):
    tiny_dir = str(save_tiny(tmp_path / "tiny"))
    # trained to copy: its own trajectory is every target's first experience (self_retrieval)
    config = ColdstartConfig(experiences=two_env_store, out=str(tmp_path / "out"), model=tiny_dir, steps=25,
                             lr=1e-2, lr_encoder=3e-3, batch_size=4, J=1, K=4, depth=1, lora_rank=4,
                             max_exp_tokens=96, heldout_fraction=0.5, checkpoint_every=25, eval_every=25,
                             self_retrieval=True, reconstruction_steps=2, ladder_targets=0,
                             ladder_rungs=",".join(RUNG_NAMES), activation_checkpointing=False)
    report = coldstart.run(config, embedder=HashEmbedder())
    ladder = report.ladder
    assert ladder is not None and set(ladder.nll) == set(RUNGS)
    # the two long phases report progress to the end (plain lines: the captured console is no terminal)
    printed = capsys.readouterr().out
    assert "ladder: training the free-vector control (h): 25/25 (100%)" in printed
    assert "ladder: choosing the task-only composer's lr (h'): 75/75 (100%)" in printed
    assert "ladder: training the task-only composer (h'): 25/25 (100%)" in printed
    batches = -(-ladder.targets // config.batch_size)
    assert f"ladder: scoring 10 rungs on {ladder.targets} held-out targets: {10 * batches}/{10 * batches} (100%)" in printed
    assert 2 <= ladder.targets <= report.heldout_trajectories and ladder.tokens > 0
    assert Ladder.model_validate_json((tmp_path / "out" / "ladder.json").read_text()) == ladder
    assert (tmp_path / "out" / "free_prompt.safetensors").is_file()
    assert (tmp_path / "out" / "task_only_composer.safetensors").is_file()
    # (h') is scored, with its lr chosen by the sweep, and (c) - (h') is reported beside (c) - (h)
    assert "h'" in ladder.nll and ladder.task_only_lr in [pytest.approx(f * config.lr) for f in (0.3, 1.0, 3.0)]
    assert len(ladder.task_only_sweep) == 3 and ladder.task_only_sweep[f"{ladder.task_only_lr:g}"] == min(
        ladder.task_only_sweep.values())
    pairs = [(d.x, d.y) for d in ladder.differences]
    assert pairs.index(("c", "h'")) == pairs.index(("c", "h")) + 1
    c_h = next(d for d in ladder.differences if (d.x, d.y) == ("c", "h'"))
    assert c_h.diff == pytest.approx(ladder.nll["c"] - ladder.nll["h'"]) and ladder.nll["h'"] != ladder.nll["h"]
    assert ladder.nll["f"] < ladder.nll["a"]
    f_a = next(d for d in ladder.differences if (d.x, d.y) == ("f", "a"))
    assert f_a.diff == pytest.approx(ladder.nll["f"] - ladder.nll["a"]) and f_a.se > 0
    assert -1 <= ladder.latent_cosine <= 1 and ladder.latent_cosine_untrained is not None
    g_i = next(d for d in ladder.differences if (d.x, d.y) == ("g", "i"))  # the text bound's own control
    assert g_i.diff == pytest.approx(ladder.nll["g"] - ladder.nll["i"]) and ladder.nll["g"] != ladder.nll["i"]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 25
    # a finished run resumed again reads its ladder back
    again = coldstart.run(config.model_copy(update={"resume": True}), embedder=HashEmbedder())
    assert again.ladder == ladder
    # `lopd report` shows it; `lopd ladder` scores the finished composer again, leaving the run as it was
    report_stage.run(ReportConfig(runs=[str(tmp_path / "out")]))
    report_md = tmp_path / "out" / "report" / "summary.md"
    assert "Composer ladder" in report_md.read_text() and "| (h) | J x K free vectors" in report_md.read_text()
    assert "| (h') | task-only composer" in report_md.read_text() and "| (c) - (h') |" in report_md.read_text()
    assert f"(h') learning rate {ladder.task_only_lr:g}, chosen on training tasks" in report_md.read_text()
    assert READING in report_md.read_text()
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    monkeypatch.setattr("stages.core.data.retrieval.load_embedder", lambda *a, **k: HashEmbedder())
    said = io.StringIO()
    again = rescore(str(tmp_path / "out"), targets=3, seed=1, out=str(tmp_path / "l.json"),
                    console=Console(file=said, width=300))
    assert "ladder: the control (h), read from free_prompt.safetensors" in said.getvalue()
    assert "ladder: the control (h'), read from task_only_composer.safetensors" in said.getvalue()
    assert "ladder: scoring 10 rungs on 3 held-out targets" in said.getvalue()  # a phase line before the long work
    assert "A negative difference favours the first rung" in said.getvalue()  # the table's caption
    assert f"(h') learning rate {ladder.task_only_lr:g}, chosen on training tasks" in said.getvalue()
    assert again is not None and again.targets == 3 and set(again.target_ids) <= set(ladder.target_ids)
    assert Ladder.model_validate_json((tmp_path / "l.json").read_text()) == again
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    for rung, sums in again.sums.items():  # the same targets score as in the run's own ladder
        for tid, value in zip(again.target_ids, sums):
            assert value == pytest.approx(ladder.sums[rung][ladder.target_ids.index(tid)], rel=1e-5)
    # without --targets / --seed, the run's own ladder_targets and seed: the run's own ladder again
    default = rescore(str(tmp_path / "out"), console=Console(file=io.StringIO()))
    assert default is not None and default.target_ids == ladder.target_ids
    assert default.nll == pytest.approx(ladder.nll, rel=1e-5)
    # --rungs d: (a), (c) and (d) only, the same numbers
    said = io.StringIO()
    subset = rescore(str(tmp_path / "out"), rungs="d", console=Console(file=said, width=300))
    assert set(subset.nll) == {"a", "c", "d"} and "scoring 3 rungs" in said.getvalue()
    assert subset.nll == pytest.approx({k: ladder.nll[k] for k in "acd"}, rel=1e-5)
    assert [(d.x, d.y) for d in subset.differences] == [("c", "a"), ("c", "d")]


def test_ladder_rungs_default_leaves_out_the_costly_task_only_control_and_names_unknown_rungs(tmp_path):
    config = ColdstartConfig(experiences="s", out=str(tmp_path / "o"))
    assert rung_list(config.ladder_rungs) == [r for r in RUNG_NAMES if r != "h'"]
    assert rung_list("d, h'") == ["a", "c", "d", "h'"]
    with pytest.raises(ValueError, match=r"--ladder-rungs: unknown rung\(s\) z"):
        ColdstartConfig(experiences="s", out=str(tmp_path / "o"), ladder_rungs="a,z")
    with pytest.raises(ValueError, match=r"--rungs: unknown rung\(s\) x"):
        rescore(str(tmp_path), rungs="c,x")


def test_rescore_refuses_bad_runs_in_one_line_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="nope: does not exist"):
        rescore("nope")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ValueError, match="f.txt: is a file"):
        rescore("f.txt")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ValueError, match="run: no config.json"):
        rescore("run")
    (run / "config.json").write_text("not json")
    with pytest.raises(ValueError, match=r"run/config.json: field '\(top level\)': Invalid JSON"):
        rescore("run")
    (run / "config.json").write_text(json.dumps({"experiences": "runs/store"}))
    with pytest.raises(ValueError, match="run/config.json: field 'out': Field required"):
        rescore("run")
    (run / "config.json").write_text(json.dumps({"experiences": "runs/store", "out": "run"}))
    with pytest.raises(ValueError, match="field 'experiences': runs/store is not there from .*; run `lopd ladder` from"):
        rescore("run")
    (tmp_path / "runs" / "store").mkdir(parents=True)
    with pytest.raises(ValueError, match="--out runs: is a folder"):
        rescore("run", out="runs")


class _StubRetriever:
    """Returns the store's other trajectories in order, as the retriever's hits."""

    def __init__(self, trajs):
        self.trajs = trajs

    def retrieve(self, text, J, *, exclude_ids=(), exclude_task_ids=(), **kw):
        from types import SimpleNamespace

        return [SimpleNamespace(trajectory=t) for t in self.trajs
                if t.trajectory_id not in exclude_ids and t.task_id not in exclude_task_ids][:J]


def test_self_retrieval_puts_the_target_first_in_training_only(tmp_path):
    from stages.coldstart.data import ColdstartData

    trajs = two_env_trajs()
    config = ColdstartConfig(experiences="x", out=str(tmp_path), J=3, self_retrieval=True)
    data = ColdstartData(_StubRetriever(trajs), tiny_tokenizer(), config, heldout_tasks=set())
    train = data.experiences(trajs[:2], heldout=False)
    held = data.experiences(trajs[:2], heldout=True)
    for target, exps, exps_held in zip(trajs[:2], train, held):
        assert exps[0] is target and len(exps) == 3 and exps[1:] == exps_held[:2]
        assert target not in exps_held
    plain = ColdstartData(_StubRetriever(trajs), tiny_tokenizer(), config.model_copy(update={"self_retrieval": False}),
                          heldout_tasks=set())
    assert plain.experiences(trajs[:2], heldout=False) == held


def test_encoder_lora_gets_its_own_learning_rate(tmp_path, two_env_store):
    tiny_dir = str(save_tiny(tmp_path / "tiny"))
    base = dict(experiences=two_env_store, model=tiny_dir, steps=1, lr=1e-2, J=1, K=2, depth=1, lora_rank=2,
                activation_checkpointing=False)
    run = coldstart.Coldstart(ColdstartConfig(out=str(tmp_path / "a"), lr_encoder=1e-4, **base),
                              embedder=HashEmbedder())
    lora, compressor = run.optimizer.param_groups
    assert (lora["lr"], compressor["lr"]) == (1e-4, 1e-2)
    assert {id(p) for p in lora["params"]} | {id(p) for p in compressor["params"]} == {id(p) for p in run.params}
    assert {id(p) for p in compressor["params"]} == {id(p) for p in run.composer.compressor.parameters()}
    one = coldstart.Coldstart(ColdstartConfig(out=str(tmp_path / "b"), **base), embedder=HashEmbedder())
    assert len(one.optimizer.param_groups) == 1 and one.optimizer.param_groups[0]["lr"] == 1e-2


def test_a_kept_free_prompt_is_reused_only_for_the_settings_and_targets_that_trained_it(tmp_path):
    from safetensors.torch import save_file

    from stages.coldstart.ladder.free_prompt import FREE_PROMPT, TRAINED_BY, kept, trained_by
    from stages.coldstart.settings import ColdstartConfig

    config = ColdstartConfig(experiences="s", out=str(tmp_path), J=2, K=4, steps=5)
    train = two_env_trajs()
    assert kept(tmp_path, config, train) is None
    save_file({"vectors_Nd": torch.zeros(8, 4)}, str(tmp_path / FREE_PROMPT),
              metadata={TRAINED_BY: trained_by(config, train)})
    assert kept(tmp_path, config, train) is True
    assert kept(tmp_path, config.model_copy(update={"lr": 1e-3}), train) is False
    assert kept(tmp_path, config, train[::-1]) is False  # other batches
    # experiences' settings count only where the objective reads the experiences
    assert kept(tmp_path, config.model_copy(update={"self_retrieval": True}), train) is True
    text = config.model_copy(update={"objective": "text-kl", "text_kl_weight": 1.0})
    save_file({"vectors_Nd": torch.zeros(8, 4)}, str(tmp_path / FREE_PROMPT), metadata={TRAINED_BY: trained_by(text, train)})
    assert kept(tmp_path, text.model_copy(update={"self_retrieval": True}), train) is False
    save_file({"vectors_Nd": torch.zeros(8, 4)}, str(tmp_path / FREE_PROMPT))  # written before the key existed
    assert kept(tmp_path, config, train) is False
