"""`lopd plan`: the estimated memory per rank of a `lopd distill` run, before any model loads.

For a backbone (a row of :data:`KNOWN_SHAPES`, or a Hugging Face ``config.json`` / model
folder), a method, the micro-batch and sequence length, the number of ranks N, the run dtype,
the student (LoRA rank, or 0 = full fine-tuning) and the sharding (``--shard``), it adds up per
rank, in bytes:

- student weights: a LoRA student's frozen backbone in the run dtype plus its adapter (float32);
  a full student unsharded in float32 under a bf16/fp16 run (its master weights,
  :func:`stages.core.models.backbone.master_dtype`: ``4P``), or sharded (``--shard fsdp``, N > 1)
  float32 master weights ``4P / N`` plus the layers gathered at a time in the run dtype (two
  decoder layers and the root's embedding and output head, :mod:`stages.core.run.sharding`);
- gradients and AdamW state (two moments): in the parameters' dtype, sharded like them;
- teacher copies: what the method holds besides the student (LOPD with a full student: a frozen
  backbone copy carrying the composers; GRPO with ``kl_coef > 0``: a frozen reference;
  SDFT/OPSD: a frozen or EMA copy unless ``teacher=current``; SDPO: an EMA copy, or with a
  LoRA student a second adapter; Skill-SD: a copy of the student, or a second adapter, plus
  GRPO's reference with ``kl_coef > 0``); never sharded; frozen ones in the run dtype, EMA
  copies and copies of a full student in the student's float32;
- composer (LOPD): its LoRA psi and compressor (float32 weights, gradients, AdamW) and the
  frozen anchor phi_0;
- activations of one micro-batch (:func:`stages.core.run.resources.step_memory_bytes` in the
  run dtype): one forward with gradient (the student's; the other methods' teachers run without
  gradient) for every method but LOPD, student + teacher + composer encoder for LOPD; the losses'
  LM-head chunks; full float32 logits only where the head is sharded;
- the rollout (HF engine): the KV cache of ``rollout_batch`` sequences and, for a sharded
  student, the full weights gathered in the run dtype while it generates;
- a fixed allowance for the CUDA context and allocator slack (:data:`RUNTIME_BYTES`), or on the
  CPU the process's libraries and the store's embedder (:data:`CPU_RUNTIME_BYTES`).

The peak is the larger of the update phase and the rollout phase. The numbers are estimates
(the activation model counts the tensors a decoder forward saves for its backward, checked
against real CPU distill steps: :mod:`stages.core.run.resources`, docs/results/memory-estimate.md).

A plan that does not fit comes with the settings that would (:func:`fitting`): the changes
below tried in turn, each kept while it lowers the peak, until the peak fits.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from stages.core.losses import DEFAULT_CHUNK_SIZE
from stages.core.registry import did_you_mean
from stages.core.run.resources import StepShape, step_memory_bytes

GB = 1e9  # decimal gigabytes, as GPU sizes are sold (80 GB)
RUNTIME_BYTES = int(2.5 * GB)  # CUDA context, NCCL buffers, allocator fragmentation (an allowance)
# a CPU run's resident memory besides tensors: Python, torch, transformers, lancedb, the store's
# MiniLM embedder (measured after set-up, docs/results/memory-estimate.md)
CPU_RUNTIME_BYTES = int(0.7 * GB)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# decoder shapes (their config.json values): hidden, layers, intermediate, heads, kv_heads, head_dim,
# vocab, tied embeddings, query/key norms
KNOWN_SHAPES: dict[str, dict] = {
    "Qwen/Qwen3-8B": dict(hidden=4096, layers=36, intermediate=12288, heads=32, kv_heads=8, head_dim=128,
                          vocab=151936, tied=False, qk_norm=True),
    "Qwen/Qwen3-4B": dict(hidden=2560, layers=36, intermediate=9728, heads=32, kv_heads=8, head_dim=128,
                          vocab=151936, tied=True, qk_norm=True),
    "Qwen/Qwen3-1.7B": dict(hidden=2048, layers=28, intermediate=6144, heads=16, kv_heads=8, head_dim=128,
                            vocab=151936, tied=True, qk_norm=True),
    "HuggingFaceTB/SmolLM2-135M-Instruct": dict(hidden=576, layers=30, intermediate=1536, heads=9, kv_heads=3,
                                                head_dim=64, vocab=49152, tied=True),
}
ALIASES = {"qwen3-8b": "Qwen/Qwen3-8B", "qwen3-4b": "Qwen/Qwen3-4B", "qwen3-1.7b": "Qwen/Qwen3-1.7B",
           "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
PLAN_METHODS = ("lopd", "grpo", "sdft", "opsd", "sdpo", "skill-sd")


@dataclass(frozen=True)
class Backbone:
    """A decoder's shape (Llama / Qwen style: attention with grouped KV heads, gated MLP)."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = False  # Qwen3: RMSNorm of queries and keys per head

    def layer_params(self) -> int:
        """Parameters of one decoder layer (projections, MLP, norms)."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q_out * 2 + self.hidden * kv_out * 2
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden + 2 * self.head_dim * self.qk_norm

    def root_params(self) -> int:
        """Embedding, output head (unless tied) and final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self) -> int:
        """All parameters."""
        return self.layers * self.layer_params() + self.root_params()

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """Parameters of a LoRA adapter of ``rank`` on ``targets`` of every layer."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"q_proj": (self.hidden, q_out), "k_proj": (self.hidden, kv_out), "v_proj": (self.hidden, kv_out),
                  "o_proj": (q_out, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                  "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


def backbone_of(name: str) -> Backbone:
    """The shape of ``name``: a :data:`KNOWN_SHAPES` name or alias, a ``config.json`` file or a
    folder holding one.

    Raises:
        ValueError: none of these (the closest known name first, the known names listed), or a
            config without the fields.
    """
    key = ALIASES.get(name.lower(), name)
    if key in KNOWN_SHAPES:
        return Backbone(**KNOWN_SHAPES[key])
    path = Path(name)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        hint = did_you_mean(name, KNOWN_SHAPES) if "/" in name else did_you_mean(name.lower(), ALIASES)
        raise ValueError(f"unknown backbone {name!r}: {hint}give a config.json (or its folder) or one of "
                         f"{', '.join(sorted(ALIASES))}")
    c = json.loads(path.read_text())
    try:
        heads = c["num_attention_heads"]
        return Backbone(hidden=c["hidden_size"], layers=c["num_hidden_layers"], intermediate=c["intermediate_size"],
                        heads=heads, kv_heads=c.get("num_key_value_heads") or heads,
                        head_dim=c.get("head_dim") or c["hidden_size"] // heads, vocab=c["vocab_size"],
                        tied=bool(c.get("tie_word_embeddings", False)), qk_norm=c.get("model_type") == "qwen3")
    except KeyError as err:
        raise ValueError(f"{path}: no field {err} (a decoder-only config is needed)") from None


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class PlanInput:
    """The settings a plan depends on (the names of `lopd distill`'s flags; each field's
    description is the help of its `lopd plan` flag)."""

    backbone: str = Field(json_schema_extra={"flag": "--model"}, description=(
        "Backbone: a config.json, its folder, or a known name (qwen3-8b, qwen3-4b, qwen3-1.7b, smollm2-135m)."))
    method: str = Field("lopd", description="lopd, grpo, sdft, opsd, sdpo or skill-sd.")
    nproc: int = Field(1, ge=1, description="Ranks (GPUs) in all: processes per node x nodes.")
    dtype: str = Field("bfloat16", json_schema_extra={"metavar": "[bfloat16|float16|float32]"},
                       description="Run dtype: bfloat16, float16 or float32.")
    shard: str = Field("none", json_schema_extra={"metavar": "[none|fsdp]"}, description="none or fsdp (as lopd distill --shard).")
    student_lora_rank: int = Field(8, description="0 = full fine-tuning.")
    micro_batch: int = Field(4, description="Training sequences per forward/backward.")
    max_len: int = Field(2048, description="Tokens of a training sequence.")
    activation_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    rollout_batch: int = Field(8, description="Episodes generated together (their KV cache).")
    max_new_tokens: int = Field(256, description="Tokens per action.")
    J: int = Field(3, description="lopd: retrieved experiences per row.")
    K: int = Field(32, description="lopd: latent tokens per experience.")
    max_exp_tokens: int = Field(512, description=(
        "lopd: tokens per experience (the paper's 512; lopd coldstart's own default is 256)."))
    composer_lora_rank: int = 8
    composer_blocks: int = Field(1, ge=1, description="lopd: QFormer blocks (1 when shared, the default; else the depth).")
    kl_coef: float = Field(0.0, description="grpo, skill-sd: > 0 keeps a frozen reference copy.")
    teacher: str = Field("frozen", description="sdft/opsd: frozen, ema or current (no copy).")
    gpu_gb: float = Field(80.0, ge=0.0, description="Memory of one GPU in GB.")
    device: str = "cuda"  # "cpu": the runtime is the process's libraries, not a CUDA context


@dataclass
class Plan:
    """Bytes per rank by component, the update and rollout phases, and the verdict."""

    components: dict[str, int] = field(default_factory=dict)
    update: list[str] = field(default_factory=list)  # components held during the update
    rollout: list[str] = field(default_factory=list)  # components held during the rollout
    params: int = 0
    gpu_bytes: int = 0

    def phase(self, names: list[str]) -> int:
        """Bytes of the components ``names``."""
        return sum(self.components[n] for n in names)

    @property
    def peak(self) -> int:
        """The larger phase, in bytes."""
        return max(self.phase(self.update), self.phase(self.rollout))

    @property
    def fits(self) -> bool:
        """Whether the peak fits the GPU size."""
        return self.peak <= self.gpu_bytes


def _student(b: Backbone, p: PlanInput, bytes_: int) -> dict[str, int]:
    """Weights, gradients, optimizer state and gathered working set of the student."""
    P = b.params()
    if p.student_lora_rank > 0:
        lora = b.lora_params(p.student_lora_rank, ("q_proj", "k_proj", "v_proj", "o_proj"))
        return {"student weights": P * bytes_ + 4 * lora, "gradients": 4 * lora, "optimizer (AdamW)": 8 * lora}
    if p.shard == "fsdp" and p.nproc > 1:
        gathered = (2 * b.layer_params() + b.root_params()) * bytes_
        return {"student weights": 4 * P // p.nproc, "gathered layers (update)": gathered,
                "gradients": 4 * P // p.nproc, "optimizer (AdamW)": 8 * P // p.nproc,
                "gathered weights (rollout)": P * bytes_}
    master = max(bytes_, 4)  # a whole student's weights stay float32 under bf16/fp16 (master_dtype)
    return {"student weights": P * master, "gradients": P * master, "optimizer (AdamW)": 2 * P * master}


def _teacher(b: Backbone, p: PlanInput, bytes_: int) -> int:
    """Bytes of the frozen / EMA copies the method holds besides the student."""
    full = p.student_lora_rank == 0
    frozen = {"lopd": int(full), "grpo": int(full and p.kl_coef > 0),
              "sdft": int(full and p.teacher == "frozen"), "opsd": int(full and p.teacher == "frozen"),
              "sdpo": 0, "skill-sd": int(full and p.kl_coef > 0)}[p.method]
    # EMA teachers and copies of a whole student keep its float32 (master_dtype)
    kept = {"sdft": int(full and p.teacher == "ema"), "opsd": int(full and p.teacher == "ema"),
            "sdpo": int(full), "skill-sd": int(full)}.get(p.method, 0)
    adapter = 0  # SDPO's and Skill-SD's teacher adapter beside a LoRA student's (float32)
    if not full and p.method in ("sdpo", "skill-sd"):
        adapter = 4 * b.lora_params(p.student_lora_rank, ("q_proj", "k_proj", "v_proj", "o_proj"))
    return (frozen * bytes_ + kept * max(bytes_, 4)) * b.params() + adapter


def _composer(b: Backbone, p: PlanInput) -> int:
    """LOPD's composer: psi (LoRA on the seven projections) + compressor (per QFormer block
    cross- and self-attention 8 d^2 and an MLP of width 4d 8 d^2; K query latents), float32, trained
    (weights, gradients, AdamW = 16 bytes each), and the frozen anchor (4 bytes each)."""
    if p.method != "lopd":
        return 0
    psi = b.lora_params(p.composer_lora_rank, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"))
    compressor = p.composer_blocks * 16 * b.hidden * b.hidden + p.K * b.hidden
    return 16 * (psi + compressor) + 4 * (psi + compressor)


def _activations(b: Backbone, p: PlanInput, bytes_: int) -> int:
    """One micro-batch's activations (:func:`stages.core.run.resources.step_memory_bytes` in the
    run dtype); a sharded student's LM head is not applied per chunk of supervised positions
    (:func:`stages.core.models.head.output_head`), so its float32 logits, their log-softmax and
    gradient (3 x 4 bytes per vocabulary entry) come on top at every position."""
    lopd = p.method == "lopd"
    shape = StepShape(layers=b.layers, hidden=b.hidden, intermediate=b.intermediate, vocab=b.vocab, heads=b.heads,
                      kv_heads=b.kv_heads, head_dim=b.head_dim, batch=p.micro_batch, J=p.J if lopd else 0,
                      K=p.K if lopd else 0, max_exp_tokens=p.max_exp_tokens if lopd else 0, seq_len=p.max_len,
                      activation_checkpointing=p.activation_checkpointing, full_student=p.student_lora_rank == 0,
                      dtype_bytes=bytes_, loss_chunk=DEFAULT_CHUNK_SIZE)
    full_logits = 3 * 4 * b.vocab * p.micro_batch * p.max_len if p.shard == "fsdp" and p.nproc > 1 else 0
    return step_memory_bytes(shape) + full_logits


def plan(p: PlanInput) -> Plan:
    """The per-rank memory plan of ``p`` (module docstring).

    Raises:
        ValueError: unknown backbone, method outside :data:`PLAN_METHODS`, unknown dtype,
            ``--shard fsdp`` with a LoRA student.
    """
    if p.method not in PLAN_METHODS:
        raise ValueError(f"lopd plan knows --method {', '.join(PLAN_METHODS)}, got {p.method!r}")
    if p.dtype not in DTYPE_BYTES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {p.dtype!r}")
    if p.shard == "fsdp" and p.student_lora_rank != 0:
        raise ValueError("--shard fsdp shards a fully fine-tuned student: add --student-lora-rank 0")
    b, bytes_ = backbone_of(p.backbone), DTYPE_BYTES[p.dtype]
    out = Plan(params=b.params(), gpu_bytes=int(p.gpu_gb * GB))
    out.components.update(_student(b, p, bytes_))
    out.components["teacher copies"] = _teacher(b, p, bytes_)
    out.components["composer + anchor"] = _composer(b, p)
    out.components["activations (one micro-batch)"] = _activations(b, p, bytes_)
    kv = 2 * b.layers * b.kv_heads * b.head_dim * bytes_
    out.components["KV cache (rollout)"] = p.rollout_batch * (p.max_len + p.max_new_tokens) * kv
    out.components["runtime allowance"] = CPU_RUNTIME_BYTES if p.device == "cpu" else RUNTIME_BYTES
    held = [n for n in out.components if "(rollout)" not in n and "(update)" not in n
            and "activations" not in n]
    out.update = held + [n for n in out.components if "(update)" in n or "activations" in n]
    out.rollout = held + [n for n in out.components if "(rollout)" in n]
    return out


def render(p: PlanInput, result: Plan, width: int = 100) -> str:
    """The plan as text: one line per component (GB per rank), both phases and the verdict; a
    line longer than ``width`` characters is broken at spaces (continued indented), never in a word."""
    sharding = f"FSDP2 over {p.nproc} ranks" if p.shard == "fsdp" and p.nproc > 1 else "not sharded"
    student = "full fine-tuning" if p.student_lora_rank == 0 else f"LoRA rank {p.student_lora_rank}"
    lines = [f"plan: {p.backbone} ({result.params / 1e9:.2f}B parameters), --method {p.method}, {student}, "
             f"{p.dtype}, {sharding}; micro-batch {p.micro_batch} x {p.max_len} tokens"
             f"{', activation checkpointing' if p.activation_checkpointing else ''}",
             "per rank:"]
    lines += [f"  {name:<32}{value / GB:8.1f} GB" for name, value in result.components.items() if value]
    update, rollout = result.phase(result.update), result.phase(result.rollout)
    lines.append(f"  {'update phase':<32}{update / GB:8.1f} GB")
    lines.append(f"  {'rollout phase':<32}{rollout / GB:8.1f} GB")
    verdict = "fits" if result.fits else "does NOT fit"
    lines.append(f"peak {result.peak / GB:.1f} GB per rank: {verdict} on {p.gpu_gb:g} GB GPUs "
                 f"({(result.gpu_bytes - result.peak) / GB:+.1f} GB headroom)")
    if not result.fits:
        lines.append(render_fit(fitting(p), p.gpu_gb))
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False,
                                   drop_whitespace=True) if len(line) > width else line for line in lines)


# The changes :func:`fitting` tries, in this order: (field, the next value after the current
# one, None when there is none). Cheapest for the result first: checkpointing and smaller
# micro-batches only cost time; sharding needs ranks; a LoRA student and shorter sequences
# change what is trained.
def _halve(floor: int):
    return lambda v: v // 2 if v // 2 >= floor else None


_CHANGES = (
    ("activation_checkpointing", lambda v: None if v else True),
    ("micro_batch", _halve(1)),
    ("shard", lambda v: None if v == "fsdp" else "fsdp"),
    ("rollout_batch", _halve(1)),
    ("dtype", lambda v: "bfloat16" if v == "float32" else None),
    ("student_lora_rank", lambda v: 8 if v == 0 else None),
    ("max_len", _halve(512)),
)


@dataclass(frozen=True)
class Fit:
    """What :func:`fitting` found: the settings changed (field -> value), the peak after each
    change kept (``trail``: (field, value, peak bytes)), and whether the last one fits."""

    changes: dict[str, object]
    trail: list[tuple[str, object, int]]
    fits: bool


def flag(name: str, value: object) -> str:
    """A plan setting as `lopd distill`'s flag: ``--micro-batch 1``, ``--activation-checkpointing``."""
    spelled = "--" + name.replace("_", "-")
    return spelled if value is True else f"{spelled} {value}"


