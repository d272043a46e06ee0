"""Dropout is off in every training and teacher forward: a backbone whose checkpoint sets
``attention_dropout=0.1`` (Llama reads it as a plain float in ``forward``) loads with every
dropout at 0; in train() mode the student's log-probs of its own samples equal the recorded
ones (on-policy ratio 1) and the teacher's targets are the same twice; LoRA dropout and torch
dropout modules are switched off too, and the distill loop covers every module a method holds."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM

from stages.core.latent.teacher import context_teacher_logits
from stages.core.models.backbone import disable_dropout, dropout_left, load_policy
from stages.core.models.student import student_logits
from stages.distill.recipe import _training_modules
from stages.engines import SamplingParams
from stages.engines.hf import HFRolloutEngine
from stages.methods.sdpo import SDPO, TEACHER, SDPOOptions
from tests.tiny import save_tiny

PROMPTS = ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def dropout_dir(tmp_path_factory):
    """The tiny model saved with attention_dropout 0.1 in its config.json."""
    folder = save_tiny(tmp_path_factory.mktemp("dropout"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.1}))
    return folder


def _ids(tok) -> torch.Tensor:
    return torch.tensor([tok(PROMPTS[0], add_special_tokens=False)["input_ids"]])


def test_the_checkpoint_really_drops_and_load_policy_turns_it_off(dropout_dir):
    raw = AutoModelForCausalLM.from_pretrained(str(dropout_dir), dtype=torch.float32).train()
    model, tok = load_policy(str(dropout_dir), dtype="float32", device="cpu")
    ids = _ids(tok)
    with torch.no_grad():
        a, b = raw(ids).logits, raw(ids).logits
        assert (a - b).abs().max() > 1e-3  # as loaded by transformers: two train forwards differ
        assert "model.layers.0.self_attn.attention_dropout" in dropout_left(raw)
        assert "model.config.attention_dropout" in dropout_left(raw)
        assert dropout_left(model) == [] and model.config.attention_dropout == 0.0
        eval_logits = model(ids).logits
        model.train()
        first, second = model(ids).logits, model(ids).logits
    model.eval()
    assert torch.equal(first, second) and torch.equal(first, eval_logits)


def test_lora_dropout_and_torch_dropout_modules_are_switched_off(dropout_dir):
    model, _ = load_policy(str(dropout_dir), dtype="float32", device="cpu")
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.2, target_modules=["q_proj"]))
    left = dropout_left(peft)
    assert any(name.endswith("lora_dropout.default.p") for name in left)
    assert sorted(disable_dropout(peft)) == sorted(left) and dropout_left(peft) == []
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3), nn.MultiheadAttention(4, 2, dropout=0.1))
    assert disable_dropout(net) == ["1.p", "2.dropout"] and net[1].p == 0.0 and net[2].dropout == 0.0
    assert disable_dropout(net) == []  # nothing left to change


def _sdpo(model_dir, rank: int) -> SDPO:
    config = SimpleNamespace(model=str(model_dir), student_lora_rank=rank, temperature=0.7, device="cpu",
                             dtype="float32", options=SDPOOptions(k=5))
    torch.manual_seed(0)
    return SDPO(config, None, {})


def test_on_policy_ratio_is_one_and_teacher_targets_repeat_in_train_mode(dropout_dir):
    method = _sdpo(dropout_dir, rank=4)
    s = method.student
    with torch.no_grad():  # a student that differs from its initial weights
        for p in s.params:
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    prompts = [s.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    gens = HFRolloutEngine(s.model, s.tokenizer, adapter=s.adapter).generate(
        prompts, SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=16, seed=2))
    s.model.train()
    method.train_mode()
    for prompt, other, gen in zip(prompts, prompts[::-1], gens):
        seq = torch.tensor([prompt + gen.token_ids])
        attn = torch.ones_like(seq)
        logits = student_logits(s.model, seq, attn, adapter=s.adapter)[0, len(prompt) - 1:-1].detach()
        logp = torch.log_softmax(logits.double() / 0.7, -1).gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1)
        ratio = (logp - torch.tensor(gen.logprobs, dtype=torch.float64)).exp()
        torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-4, rtol=0)
        insert_at = torch.tensor([len(prompt)])
        targets = [context_teacher_logits(method.teacher_model, seq, attn, insert_at, [other + prompt],
                                          adapter=TEACHER) for _ in range(2)]  # a privileged prefix
        assert torch.equal(targets[0], targets[1])
    s.model.eval()


def test_the_distill_loop_reaches_every_module_a_method_holds(dropout_dir):
    method = _sdpo(dropout_dir, rank=0)  # full fine-tuning: the teacher is a separate module
    teacher = method.teacher_model
    teacher.model.layers[0].self_attn.attention_dropout = 0.1  # as a model loaded another way would have it
    method.wrapper = SimpleNamespace(model=nn.Dropout(0.5))  # a module one attribute down
    modules = _training_modules(method)
    assert any(m is teacher for m in modules) and any(m is method.student.model for m in modules)
    for module in modules:
        disable_dropout(module)
    assert dropout_left(teacher) == [] and method.wrapper.model.p == 0.0
