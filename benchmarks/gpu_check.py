"""One GPU check command: the vLLM engine's riskiest behaviours, a bf16 step against float32 and
the step benchmark at Qwen3-4B shape, printed as one PASS / FAIL table.

    PYTHONPATH=. python benchmarks/gpu_check.py              # one CUDA GPU (bf16; the default model)
    PYTHONPATH=. python benchmarks/gpu_check.py --dry-run    # the CPU: tiny shapes, float32

Checks, in order (each row: PASS / FAIL / SKIP, its numbers, its seconds):

* ``vllm-full-sync``: a fully fine-tuned model in the ``vllm`` engine; its decoder weights are
  changed, then level-2 sleep -> ``sync_weights`` -> wake (weights, ``reload_weights``, KV cache)
  -> greedy. PASS: every greedy token is the float32 argmax of the updated model (a "tie" is a
  token whose float32 logit is within ``--tie`` of the argmax: bf16 kernels may pick either) and
  the update changed at least one completion (the reload took effect).
* ``vllm-logprobs``: vLLM's own log-probs of the ids it sampled against the float32
  ``log_softmax(raw / T)`` of the same model at those ids: greedy (T = 1) and T 0.7 with top-p 1
  must agree, T 0.7 with top-p 0.95 must differ by exactly ``-log(kept mass)`` (vLLM reports
  after truncation); and the engine's recorded log-probs at top-p 0.95 (recomputed with the
  trained model) must agree. Tolerance: mean |difference| <= ``--lp-mean``, max <= ``--lp-max``.
* ``vllm-lora-cycles``: a LoRA student with an AdamW state started beside the trainer, then
  ``--cycles`` times: change the adapter, sleep (level 1), sync, greedy. PASS: each cycle serves
  the newest adapter version (its request id) and its greedy tokens are the float32 peft argmax
  (ties as above), and GPU free memory while asleep and process RSS stay within
  ``--memory-drift-mib`` over the cycles after the first.
* ``bf16-parity``: one LOPD loss + backward (student LoRA, composer, latent teacher, top-M + tail
  reverse KL, margin, anchor) of the tiny test model on fixed rows, in float32 and in bfloat16
  from the same weights. PASS: loss within ``--parity-rtol`` (relative) and the student and
  composer gradient norms within ``2 x --parity-rtol``: bf16 keeps 8 bits of mantissa (relative
  rounding 2^-9), compounded over the forward.
* ``bench-step``: ``benchmarks/bench_step.py`` (LOPD, hf engine) at Qwen3-4B shape, shrunk to fit
  the 8 minutes (``--bench-args`` replaces its arguments); PASS: it ran, finite seconds per step.
* ``composer``: ``benchmarks/bench_composer.py`` at Qwen3-4B shape with the paper's composer
  (J = 3 x 512, K 32, depth 8): one update's parts (graph forward, QFormer, backward, phi_0's
  forward) and their time over their exact FLOP bound; PASS: every part ran in finite time.

The vLLM checks SKIP when ``vllm`` is not importable (say so in the table). The dry run uses the
tiny model of ``tests/tiny.py`` and bench_step's smoke shape; the test suite runs it with a
stand-in ``vllm`` module. Exit status 1 when a check FAILs.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from stages.engines import SamplingParams  # noqa: E402

# the paper's composer at Qwen3-4B shape (J = 3 x 512, K 32, depth 8); the dry run's is tiny
GPU_COMPOSER = ["--shape", "qwen3-4b", "--J", "3", "--tokens", "512", "--K", "32", "--depth", "8", "--repeats", "3"]
DRY_COMPOSER = ["--shape", "smollm2-135m", "--device", "cpu", "--layers", "1", "--J", "2", "--tokens", "16", "--K", "4",
                "--depth", "1", "--repeats", "1", "--matmul-n", "64"]
GPU_BENCH = ["--shape", "qwen3-4b", "--method", "lopd", "--prompt-len", "1024", "--response-len", "256",
             "--batch", "8", "--warmup", "1", "--steps", "2"]
DRY_BENCH = ["--shape", "smollm2-135m", "--method", "lopd", "--device", "cpu", "--layers", "1", "--prompt-len", "16",
             "--response-len", "4", "--batch", "2", "--warmup", "0", "--steps", "1", "--J", "2", "--K", "4",
             "--depth", "1", "--exp-tokens", "32", "--matmul-n", "64"]
PROMPTS = ["The quick brown fox", "What is the weather in Paris today?", "def add(a, b):\n",
           "You are a helpful assistant. Answer the question"]


class Skip(Exception):
    """A check that cannot run here (the reason is its message)."""


@dataclass
class Row:
    name: str
    result: str
    numbers: str
    seconds: float


@dataclass
class Setup:
    """What every check reads (from the command line)."""

    device: str
    dtype: str
    model: str
    tokenizer: object
    prompts: list[list[int]]
    args: argparse.Namespace
    scratch: Path
    shared: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------ helpers --


def _float32_copy(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model).float().eval()


def _positions_logits(model, prompt: list[int], ids: list[int], adapter: str | None = None) -> torch.Tensor:
    """(n, V) float logits of ``model`` predicting each of ``ids`` after ``prompt``."""
    from stages.core.models.composer import adapter_scope

    device = next(model.parameters()).device
    with torch.no_grad(), adapter_scope(model, adapter):
        x = torch.tensor([list(prompt) + list(ids[:-1])], device=device)
        return model(input_ids=x, logits_to_keep=len(ids), use_cache=False).logits[0].float()


def greedy_gaps(ref, prompts, gens, adapter: str | None = None) -> list[float]:
    """Per generated token: float32 argmax logit minus the logit of the token taken (0 = the argmax)."""
    gaps: list[float] = []
    for prompt, gen in zip(prompts, gens):
        logits = _positions_logits(ref, prompt, gen.token_ids, adapter)
        taken = logits.gather(1, torch.tensor(gen.token_ids, device=logits.device)[:, None])[:, 0]
        gaps += (logits.max(dim=-1).values - taken).tolist()
    return gaps


def _agreement(gaps: list[float], tie: float) -> tuple[bool, str]:
    exact, ties = sum(g == 0 for g in gaps), sum(0 < g <= tie for g in gaps)
    worst = max(gaps, default=0.0)
    return worst <= tie, f"{exact}/{len(gaps)} tokens the float32 argmax, {ties} ties, worst gap {worst:.3f}"


def kept_mass(logits_NV: torch.Tensor, top_p: float) -> torch.Tensor:
    """(N,) probability mass top-p keeps, by vLLM's rule: sorted ascending, the tokens whose
    cumulative mass is <= 1 - top_p are dropped, the most likely token always stays."""
    probs = torch.softmax(logits_NV.double(), dim=-1).sort(dim=-1).values
    dropped = probs.cumsum(dim=-1) <= 1 - top_p
    dropped[:, -1] = False
    return 1 - (probs * dropped).sum(dim=-1)


def _perturb_(params, seed: int, scale: float, relative: bool = True) -> None:
    """Add seeded Gaussian noise of std ``scale`` (x each tensor's own std when ``relative``)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            std = scale * (float(p.float().std()) if relative else 1.0)
            p.add_((torch.randn(p.shape, generator=gen) * std).to(p))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _free_gpu_mib() -> float | None:
    return torch.cuda.mem_get_info()[0] / 2**20 if torch.cuda.is_available() else None


def _need_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise Skip("vllm is not importable here (install '.[vllm]' on a CUDA machine)")


def _greedy(s: Setup) -> SamplingParams:
    return SamplingParams(temperature=0, top_p=1.0, max_new_tokens=s.args.tokens)


def _engine(s: Setup, model, adapter: str | None = None):
    from stages.engines.vllm import VLLMRolloutEngine

    return VLLMRolloutEngine(model, s.tokenizer, adapter=adapter, gpu_memory_utilization=s.args.gpu_share,
                             max_model_len=s.args.max_model_len)


# ------------------------------------------------------------------------------- checks --


def check_full_sync(s: Setup) -> tuple[bool, str]:
    """Level-2 sleep -> sync -> wake -> reload; greedy against the updated model's float32 argmax."""
    _need_vllm()
    from stages.core.models.backbone import load_policy

    model, _ = load_policy(s.model, dtype=s.dtype, device=s.device)
    engine = _engine(s, model)
    s.shared["full"] = (model, engine)
    before = engine.generate(s.prompts, _greedy(s))
    _perturb_([p for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2], seed=1, scale=0.5)
    engine.sleep()
    engine.sync_weights(model)
    after = engine.generate(s.prompts, _greedy(s))
    ok, text = _agreement(greedy_gaps(_float32_copy(model), s.prompts, after), s.args.tie)
    changed = sum(a.token_ids != b.token_ids for a, b in zip(before, after))
    return ok and changed > 0, f"{text}; {changed}/{len(after)} completions changed by the update (v{engine.version})"


def check_logprobs(s: Setup) -> tuple[bool, str]:
    """vLLM's processed log-probs vs float32 log_softmax(raw / T) on vLLM's sampled ids."""
    _need_vllm()
    from stages.engines.vllm import vllm_sampling_kwargs

    if "full" not in s.shared:
        from stages.core.models.backbone import load_policy

        model = load_policy(s.model, dtype=s.dtype, device=s.device)[0]
        s.shared["full"] = (model, _engine(s, model))
    model, engine = s.shared["full"]
    vllm, ref = importlib.import_module("vllm"), _float32_copy(model)
    n = s.args.tokens
    settings = [("greedy", SamplingParams(temperature=0, top_p=1.0, max_new_tokens=n)),
                ("T0.7", SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=n, seed=11)),
                ("T0.7 top-p 0.95", SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=n, seed=11))]
    ok, parts = True, []
    for label, params in settings:
        engine.generate(s.prompts[:1], params)  # wakes the engine if asleep
        sampling = [vllm.SamplingParams(**vllm_sampling_kwargs(params, engine.eos_ids, None if params.seed is None
                                                               else params.seed + i)) for i in range(len(s.prompts))]
        outs = engine.llm.generate([vllm.TokensPrompt(prompt_token_ids=p) for p in s.prompts], sampling,
                                   use_tqdm=False)
        diffs, shifts = [], []
        for prompt, out in zip(s.prompts, outs):
            ids = list(out.outputs[0].token_ids)
            got = torch.tensor([step[t].logprob for step, t in zip(out.outputs[0].logprobs, ids)], dtype=torch.float64)
            logits = _positions_logits(ref, prompt, ids).double() / (params.temperature or 1.0)
            want = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None].to(logits.device))[:, 0].cpu()
            shift = -torch.log(kept_mass(logits, params.top_p)).cpu() if params.top_p < 1 else torch.zeros(len(ids))
            diffs.append(got - (want + shift))
            shifts.append(shift)
        d, shift = torch.cat(diffs).abs(), torch.cat(shifts)
        good = float(d.mean()) <= s.args.lp_mean and float(d.max()) <= s.args.lp_max
        ok &= good
        note = f" (want = float32 + -log kept mass, mean {float(shift.mean()):.4f})" if params.top_p < 1 else ""
        parts.append(f"{label}: |vLLM - want| mean {float(d.mean()):.4f} max {float(d.max()):.4f}{note}")
    recorded = []
    for prompt, gen in zip(s.prompts, engine.generate(s.prompts, settings[2][1])):
        logp = torch.log_softmax(_positions_logits(ref, prompt, gen.token_ids).double() / 0.7, dim=-1)
        want = logp.gather(1, torch.tensor(gen.token_ids)[:, None].to(logp.device))[:, 0].cpu()
        recorded.append((torch.tensor(gen.logprobs, dtype=torch.float64) - want).abs())
    d = torch.cat(recorded)
    ok &= float(d.mean()) <= s.args.lp_mean and float(d.max()) <= s.args.lp_max
    parts.append(f"recorded at top-p 0.95 (the trained model's): mean {float(d.mean()):.4f} max {float(d.max()):.4f}")
    return ok, "; ".join(parts)


