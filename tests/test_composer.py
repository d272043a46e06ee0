"""Composer (Eq. 5-6) and latent-context teacher (Eq. 7-8) on a tiny in-process Llama."""
from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from stages.core.models.composer import (
    Composer,
    adapter_parameters,
    add_lora_adapter,
    base_parameters,
    enable_activation_checkpointing,
    save_composer,
)
from stages.core.latent.teacher import teacher_logits
from stages.core.models.assembly import load_composer
from stages.core.models.student import student_logits

V, D, K, J = 64, 32, 3, 2


def tiny_llama(hidden: int = D, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    return LlamaForCausalLM(cfg).eval()


def perturb_lora_b(backbone, name: str, seed: int) -> None:
    """LoRA B starts at zero (pitfall 5): give it values so every LoRA tensor gets a gradient."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in backbone.named_parameters():
            if f"lora_B.{name}." in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


@pytest.fixture
def setup():
    """(plain initial model copy, composer over a backbone with 'student' + 'composer' adapters)."""
    model = tiny_llama()
    initial = copy.deepcopy(model)
    backbone = add_lora_adapter(model, "student", rank=4, alpha=8)
    torch.manual_seed(1)
    composer = Composer(backbone, J=J, K=K, depth=2, lora_rank=4, lora_alpha=8, max_exp_tokens=16)
    perturb_lora_b(composer.backbone, "student", seed=2)
    perturb_lora_b(composer.backbone, "composer", seed=3)
    return initial, composer


def experiences(B: int = 2, L: int = 7, seed: int = 4):
    """Right-padded (B, J, L) experience ids and masks with different lengths."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, J, L), generator=gen)
    lengths = torch.randint(2, L + 1, (B, J), generator=gen)
    mask = torch.arange(L) < lengths.unsqueeze(-1)
    return ids, mask


def trajectories():
    """Right-padded (2, 9) token ids, prompt lengths (2,), second row has 2 pad tokens."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (2, 9), generator=gen)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 7:] = False
    return ids, mask, torch.tensor([3, 4])


def test_shapes_and_output_scale(setup):
    _, composer = setup
    ids, mask = experiences()
    c_phi = composer(ids, mask)
    assert c_phi.shape == (2, J * K, D)
    assert c_phi.dtype == torch.float32
    # experience j of row b sits at rows [j*K, (j+1)*K) of c_phi
    torch.testing.assert_close(c_phi[1, K : 2 * K], composer.encode(ids[1, 1:2], mask[1, 1:2])[0])
    emb_norm = composer.backbone.get_input_embeddings().weight.norm(dim=-1).mean()
    torch.testing.assert_close(c_phi.norm(dim=-1).mean(), emb_norm, rtol=0.02, atol=0)
    assert composer.compressor.depth == 2 and composer.hparams["heads"] == 8
    small = Composer(composer.backbone, J=J, K=K, depth=2, latent_scale=0.1, adapter_name="small")
    torch.testing.assert_close(small(ids, mask).norm(dim=-1).mean(), 0.1 * emb_norm, rtol=0.02, atol=0)


def test_right_padding_is_irrelevant_and_real_tokens_matter(setup):
    _, composer = setup
    ids, mask = experiences()
    ids_NL, mask_NL = ids.reshape(-1, 7), mask.reshape(-1, 7)
    with torch.no_grad():
        ref = composer.encode(ids_NL, mask_NL)
        noise = torch.randint(0, V, (ids_NL.shape[0], 5))
        no_mask = torch.zeros_like(noise, dtype=torch.bool)
        padded = composer.encode(torch.cat([ids_NL, noise], 1), torch.cat([mask_NL, no_mask], 1))
        scrambled = torch.where(mask_NL, ids_NL, (ids_NL + 1) % V)
        same = composer.encode(scrambled, mask_NL)
        changed_ids = ids_NL.clone()
        changed_ids[:, 0] = (changed_ids[:, 0] + 1) % V
        changed = composer.encode(changed_ids, mask_NL)
    torch.testing.assert_close(padded, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(same, ref, atol=1e-5, rtol=0)
    assert (changed - ref).abs().amax(dim=(1, 2)).min() > 1e-4


def test_repeated_experiences_are_encoded_once_with_equal_values_and_gradients(setup, monkeypatch):
    """Rows with the same composer inputs (G rollouts of one task) share one encoding; values and
    the gradients of every composer parameter equal encoding each copy separately."""
    _, composer = setup
    ids, mask = experiences(B=2)
    ids_dup = torch.cat([ids, ids[:1], ids[1:].clone()])  # (4, J, L): rows 0 = 2, 1 = 3
    mask_dup = torch.cat([mask, mask[:1], mask[1:]])
    ids_dup[3][~mask_dup[3]] = 0  # other padding ids: still the same experience
    encoded = []
    real_encode = composer.encode
    monkeypatch.setattr(composer, "encode", lambda i, m: encoded.append(i.shape[0]) or real_encode(i, m))
    params = [p for p in composer.trainable_parameters()]
    c_dup = composer(ids_dup, mask_dup)
    assert encoded == [2 * J]  # 4 rows x J experiences, 2 x J distinct
    (c_dup ** 2).sum().backward()
    grads_dup = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    separate = torch.cat([real_encode(ids_dup[b], mask_dup[b]).reshape(1, J * K, D) for b in range(4)])
    torch.testing.assert_close(c_dup, separate, rtol=1e-5, atol=1e-6)
    (separate ** 2).sum().backward()
    for p, g in zip(params, grads_dup):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_max_exp_tokens_truncates_and_empty_experience_raises(setup):
    _, composer = setup
    ids = torch.randint(0, V, (1, 20))
    mask = torch.ones(1, 20, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(composer.encode(ids, mask), composer.encode(ids[:, :16], mask[:, :16]))
    mask[0] = False
    with pytest.raises(ValueError, match="at least one real token"):
        composer.encode(ids, mask)


def _joint_loss(composer):
    """Reverse KL(student || teacher with latents) + student NLL: touches all three roles."""
    exp_ids, exp_mask = experiences()
    ids, mask, prompt_len = trajectories()
    c_phi = composer(exp_ids, exp_mask)
    t = teacher_logits(composer.backbone, ids, mask, c_phi, prompt_len)
    s = student_logits(composer.backbone, ids, mask)
    kl = (s.log_softmax(-1).exp() * (s.log_softmax(-1) - t.log_softmax(-1))).sum(-1)
    nll = F.cross_entropy(s[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none")
    return (kl * mask).sum() / mask.sum() + (nll * mask[:, 1:].reshape(-1)).mean()


def test_every_trainable_tensor_gets_a_grad_and_base_weights_stay_frozen(setup):
    _, composer = setup
    backbone = composer.backbone
    psi = adapter_parameters(backbone, "composer")
    theta = adapter_parameters(backbone, "student")
    chi = list(composer.compressor.parameters())
    assert len(theta) == 2 * 4 * 2  # A and B x q,k,v,o x 2 layers
    assert len(psi) == 2 * 7 * 2  # A and B x q,k,v,o,gate,up,down x 2 layers
    base_before = {n: p.detach().clone() for n, p in base_parameters(backbone)}
    _joint_loss(composer).backward()
    for p in composer.trainable_parameters() + theta:
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert len(composer.trainable_parameters()) == len(psi) + len(chi)
    for n, p in base_parameters(backbone):
        assert p.grad is None, n
    opt = torch.optim.AdamW(composer.trainable_parameters() + theta, lr=1e-2)
    lora_before = [p.detach().clone() for p in psi + theta]
    opt.step()
    for n, p in base_parameters(backbone):
        assert torch.equal(p, base_before[n]), n
    assert all(not torch.equal(p, q) for p, q in zip(psi + theta, lora_before))


def test_activation_checkpointing_recomputes_with_the_right_adapter(setup):
    _, composer = setup
    backbone = composer.backbone
    backbone.train()
    params = composer.trainable_parameters() + adapter_parameters(backbone, "student")
    _joint_loss(composer).backward()
    ref = [p.grad.clone() for p in params]
    backbone.zero_grad()
    composer.zero_grad()
    enable_activation_checkpointing(backbone)
    assert all(layer.gradient_checkpointing for layer in backbone.get_base_model().model.layers)
    # the frozen embeddings' output takes no gradient (non-reentrant checkpointing needs none)
    assert not backbone.get_input_embeddings()(torch.tensor([[1, 2]])).requires_grad
    _joint_loss(composer).backward()
    for p, g in zip(params, ref):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)


def test_teacher_without_latents_is_the_initial_backbone(setup):
    initial, composer = setup
    ids, mask, prompt_len = trajectories()
    with torch.no_grad():
        ref = initial(input_ids=ids, attention_mask=mask.long()).logits
        t = teacher_logits(composer.backbone, ids, mask, torch.zeros(2, 0, D), prompt_len)
        s = student_logits(composer.backbone, ids, mask)
    torch.testing.assert_close(t, ref, atol=1e-5, rtol=0)
    assert (s - ref).abs().max() > 1e-3  # the student adapter is really active for the student


def test_latents_act_only_from_the_insertion_point(setup):
    initial, composer = setup
    ids, mask, prompt_len = trajectories()
    with torch.no_grad():
        ref = initial(input_ids=ids, attention_mask=mask.long()).logits
        t = teacher_logits(composer.backbone, ids, mask, torch.randn(2, 4, D), prompt_len)
    for b, p in enumerate(prompt_len.tolist()):
        torch.testing.assert_close(t[b, : p - 1], ref[b, : p - 1], atol=1e-5, rtol=0)
        # position p-1 predicts the first token after the latents, so it must see them (Eq. 8)
        n = int(mask[b].sum())
        assert (t[b, p - 1 : n] - ref[b, p - 1 : n]).abs().amax(-1).min() > 1e-4


def test_latents_behave_like_inserted_tokens(setup):
    """Latents equal to token embeddings give the logits of the token sequence with them inserted."""
    initial, composer = setup
    ids, mask, prompt_len = trajectories()
    extra = torch.tensor([[7, 8, 9], [10, 11, 12]])
    latents = initial.get_input_embeddings()(extra)
    with torch.no_grad():
        t = teacher_logits(composer.backbone, ids, mask, latents, prompt_len)
        for b, p in enumerate(prompt_len.tolist()):
            n = int(mask[b].sum())
            full = torch.cat([ids[b, :p], extra[b], ids[b, p:n]]).unsqueeze(0)
            ref = initial(input_ids=full).logits[0]
            keep = torch.cat([torch.arange(p - 1), torch.arange(p + 2, n + 3)])
            torch.testing.assert_close(t[b, :n], ref[keep], atol=1e-5, rtol=0)


def test_prefix_equals_per_turn_for_one_turn_and_per_turn_is_exact_eq8(setup):
    _, composer = setup
    ids, mask, prompt_len = trajectories()
    latents = torch.randn(2, 4, D)
    with torch.no_grad():
        prefix = teacher_logits(composer.backbone, ids, mask, latents, prompt_len)
        one_turn = teacher_logits(
            composer.backbone, ids, mask, latents, placement="per-turn", action_starts=[[3], [4]]
        )
        torch.testing.assert_close(one_turn, prefix, atol=1e-6, rtol=0)
        # two turns in row 0 (actions at 3 and 6): turn 2 sees only its own latent block
        two = teacher_logits(
            composer.backbone, ids, mask, latents, placement="per-turn", action_starts=[[3, 6], [4]]
        )
        at6 = teacher_logits(composer.backbone, ids, mask, latents, torch.tensor([6, 4]))
    torch.testing.assert_close(two[0, :5], prefix[0, :5], atol=1e-6, rtol=0)
    torch.testing.assert_close(two[0, 5:], at6[0, 5:], atol=1e-6, rtol=0)
    torch.testing.assert_close(two[1], prefix[1], atol=1e-6, rtol=0)
    assert (two[0, 5:] - prefix[0, 5:]).abs().max() > 1e-4
    latents.requires_grad_(True)
    per_turn = teacher_logits(
        composer.backbone, ids, mask, latents, placement="per-turn", action_starts=[[3, 6], [4]]
    )
    per_turn[:, -1].logsumexp(-1).sum().backward()
    assert (latents.grad.abs().sum(-1) > 0).all()


def test_teacher_input_validation(setup):
    _, composer = setup
    ids, mask, prompt_len = trajectories()
    left = mask.flip(1)
    lat = torch.randn(2, 2, D)
    with pytest.raises(ValueError, match="right-padded"):
        teacher_logits(composer.backbone, ids, left, lat, prompt_len)
    with pytest.raises(ValueError, match="insert_at"):
        teacher_logits(composer.backbone, ids, mask, lat, torch.tensor([3, 8]))
    with pytest.raises(ValueError, match="needs insert_at_B"):
        teacher_logits(composer.backbone, ids, mask, lat)
    with pytest.raises(ValueError, match="strictly increasing"):
        teacher_logits(composer.backbone, ids, mask, lat, placement="per-turn", action_starts=[[4, 4], [2]])


def test_full_fine_tuning_needs_a_frozen_teacher_copy():
    student = tiny_llama()
    teacher = copy.deepcopy(student).requires_grad_(False)
    ids, mask, prompt_len = trajectories()
    lat = torch.randn(2, 2, D, requires_grad=True)
    with pytest.raises(ValueError, match="teacher_model"):
        teacher_logits(student, ids, mask, lat, prompt_len)
    t = teacher_logits(student, ids, mask, lat, prompt_len, teacher_model=teacher)
    s = student_logits(student, ids, mask, adapter=None)
    (t.logsumexp(-1).sum() + s.logsumexp(-1).sum()).backward()
    assert lat.grad is not None and lat.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None for p in student.parameters() if p.dim() > 1)


def test_save_load_round_trip_and_backbone_checks(setup, tmp_path):
    initial, composer = setup
    ids, mask = experiences()
    with torch.no_grad():
        ref = composer(ids, mask)
    out = save_composer(composer, tmp_path / "ckpt", {"backbone_id": "tiny-llama", "placement": "per-turn"})
    assert (out / "composer" / "adapter_model.safetensors").is_file()
    assert (out / "compressor.safetensors").is_file()
    cfg = json.loads((out / "composer_config.json").read_text())
    assert cfg["backbone_id"] == "tiny-llama" and cfg["placement"] == "per-turn"
    recorded = [cfg[k] for k in ("J", "K", "depth", "hidden_size", "lora_rank", "lora_alpha")]
    assert recorded == [J, K, 2, D, 4, 8]

    fresh = add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8)
    loaded = load_composer(fresh, out, trainable=True, backbone_id="tiny-llama")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), ref, atol=0, rtol=0)
    assert all(p.requires_grad for p in loaded.trainable_parameters())
    assert set(loaded.backbone.peft_config) == {"student", "composer"}
    plain = load_composer(copy.deepcopy(initial), out, trainable=True, backbone_id="tiny-llama")
    with torch.no_grad():
        torch.testing.assert_close(plain(ids, mask), ref, atol=0, rtol=0)

    with pytest.raises(ValueError, match=r"trained on backbone tiny-llama, got other-model"):
        load_composer(copy.deepcopy(initial), out, trainable=True, backbone_id="other-model")
    with pytest.raises(ValueError, match="hidden size"):
        load_composer(tiny_llama(hidden=48), out, trainable=True, backbone_id="tiny-llama")
    with pytest.raises(ValueError, match="backbone_id"):
        save_composer(composer, tmp_path / "bad", {"placement": "prefix"})


@pytest.mark.parametrize("damage", ["compressor", "adapter", "config"])
def test_a_damaged_composer_checkpoint_is_one_line_naming_the_file(setup, tmp_path, damage):
    """A truncated weights file (a full disk, a killed copy) or a config that is no JSON object:
    one ValueError line naming the file, instead of the loader's traceback."""
    initial, composer = setup
    out = save_composer(composer, tmp_path / "ckpt", {"backbone_id": "tiny-llama"})
    bad = {"compressor": out / "compressor.safetensors", "adapter": out / "composer" / "adapter_model.safetensors",
           "config": out / "composer_config.json"}[damage]
    if damage == "config":
        bad.write_text('{"J": 2,')
    else:
        bad.write_bytes(bad.read_bytes()[:100])
    named = bad if damage != "adapter" else bad.parent  # peft loads the adapter folder
    with pytest.raises(ValueError, match=re.escape(str(named))) as err:
        load_composer(copy.deepcopy(initial), out, trainable=False, backbone_id="tiny-llama")
    assert "\n" not in str(err.value) and ("cannot load" in str(err.value) or "unreadable" in str(err.value))


def test_shared_qformer_applies_one_block_depth_times_and_old_checkpoints_load_unshared(setup, tmp_path):
    """Appendix A of the LOPD paper: ONE QFormer block applied ``depth`` times (the default); the
    stacked variant has ``depth`` blocks; a checkpoint without ``qformer_shared`` (written before
    the option) loads as stacked blocks, with the same outputs."""
    initial, shared = setup  # depth 2, default: shared
    comp = shared.compressor
    assert len(comp.blocks) == 1 and shared.hparams["qformer_shared"] is True
    block_params = sum(p.numel() for p in comp.blocks[0].parameters())
    stacked = Composer(add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8), J=J, K=K, depth=2,
                       qformer_shared=False, lora_rank=4, lora_alpha=8, max_exp_tokens=16)
    assert len(stacked.compressor.blocks) == 2
    assert sum(p.numel() for p in stacked.compressor.parameters()) - sum(p.numel() for p in comp.parameters()) \
        == block_params
    # the forward is the one block twice, then the output norm
    h_NLd = torch.randn(2, 5, D)
    mask_NL = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with torch.no_grad():
        q = comp.queries.unsqueeze(0).expand(2, -1, -1)
        q = comp.blocks[0](comp.blocks[0](q, h_NLd, ~mask_NL), h_NLd, ~mask_NL)
        torch.testing.assert_close(comp(h_NLd, mask_NL), comp.out_norm(q), atol=0, rtol=0)
    # queries start at N(0, 1/d)
    big = Composer(tiny_llama(hidden=256), J=J, K=64, depth=1, lora_rank=4, lora_alpha=8)
    assert big.compressor.queries.std().item() == pytest.approx(256 ** -0.5, rel=0.1)

    ids, mask = experiences()
    with torch.no_grad():
        ref = stacked(ids, mask)
    out = save_composer(stacked, tmp_path / "old", {"backbone_id": "tiny-llama"})
    cfg = json.loads((out / "composer_config.json").read_text())
    assert cfg["qformer_shared"] is False
    del cfg["qformer_shared"]
    (out / "composer_config.json").write_text(json.dumps(cfg))
    loaded = load_composer(copy.deepcopy(initial), out, trainable=False, backbone_id="tiny-llama")
    assert len(loaded.compressor.blocks) == 2
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), ref, atol=0, rtol=0)


