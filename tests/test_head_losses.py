"""LOPD's losses on hidden states with the LM head applied per chunk of supervised positions
(stages/core/losses/head.py) against the logits functions of stages/core/losses/lopd.py on
``head(h)``; the head split off real models (stages/core/models/head.py); whole LOPD steps on the
tiny model through both paths."""
from __future__ import annotations

import math
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.nn.functional import linear
from transformers import Gemma2Config, Gemma2ForCausalLM

from stages.core.losses.head import LMHead, head_token_logprobs, head_topm_tail_reverse_kl
from stages.core.losses.kd import generalized_jsd
from stages.core.losses.sdpo import sdpo_topk_loss
from stages.core.losses.lopd import sampled_token_logprobs, topm_tail_reverse_kl
from stages.core.models.head import forward_outputs, output_head
from stages.distill.recipe import DistillConfig, Distiller
from stages.methods import Method
from tests.test_distill import ENV, _hash_embedder, assets, make_config, metrics  # noqa: F401 (fixtures)
from tests.tiny import tiny_model, tiny_tokenizer

B, T, D, V = 3, 7, 5, 40


def _leaves(seed: int = 1, bias: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {name: torch.randn(*shape, dtype=torch.float64, generator=g)
           for name, shape in (("hs", (B, T, D)), ("ht", (B, T, D)), ("ws", (V, D)), ("wt", (V, D)), ("bs", (V,)))}
    if not bias:
        out.pop("bs")
    return {k: v.requires_grad_() for k, v in out.items()}


def _mask(seed: int = 2) -> torch.Tensor:
    mask = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) > 0.4
    mask[1] = False  # a row without supervised tokens
    mask[0, 0] = True
    return mask


@pytest.mark.parametrize("M", [6, V])  # V: no tail bucket (the full reverse KL)
@pytest.mark.parametrize("reduction", ["trajectory", "token"])
@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
@pytest.mark.parametrize("trained_heads", [True, False])  # False: gradients taken in the forward
def test_head_reverse_kl_equals_the_logits_function(M, reduction, chunk_size, trained_heads):
    mask = _mask()
    ref, new = _leaves(), _leaves()
    if not trained_heads:
        for x in (ref, new):
            for name in ("ws", "wt", "bs"):
                x[name].requires_grad_(False)
    loss_ref, m_ref = topm_tail_reverse_kl(linear(ref["hs"], ref["ws"], ref["bs"]), linear(ref["ht"], ref["wt"]),
                                           mask, M=M, reduction=reduction)
    loss_ref.backward()
    loss, m = head_topm_tail_reverse_kl(new["hs"], new["ht"], mask, LMHead(new["ws"], new["bs"]),
                                        LMHead(new["wt"], None), M=M, chunk_size=chunk_size, reduction=reduction)
    loss.backward()
    assert loss.dtype == torch.float64 and loss.item() > 0
    torch.testing.assert_close(loss, loss_ref, rtol=1e-12, atol=1e-14)
    assert m == pytest.approx(m_ref, rel=1e-12, abs=1e-14)
    for name in ref:  # hidden states and the trained heads get the same gradient
        if trained_heads or name in ("hs", "ht"):
            torch.testing.assert_close(new[name].grad, ref[name].grad, rtol=1e-10, atol=1e-13, msg=name)
        else:
            assert new[name].grad is None
    assert new["hs"].grad[1].abs().max() == 0  # the unsupervised row gets none