def check_lora_cycles(s: Setup) -> tuple[bool, str]:
    """N sync/sleep/wake cycles of a LoRA student started beside a trainer with optimizer state."""
    _need_vllm()
    from stages.core.models.backbone import load_policy
    from stages.core.models.composer import add_lora_adapter

    if "full" in s.shared:  # the full-fine-tuning engine gives its GPU memory back first
        s.shared["full"][1].sleep()
    base = load_policy(s.model, dtype=s.dtype, device=s.device)[0]
    student = add_lora_adapter(base, "student", rank=8, alpha=16)
    lora = [p for n, p in student.named_parameters() if "lora_" in n and ".student" in n]
    optimizer = torch.optim.AdamW(lora, lr=1e-3)
    x = torch.tensor([s.prompts[0]], device=next(student.parameters()).device)
    student(input_ids=x, labels=x).loss.backward()
    optimizer.step()  # the trainer holds its weights, gradients and AdamW state
    engine = _engine(s, student, adapter="student")
    gaps, free, rss, served, changed, last = [], [], [], [], 0, None
    for cycle in range(s.args.cycles):
        _perturb_([p for n, p in student.named_parameters() if "lora_B.student" in n], seed=10 + cycle,
                  scale=s.args.lora_noise, relative=False)
        engine.sleep()
        free.append(_free_gpu_mib())
        rss.append(_rss_mib())
        engine.sync_weights(student, "student")
        gens = engine.generate(s.prompts, _greedy(s))
        served.append(engine._lora.lora_int_id)
        gaps += greedy_gaps(_float32_copy(student), s.prompts, gens, adapter="student")
        changed += last is not None and any(a.token_ids != b.token_ids for a, b in zip(gens, last))
        last = gens
    ok, text = _agreement(gaps, s.args.tie)
    ok &= served == list(range(2, s.args.cycles + 2)) and changed > 0
    text += f"; {changed}/{s.args.cycles - 1} new versions changed the greedy completions"
    drift = s.args.memory_drift_mib
    rss_drift = max(rss[1:], default=0) - min(rss[1:], default=0)
    ok &= rss_drift <= drift
    text += f"; versions served {served}; RSS drift {rss_drift:.0f} MiB"
    if free[0] is not None:
        free_drift = max(free[1:], default=0) - min(free[1:], default=0)
        ok &= free_drift <= drift
        text += f", GPU free-memory drift {free_drift:.0f} MiB (asleep: {min(free):.0f} MiB free)"
    return ok, text


