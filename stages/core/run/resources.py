"""Resource checks made before a training stage starts work (coldstart, distill).

A setting that cannot work (more retrieved experiences than the store holds) or a step that
would not fit in memory is one error line naming the flags to change, instead of minutes of
work ending in an out-of-memory kill with no message.

Memory model of one step's activations (:func:`step_memory_bytes`), in elements of the run
dtype per token, counted from the tensors autograd saves for the backward of a Llama-style
decoder (SmolLM2-135M, float32, CPU; docs/results/memory-estimate.md):

- every layer keeps for its input gradient ``3 * intermediate`` (MLP gate, up, activation),
  ``2 * hidden`` (the inputs of its two RMSNorms), ``2 * q + 2 * kv`` (queries and keys after
  the rotary embedding, values, the attention output; q = heads x head_dim, kv = kv_heads x
  head_dim) and ``heads`` (the attention's log-sum-exp): :func:`layer_saved_elements`;
- the projections a step trains keep their inputs as well (:func:`adapter_input_elements`):
  a LoRA student on q/k/v/o ``hidden`` more, the composer's LoRA on all seven projections
  ``2 * hidden + intermediate``, a fully trained student ``4 * hidden + intermediate``;
- with activation checkpointing a layer keeps only its input (``hidden``), and the backward
  recomputes one layer at a time.

The forwards that keep activations: the student's over ``batch * seq_len`` tokens; for LOPD
(``J > 0``) also the teacher's over ``batch * (seq_len + J * K)`` tokens (frozen weights, but
the gradient reaches the composer's latents through it) and the composer's encoder over
``batch * J * max_exp_tokens`` tokens. Teacher forwards of the other methods run without
gradient and keep nothing past a layer. The losses apply the LM head to one chunk of supervised
positions at a time: ``LOSS_CHUNK_BUFFERS`` float32 (chunk x vocab) buffers. Rows are assumed
``seq_len`` long and their prompts distinct (rows that share a prompt keep it once,
:mod:`stages.core.models.shared_prefix`, so such a step needs less).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil

_GB = 2**30


def rss_mb() -> float:
    """This process's resident set size now, in MiB (what a long run must keep flat)."""
    return psutil.Process().memory_info().rss / 2**20


@functools.cache
def _glibc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def release_free_memory() -> None:
    """Hand the C allocator's free pages back to the OS (glibc ``malloc_trim(0)``; no-op elsewhere).

    Why: PyTorch's CPU tensors come from glibc malloc, which keeps freed blocks in its arenas, and
    the shapes of a training step change with every batch (sequence lengths, experience
    lengths), so freed blocks rarely fit the next step's tensors and the process's resident
    memory grows step after step although the live tensors do not (measured in
    docs/results/memory.md). Called once at the end of every training step; it costs
    milliseconds and changes no value.
    """
    trim = _glibc_malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _glibc_mallopt():
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc: its own allocator policy stays
        return None


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
MMAP_THRESHOLD_BYTES = 1 << 20
# blocks up to this size come from the heap inside transient_blocks: 32 MiB (glibc's largest) let a
# composer's backward (J = 3 x 512 tokens) grow the heap, a cold-start step's peak 2.3 -> 3.2 GB
TRANSIENT_THRESHOLD_BYTES = 4 << 20
TRANSIENT_TRIM_BYTES = 64 << 20  # free heap top kept inside transient_blocks (a smaller one re-faults pages)
_DEFAULT_TRIM_THRESHOLD = 128 << 10  # glibc's trim threshold once the mmap threshold is fixed
_threshold: int | None = None  # the mmap threshold lopd set now (None: glibc's or the environment's policy)


