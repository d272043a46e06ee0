"""--embedder computes the sentence-transformers pipeline a model folder declares (pooling mode,
dense layers, prompts: stages.core.data.st_modules), on a tiny BERT folder written here; the
default MiniLM embedder keeps the vectors it gave before (stores already indexed stay valid)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from stages.core.data.embedders import HFEmbedder, MiniLMEmbedder

TEXTS = ["book a flight to paris", "the weather in paris is sunny", "add two numbers"]
_WORDS = "book a flight to paris the weather in is sunny add two numbers query passage :".split()


def tiny_bert_folder(folder: Path, modules: list[dict] | None, pooling: dict | None = None, seed: int = 0) -> Path:
    """A random 2-layer BertModel (hidden 32) and its word-level tokenizer saved in ``folder``,
    with ``modules.json`` (None: none) and the Pooling config ``pooling`` in ``1_Pooling``."""
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS]) + "\n")
    BertTokenizer(vocab_file=str(vocab)).save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(_WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).eval().save_pretrained(folder)
    if modules is not None:
        (folder / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    return folder


TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}


def token_states(folder: Path, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, d) last hidden states and the (B, T) attention mask of ``texts`` under the folder's model."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    enc = tok(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).last_hidden_state, enc["attention_mask"]


def unit(x: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(x, dim=1).numpy()


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).float()
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


@pytest.mark.parametrize("pooling", [{"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
                                     {"pooling_mode": "cls", "include_prompt": True}])
def test_declared_cls_pooling_gives_the_cls_vectors(tmp_path, pooling):
    folder = tiny_bert_folder(tmp_path / "cls", [TRANSFORMER, POOLING, NORMALIZE], pooling)
    hidden, mask = token_states(folder, TEXTS)
    got = HFEmbedder(folder).embed(TEXTS)
    np.testing.assert_allclose(got, unit(hidden[:, 0]), atol=1e-6)
    assert not np.allclose(got, unit(mean_pool(hidden, mask)), atol=1e-3)


def test_dense_layers_and_the_models_prompts_are_applied(tmp_path):
    from safetensors.torch import save_file

    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    folder = tiny_bert_folder(tmp_path / "dense", [TRANSFORMER, POOLING, dense, NORMALIZE],
                              {"pooling_mode": ["mean", "max"]})
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text(json.dumps(
        {"in_features": 64, "out_features": 8, "bias": True, "activation_function": "torch.nn.modules.activation.Tanh"}))
    torch.manual_seed(1)
    weight, bias = torch.randn(8, 64), torch.randn(8)
    save_file({"linear.weight": weight, "linear.bias": bias}, str(folder / "2_Dense" / "model.safetensors"))
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query : ", "passage": "passage : "}, "default_prompt_name": None}))
    embedder = HFEmbedder(folder)
    assert embedder.dim == 8
    for role, prompt in (("query", "query : "), ("document", "passage : "), ("text", "")):
        hidden, mask = token_states(folder, [prompt + t for t in TEXTS])
        maxed = hidden.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(1).values
        want = torch.tanh(torch.cat([mean_pool(hidden, mask), maxed], 1) @ weight.T + bias)
        np.testing.assert_allclose(embedder.embed(TEXTS, role=role), unit(want), atol=1e-5)


@pytest.mark.parametrize("modules, pooling, match", [
    ([TRANSFORMER, POOLING, {"path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}],
     {"pooling_mode": "mean"}, r"modules.json declares .* \(not sentence_transformers.models.LayerNorm\)"),
    ([TRANSFORMER, POOLING], {"pooling_mode": "cls", "include_prompt": False}, "1_Pooling/config.json: include_prompt"),
    ([TRANSFORMER, POOLING], {"pooling_mode": "median"}, "1_Pooling/config.json: pooling mode"),
])
def test_a_pipeline_it_cannot_compute_is_refused_in_one_line(tmp_path, modules, pooling, match):
    folder = tiny_bert_folder(tmp_path / "bad", modules, pooling)
    with pytest.raises(ValueError, match=match) as err:
        HFEmbedder(folder)
    assert str(err.value).startswith(f"--embedder {folder}") and "\n" not in str(err.value)


def test_a_folder_without_modules_json_is_mean_pooled(tmp_path):
    folder = tiny_bert_folder(tmp_path / "plain", None)
    hidden, mask = token_states(folder, TEXTS)
    np.testing.assert_allclose(HFEmbedder(folder).embed(TEXTS), unit(mean_pool(hidden, mask)), atol=1e-6)


def test_the_default_minilm_gives_the_vectors_it_gave_before():
    """MiniLM declares mean pooling and Normalize: its vectors are the masked mean of the last
    hidden states (max 256 tokens), L2-normalised, as before the pipeline was read."""
    embedder = MiniLMEmbedder(batch_size=2)
    folder = Path(embedder._model.name_or_path)
    hidden, mask = token_states(folder, TEXTS[:2])
    first = unit(mean_pool(hidden, mask))
    hidden, mask = token_states(folder, TEXTS[2:])
    want = np.concatenate([first, unit(mean_pool(hidden, mask))])
    assert embedder.dim == 384 and embedder.max_length == 256
    np.testing.assert_array_equal(embedder.embed(TEXTS), want)
