"""One on-policy self-distillation step in lopd and in TRL, alternated in one run: seconds and peak RSS.

Issue 20. The step, the same in both: the LoRA student (rank 8, alpha 16, q/k/v/o, SmolLM2-135M-
Instruct in float32) samples ``--response`` tokens (temperature 1, no top-p/top-k) ``--generations``
times for each of ``--batch`` prompts of ``--prompt`` tokens (chat-templated; all rows in one
``generate`` call and one training forward); the frozen teacher (the same backbone with the
adapter disabled) re-scores exactly those tokens with a verified reference text in its prompt;
loss = forward KL(T || S) over the full vocabulary at every sampled token, token-mean per
sequence then mean over sequences; backward; gradient clipping at 1.0; one AdamW step (lr 1e-5).

- ``trl``: TRL's ``trl.experimental.sdft.SDFTTrainer`` (``teacher_model_kind="base"``,
  ``distillation_mode="full_logits"``, ``distillation_alpha=0`` = forward KL,
  ``distillation_is_clip=None``, ``num_generations=1``; ``bf16=False`` and
  ``gradient_checkpointing=False`` like lopd's float32 without checkpointing: TRL's defaults
  are bf16 autocast, 4.5x slower on this CPU (a first step of 240 s against 54 s), and
  checkpointing), stepped inside its own ``trainer.train()`` loop; the timed step runs from
  ``on_step_begin`` to ``on_step_end`` (generation, teacher and student forwards, loss,
  backward, clipping, optimizer); its time inside the student's ``generate`` is reported as
  ``rollout_s``, beside lopd's phases.
- ``lopd-opsd``: lopd's OPSD (``stages.methods.opsd``, ``reduction=sequence`` like TRL),
  ``Distiller.train_step``: rollout through lopd's engine in a one-turn environment, the
  reference lookup in the store, the loss (:func:`stages.core.losses.kd.generalized_jsd`, beta 0),
  backward, optimizer, the engine's weight sync and the store append with its MiniLM embedding.
- ``lopd-lopd``: lopd's LOPD step on the same rows (an untrained cold-start composer, J=3
  retrieved references, K=32 latents, top-M=20 + tail reverse KL, margin, anchor): what the
  composer costs next to OPSD.

Named differences: TRL's teacher reads the reference in the user message (its
``teacher_prompt_template``, here given OPSD's framing words), lopd's OPSD in the system message;
TRL computes logits for the completion positions (``logits_to_keep``), lopd's losses apply the
LM head at the sampled tokens only (``lopd-opsd-logits``: the earlier whole-sequence logits);
lopd's step also embeds and stores the step's rollouts (``memory_s``) and syncs the rollout
engine. TRL's ``GKDTrainer`` (lmbda=1) would sample on-policy too, but its teacher is
a separate model scoring the same prompt (no privileged context), so it is not this step. TRL's
SDFT can also run a top-k + tail loss, on the STUDENT's top-k (LOPD's support is the teacher's).

Measurement: ONE run of this script; every tool lives in its own child process (spawned, models
loaded once), and the parent steps them in turn: ``--warmup`` steps each, then ``--rounds``
rounds of one step per tool (the order rotates every round). Only one child computes at a time.
Peak RSS per step: the child resets the kernel's resident high-water mark before the step
(``/proc/self/clear_refs`` = 5, Linux) and reads ``VmHWM`` after it; the table shows the
largest over the measured steps (the process's whole resident memory: weights, optimizer,
activations), and the RSS after set-up. tracemalloc would not see torch's allocations, and
separate processes keep one tool's memory out of the other's numbers.

TRL is not a project dependency. Pinned: trl==1.16.0 (benchmarks/requirements-trl.txt), measured
with transformers 5.24.0, peft 0.21.2, torch 2.13.0+cpu, accelerate 1.15.0, datasets 5.2.0::

    python -m pip install --target /work/trl-pkgs --no-deps -r benchmarks/requirements-trl.txt
    PYTHONPATH=.:/work/trl-pkgs python benchmarks/bench_vs_trl.py --rounds 5 --threads 1

Results and the exact run: docs/results/bench-vs-trl.md.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from schemas import Message, Task, Trajectory, Turn
from stages.core.run.resources import reset_peak_rss, status_mb
from stages.envs import StepResult, register

BENCH_ENV = "bench-selfdistill"
SYSTEM = "You are a helpful assistant."
INSTRUCTION = "Write a long and detailed essay that uses every one of these words:"
WORDS = ("river stone garden window paper music winter candle forest harbor letter bridge lantern "
         "meadow violin copper thunder orchard compass anchor feather mirror valley canyon").split()
TASKS_FILE = "tasks.json"


@register(BENCH_ENV)
class SelfDistillEnv:
    """One turn: the task's prompt; any answer ends the episode, reward 0 (not a success, so the
    store's verified references stay the seeded ones). Tasks come from ``data_dir/tasks.json``."""

    name = BENCH_ENV

    def __init__(self, data_dir: Path | None = None, max_turns: int = 1) -> None:
        self.prompts = json.loads((Path(data_dir) / TASKS_FILE).read_text())["prompts"]

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        if split != "train":
            return []
        tasks = [Task(task_id=f"train-{i}", env=BENCH_ENV, split="train", prompt=p) for i, p in enumerate(self.prompts)]
        return tasks[:limit]

    def reset(self, task: Task) -> list[Message]:
        return [Message(role="system", content=SYSTEM), Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        return StepResult(observation=[], reward=0.0, done=True, info={"success": False})

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Spec:
    """What every worker needs: the run's folder, model folder, sizes and step count."""

    root: str
    model_path: str
    batch: int
    response: int
    steps: int
    threads: int
    generations: int = 1
    lr: float = 1e-5
    profile: int = 0


def _set_threads(threads: int) -> None:
    """torch's intra-op threads in this worker (0: torch's default, one per core)."""
    import torch
    if threads > 0:
        torch.set_num_threads(threads)


def _words(n: int, offset: int) -> str:
    return " ".join(WORDS[(offset + k * 7) % len(WORDS)] for k in range(n))


def _fit(tokens_of, limit: int) -> int:
    """The largest n with tokens_of(n) <= limit (tokens_of grows with n)."""
    n = 1
    while tokens_of(n + 1) <= limit:
        n += 1
    return n


def make_tasks(tokenizer, n_tasks: int, prompt_tokens: int, context_tokens: int) -> tuple[list[str], list[str]]:
    """Per task: the user text (chat-templated prompt <= prompt_tokens) and a reference answer
    (<= context_tokens tokens on its own)."""
    def templated(text: str) -> int:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        return len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])

    prompts, references = [], []
    for i in range(n_tasks):
        head = f"Task {i}. {INSTRUCTION}"
        n = _fit(lambda k: templated(f"{head} {_words(k, i)}"), prompt_tokens)
        prompts.append(f"{head} {_words(n, i)}")
        m = _fit(lambda k: len(tokenizer(f"The essay. {_words(k, i + 3)}", add_special_tokens=False)["input_ids"]),
                 context_tokens)
        references.append(f"The essay. {_words(m, i + 3)}")
    return prompts, references