def fitting(p: PlanInput) -> Fit:
    """The settings that bring ``p``'s peak under ``p.gpu_gb`` (module docstring); a sharded
    student only where ``p.nproc > 1`` and the student is fully fine-tuned.

    Raises:
        ValueError: see :func:`plan`.
    """
    current, peak = p, plan(p).peak
    changes: dict[str, object] = {}
    trail: list[tuple[str, object, int]] = []
    for name, step in _CHANGES:
        if name == "shard" and (current.nproc < 2 or current.student_lora_rank != 0):
            continue
        while peak > current.gpu_gb * GB and (value := step(getattr(current, name))) is not None:
            candidate = replace(current, **{name: value})
            candidate_peak = plan(candidate).peak
            if candidate_peak >= peak:
                break
            current, peak, changes[name] = candidate, candidate_peak, value
            trail.append((name, value, peak))
    return Fit(changes, trail, peak <= current.gpu_gb * GB)


def render_fit(fit: Fit, gpu_gb: float) -> str:
    """One line: ``"fits 24 GB with --activation-checkpointing --micro-batch 1 (peak after
    --activation-checkpointing: 51.5 GB, --micro-batch 2: 32.5 GB, --micro-batch 1: 22.7 GB)"``,
    or how close the changes come."""
    if not fit.trail:
        return f"no setting lopd plan varies lowers the peak: a GPU larger than {gpu_gb:g} GB or more ranks"
    flags = " ".join(flag(name, value) for name, value in fit.changes.items())
    peaks = ", ".join(f"{flag(name, value)}: {peak / GB:.1f} GB" for name, value, peak in fit.trail)
    verdict = "fits" if fit.fits else "still does NOT fit"
    tail = "" if fit.fits else "; a larger GPU or more ranks"
    return f"{verdict} {gpu_gb:g} GB with {flags} (peak after {peaks}){tail}"


