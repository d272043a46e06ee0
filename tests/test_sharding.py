"""stages/core/run/sharding.py in one process: micro-batch padding, gradient norm and clipping
against torch's, the refusals of ``--shard fsdp``, and on a 1-rank gloo group the sharded tiny
model in bfloat16 (float32 master weights, bf16 compute, gathered for generation) with a DCP
checkpoint round trip and the gathered export. The 2-process runs: tests/test_distill_fsdp.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from stages.core.run import sharding
from stages.core.run.distributed import World
from stages.distill.recipe import DistillConfig
from tests.tiny import tiny_model, tiny_tokenizer


def test_micro_batches_pad_every_rank_to_the_largest_count():
    # 5 rows over 2 ranks: rank 0 rows 0-2, rank 1 rows 3-4; micro-batches of 2
    assert sharding.micro_batches(World(rank=0, size=2), 5, 2, padded=True) == [(0, 2), (2, 3)]
    assert sharding.micro_batches(World(rank=1, size=2), 5, 2, padded=True) == [(3, 5), None]
    assert sharding.micro_batches(World(rank=1, size=3), 2, 1, padded=True) == [(1, 2)]
    assert sharding.micro_batches(World(rank=2, size=3), 2, 1, padded=True) == [None]
    assert sharding.micro_batches(World(rank=2, size=3), 2, 1, padded=False) == []
    assert sharding.micro_batches(World(), 5, 2, padded=False) == [(0, 2), (2, 4), (4, 5)]


def test_grad_norm_and_clipping_match_torch_on_whole_tensors():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    want = float(torch.nn.utils.clip_grad_norm_(b, 0.5))
    assert sharding.clip_grad_norm_(a, 0.5, World()) == pytest.approx(want, rel=1e-6)
    for p, q in zip(a, b):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    assert sharding.grad_norm(a, World()) == pytest.approx(0.5, rel=1e-5)


def _config(**kw) -> DistillConfig:
    return DistillConfig(env="bfcl", store="s", out="o", method="grpo", shard="fsdp", student_lora_rank=0, **kw)


def test_shard_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="add --student-lora-rank 0"):
        sharding.check_shard(_config().model_copy(update={"student_lora_rank": 8}), 2)
    with pytest.raises(ValueError, match="hf engine only"):
        sharding.check_shard(_config(engine="vllm"), 2)
    sdft = DistillConfig(env="bfcl", store="s", out="o", method="sdft", shard="fsdp", student_lora_rank=0)
    with pytest.raises(ValueError, match="supports --method lopd, grpo"):
        sharding.check_shard(sdft, 2)
    sharding.check_shard(_config(), 2)
    sharding.check_shard(sdft, 1)  # one process shards nothing
    with pytest.raises(ValueError):
        DistillConfig(env="bfcl", store="s", out="o", shard="zero3")


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield World(rank=0, size=1)
    dist.destroy_process_group()


def _sharded(world: World) -> tuple[SimpleNamespace, sharding.ShardedStudent]:
    tok = tiny_tokenizer()
    student = SimpleNamespace(model=tiny_model(tok).to(torch.bfloat16), adapter=None, params=[])
    return student, sharding.ShardedStudent(student, world, torch.bfloat16)


def test_bf16_sharded_student_trains_in_float32_masters_and_round_trips_dcp(one_rank_group, tmp_path):
    student, shard = _sharded(one_rank_group)
    model, first = student.model, student.params[0]
    assert type(first).__name__ == "DTensor" and first.dtype == torch.float32
    with shard.gathered():
        assert next(model.parameters()).dtype == torch.bfloat16  # the compute copy
        with torch.inference_mode():
            model.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
    assert shard.take_gather_seconds() > 0 and shard.take_gather_seconds() == 0
    model.train()
    model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.float().pow(2).mean().backward()
    shard.idle_pass(0)
    assert first.grad.dtype == torch.float32
    extra = torch.nn.Parameter(torch.ones(3))
    extra.grad = torch.full((3,), 0.5)
    optimizer = torch.optim.AdamW([{"params": student.params, "lr": 1e-2}, {"params": [extra], "lr": 1e-3}])
    optimizer.step()
    shard.save(tmp_path / "dcp", optimizer, [extra])

    other, other_shard = _sharded(one_rank_group)
    extra2 = torch.nn.Parameter(torch.zeros(3))
    optimizer2 = torch.optim.AdamW([{"params": other.params, "lr": 1e-2}, {"params": [extra2], "lr": 1e-3}])
    other_shard.load(tmp_path / "dcp", optimizer2, [extra2])
    for p, q in zip(student.params, other.params):
        assert torch.equal(p.full_tensor(), q.full_tensor())
    assert torch.equal(extra2, extra)
    for p, q in zip([*student.params, extra], [*other.params, extra2]):
        for key in ("exp_avg", "exp_avg_sq"):
            a, b = optimizer.state[p][key], optimizer2.state[q][key]
            assert torch.equal(getattr(a, "full_tensor", lambda: a)(), getattr(b, "full_tensor", lambda: b)())
    exported = shard.exported()
    assert {v.dtype for v in exported.state.values()} == {torch.bfloat16}
    name, param = next(iter(model.named_parameters()))
    assert torch.equal(exported.state[name], param.full_tensor().to(torch.bfloat16))
    exported.save_pretrained(tmp_path / "final")
    assert (tmp_path / "final" / "model.safetensors").is_file()
