"""Seconds per distill step at a real backbone shape: random weights, no download, no store.

Builds a randomly initialised model of the shape of Qwen3-4B, Qwen3-8B or SmolLM2-135M from its
config numbers and a word-level tokenizer over its vocabulary (each id is a word ``w<hex id>``:
random words are random token ids), then runs warm-up + timed steps of one method through the
project's own code: rollouts with ``stages.engines.rollout.play`` on the ``hf`` engine (one-turn
episodes, reward = parity of the answer's word count; the engine's prefix cache as distill sets it), ``training_rows``, the method's
``prepare`` / ``loss`` / ``after_step`` (composer, teacher, losses), AdamW and the engine's
weight sync. The update loop mirrors ``Trainer.update`` (``stages.distill`` is not imported: it
opens a lancedb store); LOPD's experiences and OPSD/SDFT's verified references come from an
in-memory stand-in (one reference per task, J experiences of other tasks).

Defaults are the paper's settings (J=3, K=32, M=20, QFormer depth 8, LoRA rank 8, prompt 2k
tokens, response 1k, batch 32, top-k 20); shrink them for a smoke run, e.g. on a CPU::

    PYTHONPATH=. python benchmarks/bench_step.py --shape smollm2-135m --method lopd \\
        --prompt-len 256 --response-len 64 --batch 2 --warmup 1 --steps 2

A prompt is a system message of ``--prompt-len - --task-len`` words shared by every task (an
environment's tool docs) and a user message of ``--task-len`` words (the task text, also the
start of each composer input); ``--group-size`` rollouts of each task share the whole prompt.

Printed: seconds per step and per phase, tokens/s per phase, peak memory (RSS on the CPU,
``torch.cuda.max_memory_allocated`` on CUDA) and the FLOP-bound time: the step's matmul FLOPs,
counted exactly where they run (``benchmarks/step_meter.py``: a frozen weight's backward costs
its input gradient only), divided by the rate of a square matmul in the same dtype, measured
first. Every time is also taken as the
process's CPU time (``time.process_time``): with one thread (``OMP_NUM_THREADS=1``) on a shared
machine, CPU seconds and the CPU-time matmul rate do not grow with the other processes' load.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import random
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch import nn

from benchmarks.step_meter import Meter, matmul_rate, now, since, sync
from schemas import Message, Task, Trajectory, Turn
from stages.core.data.rows import training_rows
from stages.envs.base import StepResult
import stages.core.losses.head
import stages.core.losses.kd
import stages.core.losses.sdpo
import stages.core.models.assembly
import stages.core.models.backbone
import stages.core.models.head
from stages.core.models.backbone import resolve_device_dtype
from stages.core.models.composer import Composer, base_model, enable_activation_checkpointing, save_composer
from stages.engines import SamplingParams, make_engine
from stages.engines.prefix_cache import PREFIX_CACHE_TOKENS
from stages.engines.rollout import RolloutStats, play
from stages.methods import Method, StepBatch, StepContext, get_method

# config.json numbers of the public checkpoints (hidden size, layers, heads, kv heads, MLP width, vocab)
SHAPES = {
    "qwen3-4b": ("qwen3", dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                               head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True,
                               max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6)),
    "qwen3-8b": ("qwen3", dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                               head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
                               max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6)),
    "smollm2-135m": ("llama", dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                   head_dim=64, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                                   max_position_embeddings=8192, rope_theta=1e5, rms_norm_eps=1e-5)),
}
METHODS = ("lopd", "grpo", "opsd", "sdft", "sdpo")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")  # ids 0-3; the words follow
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@dataclass
class BenchConfig:
    """The settings of :class:`stages.distill.settings.DistillConfig` that the methods and this loop read."""

    model: str
    device: str
    dtype: str
    micro_batch: int
    max_new_tokens: int
    lr: float = 1e-5
    student_lora_rank: int = 8
    activation_checkpointing: bool = True
    max_len: int | None = None
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 20
    grad_clip: float = 1.0
    options: object = None  # the method's Options, resolved (set once the method is known)


# ------------------------------------------------------------------------ model, tokenizer --


def random_model(shape: str, layers: int | None, dtype: str, device: str, seed: int = 0) -> nn.Module:
    """A randomly initialised causal LM of ``shape`` (``layers`` overrides the depth), built on
    ``device`` in ``dtype`` (the same weights for the same seed, in eval mode)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    kind, numbers = SHAPES[shape]
    numbers = {**numbers, **({"num_hidden_layers": layers} if layers else {})}
    config = (Qwen3Config if kind == "qwen3" else LlamaConfig)(
        **numbers, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 2
    return model.eval()


def word_tokenizer(vocab_size: int):
    """A ChatML tokenizer whose ids 4.. are the words ``w<hex id>`` (pad 0, eos ``<|im_end|>`` 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)} | {f"w{i:x}": i for i in range(len(SPECIALS), vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token="[UNK]", additional_special_tokens=["<|im_start|>"], padding_side="left")
    tok.chat_template = CHATML
    return tok


def words(rng: random.Random, n: int, vocab_size: int) -> str:
    """``n`` random words, i.e. ``n`` random token ids."""
    return " ".join(f"w{rng.randrange(len(SPECIALS), vocab_size):x}" for _ in range(n))


# ---------------------------------------------------------------- environment, memory --


class OneTurnEnv:
    """One action per episode; reward 1 when the answer has an even number of words. The
    opening is ``system`` (when not empty) and the task text as the user message."""

    max_turns = 1

    def __init__(self, system: str = ""):
        self.system = system

    def reset(self, task: Task) -> list[Message]:
        return [Message(role="system", content=self.system)] * bool(self.system) + [
            Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        reward = float(len(action.split()) % 2 == 0)
        return StepResult(observation=[], reward=reward, done=True, info={"success": reward == 1.0})

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Hit:
    trajectory: Trajectory


class InMemoryMemory:
    """Stand-in for the experience store (``query``: OPSD/SDFT's verified references) and its
    retriever (``retrieve``: LOPD's experiences) over trajectories held in a list."""

    def __init__(self, trajectories: list[Trajectory]):
        self.trajectories = trajectories

    def query(self, *, split=None, success=None, task_ids=None, env=None, **_) -> list[Trajectory]:
        return [t for t in self.trajectories if (split is None or t.split == split) and
                (success is None or t.success == success) and (task_ids is None or t.task_id in task_ids)
                and (env is None or t.env == env)]

    def retrieve(self, text: str, k: int, *, success_only: bool = False, env=None, split=None,
                 exclude_ids=(), exclude_task_ids=(), **_) -> list[_Hit]:
        found = [t for t in self.query(split=split, success=True if success_only else None, env=env)
                 if t.trajectory_id not in exclude_ids and t.task_id not in exclude_task_ids]
        return [_Hit(t) for t in found[:k]]


def _solved(rng: random.Random, task_id: str, prompt: str, turns: int, length: int, vocab: int) -> Trajectory:
    actions = [words(rng, length, vocab) for _ in range(turns)]
    messages = [Message(role="user", content=prompt)] + [Message(role="assistant", content=a) for a in actions]
    return Trajectory(trajectory_id=f"ref-{task_id}", task_id=task_id, env="bench", split="train", prompt=prompt,
                      policy="reference", messages=messages, turns=[Turn(action=a) for a in actions], reward=1.0,
                      success=True, num_steps=turns, num_tool_calls=0, run_id="bench")


# --------------------------------------------------------------------------- measuring --


# ------------------------------------------------------------------------------- set-up --


@dataclass
class Bench:
    """Everything one timed step needs (built by :func:`build`)."""

    args: argparse.Namespace
    config: BenchConfig
    tokenizer: object
    method: object
    optimizer: torch.optim.Optimizer
    groups: list[nn.Parameter]
    engine: object
    system: str
    tasks: list[Task]
    memory: InMemoryMemory
    meter: Meter
    patches: contextlib.ExitStack


def build(args: argparse.Namespace, scratch: Path) -> Bench:
    """Model, method, optimizer, engine, tasks and memory of the benchmark (nothing timed)."""
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    name = f"random/{args.shape}"  # what the composer records as its backbone
    vocab = SHAPES[args.shape][1]["vocab_size"]
    config = BenchConfig(model=name, device=device, dtype=dtype, micro_batch=args.micro_batch,
                         max_new_tokens=args.response_len, student_lora_rank=args.lora_rank,
                         activation_checkpointing=args.activation_checkpointing)
    tokenizer = word_tokenizer(vocab)
    spare: list[nn.Module] = []  # a backbone built already (for the composer), used by the first load

    def load(model_name: str, dtype: str | None = None, device: str | None = None):
        """The project's loaders (``load_student``, ``load_models``) get a random model: the same
        initial weights at every load, as from a checkpoint."""
        model = spare.pop() if spare else random_model(args.shape, args.layers, dtype or config.dtype,
                                                       device or config.device)
        return model, tokenizer

    method_cls = get_method(args.method)
    options = {}
    if args.method == "lopd":  # a fresh composer saved as the cold-start phi_0 (LOPD reads one)
        backbone = random_model(args.shape, args.layers, dtype, device)
        composer = Composer(backbone, J=args.J, K=args.K, depth=args.depth, lora_rank=8, lora_alpha=16,
                            max_exp_tokens=args.exp_tokens)
        save_composer(composer, scratch / "composer0", {"backbone_id": name})
        spare.append(composer.backbone.unload())  # the plain model again, for load_models
        options = {"composer": str(scratch / "composer0"), "J": args.J, "K": args.K, "M": args.M}
    config.options = method_cls.Options(**options).resolve()
    with mock.patch.object(stages.core.models.assembly, "load_policy", load), \
            mock.patch.object(stages.core.models.backbone, "load_policy", load), \
            mock.patch.object(stages.core.models.assembly, "resolve_model", lambda name: name):  # no such model on disk
        method = method_cls(config, None, {})
    student = method.student
    if config.activation_checkpointing:  # as Distiller does; a composer method did it on its backbone
        if student.adapter is None:
            base_model(student.model).gradient_checkpointing_enable()
        elif not method.needs_composer:
            enable_activation_checkpointing(student.model)
    extra = method.param_groups()
    groups = list(student.params) + [p for params, _ in extra.values() for p in params]
    optimizer = torch.optim.AdamW([{"params": student.params, "lr": config.lr},
                                   *({"params": params, "lr": lr} for params, lr in extra.values())], weight_decay=0.0)
    engine = make_engine("hf", student.model, tokenizer, adapter=student.adapter, batch_size=args.batch,
                         prefix_cache_tokens=args.prefix_cache_tokens)

    rng = random.Random(0)
    group, task_len = min(args.group_size, args.batch), min(args.task_len or args.prompt_len, args.prompt_len)
    system = words(rng, args.prompt_len - task_len, vocab)
    tasks = [Task(task_id=f"task-{i}", env="bench", split="train", prompt=words(rng, task_len, vocab))
             for i in range(max(1, args.batch // group))]
    pool = [_solved(rng, t.task_id, t.prompt, 1, args.response_len, vocab) for t in tasks]  # OPSD/SDFT's references
    pool += [_solved(rng, f"other-{j}", words(rng, 64, vocab), 3, 300, vocab) for j in range(args.J)]  # LOPD's m_j

    meter = Meter(device)
    for module in [student.model, *(m for m in vars(method).values() if isinstance(m, nn.Module)),
                   getattr(getattr(method, "teacher", None), "model", None)]:
        if isinstance(module, nn.Module) and hasattr(base_model(module), "get_decoder"):
            meter.watch(module)
    patches = contextlib.ExitStack()
    for cls in type(method).__mro__:  # the forwards the method calls, timed (device-synchronised)
        module = __import__(cls.__module__, fromlist=["_"])
        for fn, label in (("student_logits", "student"), ("teacher_logits", "teacher"),
                          ("latent_teacher_logits", "teacher"), ("context_teacher_logits", "teacher")):
            if hasattr(module, fn):
                patches.enter_context(mock.patch.object(module, fn, meter.timed(label, getattr(module, fn))))
    patches.enter_context(mock.patch.object(Method, "head_at_supervised", args.head_at_supervised))
    if not args.shared_prefix:
        patches.enter_context(mock.patch.object(stages.core.models.head, "prefix_groups", lambda ids, lengths: []))
    for losses in (stages.core.losses.head, stages.core.losses.kd, stages.core.losses.sdpo):
        patches.enter_context(mock.patch.object(losses, "linear", meter.head_linear(losses.linear)))
    for losses, fn in ((stages.core.losses.kd, "_forward_kl_rows"), (stages.core.losses.head, "_topm_tail_rows")):
        patches.enter_context(mock.patch.object(losses, fn, meter.closed_form_head(getattr(losses, fn))))
    for composer in (getattr(method, "composer", None), getattr(method, "anchor", None)):
        if composer is not None:
            composer.forward = meter.timed("composer", composer.forward)
            meter.watch_compressor(composer.compressor)
    return Bench(args, config, tokenizer, method, optimizer, groups, engine, system, tasks, InMemoryMemory(pool),
                 meter, patches)


# --------------------------------------------------------------------------------- step --


def step(bench: Bench, index: int) -> dict:
    """One distill step; returns its seconds per phase (wall; CPU under ``"cpu"``) and token counts."""
    b, c, meter = bench, bench.config, bench.meter
    method, student = b.method, b.method.student
    meter.reset()
    sync(c.device)
    t_start = now()
    stats = RolloutStats()
    params = SamplingParams(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                            max_new_tokens=c.max_new_tokens, seed=index)
    student.model.eval()
    cache = getattr(b.engine, "prefix_cache", None)
    hits, misses = (cache.hit_tokens, cache.miss_tokens) if cache else (0, 0)
    env = functools.partial(OneTurnEnv, b.system)
    trajectories = list(play(b.engine, b.tokenizer, env, b.tasks, params=params, stats=stats,
                             samples_per_task=min(b.args.group_size, b.args.batch), policy_id=c.model,
                             run_id="bench", max_concurrent=b.args.batch))
    sync(c.device)
    rollout_s, rollout_cpu = since(t_start)
    t0 = now()
    rows, _ = training_rows(b.tokenizer, [t for t in trajectories if t.turns], max_len=c.max_len)
    batch = StepBatch(rows, trajectories)
    batch.extras = method.prepare(batch, StepContext(b.memory, b.memory, b.engine, index))
    if hasattr(b.engine, "sleep"):  # as Distiller.train_step: the engine's caches go before the update
        b.engine.sleep()
    prepare_s, prepare_cpu = since(t0)
    student.model.train()
    method.train_mode()
    loss_fn, backward = meter.timed("forward", method.loss), meter.timed("backward", torch.Tensor.backward)
    sums: dict[str, float] = {"loss": 0.0}
    for _ in range(method.update_epochs):  # as Trainer.update: exact accumulation over micro-batches
        b.optimizer.zero_grad(set_to_none=True)
        if b.args.shared_latents:  # as Trainer.update: LOPD encodes each distinct composer input once
            meter.timed("forward", method.begin_update)(rows, batch.extras)
        for lo in range(0, len(rows), c.micro_batch):
            part = rows[lo:lo + c.micro_batch]
            loss, metrics = loss_fn(part, batch.extras[lo:lo + c.micro_batch], len(part) / len(rows))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at step {index}")
            for p in b.groups:  # adapter switching flips requires_grad; autograd reads it at backward
                p.requires_grad_(True)
            backward(loss)
            sums["loss"] += float(loss.detach())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v / method.update_epochs
        if b.args.shared_latents:
            for p in b.groups:
                p.requires_grad_(True)
            with meter.recomputing():  # several chunks: the composer's forward runs again, with its graph
                meter.timed("backward", method.end_update)()
        meter.timed("optimizer", _clip_and_step)(b.groups, b.optimizer, c.grad_clip)  # as Trainer.update
    t0 = now()
    method.after_step(sums)
    b.engine.sync_weights(student.model, student.adapter)
    sync(c.device)
    (sync_s, sync_cpu), (seconds, cpu) = since(t0), since(t_start)
    prompt = sum(len(t.turns[0].context_ids) for t in trajectories if t.turns)
    return {"seconds": seconds, "rollout_s": rollout_s, "prepare_s": prepare_s, "sync_s": sync_s,
            **{f"{k}_s": v for k, v in meter.seconds.items()}, "generated": stats.generated_tokens,
            "prompt": prompt, "encoded": (cache.miss_tokens - misses) if cache else prompt,
            "cached": (cache.hit_tokens - hits) if cache else 0, "generations": len(trajectories),
            "trained": sum(len(r.ids_T) for r in rows), "rows": len(rows), "flops": meter.flops(),
            "tokens": dict(meter.tokens), "cpu": {"seconds": cpu, "rollout_s": rollout_cpu, "prepare_s": prepare_cpu,
                                                  "sync_s": sync_cpu, **{f"{k}_s": v for k, v in meter.cpu.items()}}}


def _clip_and_step(params: list[nn.Parameter], optimizer: torch.optim.Optimizer, grad_clip: float) -> None:
    torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()


# --------------------------------------------------------------------------------- main --


def report(bench: Bench, timed: list[dict], rate: tuple[float, float]) -> None:
    """The mean of the timed steps: seconds (wall and CPU), tokens/s per phase, FLOP-bound time,
    peak memory. ``rate``: the matmul FLOP per wall and per CPU second (:func:`matmul_rate`)."""
    def _rate(tokens: float, seconds: float) -> str:
        return f"{tokens / seconds:,.0f}" if seconds > 0 else "-"
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in timed[0] if k not in ("tokens", "cpu")}
    cpu = {k: sum(r["cpu"].get(k, 0.0) for r in timed) / len(timed) for k in timed[0]["cpu"]}
    tokens = {k: sum(r["tokens"][k] for r in timed) / len(timed) for k in timed[0]["tokens"]}
    phases = ("rollout_s", "prepare_s", "forward_s", "backward_s", "optimizer_s", "sync_s")
    for clock, values in (("wall", mean), ("CPU", cpu)):
        print(f"mean of {len(timed)} timed step(s), {clock}: {values['seconds']:.2f} s/step = "
              + " + ".join(f"{k[:-2]} {values.get(k, 0.0):.2f}" for k in phases)
              + " (forward: " + ", ".join(f"{k[:-2]} {values[k]:.2f}" for k in ("student_s", "teacher_s", "composer_s")
                                         if k in values) + ")")
    print(f"tokens per step: {mean['rows']:.0f} rows, {mean['prompt']:,.0f} prompt ({mean['encoded']:,.0f} encoded, "
          f"{mean['cached']:,.0f} from the prefix cache) + {mean['generated']:,.0f} generated in the rollout, "
          f"{mean['trained']:,.0f} in the training rows")
    print(f"rollout: {mean['rollout_s'] / mean['generations']:.2f} s ({cpu['rollout_s'] / mean['generations']:.2f} "
          f"CPU s) per generation, {mean['generations']:.0f} generations of <= {bench.config.max_new_tokens} tokens")
    print(f"tokens/s: rollout {_rate(mean['generated'], mean['rollout_s'])} generated "
          f"({_rate(mean['generated'] + mean['prompt'], mean['rollout_s'])} with the prompt), "
          f"forward {_rate(mean['trained'], mean.get('forward_s', 0.0))}, "
          f"backward {_rate(mean['trained'], mean.get('backward_s', 0.0))}, "
          f"whole step {_rate(mean['trained'], mean['seconds'])} (training-row tokens)")
    p = bench.meter.params
    print(f"forward positions computed per step (padding included): backpropagated {tokens[('body', True)]:,.0f} "
          f"(LM head {tokens[('head', True)]:,.0f}), forward-only {tokens[('body', False)]:,.0f} "
          f"(LM head {tokens[('head', False)]:,.0f})")
    print(f"FLOPs per step: {mean['flops'] / 1e12:.3f} TFLOP, every matmul counted where it runs (P_layers "
          f"{p['body'] / 1e6:.1f}M, P_head {p['head'] / 1e6:.1f}M): 2 x its weights per position forward; a backward "
          "adds the input's gradient where the input needs one and the weight's where the weight is trained (x2 "
          "for a frozen weight, x3 for a trained one); attention products over the causal pairs; the QFormer "
          "(elementwise work, the optimizer and checkpointing's recomputes not counted)")
    bound, bound_cpu = mean["flops"] / rate[0], mean["flops"] / rate[1]
    print(f"FLOP-bound time: {bound:.2f} s/step at the measured matmul rate; measured / bound = "
          f"{mean['seconds'] / bound:.1f}x (CPU time: bound {bound_cpu:.2f} s, measured / bound "
          f"{cpu['seconds'] / bound_cpu:.1f}x)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if torch.device(bench.config.device).type == "cuda":
        print(f"peak memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated on the GPU "
              f"({torch.cuda.max_memory_reserved() / 2**30:.1f} GiB reserved), RSS {rss:,.0f} MB")
    else:
        print(f"peak memory: RSS {rss:,.0f} MB (resource.getrusage ru_maxrss)")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b")
    parser.add_argument("--method", choices=METHODS, default="lopd")
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", choices=stages.core.models.backbone.DTYPES,
                        help="(default: bfloat16 on cuda, else float32)")
    parser.add_argument("--prompt-len", type=int, default=2048, help="prompt words (= tokens) per task")
    parser.add_argument("--task-len", type=int, help="words of the task text (default: the whole prompt); the "
                        "rest of the prompt is a system message shared by all tasks")
    parser.add_argument("--prefix-cache-tokens", type=int, default=PREFIX_CACHE_TOKENS,
                        help="the rollout engine's prefix-cache budget (default: distill's); 0 = off")
    parser.add_argument("--response-len", type=int, default=1024, help="max new tokens per rollout")
    parser.add_argument("--batch", type=int, default=32, help="rollouts per step (the paper's batch)")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per task (B.1's G)")
    parser.add_argument("--micro-batch", type=int, default=4, help="training rows per forward/backward")
    parser.add_argument("--head-at-supervised", action=argparse.BooleanOptionalAction, default=True,
                        help="losses apply the LM head only at supervised positions, as distill does "
                             "(--no-head-at-supervised: full (B, T, V) logits, the path before)")
    parser.add_argument("--shared-latents", action=argparse.BooleanOptionalAction, default=True,
                        help="LOPD: each distinct composer input encoded once per update, as distill does "
                             "(--no-shared-latents: once per micro-batch row, the path before)")
    parser.add_argument("--shared-prefix", action=argparse.BooleanOptionalAction, default=True,
                        help="rows sharing a prompt run it once per group, as distill does (skipped under "
                             "activation checkpointing; --no-shared-prefix: every row whole, the path before)")
    parser.add_argument("--J", type=int, default=3)
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--M", type=int, default=20)
    parser.add_argument("--depth", type=int, default=8, help="QFormer block applications")
    parser.add_argument("--exp-tokens", type=int, default=512, help="token budget of one composer input")
    parser.add_argument("--lora-rank", type=int, default=8, help="student LoRA rank; 0 = full fine-tuning")
    parser.add_argument("--layers", type=int, help="override the number of decoder layers (smoke runs)")
    parser.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--matmul-n", type=int, help="side of the timed square matmul (default: 8192 cuda, 1024 cpu)")
    args = parser.parse_args(argv)
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    n = args.matmul_n or (8192 if torch.device(device).type == "cuda" else 1024)
    rate = matmul_rate(device, dtype, n)
    _, numbers = SHAPES[args.shape]
    print(f"bench_step: {args.shape} shape (layers {args.layers or numbers['num_hidden_layers']}, hidden "
          f"{numbers['hidden_size']}, vocab {numbers['vocab_size']}), random weights, method {args.method}, "
          f"{device} {dtype}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print(f"matmul {n}x{n} {dtype}: {rate[0] / 1e12:.3f} TFLOP/s ({rate[1] / 1e12:.3f} per CPU second)")
    with tempfile.TemporaryDirectory(prefix="bench-step-") as scratch:
        t0 = time.perf_counter()
        bench = build(args, Path(scratch))
        with bench.patches:
            lopd = f", J={args.J} K={args.K} M={args.M} depth {args.depth}, composer inputs <= {args.exp_tokens} tokens, " + \
                ("each encoded once per update" if args.shared_latents else "encoded per micro-batch row")
            print(f"settings: {args.batch} rollouts ({len(bench.tasks)} tasks x G {min(args.group_size, args.batch)}), "
                  f"prompt {args.prompt_len} (task {args.task_len or args.prompt_len}), prefix cache "
                  f"{args.prefix_cache_tokens} tokens, response <= {args.response_len}, micro-batch {args.micro_batch}, LoRA "
                  f"rank {args.lora_rank}, activation checkpointing {'on' if args.activation_checkpointing else 'off'}, "
                  f"LM head {'at supervised positions' if args.head_at_supervised else 'at every position'}"
                  f"{lopd if args.method == 'lopd' else ''}; set-up {time.perf_counter() - t0:.1f} s")
            rows = []
            for i in range(args.warmup + args.steps):
                if i == args.warmup and torch.device(device).type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                row = step(bench, i)
                row["warmup"] = i < args.warmup
                rows.append(row)
                print(f"step {i + 1}{' (warm-up)' if i < args.warmup else ''}: {row['seconds']:.2f} s (rollout "
                      f"{row['rollout_s']:.2f}, forward {row.get('forward_s', 0):.2f}, backward "
                      f"{row.get('backward_s', 0):.2f}, optimizer {row.get('optimizer_s', 0):.2f})", flush=True)
            report(bench, rows[args.warmup:] or rows, rate)
    return rows


if __name__ == "__main__":
    main()
