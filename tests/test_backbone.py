"""Backbone resolution, chat rendering with tools and action masks (the engines: test_engines.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from schemas import Message, ToolCall
from stages.core.models.backbone import load_policy, resolve_device_dtype, resolve_model
from stages.core.text.chat import action_spans, render, render_prompt, tokenize_for_training
from stages.engines import SamplingParams
from stages.engines.hf import HFRolloutEngine
from tests.tiny import save_tiny, tiny_model, tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CONVERSATION = [
    Message(role="system", content="You are a helpful assistant."),
    Message(role="user", content="What is the weather in Paris?"),
    Message(role="assistant", content="", tool_calls=[ToolCall(name="get_weather", arguments='{"city": "Paris"}')]),
    Message(role="tool", name="get_weather", content="sunny, 21 degrees"),
    Message(role="assistant", content="The weather in Paris is sunny."),
    Message(role="user", content="And 2+2?"),
    Message(role="assistant", content="The answer is 4."),
]
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


# --- resolve_model / load_policy -------------------------------------------------------------


def test_resolve_passthrough_hf_id_and_existing_path(tmp_path):
    assert resolve_model("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert resolve_model("gpt2") == "gpt2"
    assert resolve_model(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("name", ["./no/such/model", "/no/such/model", "runs/lopd/final"])
def test_resolve_missing_local_path_raises(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such local folder"):
        resolve_model(name)


def test_hub_like_name_under_a_local_folder_is_a_missing_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model("runs/nope") == "runs/nope"  # could be a hub id while no runs/ exists
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match="'runs/nope': no such local folder"):
        resolve_model("runs/nope")


@pytest.mark.parametrize("typo", ["smollm2-135", "SmolLM2-135M", "smolm2-135m", "smollm", "SmolLM2", "smol"])
def test_misspelt_embedded_model_fails_at_once_with_a_suggestion(typo, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as err:
        resolve_model(typo)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"--model {typo!r}: ")
    assert "did you mean 'smollm2-135m'?" in message and "embedded models: smollm2-135m" in message


def test_hub_id_is_looked_up_in_the_local_cache_first(tmp_path, monkeypatch):
    import huggingface_hub

    hub = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"^--model 'owner/model': not a local folder, not in the "
                                                r"Hugging Face cache, and HF_HUB_OFFLINE is set; embedded models"):
        resolve_model("owner/model")
    repo = hub / "models--owner--model"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert resolve_model("owner/model") == "owner/model"  # cached: the loaders find it offline
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert resolve_model("owner/other") == "owner/other"  # not cached, online: the hub is asked


def test_unloadable_hub_id_is_one_clear_error(monkeypatch):
    from transformers import AutoTokenizer

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to the hub to load this file.\nCheck your connection.")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(FileNotFoundError, match=r"^--model 'owner/model': cannot load it: We couldn't connect "
                                                r"to the hub to load this file; embedded models: smollm2-135m"):
        load_policy("owner/model")


def test_load_policy_from_saved_folder(tmp_path, tok):
    folder = save_tiny(tmp_path / "tiny")
    model, loaded = load_policy(str(folder))
    assert not model.training
    assert model.use_kernels is False  # no layer swapped for a Hub kernel (fetched on CUDA, fails offline)
    assert loaded.padding_side == "left" and loaded.pad_token == "<|endoftext|>"
    assert model.config.vocab_size == len(loaded) == len(tok)
    ids = torch.tensor([tok("What is 2+2?")["input_ids"]])
    expected = tiny_model(tok)(ids).logits
    torch.testing.assert_close(model(ids).logits, expected)


def test_load_policy_rejects_bad_dtype(tmp_path):
    with pytest.raises(ValueError, match="--dtype 'float33': use one of float32, bfloat16"):
        load_policy(str(save_tiny(tmp_path / "tiny")), dtype="float33")


def test_device_and_dtype_defaults_and_errors(tmp_path):
    cuda = torch.cuda.is_available()
    assert resolve_device_dtype() == (("cuda", "bfloat16") if cuda else ("cpu", "float32"))
    assert resolve_device_dtype("cpu") == ("cpu", "float32")  # CPU results stay as before: float32
    assert resolve_device_dtype("cpu", "float64") == ("cpu", "float64")
    with pytest.raises(ValueError, match="--device 'gpu0': not a torch device"):
        resolve_device_dtype("gpu0")
    if not cuda:
        with pytest.raises(ValueError, match="--device 'cuda': CUDA is not available"):
            resolve_device_dtype("cuda")
    model, _ = load_policy(str(save_tiny(tmp_path / "tiny")), dtype="float64", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float64}


@pytest.mark.skipif(os.environ.get("LOPD_REAL_MODEL") != "1", reason="slow (GGUF conversion); set LOPD_REAL_MODEL=1")
def test_real_smollm2_conversion_and_chat(tmp_path):
    path = Path(resolve_model("smollm2-135m", cache_dir=tmp_path))
    assert (path / "config.json").is_file() and not list(path.parent.glob(".*tmp-*"))
    model, tok = load_policy(str(path))
    ids, mask = tokenize_for_training(tok, CONVERSATION, TOOLS)
    assert ids.tolist() == tok(render(tok, CONVERSATION, TOOLS, False), add_special_tokens=False)["input_ids"]
    prompt = render_prompt(tok, [Message(role="user", content="What is 2+2?")], [])
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    (gen,) = HFRolloutEngine(model, tok).generate([prompt_ids], SamplingParams(temperature=0, max_new_tokens=16))
    assert "4" in gen.text


# --- chat rendering -------------------------------------------------------------------------


def test_tools_injected_into_system_prompt_when_template_has_no_tools(tok):
    text = render_prompt(tok, CONVERSATION[:4], TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert json.dumps(TOOLS[0]) in system and "<tool_call>" in system
    assert f"<|im_start|>assistant\n{CALL_TEXT}<|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 degrees\n</tool_response><|im_end|>\n" in text
    assert "<|im_start|>tool" not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_system_message_created_for_tools_and_bare_schema_wrapped(tok):
    text = render_prompt(tok, [Message(role="user", content="hi")], [TOOLS[0]["function"]])
    assert text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(TOOLS[0]) in text


def test_raw_action_with_tool_call_text_is_not_duplicated(tok):
    raw = Message(role="assistant", content=CALL_TEXT, tool_calls=CONVERSATION[2].tool_calls)
    text = render_prompt(tok, [*CONVERSATION[:2], raw], TOOLS)
    assert text.count(CALL_TEXT) == 1


def test_consecutive_tool_results_share_one_user_turn(tok):
    msgs = [*CONVERSATION[:3], Message(role="tool", content="a"), Message(role="tool", content="b")]
    text = render_prompt(tok, msgs, TOOLS)
    assert "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>" in text


def test_native_tool_template_gets_tools_and_openai_tool_calls():
    tok = tiny_tokenizer()
    tok.chat_template = (
        "{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    text = render_prompt(tok, CONVERSATION[:4], TOOLS)
    assert text.startswith("TOOLS=") and '"get_weather"' in text.splitlines()[0]
    assert 'CALL get_weather {"city": "Paris"}' in text
    assert "<|im_start|>tool\nsunny, 21 degrees" in text and "<tool_response>" not in text


def test_missing_chat_template_is_a_clear_error(tok):
    bare = tiny_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat_template is missing"):
        render_prompt(bare, CONVERSATION[:2], [])


# --- training tokens and action mask --------------------------------------------------------


def test_segments_concatenate_to_whole_conversation_tokens(tok):
    ids, mask = tokenize_for_training(tok, CONVERSATION, TOOLS)
    whole = tok(render(tok, CONVERSATION, TOOLS, add_generation_prompt=False), add_special_tokens=False)
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
    assert ids.tolist() == whole["input_ids"]


def test_mask_covers_exactly_assistant_tokens(tok):
    ids, mask = tokenize_for_training(tok, CONVERSATION, TOOLS)
    spans = action_spans(mask)
    expected = [CALL_TEXT, "The weather in Paris is sunny.", "The answer is 4."]
    assert len(spans) == len(expected)
    for (start, end), content in zip(spans, expected):
        assert tok.decode(ids[start:end]) == content + "<|im_end|>"
        assert ids[end - 1].item() == tok.eos_token_id
        assert tok.decode(ids[:start]).endswith("<|im_start|>assistant\n")  # scaffolding unmasked
        assert not mask[start - 1] and (end == len(mask) or not mask[end])
    assert mask.sum().item() == sum(e - s for s, e in spans)
    unmasked = tok.decode(ids[~mask])
    assert "What is the weather in Paris?" in unmasked and "sunny, 21 degrees" in unmasked
    assert "The answer is 4." not in unmasked


def test_prompt_tokens_match_training_context(tok):
    """The tokens a rollout is sampled from equal the training context before that action."""
    ids, mask = tokenize_for_training(tok, CONVERSATION, TOOLS)
    start = action_spans(mask)[1][0]
    prompt_ids = tok(render_prompt(tok, CONVERSATION[:4], TOOLS), add_special_tokens=False)["input_ids"]
    assert ids[:start].tolist() == prompt_ids


def test_action_spans_of_mask():
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1], dtype=torch.bool)
    assert action_spans(mask) == [(1, 3), (5, 6), (7, 8)]
    assert action_spans(torch.zeros(4, dtype=torch.bool)) == []
