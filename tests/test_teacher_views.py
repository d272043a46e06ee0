"""Teacher views on the student's completion tokens: no extra context, a privileged text prompt,
and the teacher weights (frozen initial, or the current student), position by position."""
from __future__ import annotations

import torch

from stages.core.latent.teacher import context_teacher_logits
from stages.core.models.composer import adapter_parameters, add_lora_adapter
from stages.core.models.student import student_logits
from tests.tiny import tiny_model, tiny_tokenizer


def _batch(tok):
    prompts = ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nThe weather in Paris today?<|im_end|>\n<|im_start|>assistant\n"]
    answers = ["The answer is 4.<|im_end|>", "sunny"]
    rows = [tok(p, add_special_tokens=False)["input_ids"] + tok(a, add_special_tokens=False)["input_ids"]
            for p, a in zip(prompts, answers)]
    starts = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    T = max(map(len, rows))
    ids = torch.zeros(2, T, dtype=torch.long)
    attn = torch.zeros(2, T, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, :len(r)], attn[b, :len(r)] = torch.tensor(r), True
    return ids, attn, torch.tensor(starts), [len(r) for r in rows]


def test_no_context_view_equals_the_plain_forward_on_completion_positions():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    ids, attn, starts, lengths = _batch(tok)
    got = context_teacher_logits(model, ids, attn, starts)
    want = model(input_ids=ids, attention_mask=attn.long()).logits
    for b in range(2):
        lo, hi = int(starts[b]) - 1, lengths[b]
        assert torch.allclose(got[b, lo:hi], want[b, lo:hi], atol=1e-5)


def test_text_context_view_scores_the_same_tokens_after_another_prompt():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    ids, attn, starts, lengths = _batch(tok)
    prefix = [tok("<|im_start|>system\nA reference answer: 4.<|im_end|>\n", add_special_tokens=False)["input_ids"]
              + ids[b, :int(starts[b])].tolist() for b in range(2)]
    got = context_teacher_logits(model, ids, attn, starts, prefix)
    for b in range(2):
        completion = ids[b, int(starts[b]):lengths[b]].tolist()
        alone = model(input_ids=torch.tensor([prefix[b] + completion])).logits[0]
        P = len(prefix[b])
        for i in range(int(starts[b]) - 1, lengths[b]):  # logits[i] scores token i + 1
            assert torch.allclose(got[b, i], alone[P + i - int(starts[b])], atol=1e-5)
        # the view differs from the student's own context where it matters
        own = context_teacher_logits(model, ids, attn, starts)
        assert not torch.allclose(got[b, int(starts[b])], own[b, int(starts[b])], atol=1e-4)


def test_teacher_weights_current_student_or_frozen_initial_and_no_gradient():
    tok = tiny_tokenizer()
    peft = add_lora_adapter(tiny_model(tok), "student", 4, 8)
    with torch.no_grad():
        for p in adapter_parameters(peft, "student"):
            p.add_(0.3 * torch.randn_like(p))  # LoRA B starts at zero: make the adapter matter
    ids, attn, starts, lengths = _batch(tok)
    current = context_teacher_logits(peft, ids, attn, starts, adapter="student")
    initial = context_teacher_logits(peft, ids, attn, starts, adapter=None)
    s = student_logits(peft, ids, attn, adapter="student")
    base = student_logits(peft, ids, attn, adapter=None)
    lo, hi = int(starts[0]) - 1, lengths[0]
    assert torch.allclose(current[0, lo:hi], s[0, lo:hi], atol=1e-5)
    assert torch.allclose(initial[0, lo:hi], base[0, lo:hi], atol=1e-5)
    assert not torch.allclose(current[0, lo:hi], initial[0, lo:hi], atol=1e-4)
    assert not current.requires_grad and not initial.requires_grad
