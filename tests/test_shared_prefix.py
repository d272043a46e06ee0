"""The shared-prefix training forward: which rows share, and the same values and gradients as the
plain batched forward (student with LoRA and gradient; frozen teacher view; LOPD's latent
teacher, whose rows are embeddings with a task's latents spliced in)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
from peft import LoraConfig, get_peft_model

from stages.core.latent.splice import spliced_logits
from stages.core.models import head
from stages.core.models.shared_prefix import position_keys, prefix_groups, right_padded_lengths
from stages.core.models.student import student_logits
from tests.tiny import tiny_model, tiny_tokenizer


def _batch(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    return ids, mask


def _row(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat(parts)


def _toks(n: int, start: int) -> torch.Tensor:
    return torch.arange(start, start + n) % 300 + 5


def test_groups_rows_by_their_shared_prompt_and_keeps_a_last_token_each():
    a, b = _toks(100, 0), _toks(90, 200)
    rows = [_row(a, _toks(5, 7)), _row(b, _toks(3, 1)), _row(a, _toks(9, 50)), _row(b, _toks(4, 90)),
            _row(a, _toks(2, 80)), _row(b, _toks(1, 11)), _toks(40, 150)]
    ids, mask = _batch(rows)
    assert prefix_groups(ids, right_padded_lengths(mask)) == [([0, 2, 4], 100), ([1, 3, 5], 90)]
    # a row that is nothing but the prompt keeps its last token out of the shared part
    ids, mask = _batch([a, _row(a, _toks(5, 7)), _row(a, _toks(6, 9))])
    assert prefix_groups(ids, right_padded_lengths(mask)) == [([0, 1, 2], 99)]


def test_a_join_never_shrinks_a_group_and_small_savings_are_not_grouped():
    system, a = _toks(60, 0), _toks(100, 100)
    # rows 0/1 share 160 tokens; row 2 shares only the 60-token system part: a group of its own
    rows = [_row(system, a, _toks(3, 1)), _row(system, a, _toks(3, 9)), _row(system, _toks(80, 250)),
            _row(system, _toks(80, 250), _toks(2, 1))]
    ids, mask = _batch(rows)
    assert prefix_groups(ids, right_padded_lengths(mask)) == [([0, 1], 160), ([2, 3], 139)]
    # two rows sharing 100 tokens save 100 positions: under the default minimum of 128
    ids, mask = _batch([_row(a, _toks(3, 1)), _row(a, _toks(3, 9))])
    assert prefix_groups(ids, right_padded_lengths(mask)) == []
    assert prefix_groups(ids, right_padded_lengths(mask), min_saved=100) == [([0, 1], 100)]
    # fewer than min_shared common tokens: no group
    short = _toks(20, 0)
    ids, mask = _batch([_row(short, _toks(3, 100)), _row(short, _toks(3, 200)), _row(short, _toks(3, 250))])
    assert prefix_groups(ids, right_padded_lengths(mask), min_saved=1) == []


def test_right_padded_lengths_refuses_left_padding():
    assert right_padded_lengths(torch.tensor([[1, 1, 0], [1, 1, 1]])) == [2, 3]
    assert right_padded_lengths(torch.tensor([[0, 1, 1], [1, 1, 1]])) is None


@pytest.fixture(scope="module")
def student():
    """A float64 tiny Llama with a randomly initialised LoRA adapter ``student`` (base frozen)."""
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = get_peft_model(tiny_model(tok).double(), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]), adapter_name="student")
    return model.double(), len(tok)


def _interleaved_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tasks' rollouts interleaved (prompts of 80 and 70 tokens, 3 and 2 rows, responses of
    other lengths) and one unrelated row."""
    g = torch.Generator().manual_seed(3)
    rand = lambda n: torch.randint(5, vocab, (n,), generator=g)  # noqa: E731
    a, b = rand(80), rand(70)
    rows = [_row(a, rand(10)), _row(b, rand(3)), rand(40), _row(a, rand(20)), _row(b, rand(30)), _row(a, rand(5))]
    return _batch(rows)


