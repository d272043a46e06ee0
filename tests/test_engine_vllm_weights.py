"""The vllm rollout engine's weights (LoRA requests per version, reloads, served folders), a
missing vllm, and the distill loop on it, against the stand-in ``vllm`` module of
tests/test_engine_vllm.py (vLLM cannot run on the CPU machines)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stages.engines import SamplingParams, check_engine, make_engine
from stages.engines.vllm import SERVING_GPU_SHARE, TRAINING_GPU_SHARE, VLLMRolloutEngine
from tests.test_engine_vllm import FakeLLM, base_folder, fake_vllm, ids, lora_student, tok  # noqa: F401 (fixtures)
from tests.tiny import save_tiny, tiny_model


def test_lora_student_gets_a_fresh_request_per_version(fake_vllm, tok, ids, base_folder):
    student = lora_student(base_folder, rank=4)
    engine = make_engine("vllm", student, tok, adapter="student")
    llm = FakeLLM.last
    assert llm.kwargs == dict(model=str(base_folder), dtype="float32", gpu_memory_utilization=TRAINING_GPU_SHARE,
                              max_model_len=None, enable_sleep_mode=True, logprobs_mode="processed_logprobs",
                              enable_lora=True, max_loras=1, max_lora_rank=8)
    first = engine._lora
    assert (first.lora_name, first.lora_int_id) == ("student-v1", 1)
    lora_b = next(n for n, _ in student.named_parameters() if "lora_B.student" in n)
    for version in (2, 3):
        with torch.no_grad():
            dict(student.named_parameters())[lora_b].add_(0.5)
        engine.sleep()
        engine.sync_weights(student, "student")
        engine.generate([ids], SamplingParams())
        request = llm.generated[-1][2]
        assert (request.lora_name, request.lora_int_id) == (f"student-v{version}", version)
        saved = load_file(Path(request.lora_path) / "adapter_model.safetensors")
        key = next(k for k in saved if "lora_B" in k and k.split("lora_B")[0] in lora_b)
        torch.testing.assert_close(saved[key], dict(student.named_parameters())[lora_b])
        assert not Path(first.lora_path).exists()  # the older versions' folders are gone
        first = request
    # level 1: base weights parked in CPU memory, nothing to reload on wake
    assert llm.calls == [call for v in (2, 3) for call in (
        ("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("generate", v))]
    with pytest.raises(ValueError, match="built for adapter 'student', asked to sync None"):
        engine.sync_weights(student, None)


def test_a_wake_serves_the_adapter_under_a_fresh_request(fake_vllm, tok, ids, base_folder):
    """A step without training rows sleeps and wakes without a sync: the next rollouts must not
    reuse the adapter vLLM loaded before the sleep (vllm#53888), but load it again."""
    student = lora_student(base_folder, rank=4)
    engine = make_engine("vllm", student, tok, adapter="student")
    llm = FakeLLM.last
    engine.generate([ids], SamplingParams())
    before = llm.generated[-1][2]
    engine.sleep()  # a step with no rows: no sync_weights
    engine.generate([ids], SamplingParams())
    after = llm.generated[-1][2]
    assert after.lora_int_id != before.lora_int_id and after.lora_path == before.lora_path  # main: the same id
    engine.generate([ids], SamplingParams())  # awake: the same request
    engine.sleep()
    engine.sync_weights(student, "student")  # a new version: its request is fresh already
    engine.generate([ids], SamplingParams())
    ids_used = [c[1] for c in llm.calls if c[0] == "generate"]
    assert ids_used == [1, 2, 2, 3]
    assert [c for c in llm.calls if c[0] != "generate"] == [
        ("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))] * 2


def test_full_fine_tuning_reloads_the_saved_weights(fake_vllm, tok, ids):
    model = tiny_model(tok)
    engine = VLLMRolloutEngine(model, tok)
    llm = FakeLLM.last
    start = Path(llm.kwargs["model"])
    assert start.name == "v1" and (start / "config.json").is_file() and (start / "tokenizer.json").is_file()
    assert llm.kwargs["enable_sleep_mode"] is True and "enable_lora" not in llm.kwargs
    name = "model.layers.0.mlp.up_proj.weight"
    with torch.no_grad():
        model.get_parameter(name).mul_(2.0)
    engine.sleep()
    engine.sync_weights(model)  # asleep: saved only; the wake loads it
    assert llm.calls == [("sleep", 2)] and not start.exists()
    engine.generate([ids], SamplingParams())
    assert [c[:3] for c in llm.calls[1:]] == [("wake_up", ("weights",)), ("rpc", "reload_weights", "v2"),
                                              ("reset_prefix_cache",), ("wake_up", ("kv_cache",)), ("generate", None)]
    torch.testing.assert_close(llm.calls[2][3][name], model.get_parameter(name))
    engine.sleep()
    engine.generate([ids], SamplingParams())  # no update between: the same version is loaded again
    assert llm.calls[-4][:3] == ("rpc", "reload_weights", "v2")
    del llm.calls[:]
    engine.sync_weights(model)  # awake: reloaded at once
    assert [c[:3] for c in llm.calls] == [("rpc", "reload_weights", "v3"), ("reset_prefix_cache",)]
    assert engine.version == 3


def test_a_model_folder_is_served_as_it_is(fake_vllm, tok, ids, tmp_path):
    folder = save_tiny(tmp_path / "m")
    engine = make_engine("vllm", str(folder), tok, batch_size=3, prefix_cache_tokens=100)
    llm = FakeLLM.last
    assert llm.kwargs == dict(model=str(folder), dtype="bfloat16", gpu_memory_utilization=SERVING_GPU_SHARE,
                              max_model_len=None, enable_sleep_mode=False, logprobs_mode="processed_logprobs")
    assert engine.eos_ids == [tok.eos_token_id] and engine.dtype == torch.bfloat16
    engine.sleep()
    engine.generate([ids], SamplingParams())
    assert llm.calls == [("generate", None)]
    with pytest.raises(ValueError, match="no trained weights to sync"):
        engine.sync_weights(tiny_model(tok))


def adapter_folder(base_folder: Path, out: Path, rank: int = 4) -> Path:
    """A LoRA student of the tiny base saved as ``lopd export`` writes it without --merge: the
    adapter (a non-zero update) with its base's name_or_path, no config.json."""
    student = lora_student(base_folder, rank=rank)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    student.save_pretrained(str(out), selected_adapters=["student"])
    return out / "student"


def test_serving_args_serve_each_student_folder_as_trained(tmp_path, base_folder):
    """What vLLM is asked for each kind of folder (vllm is not imported): a LoRA adapter folder as
    its base plus the adapter through vLLM's LoRA path, a float32-merged LoRA student in float32
    (in bfloat16 its update would mostly round away), anything else in bfloat16."""
    from stages.core.models.backbone import merge_lora_float32
    from stages.engines.vllm import serving_args

    assert serving_args(str(base_folder)) == (dict(model=str(base_folder), dtype="bfloat16"), None)
    adapter = adapter_folder(base_folder, tmp_path / "export")
    assert serving_args(str(adapter)) == (dict(model=str(base_folder), dtype="bfloat16", enable_lora=True, max_loras=1,
                                               max_lora_rank=8), str(adapter))
    merged = tmp_path / "merged"
    merge_lora_float32(str(base_folder), adapter).save_pretrained(merged)
    assert serving_args(str(merged)) == (dict(model=str(merged), dtype="float32"), None)
    config = json.loads((adapter / "adapter_config.json").read_text())
    for change, match in ((dict(r=600), "LoRA rank 600 is above vLLM's largest, 512"),
                          (dict(rank_pattern={"q_proj": 1024}), "LoRA rank 1024"),
                          (dict(modules_to_save=["lm_head"]), "modules_to_save"),
                          (dict(use_dora=True), "use_dora"),
                          (dict(base_model_name_or_path=None), "no base_model_name_or_path|with a base_model_name_or_path")):
        (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=match):
            serving_args(str(adapter))


def test_an_exported_student_is_served_as_trained(fake_vllm, tok, ids, tmp_path, base_folder):
    from stages.core.models.backbone import merge_lora_float32

    adapter = adapter_folder(base_folder, tmp_path / "export")
    engine = make_engine("vllm", str(adapter), tok)
    llm = FakeLLM.last
    assert (llm.kwargs["model"], llm.kwargs["dtype"], llm.kwargs["enable_lora"], llm.kwargs["max_lora_rank"]) == (
        str(base_folder), "bfloat16", True, 8)
    engine.generate([ids], SamplingParams())
    served = llm.generated[-1][2]
    assert served.lora_path == str(adapter) and llm.calls == [("generate", served.lora_int_id)]
    merged = tmp_path / "merged"
    merge_lora_float32(str(base_folder), adapter).save_pretrained(merged)
    engine = make_engine("vllm", str(merged), tok)
    assert FakeLLM.last.kwargs["dtype"] == "float32" and engine.dtype == torch.float32
    assert "enable_lora" not in FakeLLM.last.kwargs


def test_bad_students_are_refused(fake_vllm, tok, base_folder):
    student = lora_student(base_folder)
    with pytest.raises(ValueError, match=r"no adapter 'nope' \(adapters: \['student'\]\)"):
        VLLMRolloutEngine(student, tok, adapter="nope")
    with pytest.raises(ValueError, match="must be a plain transformers model"):
        VLLMRolloutEngine(student, tok)
    from stages.core.models.composer import add_lora_adapter

    with pytest.raises(ValueError, match="base model has no name_or_path"):
        VLLMRolloutEngine(add_lora_adapter(tiny_model(tok), "student"), tok, adapter="student")


# --- without vllm -----------------------------------------------------------------------------


def test_missing_vllm_is_one_clear_error(monkeypatch, tok):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    msg = r"^engine 'vllm' needs the vllm package \(a CUDA GPU\): install with pip install '\.\[vllm\]'$"
    with pytest.raises(ValueError, match=msg):
        check_engine("vllm")
    with pytest.raises(ValueError, match=msg):
        make_engine("vllm", tiny_model(tok), tok)
    check_engine("hf")
    with pytest.raises(ValueError, match="unknown engine 'sglang'; known engines: hf, vllm"):
        check_engine("sglang")


def test_distill_and_evaluate_refuse_a_missing_vllm_before_loading(monkeypatch, tmp_path):
    from stages import evaluate
    from stages.distill.recipe import DistillConfig, Distiller

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ValueError, match="install with pip install"):
        Distiller(DistillConfig(env="code", store=str(tmp_path / "s"), out=str(tmp_path / "o"), method="grpo",
                                engine="vllm"))
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()
    with pytest.raises(ValueError, match="install with pip install"):
        evaluate.run(evaluate.EvaluateConfig(bench="humaneval-plus", engine="vllm", out=str(tmp_path / "r.json")))
    with pytest.raises(ValueError, match="drop --engine vllm"):
        evaluate.EvaluateConfig(bench="bfcl-v3", engine="vllm", composer="c", store="s")


# --- in the distill loop ----------------------------------------------------------------------


def test_distill_rolls_out_through_vllm_and_sleeps_for_each_update(fake_vllm, monkeypatch, tmp_path, tok,
                                                                   base_folder):
    """Two GRPO steps: the rollouts are exactly vLLM's ids and log-probs, the engine sleeps before
    each update, and step 2 samples with the adapter of version 2 (the one after step 1's update)."""
    from stages.core.data.store import ExperienceStore
    import stages.distill.recipe as distill
    from tests.test_distill import ENV, HashEmbedder  # registers the toy environment

    monkeypatch.setattr(distill, "load_embedder", lambda name=None, **kw: HashEmbedder())
    answers = [tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
               for text in ("The answer is 4.", "It is 4")]
    config = distill.DistillConfig(env=ENV, store=str(tmp_path / "store"), out=str(tmp_path / "run"),
                                   model=str(base_folder), method="grpo", engine="vllm", steps=2, tasks_per_step=1,
                                   group_size=2, max_new_tokens=8, student_lora_rank=4, micro_batch=2, lr=1e-2,
                                   top_p=1.0, run_id="vllm-test", new_store=True)  # untruncated: vLLM's log-probs are kept
    trainer = distill.Distiller(config)
    llm = FakeLLM.last
    assert llm.kwargs["enable_lora"] and llm.kwargs["model"] == str(base_folder)
    llm.respond = lambda prompt, k: (answers[k["seed"] % 2], [-0.5] * len(answers[k["seed"] % 2]))
    trainer.fit()
    # per step: two turns of generation, then sleep for the update (the sync needs no call for LoRA)
    assert llm.calls == [("generate", 1), ("generate", 1), ("sleep", 1),
                         ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("generate", 2), ("generate", 2),
                         ("sleep", 1)]
    trajectories = ExperienceStore.open(config.store).query(run_id="vllm-test")
    assert len(trajectories) == 4
    for traj in trajectories:
        for turn in traj.turns:
            assert turn.token_ids in answers and turn.finish_reason == "eos"
            assert turn.logprobs == [-0.5] * len(turn.token_ids)
    assert {t for traj in trajectories for t in map(tuple, (turn.token_ids for turn in traj.turns))} == set(
        map(tuple, answers))
