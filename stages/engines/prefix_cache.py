"""Automatic prefix caching for the HF rollout engine: reuse the KV cache of earlier calls.

A multi-turn rollout re-renders the whole conversation at every step, so step t's prompt starts
with step t-1's prompt and completion; episodes of one bench also share their system prompt and
tool docs (BFCL-v3 multi-turn: ~7,000 tokens). Re-encoding that prefix at every step dominates
CPU rollouts. :class:`PrefixCache` keeps the key/value tensors of recent sequences;
:func:`generate_cached` encodes only the part of each prompt past its longest cached prefix.

A batch mixes rows with different cached lengths. Row i's cache (length c_i) is left-padded to
the longest C, and its uncached tokens (n_i) are left-padded to the longest N, so the sequence
is ``[pad | cached_i | pad | new_i]`` with attention mask 0 on the pads; position ids follow
from the mask (cumulative sum), so every real token keeps the position it had when cached. The
batch decodes into a ``StaticCache`` sized for the call, written in place (a ``DynamicCache``
copies every key at every new token: a third slower at 4 x 7k tokens on a 2-core CPU).

The cached tensors are only valid for the weights that produced them: a caller that updates the
model must :meth:`PrefixCache.clear` (:meth:`stages.engines.hf.HFRolloutEngine.sync_weights`
does).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used, so the CLI can read the default cheaply
    import torch

# default budget of the engines of `collect` and `evaluate`: a batch of 8 BFCL-v3 episodes
# (~8k tokens each); ~3 GB for SmolLM2-135M in fp32, ~10 GB for Qwen3-4B in bf16
PREFIX_CACHE_TOKENS = 65536
# when ``generate`` compiles its decoding forward (``disable_compile`` off, on a GPU), the static
# cache's length is rounded up to a multiple of this, so that calls of near lengths share a shape
COMPILED_CACHE_MULTIPLE = 256


@dataclass(eq=False)  # entries compare by identity (their tensors have no single truth value)
class _Entry:
    ids: torch.Tensor  # (L,) int64: the tokens whose keys/values are stored
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (H, L, D)


class PrefixCache:
    """Least-recently-used store of per-sequence KV caches, bounded by a token budget.

    Args:
        max_tokens: most tokens kept over all entries (memory is ``max_tokens`` x layers x 2 x
            kv heads x head dim x dtype size; SmolLM2-135M in fp32: ~46 KB per token).

    Raises:
        ValueError: ``max_tokens`` < 1.
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"PrefixCache: max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.entries: list[_Entry] = []  # oldest first
        self.hit_tokens = 0  # prompt tokens of generate calls served from the cache
        self.miss_tokens = 0  # prompt tokens that had to be encoded (shared prefixes included)

    def clear(self) -> None:
        """Drop every entry (call after the model's weights change)."""
        self.entries.clear()

    @property
    def tokens(self) -> int:
        """Tokens stored over all entries."""
        return sum(len(e.ids) for e in self.entries)

    def match(self, ids: torch.Tensor) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Longest cached prefix of ``ids`` (1-D int64): its length n and per-layer (H, n, D) views.

        The entry used becomes the most recent. n = 0 (and no layers) when nothing matches.
        """
        best, best_n = None, 0
        for entry in self.entries:
            common = _common_prefix(entry.ids, ids)
            if common > best_n:
                best, best_n = entry, common
        if best is None:
            return 0, []
        self.entries.remove(best)
        self.entries.append(best)
        return best_n, [(k[:, :best_n], v[:, :best_n]) for k, v in best.layers]

    def add(self, ids: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store the KV tensors of sequence ``ids`` (per layer (H, L, D), L = ``len(ids)``).

        The tensors are kept as given (pass copies, not views of a larger cache). Entries that
        are a prefix of ``ids`` are superseded and dropped; the oldest entries are
        evicted until the budget holds (a sequence longer than the budget is not stored).
        """
        import torch

        if len(ids) > self.max_tokens or len(ids) == 0:
            return
        self.entries = [
            e for e in self.entries if not (len(e.ids) <= len(ids) and torch.equal(e.ids, ids[: len(e.ids)]))
        ]
        self.entries.append(_Entry(ids.clone(), layers))
        while self.tokens > self.max_tokens:
            self.entries.pop(0)


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D token tensors."""
    n = min(len(a), len(b))
    return int((a[:n] == b[:n]).to(a.dtype).cumprod(0).sum()) if n else 0


def _encode_prefix(model, ids: torch.Tensor, cache: PrefixCache) -> None:
    """Run one forward over ``ids`` (1-D), reusing and extending ``cache``'s longest match of it."""
    from transformers import DynamicCache

    n, layers = cache.match(ids)
    past = DynamicCache([(k[None], v[None]) for k, v in layers], config=model.config) if n else None
    out = model(input_ids=ids[None, n:].to(model.device), cache=past, use_cache=True)
    cache.miss_tokens += len(ids) - n
    cache.add(ids, [(lay.keys[0], lay.values[0]) for lay in out.cache.layers])