def _grad_norm(params) -> float:
    return math.sqrt(sum(float(p.grad.float().pow(2).sum()) for p in params if p.grad is not None))


def _parity_rows(tokenizer, J: int):
    """Fixed LOPD rows (one action each) and J successful experiences per row."""
    from schemas import Message, Trajectory, Turn
    from stages.core.data.rows import training_rows

    def traj(i: int, prompt: str, action: str, reward: float) -> Trajectory:
        return Trajectory(trajectory_id=f"t{i}", task_id=f"task{i}", env="parity", split="train", prompt=prompt,
                          policy="fixed", messages=[Message(role="user", content=prompt),
                                                    Message(role="assistant", content=action)],
                          turns=[Turn(action=action)], reward=reward, success=reward == 1.0, num_steps=1,
                          num_tool_calls=0, run_id="parity")

    texts = [(PROMPTS[i % len(PROMPTS)], PROMPTS[(i + 1) % len(PROMPTS)] * 2) for i in range(4)]
    trajs = [traj(i, p, a, float(i % 2)) for i, (p, a) in enumerate(texts)]
    with warnings.catch_warnings():  # rows without token ids are tokenized from their text, with a warning
        warnings.simplefilter("ignore")
        rows, _ = training_rows(tokenizer, trajs)
    experiences = [traj(100 + j, PROMPTS[j], PROMPTS[-1 - j], 1.0) for j in range(J)]
    return rows, [experiences for _ in rows]