# A run without --max-len trains on whole episodes: up to max_turns actions of max_new_tokens
# each after the task prompt (observations come on top), capped by the model's context.
PROMPT_TOKENS = 512


def run_plan_input(config: Any, *, nproc: int, dtype: str, available_bytes: int,
                   device: str = "cuda") -> PlanInput | None:
    """The :class:`PlanInput` of a `lopd distill` run's settings (``config``: a DistillConfig, its
    method's options resolved), to be compared with ``available_bytes``; None
    when the plan cannot tell (a method outside :data:`PLAN_METHODS`, a backbone it cannot read).
    Without ``max_len`` the sequence is ``PROMPT_TOKENS + max_turns * max_new_tokens`` tokens,
    at most the model's ``max_position_embeddings``."""
    if config.method not in PLAN_METHODS or dtype not in DTYPE_BYTES:
        return None
    try:
        backbone_of(config.model)
    except (ValueError, OSError):
        return None
    max_len = config.max_len or min(PROMPT_TOKENS + config.max_turns * config.max_new_tokens,
                                    _context_length(config.model))
    options = config.options.model_dump()
    lopd = {k: options[k] for k in ("J", "K", "max_exp_tokens") if options.get(k) is not None}
    extra = {k: options[k] for k in ("kl_coef", "teacher") if k in options}
    return PlanInput(backbone=config.model, method=config.method, nproc=nproc, dtype=dtype, shard=config.shard,
                     student_lora_rank=config.student_lora_rank, micro_batch=config.micro_batch, max_len=max_len,
                     activation_checkpointing=config.activation_checkpointing, rollout_batch=config.rollout_batch,
                     max_new_tokens=config.max_new_tokens, gpu_gb=available_bytes / GB,
                     device="cpu" if device == "cpu" else "cuda", **lopd, **extra)