def prepare(args: argparse.Namespace, root: Path) -> tuple[Spec, dict]:
    """Task file (prompts, and each reference rendered as lopd's OPSD shows it: "Step 1: ..."), one
    seeded store per lopd worker (references indexed with MiniLM), a fresh composer for LOPD;
    returns the spec and the token counts of the prompts."""
    import torch
    from stages.core.data.retrieval import index_new, load_embedder
    from stages.core.data.rows import training_rows
    from stages.core.data.store import ExperienceStore
    from stages.core.latent.privileged import privileged_prefix
    from stages.core.models.backbone import load_policy, resolve_model
    from stages.core.models.composer import Composer, save_composer
    from stages.methods._text_context import demonstration_text
    from stages.methods.opsd import SYSTEM_FRAMING

    model_path = resolve_model(args.model)
    model, tok = load_policy(args.model)
    prompts, references = make_tasks(tok, args.tasks, args.prompt, args.context)
    seeds = [Trajectory(trajectory_id=f"ref-{i}", task_id=f"train-{i}", env=BENCH_ENV, split="train", prompt=p,
                        policy="reference", messages=[Message(role="system", content=SYSTEM),
                                                      Message(role="user", content=p),
                                                      Message(role="assistant", content=r)],
                        turns=[Turn(action=r)], reward=1.0, success=True, num_steps=1, num_tool_calls=0,
                        run_id="seed") for i, (p, r) in enumerate(zip(prompts, references))]
    embedder = load_embedder()
    for name in ("lopd-opsd", "lopd-opsd-logits", "lopd-opsd-unshared", "lopd-lopd"):
        store = ExperienceStore.open(root / f"store-{name}")
        store.append(seeds)
        index_new(store, embedder)
    torch.manual_seed(0)
    save_composer(Composer(model, J=3, K=32), root / "composer", {"backbone_id": model_path})
    demos = [demonstration_text(s, tok, max_tokens=1024, max_observation_chars=300).text for s in seeds]
    (root / TASKS_FILE).write_text(json.dumps({"prompts": prompts, "contexts": demos}))
    row, demo = training_rows(tok, seeds[:1])[0][0], demos[0]
    trl_user = f"{prompts[0]}\n\n" + SYSTEM_FRAMING.format(demonstration=demo)
    trl_msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": trl_user}]
    lengths = {
        "student prompt": int(row.mask_T.nonzero()[0]),
        "lopd teacher prompt": len(privileged_prefix(tok, row, system=SYSTEM_FRAMING.format(demonstration=demo))),
        "trl teacher prompt": len(tok.apply_chat_template(trl_msgs, add_generation_prompt=True, tokenize=True,
                                                          return_dict=True)["input_ids"]),
    }
    return Spec(str(root), model_path, args.batch, args.response, args.warmup + args.rounds, args.threads,
                args.generations, profile=args.profile), lengths