def check_bf16_parity(s: Setup) -> tuple[bool, str]:
    """One LOPD loss + backward of the tiny model, float32 against bfloat16 from the same weights."""
    from types import SimpleNamespace

    from stages.core.models.backbone import load_policy
    from stages.core.models.composer import Composer, save_composer
    from stages.methods import get_method
    from tests.tiny import save_tiny

    folder = save_tiny(s.scratch / "parity-model")
    backbone, tokenizer = load_policy(str(folder), dtype="float32", device=s.device)
    torch.manual_seed(0)
    J, K = 2, 4
    save_composer(Composer(backbone, J=J, K=K, depth=2, max_exp_tokens=64), s.scratch / "parity-composer",
                  {"backbone_id": str(folder)})
    lopd = get_method("lopd")
    options = lopd.Options(composer=str(s.scratch / "parity-composer"), J=J, K=K, M=8).resolve()
    rows, extras = _parity_rows(tokenizer, J)
    out = {}
    for dtype in ("float32", "bfloat16"):
        config = SimpleNamespace(model=str(folder), device=s.device, dtype=dtype, student_lora_rank=8, lr=1e-5,
                                 activation_checkpointing=False, max_len=None, micro_batch=len(rows), options=options)
        torch.manual_seed(0)
        method = lopd(config, None, {})
        with torch.no_grad():  # a trained student: its LoRA B away from zero (the same values in both)
            _perturb_([p for n, p in method.student.model.named_parameters() if "lora_B" in n and p.requires_grad],
                      seed=3, scale=0.1, relative=False)
        method.train_mode()
        loss, _ = method.loss(rows, extras, 1.0)
        loss.backward()
        out[dtype] = (float(loss.detach()), _grad_norm(method.student.params), _grad_norm(method.composer_params))
    (l32, s32, c32), (l16, s16, c16) = out["float32"], out["bfloat16"]
    rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)  # noqa: E731
    tol = s.args.parity_rtol
    ok = rel(l16, l32) <= tol and rel(s16, s32) <= 2 * tol and rel(c16, c32) <= 2 * tol and s32 > 0 and c32 > 0
    return ok, (f"loss {l32:.5f} / {l16:.5f} (rel {rel(l16, l32):.1e}); grad norm student {s32:.4g} / {s16:.4g} "
                f"(rel {rel(s16, s32):.1e}), composer {c32:.4g} / {c16:.4g} (rel {rel(c16, c32):.1e}) [float32 / bf16]")


