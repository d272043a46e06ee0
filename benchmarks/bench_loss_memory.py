"""Peak memory of LOPD's top-M + tail reverse KL against a full-vocabulary reverse KL.

Issue 20, "Long sequences": synthetic logits (batch 1, every position supervised), forward and
backward of

- ``topm``: :func:`stages.core.losses.lopd.topm_tail_reverse_kl` (Eq. 9-10 of the LOPD paper, M=20,
  its default chunking over positions), the loss LOPD's step calls;
- ``full``: the straightforward full-vocabulary reverse KL: ``log_softmax`` over the whole
  vocabulary for student and teacher, ``sum_v p_S (log p_S - log p_T)`` per position, masked
  mean, plain autograd.

What is counted: the peak memory beyond the inputs, i.e. beyond the student and teacher logits
(B, T, V) and the mask, which exist before either loss runs (a model's lm_head makes them). It
includes the gradients of the inputs (student's, and with ``--teacher-grad on`` the teacher's,
as in LOPD where the teacher's logits carry the composer's gradient): any loss that takes
logits must produce those, so the table's ``floor`` column is that many (B, T, V) tensors.

How: every case runs in a fresh child process. On CPU the child resets the kernel's resident
high-water mark after building the inputs (``/proc/self/clear_refs`` = 5, Linux) and reads
``VmHWM`` minus ``VmRSS`` at that point after the backward pass. The child runs with glibc's
``MALLOC_MMAP_THRESHOLD_`` at 1 MiB, so every tensor above 1 MiB is mmap'ed and returned to
the kernel when freed (without it, chunk-sized tensors below glibc's dynamic 32 MiB threshold
stay in the heap after use and inflate the mark), and it runs the loss once on 4 positions
before the measurement, so that the library code pages the kernels load are resident already:
the high-water mark then tracks live tensors. On
CUDA the child reads ``torch.cuda.max_memory_allocated`` minus the allocation after the
inputs. Sizes whose inputs do not fit can be measured at a smaller vocabulary: every tensor in
both losses is (positions x V) or (positions x M), so the memory scales linearly in V.

    PYTHONPATH=. python benchmarks/bench_loss_memory.py --lengths 256 1024 --vocab 151936
    PYTHONPATH=. python benchmarks/bench_loss_memory.py --lengths 1024 4096 16384 --vocab 9496
    PYTHONPATH=. python benchmarks/bench_loss_memory.py --hidden 576 --impls head topm full --lengths 1024 --vocab 9496

With ``--hidden d`` every case starts from hidden states and a frozen LM head instead (what a
model hands a loss when its head is applied inside the loss): ``full`` and ``topm`` then make
their (1, T, V) logits in the measurement, and ``head`` is the hidden-state loss
(:func:`stages.core.losses.head.head_topm_tail_reverse_kl`), which never holds more than one
chunk of logits; its memory is not linear in V (the hidden states' gradients do not grow with V).
``fkl-head`` is OPSD's and SDFT's loss on hidden states with frozen heads (a LoRA student):
:func:`stages.core.losses.kd.generalized_jsd` with ``beta=0``, the forward KL over the full
vocabulary (run it with ``--teacher-grad off``: its teacher gets no gradient)::

    PYTHONPATH=. python benchmarks/bench_loss_memory.py --hidden 576 --impls fkl-head --lengths 1024 \
        --vocab 49152 --teacher-grad off
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from torch.nn.functional import linear

from stages.core.losses.head import LMHead, head_topm_tail_reverse_kl
from stages.core.losses.kd import generalized_jsd
from stages.core.losses.lopd import DEFAULT_CHUNK_SIZE, topm_tail_reverse_kl
from stages.core.run.resources import reset_peak_rss, status_mb

MIB = 2**20


def full_vocab_reverse_kl(student_BTV: torch.Tensor, teacher_BTV: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Reverse KL(S || T) over the whole vocabulary, masked mean over positions (nats, float32)."""
    s_logp_BTV = torch.log_softmax(student_BTV.float(), dim=-1)
    t_logp_BTV = torch.log_softmax(teacher_BTV.float(), dim=-1)
    kl_BT = (s_logp_BTV.exp() * (s_logp_BTV - t_logp_BTV)).sum(-1)
    mask = mask_BT.float()
    return (kl_BT * mask).sum() / mask.sum()