def _step_result(t0: float, tokens: int, extra: dict | None = None) -> dict:
    return {"seconds": time.perf_counter() - t0, "peak_rss_mb": status_mb("VmHWM"), "rss_mb": status_mb("VmRSS"),
            "tokens": tokens, **(extra or {})}


def lopd_worker(method: str, spec: Spec, conn) -> None:
    """A Distiller of ``method`` on the bench env; one ``train_step`` per "step" message.
    ``opsd-logits``: OPSD with (B, T, V) logits at every position (the path before the LM head
    moved into the loss); ``opsd-unshared``: OPSD without the shared-prefix training forward
    (:mod:`stages.core.models.shared_prefix`; the path before)."""
    import torch
    from rich.console import Console
    from stages.distill.recipe import PHASE_FIELDS, DistillConfig, Distiller
    from stages.methods import Method

    _set_threads(spec.threads)
    root = Path(spec.root)
    store = root / f"store-lopd-{method}"
    if method == "opsd-logits":
        Method.head_at_supervised, method = False, "opsd"
    if method == "opsd-unshared":  # every row's prompt encoded on its own in the training forwards
        from stages.core.models import head
        head.prefix_groups, method = (lambda ids, lengths: []), "opsd"
    options = {"opsd": {"reduction": "sequence"}, "lopd": {"composer": str(root / "composer"), "M": 20}}[method]
    rows = spec.batch * spec.generations  # one forward and one generate call for the step's rows, as TRL
    config = DistillConfig(method=method, env=BENCH_ENV, data_dir=str(root), store=str(store),
                           out=str(root / f"out-{store.name}"), model=spec.model_path, lr=spec.lr, steps=spec.steps,
                           tasks_per_step=spec.batch, group_size=spec.generations, max_turns=1,
                           max_new_tokens=spec.response, temperature=1.0, top_p=1.0, student_lora_rank=8,
                           micro_batch=rows, rollout_batch=rows, checkpoint_every=spec.steps + 1,
                           run_id=f"bench-{store.name}", **options).resolved()
    distiller = Distiller(config, console=Console(file=io.StringIO()))
    conn.send({"setup_rss_mb": status_mb("VmRSS")})
    for step in range(1, spec.steps + 1):
        conn.recv()
        reset_peak_rss()
        profiled = spec.profile and step == spec.steps
        with torch.profiler.profile() if profiled else contextlib.nullcontext() as prof:
            t0 = time.perf_counter()
            row = distiller.train_step(step)
        extra = {k: row[k] for k in PHASE_FIELDS}
        if profiled:  # the ops of the last step by their own CPU time (the step's time includes the profiler's)
            extra["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=spec.profile,
                                                         max_name_column_width=60)
        conn.send(_step_result(t0, int(row["tokens"]), extra))


