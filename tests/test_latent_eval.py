"""Generation conditioned on retrieved latents (`lopd evaluate --composer --store`, Table 3's "base +
composer" row): A.4's equivalence check on the generation path, and a bfcl-single evaluation with
a tiny model, composer and store."""
from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

from schemas import Message, Task
from stages.core.data import retrieval
from stages.core.data.retrieval import index_new
from stages.core.data.store import ExperienceStore, StoreError
from stages.core.models.backbone import load_policy
from stages.core.models.composer import Composer, save_composer
from stages.core.text.chat import render_prompt
from stages.engines import SamplingParams, make_engine
from stages.engines.latent import LatentEngine
from stages.evaluate import EvaluateConfig, run
from tests.test_index import HashEmbedder
from tests.test_store import make_traj
from tests.tiny import save_tiny, tiny_model, tiny_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


class KnownLatents:
    """A composer stand-in whose latents are the input embeddings of known tokens."""

    hparams = {"J": 1, "max_exp_tokens": 16}

    def __init__(self, model, span: list[int]):
        self.latents = model.get_input_embeddings()(torch.tensor(span)).detach()

    def __call__(self, ids_BJL, mask_BJL):
        return self.latents.unsqueeze(0)


class NoExperiences:
    def retrieve(self, *args, **kwargs):
        return []


@pytest.mark.parametrize("placement", ["prefix", "framed", "per-turn"])
def test_latents_of_known_token_embeddings_decode_like_those_tokens_as_ids(placement):
    """A.4: known token embeddings in the latent span give the same greedy decode (ids and
    log-probs) as the same tokens in the prompt; later prompts of the episode keep them."""
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1)
    span = tok("reference: the answer is 4", add_special_tokens=False)["input_ids"]
    engine = LatentEngine(model, tok, KnownLatents(model, span), NoExperiences(), placement=placement, batch_size=2)
    plain = make_engine("hf", model, tok, batch_size=2)
    task = Task(task_id="t1", env="bfcl", split="test", prompt="What is 2+2?")
    messages = [Message(role="system", content="Be brief."), Message(role="user", content=task.prompt)]
    opening = tok(render_prompt(tok, messages, []), add_special_tokens=False)["input_ids"]
    engine.begin_episode(task, messages, [], opening)
    later = opening + tok("4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False)["input_ids"]
    if placement == "framed":
        head, tail = engine._episodes[tuple(opening)][0], engine._episodes[tuple(opening)][2]
        assert "different task" in tok.decode(head) and tok.decode(tail).endswith("<|im_start|>assistant\n")
        as_ids = [head + span + tail, head + span + tail + later[len(opening):]]
    elif placement == "prefix":
        as_ids = [opening + span, opening + span + later[len(opening):]]
    else:
        as_ids = [opening + span, later + span]
    got = engine.generate([opening, later], GREEDY)
    want = plain.generate(as_ids, GREEDY)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and len(g.token_ids) > 0
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert engine.unconditioned == 0
    # and the latents matter: without them the model decodes something else
    bare = plain.generate([opening, later], GREEDY)
    assert any(b.logprobs != pytest.approx(w.logprobs, abs=1e-3) for b, w in zip(bare, want))
    # a prompt that does not start with a known opening is generated without latents
    other = tok(render_prompt(tok, [Message(role="user", content="Unrelated?")], []), add_special_tokens=False)["input_ids"]
    assert engine.generate([other], GREEDY)[0].token_ids == plain.generate([other], GREEDY)[0].token_ids
    assert engine.unconditioned == 1


def test_evaluate_with_a_composer_retrieves_train_experiences_of_other_tasks(tmp_path, monkeypatch):
    model_dir = save_tiny(tmp_path / "tiny")
    model, _ = load_policy(str(model_dir))
    torch.manual_seed(0)
    save_composer(Composer(model, J=2, K=2, depth=1, lora_rank=4, lora_alpha=8, max_exp_tokens=32),
                  tmp_path / "composer", {"backbone_id": str(model_dir), "placement": "framed"})
    store = ExperienceStore.open(tmp_path / "store")
    store.append([make_traj(f"bfcl-{i}", f"simple_{i}", env="bfcl", prompt=f"compute the area {i}") for i in range(3)]
                 + [make_traj("test-row", "simple_9", env="bfcl", split="test", prompt="compute")])
    index_new(store, HashEmbedder())
    monkeypatch.setattr(retrieval, "load_embedder", lambda name, batch_size=32: HashEmbedder())
    config = EvaluateConfig(bench="bfcl-single", limit=2, max_new_tokens=4, batch_size=2, model=str(model_dir),
                            composer=str(tmp_path / "composer"), store=str(tmp_path / "store"),
                            out=str(tmp_path / "report.json"))
    report = run(config, Console(file=open("/dev/null", "w")))
    rows = json.loads((tmp_path / "report.json").read_text())["per_task"]
    assert len(rows) == 2 and report["config"]["composer"] == str(tmp_path / "composer")
    for row in rows:
        assert len(row["experiences"]) == 2 and set(row["experiences"]) <= {"bfcl-0", "bfcl-1", "bfcl-2"}
    assert "reference_nll" not in report["scores"]
    with pytest.raises(ValueError, match="--composer needs --store"):
        EvaluateConfig(bench="bfcl-single", composer=str(tmp_path / "composer"))
    assert "retrieval: experiences for 2 of 2 tasks (2.0 per task, J=2)" in report["notes"]
    with pytest.raises(ValueError, match="trained on backbone"):
        run(config.model_copy(update={"model": "smollm2-135m", "out": str(tmp_path / "other.json")}),
            Console(file=open("/dev/null", "w")))
    toy = ExperienceStore.open(tmp_path / "toy")  # a store of another run: nothing for bfcl's tasks
    toy.append([make_traj(f"toy-{i}", f"t{i}", env="toy", prompt=f"add {i}") for i in range(2)])
    index_new(toy, HashEmbedder())
    with pytest.raises(StoreError, match=r"serves none of the tasks of --composer .*env bfcl \(its successful "
                                         r"train trajectories by env: toy 2\)"):
        run(config.model_copy(update={"store": str(tmp_path / "toy"), "out": str(tmp_path / "toy.json")}),
            Console(file=open("/dev/null", "w")))