def _context_length(model: str) -> int:
    """``max_position_embeddings`` of ``model``'s config.json (a folder or file), else 32768."""
    path = Path(model) / "config.json" if Path(model).is_dir() else Path(model)
    try:
        return int(json.loads(path.read_text()).get("max_position_embeddings") or 32768)
    except (OSError, ValueError, AttributeError):
        return 32768


def check_run_memory(p: PlanInput, *, stage: str = "distill", where: str = "free memory", assumed: str = "") -> Plan:
    """Refuse a run whose planned peak exceeds ``p.gpu_gb`` (the memory free now, per rank),
    naming the flags that would fit (:func:`fitting`). Returns the plan.

    Args:
        where: what ``p.gpu_gb`` is, for the message.
        assumed: how the sequence length was chosen, for the message (``"no --max-len: ..."``).

    Raises:
        ValueError: ``"distill: a step needs about 155.4 GB (lopd plan's estimate: micro-batch 4
            x 8192 tokens, ...), 21.0 GB free memory: fits 21 GB with --activation-checkpointing
            --micro-batch 1 (...)"``.
    """
    result = plan(p)
    if result.fits:
        return result
    raise ValueError(f"{stage}: a step needs about {result.peak / GB:.1f} GB (lopd plan's estimate for "
                     f"micro-batch {p.micro_batch} x {p.max_len} tokens{assumed}, {p.dtype}; `lopd plan --model "
                     f"{p.backbone} --method {p.method} ...` shows the parts), {p.gpu_gb:.1f} GB {where}: "
                     + render_fit(fitting(p), round(p.gpu_gb, 1)))