def run_case(impl: str, T: int, V: int, M: int, chunk_size: int, dtype: torch.dtype, device: str,
             teacher_grad: bool, hidden: int = 0) -> dict:
    """One forward+backward in this process; peak memory beyond the inputs in MiB, and seconds.

    ``hidden`` > 0: the inputs are hidden states (1, T, hidden) of student and teacher and one
    frozen LM head (V, hidden); ``full`` and ``topm`` compute their logits from them inside the
    measurement, ``head`` is :func:`stages.core.losses.head.head_topm_tail_reverse_kl`."""
    def topm(s: torch.Tensor, t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return topm_tail_reverse_kl(s, t, m, M=M, chunk_size=chunk_size)[0]

    loss_fn = {"topm": topm, "full": full_vocab_reverse_kl}.get(impl)
    width = hidden or V
    g = torch.Generator(device=device).manual_seed(0)
    if hidden:
        head = LMHead(torch.randn(V, hidden, generator=g, device=device, dtype=dtype) / hidden**0.5, None)
        if impl == "head":
            loss_fn = lambda s, t, m: head_topm_tail_reverse_kl(s, t, m, head, head, M=M, chunk_size=chunk_size)[0]  # noqa: E731
        elif impl == "fkl-head":
            loss_fn = lambda s, t, m: generalized_jsd(s, t, m, 0.0, chunk_size=chunk_size, heads=(head, head))[0]  # noqa: E731
        else:
            logits_loss = loss_fn
            loss_fn = lambda s, t, m: logits_loss(linear(s, head.weight_Vd), linear(t, head.weight_Vd), m)  # noqa: E731
    warm_BTW = torch.zeros(1, 4, width, device=device, dtype=dtype, requires_grad=True)
    loss_fn(warm_BTW, warm_BTW, torch.ones(1, 4, dtype=torch.bool, device=device)).backward()  # loads code pages
    student_BTV = (torch.randn(1, T, width, generator=g, device=device, dtype=dtype)).requires_grad_(True)
    teacher_BTV = torch.randn(1, T, width, generator=g, device=device, dtype=dtype).requires_grad_(teacher_grad)
    mask_BT = torch.ones(1, T, dtype=torch.bool, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        reset_peak_rss()
        base = status_mb("VmRSS") * MIB
    t0 = time.perf_counter()
    loss = loss_fn(student_BTV, teacher_BTV, mask_BT)
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = status_mb("VmHWM") * MIB
    seconds = time.perf_counter() - t0
    input_mib = T * width * student_BTV.element_size() / MIB
    return {"impl": impl, "T": T, "V": V, "dtype": str(dtype).removeprefix("torch."), "device": device,
            "teacher_grad": teacher_grad, "input_mib": input_mib, "extra_mib": (peak - base) / MIB,
            "floor_mib": input_mib * (2 if teacher_grad else 1), "seconds": seconds, "loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="response tokens T")
    parser.add_argument("--vocab", type=int, default=151936, help="V (Qwen's: 151936)")
    parser.add_argument("--extrapolate-to", type=int, default=151936, help="also print extra memory scaled to this V")
    parser.add_argument("--M", type=int, default=20)
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="positions per chunk of the chunked losses")
    parser.add_argument("--impls", nargs="+", default=["topm", "full"], choices=["topm", "full", "head", "fkl-head"],
                        help="head, fkl-head: the LM head per chunk of positions (need --hidden)")
    parser.add_argument("--hidden", type=int, default=0,
                        help="d > 0: every case starts from (1, T, d) hidden states and a (V, d) LM head")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--teacher-grad", default="on", choices=["on", "off"],
                        help="teacher logits require grad (on: LOPD, the composer's gradient)")
    parser.add_argument("--case", action="store_true", help="(internal) run one case and print JSON")
    args = parser.parse_args()
    if args.case:
        result = run_case(args.impls[0], args.lengths[0], args.vocab, args.M, args.chunk_size, getattr(torch, args.dtype),
                          args.device, args.teacher_grad == "on", args.hidden)
        print(json.dumps(result))
        return
    scale = args.extrapolate_to / args.vocab
    print(f"device {args.device}, dtype {args.dtype}, batch 1, M={args.M}, chunk {args.chunk_size}, teacher grad {args.teacher_grad};"
          f" extra = peak beyond the inputs; floor = the inputs' gradients; MiB")
    if {"head", "fkl-head"} & set(args.impls) and not args.hidden:
        parser.error("--impls head and fkl-head need --hidden d")
    if args.hidden:
        print(f"inputs: hidden states (1, T, {args.hidden}) of student and teacher and a frozen ({args.vocab}, {args.hidden})"
              " LM head; full and topm make their logits inside the measurement")
    header = (f"| T | V | impl | input (B,T,{'d' if args.hidden else 'V'}) | extra | extra / input | floor | s fwd+bwd |"
              + (f" extra at V={args.extrapolate_to} (extrapolated) |" if scale != 1 else ""))
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for T in args.lengths:
        for impl in args.impls:
            cmd = [sys.executable, __file__, "--case", "--impls", impl, "--lengths", str(T), "--vocab",
                   str(args.vocab), "--M", str(args.M), "--chunk-size", str(args.chunk_size), "--dtype", args.dtype, "--device", args.device,
                   "--teacher-grad", args.teacher_grad, "--hidden", str(args.hidden)]
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                               env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MIB)}).stdout.splitlines()[-1])
            row = (f"| {T} | {args.vocab} | {impl} | {r['input_mib']:.0f} | {r['extra_mib']:.0f} |"
                   f" {r['extra_mib'] / r['input_mib']:.2f} | {r['floor_mib']:.0f} | {r['seconds']:.1f} |")
            scaled = "- (not linear in V: measure it) |" if impl.endswith("head") else f" {r['extra_mib'] * scale:.0f} |"
            print(row + (scaled if scale != 1 else ""), flush=True)


if __name__ == "__main__":
    main()