def _outputs_and_grads(model, ids, mask, hidden: bool, share: bool):
    model.zero_grad()
    with _sharing(share):
        out = student_logits(model, ids, mask, hidden=hidden)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    (out * weight * mask[..., None]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def _sharing(on: bool):
    """Within the block, groups as prefix_groups finds them with a 64-position minimum (on), or none."""
    return mock.patch.object(head, "prefix_groups",
                             (lambda ids, lengths: prefix_groups(ids, lengths, min_saved=64)) if on else
                             (lambda ids, lengths: []))


@pytest.mark.parametrize("hidden", [True, False])
def test_student_forward_with_shared_prefixes_equals_the_plain_forward(student, hidden):
    model, vocab = student
    ids, mask = _interleaved_batch(vocab)
    assert prefix_groups(ids, right_padded_lengths(mask), min_saved=64) == [([0, 3, 5], 80), ([1, 4], 70)]
    plain_out, plain_grads = _outputs_and_grads(model, ids, mask, hidden, share=False)
    shared_out, shared_grads = _outputs_and_grads(model, ids, mask, hidden, share=True)
    real = mask.bool()
    assert shared_out.shape == plain_out.shape
    torch.testing.assert_close(shared_out[real], plain_out[real], rtol=0, atol=1e-12)
    # exactly the LoRA matrices get a gradient, in both
    assert set(shared_grads) == set(plain_grads) and all("lora_" in n for n in plain_grads)
    assert len(plain_grads) == 2 * 4 * 2  # A and B of q/k/v/o in 2 layers
    for name, grad in plain_grads.items():
        # transformers' Llama RMSNorm computes in float32 even for a float64 model, so gradients
        # summed over a group before the backward round differently at ~1e-7 of their size
        scale = float(grad.abs().max())
        torch.testing.assert_close(shared_grads[name], grad, rtol=0, atol=1e-6 * scale, msg=name)


def test_frozen_teacher_view_with_shared_prefixes_equals_the_plain_forward(student):
    model, vocab = student
    ids, mask = _interleaved_batch(vocab)
    with torch.no_grad(), _sharing(False):
        plain = student_logits(model, ids, mask, adapter=None)
    with torch.no_grad(), _sharing(True):
        shared = student_logits(model, ids, mask, adapter=None)
    torch.testing.assert_close(shared[mask.bool()], plain[mask.bool()], rtol=0, atol=1e-12)


def test_sharing_is_skipped_where_it_does_not_apply(student):
    model, vocab = student
    ids, mask = _interleaved_batch(vocab)
    with mock.patch.object(head, "shared_prefix_outputs") as shared, _sharing(True):
        with torch.no_grad():
            # left padding
            left = torch.flip(mask, dims=[1])
            head.forward_outputs(model, True, input_ids=torch.flip(ids, dims=[1]), attention_mask=left)
            # position ids other than 0..T-1
            positions = torch.arange(ids.shape[1]).expand_as(ids) + 3
            head.forward_outputs(model, True, input_ids=ids, attention_mask=mask, position_ids=positions)
        assert shared.call_count == 0
        model.get_base_model().activation_checkpointing_enable()
        try:
            head.forward_outputs(model, True, input_ids=ids, attention_mask=mask, use_cache=False)
        finally:
            model.get_base_model().activation_checkpointing_disable()
        assert shared.call_count == 0
        with torch.no_grad():
            head.forward_outputs(model, True, input_ids=ids, attention_mask=mask, use_cache=False)
            head.forward_outputs(model, True, input_ids=ids, attention_mask=mask, position_ids=positions - 3)
        assert shared.call_count == 2


def test_position_keys_are_equal_exactly_where_the_vectors_are():
    embeds = torch.tensor([[[1.0, -2.0], [3.0, 4.0], [1.0, -2.0]], [[3.0, 4.0], [1.0, 2.5], [1.0, -2.0]]])
    flat = embeds.reshape(6, 2)
    equal_vectors = (flat[:, None] == flat[None, :]).all(-1)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        keys = position_keys(embeds.to(dtype))
        assert keys.shape == (2, 3) and keys.dtype == torch.long
        assert torch.equal(keys.reshape(-1)[:, None] == keys.reshape(-1)[None, :], equal_vectors), dtype
    ids = torch.tensor([[4, 5], [6, 7]])
    assert position_keys(ids) is ids


def test_latent_teacher_with_shared_prefixes_equals_the_plain_forward(student):
    """LOPD's teacher view: the frozen model on the rows' embeddings with the task's latents spliced
    into the prompt; the latents' gradient (what reaches the composer) is the same too."""
    model, vocab = student
    ids, mask = _interleaved_batch(vocab)
    g = torch.Generator().manual_seed(5)
    d = model.config.hidden_size
    latent_a = torch.randn(6, d, generator=g, dtype=torch.float64, requires_grad=True)
    latent_b = torch.randn(6, d, generator=g, dtype=torch.float64, requires_grad=True)
    # rows 0, 3, 5 are task a (prompt 80), rows 1, 4 task b (prompt 70), row 2 alone
    task = [0, 1, 0, 0, 1, 0]
    insert_at = torch.tensor([30, 25, 12, 30, 25, 30])
    weight = torch.randn(*ids.shape, d, generator=g, dtype=torch.float64)

    def run(share: bool):
        latent_a.grad = latent_b.grad = None
        model.zero_grad()
        latents = torch.stack([latent_a if t == 0 else latent_b for t in task])
        with _sharing(share), mock.patch.object(head, "shared_prefix_outputs",
                                                wraps=head.shared_prefix_outputs) as shared:
            out = spliced_logits(model, ids, mask, latents, insert_at, hidden=True)
        (out * weight * mask[..., None]).sum().backward()
        return out.detach(), latent_a.grad.clone(), latent_b.grad.clone(), shared.call_count

    plain, grad_a, grad_b, calls = run(False)
    assert calls == 0
    shared, shared_a, shared_b, calls = run(True)
    assert calls == 1
    torch.testing.assert_close(shared[mask.bool()], plain[mask.bool()], rtol=0, atol=1e-12)
    for got, want in ((shared_a, grad_a), (shared_b, grad_b)):
        assert float(want.abs().max()) > 0
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    # the teacher is frozen: its adapters are off and no weight of the model gets a gradient
    assert all(p.grad is None for p in model.parameters())