def test_encoder_lora_covers_the_seven_projections_and_old_checkpoints_keep_theirs(setup, tmp_path):
    """A.1 of the LOPD paper: encoder LoRA (rank 8, alpha 16, dropout 0) on q/k/v/o/gate/up/down of
    every block; a composer saved with q/k/v/o only loads with q/k/v/o."""
    initial, composer = setup
    lora_A = [n for n, _ in composer.backbone.named_parameters() if "lora_A.composer." in n]
    layers = initial.config.num_hidden_layers
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert sum(f".{proj}.lora_A." in n for n in lora_A) == layers, proj
    assert len(lora_A) == 7 * layers
    cfg = composer.backbone.peft_config["composer"]
    assert cfg.lora_dropout == 0.0 and (cfg.r, cfg.lora_alpha) == (4, 8)
    default = Composer(tiny_llama(), J=J, K=K, depth=1)
    assert (default.hparams["lora_rank"], default.hparams["lora_alpha"]) == (8, 16)

    four = Composer(add_lora_adapter(copy.deepcopy(initial), "student", rank=4, alpha=8), J=J, K=K, depth=2,
                    lora_rank=4, lora_alpha=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    out = save_composer(four, tmp_path / "qkvo", {"backbone_id": "tiny-llama"})
    loaded = load_composer(copy.deepcopy(initial), out, trainable=False, backbone_id="tiny-llama")
    names = [n for n, _ in loaded.backbone.named_parameters() if "lora_A.composer." in n]
    assert len(names) == 4 * layers and not any("mlp" in n for n in names)


def test_a_missing_composer_checkpoint_names_the_command_that_makes_one(tmp_path):
    from stages.core.models.composer_config import read_composer_config

    with pytest.raises(ValueError, match=r"composer_config.json: no composer checkpoint .*`lopd coldstart"):
        read_composer_config(tmp_path / "nocomposer")