def check_bench_step(s: Setup) -> tuple[bool, str]:
    """benchmarks/bench_step.py's main, as a module of its own."""
    spec = importlib.util.spec_from_file_location("bench_step", REPO / "benchmarks" / "bench_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_step"] = module  # its dataclasses look their module up while being built
    try:
        spec.loader.exec_module(module)
        argv = s.args.bench_args.split() if s.args.bench_args else (DRY_BENCH if s.args.dry_run else GPU_BENCH)
        rows = module.main(argv)
    finally:
        del sys.modules["bench_step"]
    seconds = [r["seconds"] for r in rows if not r["warmup"]] or [r["seconds"] for r in rows]
    ok = bool(rows) and all(math.isfinite(x) and x > 0 for x in seconds)
    return ok, (f"{' '.join(argv[:4])}: {statistics.median(seconds):.2f} s/step (median of {len(seconds)} timed), "
                f"{rows[0]['generated']} tokens generated, {rows[0]['flops'] / 1e12:.2f} TFLOP counted per step")


def check_composer(s: Setup) -> tuple[bool, str]:
    """benchmarks/bench_composer.py's main: one composer update's parts against their FLOP bound."""
    spec = importlib.util.spec_from_file_location("bench_composer", REPO / "benchmarks" / "bench_composer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(DRY_COMPOSER if s.args.dry_run else GPU_COMPOSER)
    update = [r for r in rows if r["update"]]
    wall, bound = sum(r["wall_s"] for r in update), sum(r["bound_wall_s"] for r in update)
    ok = all(math.isfinite(r["wall_s"]) and r["wall_s"] > 0 and r["flops"] > 0 for r in rows)
    parts = ", ".join(f"{r['part']} {r['wall_s']:.2f}" for r in update)
    return ok, f"update {wall:.2f} s = {wall / bound:.1f}x its FLOP bound ({parts})"


CHECKS = {"vllm-full-sync": check_full_sync, "vllm-logprobs": check_logprobs, "vllm-lora-cycles": check_lora_cycles,
          "bf16-parity": check_bf16_parity, "bench-step": check_bench_step, "composer": check_composer}


def run(name: str, s: Setup) -> Row:
    """One check as a table row; an exception is a FAIL with its first line."""
    t0 = time.perf_counter()
    try:
        ok, numbers = CHECKS[name](s)
        result = "PASS" if ok else "FAIL"
    except Skip as e:
        result, numbers = "SKIP", str(e)
    except Exception as e:  # noqa: BLE001 (one failing check must not hide the others)
        result, numbers = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return Row(name, result, numbers, time.perf_counter() - t0)


def table(rows: list[Row]) -> str:
    lines = [f"{'check':<17} {'result':<6} {'seconds':>8}  numbers"]
    lines += [f"{r.name:<17} {r.result:<6} {r.seconds:>8.1f}  {r.numbers}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the CPU: tiny model, float32, bench_step smoke shape")
    parser.add_argument("--model", help="model of the vLLM checks (default: smollm2-135m; the tiny test model "
                        "with --dry-run)")
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), help="run these checks only")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per prompt in the vLLM checks")
    parser.add_argument("--cycles", type=int, default=4, help="LoRA sync/sleep/wake cycles")
    parser.add_argument("--tie", type=float, default=0.25, help="float32 logit gap under which a greedy token "
                        "other than the argmax counts as a tie")
    parser.add_argument("--lp-mean", type=float, default=0.02, help="mean |log-prob difference| allowed (nats)")
    parser.add_argument("--lp-max", type=float, default=0.25, help="largest |log-prob difference| allowed (nats)")
    parser.add_argument("--parity-rtol", type=float, default=0.02, help="bf16 vs float32 relative loss tolerance")
    parser.add_argument("--lora-noise", type=float, default=0.2, help="std of the noise added to LoRA B per cycle")
    parser.add_argument("--memory-drift-mib", type=float, default=512.0)
    parser.add_argument("--gpu-share", type=float, default=0.3, help="the vLLM engines' GPU memory share")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--bench-args", help="bench_step's arguments, one string (default: Qwen3-4B shape, shrunk)")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU visible: run with --dry-run on the CPU")
    from stages.core.models.backbone import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="lopd-gpu-check-") as tmp:
        scratch = Path(tmp)
        if args.dry_run:
            from tests.tiny import save_tiny

            model = args.model or str(save_tiny(scratch / "tiny"))
        else:
            model = args.model or "smollm2-135m"
        tokenizer = load_tokenizer(model)
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
        setup = Setup(device="cpu" if args.dry_run else "cuda", dtype="float32" if args.dry_run else "bfloat16",
                      model=model, tokenizer=tokenizer, prompts=prompts, args=args, scratch=scratch)
        rows = []
        for name in args.only or CHECKS:
            rows.append(run(name, setup))
            print(f"gpu_check: {name}: {rows[-1].result}", flush=True)
        print(table(rows), flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(1 if any(r.result == "FAIL" for r in main()) else 0)