def trl_worker(spec: Spec, conn) -> None:
    """TRL's SDFTTrainer.train() for ``spec.steps`` steps, each one gated by a "step" message."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.sdft import SDFTConfig, SDFTTrainer

    from stages.methods.opsd import SYSTEM_FRAMING

    _set_threads(spec.threads)
    root = Path(spec.root)
    tasks = json.loads((root / TASKS_FILE).read_text())
    tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
    model = AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=torch.float32)
    data = Dataset.from_list([{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}],
                               "privileged_context": c} for p, c in zip(tasks["prompts"], tasks["contexts"])])
    args = SDFTConfig(output_dir=str(root / "out-trl"), per_device_train_batch_size=spec.batch * spec.generations,
                      gradient_accumulation_steps=1, num_generations=spec.generations,
                      max_completion_length=spec.response,
                      temperature=1.0, top_p=1.0, top_k=0, learning_rate=spec.lr, lr_scheduler_type="constant",
                      weight_decay=0.0, max_grad_norm=1.0, max_steps=spec.steps, save_strategy="no",
                      report_to="none", logging_steps=10**6, use_cpu=True, seed=0, shuffle_dataset=False,
                      teacher_model_kind="base", distillation_mode="full_logits", distillation_alpha=0.0,
                      distillation_is_clip=None, gradient_checkpointing=False, bf16=False,
                      teacher_prompt_template="{prompt}\n\n" + SYSTEM_FRAMING.replace("{demonstration}",
                                                                                      "{privileged_context}"))

    class Gate(TrainerCallback):
        t0 = 0.0
        rollout_s = 0.0  # the step's time in the student's generate (TRL's rollout)

        def on_step_begin(self, *_, **__):
            conn.recv()
            reset_peak_rss()
            self.t0, self.rollout_s = time.perf_counter(), 0.0

        def on_step_end(self, *_, **__):
            batch = trainer._buffered_inputs[0]
            conn.send(_step_result(self.t0, int(batch["completion_mask"].sum()), {"rollout_s": self.rollout_s}))

    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    gate = Gate()
    trainer = SDFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                          peft_config=lora, callbacks=[gate])
    generate = trainer.model.generate  # the peft model TRL's rollout calls (unwrapped: no DDP on a CPU)

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            gate.rollout_s += time.perf_counter() - t0

    trainer.model.generate = timed_generate
    conn.send({"setup_rss_mb": status_mb("VmRSS")})
    trainer.train()


def _start(name: str, spec: Spec, ctx):
    parent, child = ctx.Pipe()
    target, args = (trl_worker, (spec, child)) if name == "trl" else (lopd_worker, (name.removeprefix("lopd-"), spec, child))
    proc = ctx.Process(target=target, args=args, name=name)
    proc.start()
    return proc, parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt", type=int, default=128, help="student prompt tokens (chat-templated)")
    parser.add_argument("--context", type=int, default=64, help="reference tokens in the teacher's prompt")
    parser.add_argument("--response", type=int, default=64, help="max new tokens per rollout")
    parser.add_argument("--batch", type=int, default=2, help="prompts per step")
    parser.add_argument("--generations", type=int, default=1,
                        help="rollouts per prompt (TRL's num_generations, lopd's group_size; TRL's default is 8)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tools", nargs="+", default=["trl", "lopd-opsd", "lopd-lopd"],
                        choices=["trl", "lopd-opsd", "lopd-opsd-logits", "lopd-opsd-unshared", "lopd-lopd"],
                        help="lopd-opsd-logits: lopd's OPSD with full logits at every position; lopd-opsd-unshared:"
                             " without the shared-prefix forward (the paths before)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: torch's default)")
    parser.add_argument("--json", help="also write every step's numbers here")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile each lopd tool's last step (torch.profiler) and print its N costliest ops")
    args = parser.parse_args()
    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as tmp:
        spec, lengths = prepare(args, Path(tmp))
        ctx = mp.get_context("spawn")
        workers, setup = {}, {}
        for name in args.tools:  # one at a time: set-up loads do not overlap
            workers[name] = _start(name, spec, ctx)
            setup[name] = workers[name][1].recv()["setup_rss_mb"]
            print(f"[{time.perf_counter() - t_start:.0f} s] {name} set up, RSS {setup[name]:.0f} MiB", file=sys.stderr, flush=True)
        steps: dict[str, list[dict]] = {name: [] for name in args.tools}
        for r in range(spec.steps):
            order = args.tools[r % len(args.tools):] + args.tools[:r % len(args.tools)]
            for name in order:
                workers[name][1].send("step")
                steps[name].append(workers[name][1].recv())
                print(f"[{time.perf_counter() - t_start:.0f} s] {name} step {r + 1}: {steps[name][-1]['seconds']:.1f} s",
                      file=sys.stderr, flush=True)
        for proc, _ in workers.values():
            proc.join()
    print(f"SmolLM2-135M-Instruct float32, torch threads {args.threads or 'default'}, batch {args.batch}"
          f" x {args.generations} rollouts,"
          f" response <= {args.response} tokens, "
          + ", ".join(f"{k} {v} tokens" for k, v in lengths.items())
          + f"; {args.warmup} warm-up step(s) per tool, then {args.rounds} rounds; total {time.perf_counter() - t_start:.0f} s;"
          f" load average (1 min) at start {load_start:.1f}, at end {os.getloadavg()[0]:.1f}")
    print("| tool | s/step median | min | max | peak RSS MiB | RSS after set-up MiB | tokens/step |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in steps.items():
        measured = rows[args.warmup:]
        secs = [s["seconds"] for s in measured]
        print(f"| {name} | {statistics.median(secs):.2f} | {min(secs):.2f} | {max(secs):.2f} |"
              f" {max(s['peak_rss_mb'] for s in measured):.0f} | {setup[name]:.0f} |"
              f" {statistics.mean(s['tokens'] for s in measured):.0f} |")
    measured = {n: rows[args.warmup:] for n, rows in steps.items()}
    fields = list(dict.fromkeys(k for rows in measured.values() for k in rows[0] if k.endswith("_s")))
    print("\nphases, median s (trl: its generate as rollout_s; the rest of its step is not split): | tool | "
          + " | ".join(fields) + " |")
    for name, rows in measured.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(r[k] for r in rows):.2f}" if k in rows[0] else "-"
                                          for k in fields) + " |")
    for name, rows in steps.items():
        if "profile" in rows[-1]:
            print(f"\n{name}, last step, ops by own CPU time (under the profiler):\n{rows[-1].pop('profile')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "lengths": lengths, "setup_rss_mb": setup,
                                               "steps": steps, "spec": asdict(spec)}, indent=1))


if __name__ == "__main__":
    main()