def share_prefixes(model, ids: list[torch.Tensor], cache: PrefixCache, min_tokens: int = 256) -> None:
    """Encode once the prefixes that rows of one batch share beyond what ``cache`` holds.

    The G rollouts of one task share their whole prompt, and episodes of one bench their system
    prompt and tool docs; without this step every row would encode them separately. A candidate
    is the common prefix P of two or more rows (never a row's last token: ``generate`` needs one
    to feed). Rows that start with P hold the same part of it in ``cache`` (c tokens), so
    encoding P once instead of in each of its r rows saves (r - 1) x (|P| - c) positions.
    Repeatedly encodes and stores the candidate that saves most while that is at least
    ``min_tokens`` (one extra forward each, at most ``len(ids) - 1``).

    Args:
        model: the causal LM whose keys/values ``cache`` stores.
        ids: the batch's prompts, 1-D int64 CPU tensors of at least one token each.
        cache: read and extended in place.
        min_tokens: the fewest encoded positions one extra forward must save.
    """
    n = len(ids)
    common = [[0] * n for _ in range(n)]  # prefix shared by rows i and j, their last tokens excluded
    for i in range(n):
        for j in range(i + 1, n):
            common[i][j] = common[j][i] = min(_common_prefix(ids[i], ids[j]), len(ids[i]) - 1, len(ids[j]) - 1)
    candidates = {(size, tuple(k for k in range(n) if k == i or common[i][k] >= size))
                  for i in range(n) for j in range(i + 1, n) if (size := common[i][j]) > 0}
    cached = [cache.match(p[:-1])[0] for p in ids]
    for _ in range(n - 1):
        gain, size, rows = max(((len(rows) - 1) * (size - min(size, cached[rows[0]])), size, rows)
                               for size, rows in candidates) if candidates else (0, 0, ())
        if gain < min_tokens:
            return
        r = rows[0]
        _encode_prefix(model, ids[r][:size], cache)
        # every row sharing part of it now finds that part cached, in ``rows`` or not (two tasks'
        # longer pair shares the system prompt with a shorter pair, whose own candidate must not
        # count it as unencoded)
        for k in range(n):
            cached[k] = max(cached[k], size if k == r else min(size, common[r][k]))


def generate_cached(model, prompt_ids: list[list[int]], config, cache: PrefixCache, pad_id: int,
                    eos_ids: list[int], **generate_kwargs) -> list[list[int]]:
    """Batched ``model.generate`` that encodes only what ``cache`` does not hold; updates ``cache``.

    Args:
        model: a causal LM with (B, H, L, D) key/value caches (``generate`` is given a
            ``StaticCache`` holding the cached prefixes).
        prompt_ids: B prompts as token ids (unpadded, each at least one token).
        config: the ``GenerationConfig`` (``return_dict_in_generate`` is forced on).
        cache: the prefix cache, read for every prompt and given each finished sequence.
        pad_id: token id used for padding positions (masked out).
        eos_ids: ids that end a completion (the stored sequence stops at the first one).
        generate_kwargs: passed through (e.g. ``tokenizer`` for stop strings, ``logits_processor``
            to read each step's raw logits, as the HF engine does for the sampled log-probs).

    Returns:
        B lists of generated token ids (padding after eos included, as ``generate`` returns).

    Raises:
        ValueError: an empty prompt.
    """
    import torch
    from transformers import StaticCache

    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("generate_cached: empty prompt")
    device = model.device
    ids = [torch.tensor(p, dtype=torch.long, device="cpu") for p in prompt_ids]  # host side: the cache's keys
    share_prefixes(model, ids, cache)
    # keep at least the last prompt token uncached: generate needs one token to feed
    hits = [cache.match(p[:-1]) for p in ids]
    C = max(n for n, _ in hits)
    N = max(len(p) - n for p, (n, _) in zip(ids, hits))
    B = len(ids)
    input_ids = torch.full((B, C + N), pad_id, dtype=torch.long, device="cpu")  # sent in one copy below
    mask = torch.zeros((B, C + N), dtype=torch.long, device="cpu")
    for i, (p, (n, _)) in enumerate(zip(ids, hits)):
        new = p[n:]
        input_ids[i, C + N - len(new):] = new
        input_ids[i, C - n: C] = p[:n]
        mask[i, C - n: C] = 1
        mask[i, C + N - len(new):] = 1
        cache.hit_tokens += n
        cache.miss_tokens += len(new)
    # a static cache is written in place: a dynamic one copies all of its keys at every token
    length = C + N + config.max_new_tokens
    if not config.disable_compile:
        length = -(-length // COMPILED_CACHE_MULTIPLE) * COMPILED_CACHE_MULTIPLE
    kv = StaticCache(config=model.config, max_cache_len=length)
    if C > 0:
        some = next(lay for n, lay in hits if n)
        for layer, (ref_k, ref_v) in enumerate(some):
            k_all = ref_k.new_zeros((B, ref_k.shape[0], C, ref_k.shape[2]))
            v_all = ref_v.new_zeros((B, ref_v.shape[0], C, ref_v.shape[2]))
            for i, (n, lay) in enumerate(hits):
                if n:
                    k_all[i, :, C - n:] = lay[layer][0]
                    v_all[i, :, C - n:] = lay[layer][1]
            kv.layers[layer].update(k_all.to(device), v_all.to(device))
    config.return_dict_in_generate = True
    out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device), cache=kv,
                         generation_config=config, **generate_kwargs)
    new_tokens = out.sequences.cpu()[:, C + N:]
    stored = int(kv.get_seq_length())  # C + N + generated - 1: the last token is never fed
    eos = set(eos_ids)
    for i, (p, (n, _)) in enumerate(zip(ids, hits)):
        gen = new_tokens[i].tolist()
        body = next((j for j, t in enumerate(gen) if t in eos), len(gen))
        keep = min(body, stored - (C + N))
        cols = torch.cat([torch.arange(C - n, C, device=device),
                          torch.arange(C + N - (len(p) - n), C + N + keep, device=device)])
        seq = torch.cat([p, new_tokens[i, :keep]])
        cache.add(seq, [(lay.keys[i, :, cols], lay.values[i, :, cols]) for lay in kv.layers])
    return new_tokens.tolist()