def map_large_blocks(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve every C allocation of at least ``threshold`` bytes from a mapping of its own (glibc
    ``mallopt(M_MMAP_THRESHOLD)``), so a freed activation leaves the resident set at once.

    Why: glibc raises its mmap threshold to up to 32 MiB after the first large free, from then on
    a training step's activations come from the heap arenas, and the arenas keep what the step
    freed while the next micro-batch allocates other shapes: a 2-task GRPO step on BFCL (135M,
    micro-batch 4, 915-token rows) peaked at 7.7 GiB resident, 5.3 GiB with this
    (docs/results/method-memory.md). A fixed threshold also stops glibc's adjustment. Cost: a
    mapping's pages are zeroed when first touched, so code whose blocks die within it (no-grad
    forwards, backward passes) runs under :func:`transient_blocks`. Called at the start of the
    training stages; ``MALLOC_MMAP_THRESHOLD_`` set in the environment wins.

    Returns:
        True when the threshold was set (glibc, no environment override).
    """
    global _threshold
    mallopt = _glibc_mallopt()
    if mallopt is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if not mallopt(_M_MMAP_THRESHOLD, int(threshold)):
        return False
    _threshold = int(threshold)
    return True


@contextlib.contextmanager
def transient_blocks() -> Iterator[None]:
    """Within the block, allocations below 4 MiB come from glibc's heap arenas again, not from
    mappings of their own, and up to 64 MiB of free heap top stay mapped; for code whose large
    blocks die inside it: a no-grad forward (each layer's temporaries, freed before the next
    layer makes the same shapes) and a backward pass (its gradient temporaries). glibc then
    reuses a freed block for the next one, where every fresh mapping has its pages zeroed by
    the kernel at first touch. What outlives the block (activations saved for the backward,
    made outside it) stays a mapping of its own. On exit the threshold
    :func:`map_large_blocks` set and glibc's trim threshold are restored and the heap's free
    pages handed back (``malloc_trim``). Without :func:`map_large_blocks`'s setting (another C
    library, ``MALLOC_MMAP_THRESHOLD_`` in the environment) the block changes nothing;
    ``MALLOC_TRIM_THRESHOLD_`` in the environment keeps its trim threshold.
    """
    global _threshold
    outer = _threshold
    if outer is None or outer >= TRANSIENT_THRESHOLD_BYTES:  # not lopd's setting, or an outer block
        yield
        return
    mallopt, trim = _glibc_mallopt(), "MALLOC_TRIM_THRESHOLD_" not in os.environ
    mallopt(_M_MMAP_THRESHOLD, TRANSIENT_THRESHOLD_BYTES)
    if trim:
        mallopt(_M_TRIM_THRESHOLD, TRANSIENT_TRIM_BYTES)
    _threshold = TRANSIENT_THRESHOLD_BYTES
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, outer)
        if trim:
            mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        _threshold = outer
        release_free_memory()


def status_mb(field: str) -> float:
    """A memory field of ``/proc/self/status`` in MiB: ``VmRSS`` (resident now), ``VmHWM`` (the
    resident high-water mark since the start or the last :func:`reset_peak_rss`). Linux only.

    Raises:
        OSError: no ``/proc`` (not Linux). KeyError: no such field.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # the kernel writes kB
    raise KeyError(field)


def reset_peak_rss() -> None:
    """Set the kernel's resident high-water mark (``VmHWM``) to the resident size now, so that
    ``status_mb("VmHWM")`` afterwards is the peak of what ran since (``/proc/self/clear_refs`` = 5).
    Linux only; benchmarks use it to take one phase's peak.

    Raises:
        OSError: no ``/proc`` (not Linux).
    """
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    """This process's high-water resident set size so far, in MiB (``ru_maxrss``, Linux KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check_experience_count(J: int, available: int, *, store: str, flag: str = "--J") -> None:
    """Refuse a J that the store cannot fill: at most ``available - 1`` other successes exist.

    Args:
        J: experiences to retrieve per target.
        available: successful trajectories in the store usable as experiences (the target
            itself is one of them and is never retrieved).

    Raises:
        ValueError: ``J > available - 1`` (one line naming the store and the flag).
    """
    if J > max(available - 1, 0):
        raise ValueError(f"{flag} {J}: store {store} holds {available} successful train trajectories, so "
                         f"at most {max(available - 1, 0)} other ones can be retrieved per target; "
                         f"lower {flag} or collect more (`lopd collect --split train --store {store}`)")


LOSS_CHUNK_BUFFERS = 6  # float32 (chunk x vocab) buffers of a loss on hidden states: workspace, head gradient


@dataclass(frozen=True)
class StepShape:
    """The sizes that decide a step's activation memory (see the module docstring).

    ``J > 0``: a LOPD step (teacher forward with gradient, composer encoder); ``full_student``:
    every student weight trained (else a LoRA adapter on q/k/v/o); ``dtype_bytes``: bytes per
    activation element (4 float32, 2 bfloat16); ``loss_chunk``: supervised positions per LM-head
    chunk of the losses (``stages.core.losses.DEFAULT_CHUNK_SIZE``).
    """

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    batch: int
    J: int
    K: int
    max_exp_tokens: int
    seq_len: int
    activation_checkpointing: bool
    full_student: bool = False
    dtype_bytes: int = 4
    loss_chunk: int = 256


def shape_of(model_config, **sizes) -> StepShape:
    """A :class:`StepShape` from a Hugging Face model config and the step's sizes."""
    c, heads = model_config, model_config.num_attention_heads
    return StepShape(layers=c.num_hidden_layers, hidden=c.hidden_size,
                     intermediate=getattr(c, "intermediate_size", None) or 4 * c.hidden_size, vocab=c.vocab_size,
                     heads=heads, kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                     head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, **sizes)