def check_distill_memory(config: Any, world_size: int = 1) -> Plan | None:
    """Before a `lopd distill` run loads a model: its planned peak per rank (:func:`run_plan_input`)
    against the memory free now (a CUDA device's free memory; on the CPU the machine's available
    memory shared by the ``world_size`` processes), refused with the flags that would fit
    (:func:`check_run_memory`). ``LOPD_MEMORY_CHECK=0`` skips it (the estimate assumes every row
    as long as ``max_len``). Returns the plan, None when skipped or when the plan cannot tell.

    Raises:
        ValueError: the planned peak exceeds the free memory (one line with the flags that fit).
    """
    import os

    import psutil

    from stages.core.models.backbone import resolve_device_dtype

    if os.environ.get("LOPD_MEMORY_CHECK", "1") == "0":
        return None
    device, dtype = resolve_device_dtype(config.device, config.dtype)
    if device.startswith("cuda"):
        import torch

        free, where = torch.cuda.mem_get_info(torch.device(device))[0], f"free on {device}"
    else:
        free, where = psutil.virtual_memory().available // world_size, "of memory available" + (
            f" per process ({world_size} on this machine)" if world_size > 1 else "")
    p = run_plan_input(config, nproc=world_size, dtype=dtype, available_bytes=free, device=device)
    if p is None:
        return None
    assumed = "" if config.max_len else (f" (no --max-len: whole episodes of {config.max_turns} turns x "
                                         f"{config.max_new_tokens} tokens assumed)")
    return check_run_memory(p, where=where, assumed=assumed)