def test_head_reverse_kl_hand_values_and_edge_cases():
    # one position, V = 2, M = 1: buckets (top-1, tail); student logits (0, 0), teacher (log 3, 0)
    h = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    student = LMHead(torch.zeros(2, 2, dtype=torch.float64), None)
    teacher = LMHead(torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]], dtype=torch.float64), None)
    loss, m = head_topm_tail_reverse_kl(h, h.detach(), torch.ones(1, 1, dtype=torch.bool), student, teacher, M=1)
    # KL((1/2, 1/2) || (3/4, 1/4)) = 1/2 log(2/3) + 1/2 log 2
    assert loss.item() == pytest.approx(0.5 * math.log(2 / 3) + 0.5 * math.log(2.0), rel=1e-12)
    assert m["teacher_tail_mass"] == pytest.approx(0.25) and m["student_tail_mass"] == pytest.approx(0.5)
    # p = q: 0, and a zero gradient
    x = _leaves()
    same, _ = head_topm_tail_reverse_kl(x["hs"], x["hs"], _mask(), LMHead(x["ws"], None), LMHead(x["ws"], None), M=4)
    same.backward()
    assert same.item() == pytest.approx(0.0, abs=1e-14) and x["hs"].grad.abs().max() < 1e-12
    # nothing supervised: 0 with a defined all-zero gradient, never NaN
    y = _leaves()
    empty, m = head_topm_tail_reverse_kl(y["hs"], y["ht"], torch.zeros(B, T), LMHead(y["ws"], None), LMHead(y["wt"], None))
    empty.backward()
    assert empty.item() == 0.0 and m["num_tokens"] == 0.0 and torch.equal(y["ht"].grad, torch.zeros(B, T, D))


def test_head_reverse_kl_refuses_shapes_that_do_not_fit():
    x = _leaves()
    head = LMHead(x["ws"], None)
    with pytest.raises(ValueError, match="hidden states must be"):
        head_topm_tail_reverse_kl(x["hs"][0], x["ht"][0], _mask()[0], head, head)
    with pytest.raises(ValueError, match="head weight must be"):
        head_topm_tail_reverse_kl(x["hs"], x["ht"], _mask(), LMHead(x["ws"][:, :3], None), head)
    with pytest.raises(ValueError, match="differ"):
        head_topm_tail_reverse_kl(x["hs"], x["ht"], _mask(), LMHead(x["ws"][:5], None), head)
    with pytest.raises(ValueError, match="M must be"):
        head_topm_tail_reverse_kl(x["hs"], x["ht"], _mask(), head, head, M=0)
    with pytest.raises(ValueError, match="token ids"):
        head_token_logprobs(x["hs"], head, torch.full((B, T), V), _mask())


def test_head_token_logprobs_equal_the_logits_gather_at_masked_positions():
    mask, ids = _mask(), torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    ids[~mask] = -100  # ignored where unsupervised
    ref, new = _leaves(), _leaves()
    logp_ref = sampled_token_logprobs(linear(ref["ht"], ref["wt"], ref["bs"]), ids.clamp(min=0))
    (logp_ref * mask).sum().backward()
    logp = head_token_logprobs(new["ht"], LMHead(new["wt"], new["bs"]), ids, mask, chunk_size=2)
    logp.sum().backward()
    torch.testing.assert_close(logp[mask], logp_ref[mask], rtol=1e-12, atol=1e-14)
    assert torch.equal(logp[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))
    for name in ("ht", "wt", "bs"):
        torch.testing.assert_close(new[name].grad, ref[name].grad, rtol=1e-10, atol=1e-13, msg=name)


def test_no_full_logits_are_kept_for_the_backward():
    """Autograd saves no tensor with more than one chunk of vocabulary rows (logits are recomputed)."""
    x = _leaves()
    chunk = 2
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = head_topm_tail_reverse_kl(x["hs"], x["ht"], torch.ones(B, T, dtype=torch.bool),
                                            LMHead(x["ws"], None), LMHead(x["wt"], None), M=4, chunk_size=chunk)
        logp = head_token_logprobs(x["ht"], LMHead(x["wt"], None), torch.zeros(B, T, dtype=torch.long),
                                   torch.ones(B, T, dtype=torch.bool), chunk_size=chunk)
    (loss + logp.sum()).backward()
    vocab_rows = [s for s in saved if s and s[-1] == V and len(s) == 2 and s != (V, D)]
    assert saved and not vocab_rows  # neither (N, V) logits nor a chunk's: only inputs are saved
    assert x["hs"].grad.abs().max() > 0