def layer_saved_elements(s: StepShape) -> int:
    """Elements per token a decoder layer keeps for its input gradient (module docstring)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return 3 * s.intermediate + 2 * s.hidden + 2 * q + 2 * kv + s.heads


def adapter_input_elements(s: StepShape, trained: str) -> int:
    """Elements per token and layer that the trained projections keep besides
    :func:`layer_saved_elements`: ``trained`` is "frozen" (nothing trained in the layer),
    "attention-lora" (q/k/v/o), "all-lora" (all seven projections) or "full"."""
    return {"frozen": 0, "attention-lora": s.hidden, "all-lora": 2 * s.hidden + s.intermediate,
            "full": 4 * s.hidden + s.intermediate}[trained]


def forward_bytes(s: StepShape, tokens: int, trained: str) -> int:
    """Activations a forward with gradient over ``tokens`` tokens keeps for its backward, in bytes."""
    per_layer = layer_saved_elements(s) + adapter_input_elements(s, trained)
    if s.activation_checkpointing:  # each layer's input, plus the one layer the backward recomputes
        return s.dtype_bytes * tokens * (s.layers * s.hidden + per_layer)
    return s.dtype_bytes * tokens * s.layers * per_layer


def step_memory_bytes(s: StepShape) -> int:
    """Estimated peak activation memory of one step in bytes (module docstring: the model)."""
    student = forward_bytes(s, s.batch * s.seq_len, "full" if s.full_student else "attention-lora")
    lopd = 0
    if s.J > 0:
        lopd = (forward_bytes(s, s.batch * (s.seq_len + s.J * s.K), "frozen")
                + forward_bytes(s, s.batch * s.J * s.max_exp_tokens, "all-lora"))
    loss = LOSS_CHUNK_BUFFERS * 4 * min(s.loss_chunk, s.batch * s.seq_len) * s.vocab
    return student + lopd + loss


def check_step_memory(s: StepShape, *, stage: str, knobs: str, available: int | None = None) -> int:
    """Refuse a step whose estimated memory exceeds 90% of the memory available now.

    Args:
        knobs: the flags that shrink the step, named in the error.
        available: bytes available (default: ``psutil.virtual_memory().available``).

    Returns:
        The estimate in bytes.

    Raises:
        ValueError: the estimate does not fit (one line with both numbers and the knobs).
    """
    need = step_memory_bytes(s)
    free = psutil.virtual_memory().available if available is None else available
    if need > 0.9 * free:
        raise ValueError(
            f"{stage}: one step needs about {need / _GB:.1f} GB (batch {s.batch} x J={s.J} x "
            f"{s.max_exp_tokens} experience tokens and {s.seq_len}-token sequences through {s.layers} layers), "
            f"{free / _GB:.1f} GB are available; lower {knobs}"
            + ("" if s.activation_checkpointing else ", or turn on activation checkpointing"))
    return need
