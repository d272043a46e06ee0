"""Tiny in-process model + tokenizer for tests (no download, well under a second to build).

* :func:`tiny_tokenizer`: a byte-level BPE fast tokenizer trained on a small built-in corpus, with
  the ChatML special tokens and chat template of SmolLM2 (``<|im_start|>role\\ncontent<|im_end|>\\n``,
  generation prompt ``<|im_start|>assistant\\n``); eos ``<|im_end|>``, pad ``<|endoftext|>``.
* :func:`tiny_model`: a randomly initialised 2-layer ``LlamaForCausalLM`` (hidden 64, fp32) over
  that vocabulary.
* :func:`save_tiny`: both saved to a folder that ``load_policy(str(folder))`` / ``--model`` load.
"""
from __future__ import annotations

import functools
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "You are a helpful assistant. Answer the question and call tools when needed.",
    "What is 2+2? The answer is 4. What is the weather in Paris today?",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    "<tool_response>sunny, 21 degrees</tool_response> The weather in Paris is sunny.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "system user assistant tool function name arguments description parameters type object",
    "The quick brown fox jumps over the lazy dog. 0123456789 {}[]():;,.!?\"'",
]


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok.to_str()


def tiny_tokenizer():
    """A fresh ``PreTrainedTokenizerFast`` (ChatML template, left padding); cheap after the first call."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def tiny_model(tokenizer, seed: int = 0):
    """A random 2-layer Llama (hidden 64, 4 heads, fp32, eval mode) with ``len(tokenizer)`` vocab.

    ``initializer_range`` is large so that next-token distributions are peaked: greedy decoding
    then does not hinge on 1e-7 numerical differences (e.g. between padded and unpadded batches).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.float().eval()


def save_tiny(folder: Path, seed: int = 0) -> Path:
    """Save a tiny model + tokenizer into ``folder`` (created) and return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer()
    tiny_model(tok, seed=seed).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