def test_output_head_of_real_models():
    model = tiny_model(tiny_tokenizer())
    head = output_head(model)
    assert head is not None and head.weight_Vd is model.get_output_embeddings().weight
    ids = torch.tensor([[5, 9, 17, 3]])
    with torch.no_grad():
        hidden = forward_outputs(model, True, input_ids=ids, use_cache=False)
        logits = forward_outputs(model, False, input_ids=ids, use_cache=False)
    assert hidden.shape == (1, 4, model.config.hidden_size)
    torch.testing.assert_close(linear(hidden, *head), logits)
    # peft-wrapped: the same head through the wrapper
    wrapped = get_peft_model(tiny_model(tiny_tokenizer()), LoraConfig(r=2, target_modules=["q_proj"]))
    assert output_head(wrapped) is not None
    # a LoRA-adapted head is no plain Linear: the logits path
    lora_head = get_peft_model(tiny_model(tiny_tokenizer()), LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    assert output_head(lora_head) is None
    # soft-capped logits are not head(hidden): the logits path
    config = Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, final_logit_softcapping=0.5)
    assert output_head(Gemma2ForCausalLM(config).eval()) is None
    config.final_logit_softcapping = None
    assert output_head(Gemma2ForCausalLM(config).eval()) is not None


@pytest.mark.parametrize("lora_rank", [4, 0])  # 0: full fine-tuning, the student's head trained
def test_lopd_steps_equal_through_hidden_states_and_logits(assets, tmp_path, monkeypatch, lora_rank):
    """Two LOPD steps (student LoRA or full fine-tuning, composer trained): metrics and weights of
    the head-at-supervised-positions path equal the full-logits path."""
    def run(name: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
        trainer = Distiller(make_config(assets, tmp_path, name, steps=2, checkpoint_every=2, student_lora_rank=lora_rank))
        trainer.fit()
        assert (trainer.method._heads() is not None) == Method.head_at_supervised
        weights = {f"student.{n}": p.detach().clone() for n, p in trainer.student.model.named_parameters()
                   if p.requires_grad}
        weights.update({f"composer.{i}": p.detach().clone() for i, p in enumerate(trainer.method.composer_params)})
        return metrics(trainer.out), weights

    head_rows, head_weights = run("head")
    monkeypatch.setattr(Method, "head_at_supervised", False)
    logit_rows, logit_weights = run("logits")
    for a, b in zip(logit_rows, head_rows):
        for key in ("loss", "reverse_kl", "Delta", "anchor", "latent_norm", "grad_norm_student", "grad_norm_composer"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert any(r["grad_norm_composer"] > 0 for r in head_rows) and all(r["reverse_kl"] > 0 for r in head_rows)
    for name, value in logit_weights.items():  # two Adam steps at lr 1e-2; float32 summation order
        torch.testing.assert_close(head_weights[name], value, rtol=1e-3, atol=2e-5, msg=lambda m: f"{name}: {m}")


def _method_config(assets, tmp_path, method: str, name: str, **options) -> DistillConfig:
    model_dir, _, store_template = assets
    store = tmp_path / f"store-{name}"
    shutil.copytree(store_template, store)
    return DistillConfig(method=method, env=ENV, store=str(store), out=str(tmp_path / name), model=str(model_dir),
                         lr=1e-2, steps=2, tasks_per_step=2, group_size=2, max_new_tokens=8, temperature=1.0,
                         student_lora_rank=4, micro_batch=2, max_len=256, checkpoint_every=2, run_id=name,
                         options=options)


@pytest.mark.parametrize("method,options,keys", [
    ("grpo", {"kl_coef": 0.1}, ("loss", "pg_loss", "kl_ref")),
    ("skill-sd", {}, ("loss", "pg_loss", "sdl")),
    ("opsd", {}, ("loss", "kd_loss")),
    ("sdft", {}, ("loss", "forward_kl", "reverse_kl")),
    ("sdpo", {}, ("loss", "distill_loss", "reverse_kl")),
    ("lopd-text", {"J": 2, "M": 5, "max_exp_tokens": 64}, ("loss", "reverse_kl", "Delta")),
])
def test_every_method_steps_equal_through_hidden_states_and_logits(assets, tmp_path, monkeypatch, method, options, keys):
    """Two steps of each baseline: metrics and student weights of the head-at-supervised-positions
    path equal the full-logits path (the same rollouts: same seed)."""
    def run(name: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
        trainer = Distiller(_method_config(assets, tmp_path, method, name, **options))
        trainer.fit()
        assert (trainer.method.output_head(trainer.student.model) is not None) == Method.head_at_supervised
        return metrics(trainer.out), {n: p.detach().clone() for n, p in trainer.student.model.named_parameters()
                                      if p.requires_grad}

    head_rows, head_weights = run("head")
    monkeypatch.setattr(Method, "head_at_supervised", False)
    logit_rows, logit_weights = run("logits")
    assert len(head_rows) == len(logit_rows) == 2
    for a, b in zip(logit_rows, head_rows):
        for key in (*keys, "grad_norm_student"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert any(r["grad_norm_student"] > 0 for r in head_rows)
    for name, value in logit_weights.items():
        torch.testing.assert_close(head_weights[name], value, rtol=1e-3, atol=2e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("loss_name", ["jsd", "sdpo"])
def test_baseline_losses_with_heads_equal_them_on_logits(loss_name):
    """generalized_jsd (OPSD, SDFT) and sdpo_topk_loss given hidden states and heads: the values,
    metrics and student-side gradients (hidden states, a trained head) of the logits call."""
    mask = _mask()
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(4))
    old = torch.randn(B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) - 3.0

    def call(x: dict, heads: bool):
        s, t = (x["hs"], x["ht"]) if heads else (linear(x["hs"], x["ws"], x["bs"]), linear(x["ht"], x["wt"]))
        pair = (LMHead(x["ws"], x["bs"]), LMHead(x["wt"], None)) if heads else None
        if loss_name == "jsd":
            return generalized_jsd(s, t, mask, 0.3, temperature=1.5, chunk_size=2, heads=pair)
        return sdpo_topk_loss(s, t, ids, mask, old, k=5, alpha=0.5, temperature=1.5, chunk_size=2, heads=pair)

    ref, new = _leaves(), _leaves()
    loss_ref, m_ref = call(ref, False)
    loss_ref.backward()
    loss, m = call(new, True)
    loss.backward()
    assert loss.item() > 0
    torch.testing.assert_close(loss, loss_ref, rtol=1e-12, atol=1e-14)
    assert m == pytest.approx(m_ref, rel=1e-10, abs=1e-13)
    for name in ("hs", "ws", "bs"):
        torch.testing.assert_close(new[name].grad, ref[name].grad, rtol=1e-10, atol=1e-13, msg=name)
    assert new["ht"].grad is None and new["wt"].grad is None  # the teacher is detached in both


class TorchDispatchCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Appends the name of every matmul-like op dispatched inside the block to ``calls``."""

    def __init__(self, calls: list[str]):
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "addmm", "bmm", "matmul", "linear"):
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _frozen_leaves() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two equal sets of leaves where only the student's hidden states require grad (a LoRA student)."""
    ref, new = _leaves(), _leaves()
    for leaves in (ref, new):
        for name in ("ws", "wt", "bs", "ht"):
            leaves[name].requires_grad_(False)
    return ref, new


def _counted(call) -> tuple[torch.Tensor, dict, int, int]:
    """``call()``'s (loss, metrics), then the matmuls dispatched in it and in the loss's backward."""
    forward, backward = [], []
    with TorchDispatchCounter(forward):
        loss, m = call()
    with TorchDispatchCounter(backward):
        loss.backward()
    return loss, m, len(forward), len(backward)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("reduction,denominators", [("sequence", {}), ("token", {}),
                                                    ("sequence", {"num_sequences": 5}), ("token", {"num_tokens": 17})])
@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_jsd_with_frozen_heads_takes_its_gradient_in_the_forward(beta, reduction, denominators, chunk_size):
    """generalized_jsd with frozen heads (a LoRA student): value, metrics and the gradient w.r.t. the
    student's hidden states equal the logits call's, and nothing is recomputed in the backward:
    the heads' matmuls all run in the forward call."""
    mask = _mask()
    ref, new = _frozen_leaves()
    kw = dict(temperature=1.5, chunk_size=chunk_size, reduction=reduction, **denominators)
    loss_ref, m_ref = generalized_jsd(linear(ref["hs"], ref["ws"], ref["bs"]), linear(ref["ht"], ref["wt"]), mask, beta,
                                      **kw)
    loss_ref.backward()
    loss, m, forward_matmuls, backward_matmuls = _counted(lambda: generalized_jsd(
        new["hs"], new["ht"], mask, beta, heads=(LMHead(new["ws"], new["bs"]), LMHead(new["wt"], None)), **kw))
    assert loss.item() > 0 and forward_matmuls > 0 and backward_matmuls == 0
    torch.testing.assert_close(loss, loss_ref, rtol=1e-12, atol=1e-14)
    assert m == pytest.approx(m_ref, rel=1e-10, abs=1e-13)
    torch.testing.assert_close(new["hs"].grad, ref["hs"].grad, rtol=1e-10, atol=1e-13)
    assert new["hs"].grad[1].abs().sum() == 0  # the row without supervised tokens


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_kl_closed_form_matches_autograd_at_the_floors(dtype, tol, temperature):
    """The forward KL with frozen heads (closed-form gradient, one workspace for every chunk)
    against the same loss on the heads' logits through autograd, in float32 and bfloat16, where
    some student log-probs lie 300 nats down (their probabilities underflow float32, the
    log-probs do not) and the teacher puts mass on them: exact values, and the gradient
    p_S - p_T pulls the student up there."""
    g = torch.Generator().manual_seed(5)
    n, d = 7, 6
    w_Vd = torch.eye(d, dtype=dtype)  # logits = hidden states, so the gaps are set exactly
    hs = torch.randn(2, n, d, generator=g) * 3
    hs[0, :, 0] = -300.0  # far below every other logit: log p_S < log(tiny of float32)
    ht = torch.randn(2, n, d, generator=g) * 3
    ht[0, :, 0] = 4.0  # the teacher's most likely token there
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, :2] = False
    kw = dict(temperature=temperature, chunk_size=3, reduction="sequence")
    ref_h = hs.to(dtype).requires_grad_()
    loss_ref, m_ref = generalized_jsd(linear(ref_h, w_Vd), linear(ht.to(dtype), w_Vd), mask, 0.0, **kw)
    loss_ref.backward()
    new_h = hs.to(dtype).requires_grad_()
    loss, m = generalized_jsd(new_h, ht.to(dtype), mask, 0.0, heads=(LMHead(w_Vd, None), LMHead(w_Vd, None)), **kw)
    loss.backward()
    assert loss.item() > 50.0  # the underflowed entries count at their exact -300 nats
    torch.testing.assert_close(loss, loss_ref, rtol=tol, atol=tol)
    assert m == pytest.approx(m_ref, rel=tol, abs=tol)
    torch.testing.assert_close(new_h.grad.float(), ref_h.grad.float(), rtol=tol, atol=tol)
    assert new_h.grad[0, :, 0].max() < 0  # -p_T there: the teacher's mass pulls the student up
    assert new_h.grad[1, :2].abs().sum() == 0  # unsupervised positions


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_topm_tail_closed_form_matches_autograd_at_the_floors(dtype, tol):
    """LOPD's top-M + tail loss with frozen heads (closed-form gradients of both hidden states,
    one workspace for every chunk) against the logits function through autograd, in float32 and
    bfloat16, where buckets lie below the float32 floor of kl_rows (300 nats down): a teacher
    top-M token the student gives no mass, a student tail and a teacher tail of no mass."""
    g = torch.Generator().manual_seed(7)
    n, d, M = 6, 8, 3
    w_Vd = torch.eye(d, dtype=dtype)  # logits = hidden states, so the gaps are set exactly
    hs, ht = torch.randn(3, n, d, generator=g) * 3, torch.randn(3, n, d, generator=g) * 3
    ht[:, :, :M] += 20.0  # the teacher's top-M: the first M ids
    hs[0, :, 0] = -300.0  # the student: no mass on a teacher top-M token
    hs[1, :, M:] = -300.0  # the student: no tail mass
    ht[2, :, M:] = -300.0  # the teacher: no tail mass
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, :2] = False
    ref_s, ref_t = hs.to(dtype).requires_grad_(), ht.to(dtype).requires_grad_()
    loss_ref, m_ref = topm_tail_reverse_kl(linear(ref_s, w_Vd), linear(ref_t, w_Vd), mask, M=M)
    loss_ref.backward()
    new_s, new_t = hs.to(dtype).requires_grad_(), ht.to(dtype).requires_grad_()
    loss, m = head_topm_tail_reverse_kl(new_s, new_t, mask, LMHead(w_Vd, None), LMHead(w_Vd, None), M=M, chunk_size=4)
    loss.backward()
    assert loss.item() > 1.0  # the floored buckets carry real mass on the other side
    torch.testing.assert_close(loss, loss_ref, rtol=tol, atol=tol)
    assert m == pytest.approx(m_ref, rel=tol, abs=tol)
    for new, ref in ((new_s, ref_s), (new_t, ref_t)):
        assert new.grad.isfinite().all()
        torch.testing.assert_close(new.grad.float(), ref.grad.float(), rtol=tol, atol=tol)
    assert new_s.grad[0, :, 0].abs().max() < 1e-30 < new_s.grad[0, :, 1:].abs().max()
    assert new_s.grad[1, :2].abs().sum() == 0 and new_t.grad[1, :2].abs().sum() == 0  # unsupervised


@pytest.mark.parametrize("reduction,denominator", [("token", None), ("trajectory", None), ("token", 9.0),
                                                   ("trajectory", 4.0)])
@pytest.mark.parametrize("is_clip", [2.0, None])
@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_sdpo_with_frozen_heads_takes_its_gradient_in_the_forward(reduction, denominator, is_clip, chunk_size):
    """sdpo_topk_loss with frozen heads: value, metrics and the student hidden states' gradient of
    the logits call (sampled ids and old log-probs split into the same chunks), no matmul in the
    backward."""
    mask = _mask()
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(4))
    old = torch.randn(B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) - 3.0
    old[0, 0] = float("nan")  # not recorded: weight 1
    ref, new = _frozen_leaves()
    kw = dict(k=5, alpha=0.5, is_clip=is_clip, temperature=1.5, chunk_size=chunk_size, reduction=reduction,
              denominator=denominator)
    loss_ref, m_ref = sdpo_topk_loss(linear(ref["hs"], ref["ws"], ref["bs"]), linear(ref["ht"], ref["wt"]), ids, mask,
                                     old, **kw)
    loss_ref.backward()
    loss, m, forward_matmuls, backward_matmuls = _counted(lambda: sdpo_topk_loss(
        new["hs"], new["ht"], ids, mask, old, heads=(LMHead(new["ws"], new["bs"]), LMHead(new["wt"], None)), **kw))
    assert loss.item() > 0 and forward_matmuls > 0 and backward_matmuls == 0
    torch.testing.assert_close(loss, loss_ref, rtol=1e-12, atol=1e-14)
    assert m == pytest.approx(m_ref, rel=1e-10, abs=1e-13)
    torch.testing.assert_close(new["hs"].grad, ref["hs"].grad, rtol=1e-10, atol=1e-13)
