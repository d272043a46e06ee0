"""Clocks, a matmul rate and the FLOP meter of ``benchmarks/bench_step.py``.

The meter counts the matmul FLOPs of a step where they run, one product at a time: every
``nn.Linear`` of the watched backbones and of LOPD's QFormer compressor, the LM head the
hidden-state losses apply per chunk, the QFormer's attention projections, and the backbones'
attention products (QK^T and PV over the causal query-key pairs, the cached keys included).
A product of (n x k) by (k x m) is 2 n k m FLOPs forward; when autograd records it, its backward
adds the input gradient (the same FLOPs) only when the input requires a gradient and the weight
gradient only when the weight is trained. So a backbone whose weights are frozen (a LoRA student,
the teacher reading trainable latents, the composer's encoder) costs 2x its forward when
backpropagated, not 3x, and its LoRA matrices cost 3x. Elementwise work (norms, softmax,
activations), embedding lookups, the optimizer and the forwards that activation checkpointing
repeats inside a backward pass are not counted: the count is what the step cannot do without.
"""
from __future__ import annotations

import contextlib
import functools
import time

import torch
from torch import nn

from stages.core.models.composer import base_model


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def now() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process), for differences."""
    return time.perf_counter(), time.process_time()


def since(t0: tuple[float, float]) -> tuple[float, float]:
    """Wall and CPU seconds since ``t0`` (from :func:`now`)."""
    wall, cpu = now()
    return wall - t0[0], cpu - t0[1]


def matmul_rate(device: str, dtype: str, n: int, seconds: float = 1.0) -> tuple[float, float]:
    """FLOP per wall second and per CPU second of an (n x n) @ (n x n) matmul in ``dtype`` on
    ``device`` (2 n^3 per product)."""
    a = torch.randn(n, n, device=device).to(getattr(torch, dtype))
    b = torch.randn(n, n, device=device).to(getattr(torch, dtype))
    a @ b
    sync(device)
    done, t0 = 0, now()
    while since(t0)[0] < seconds or done < 3:
        a @ b
        done += 1
        if done % 8 == 0:
            sync(device)
    sync(device)
    wall, cpu = since(t0)
    return 2 * n ** 3 * done / wall, 2 * n ** 3 * done / max(cpu, 1e-9)


def _in_backward() -> bool:
    """True inside a backward pass (an activation-checkpointing recompute runs there)."""
    return torch._C._current_graph_task_id() != -1


def _recorded() -> bool:
    """Whether autograd records the forward running now."""
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


class Meter:
    """Forward positions per backbone, exact matmul FLOPs and timed calls of the step's forwards.

    ``tokens[(part, trained)]`` counts the positions a watched backbone's decoder body ("body")
    and LM head ("head") compute (padding included), ``trained`` when autograd records the
    forward (the student, the composer encoder, LOPD's teacher) and not (rollouts, frozen
    teachers, the anchor composer). ``forward_flops`` and ``backward_flops`` are the exact count
    of the module docstring (a backward's FLOPs are counted when its forward runs).
    """

    def __init__(self, device: str):
        self.device = device
        self.tokens = {("body", True): 0, ("body", False): 0, ("head", True): 0, ("head", False): 0}
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # CPU seconds of the same calls
        self.forward_flops = self.backward_flops = 0.0
        self.params = {"body": 0, "head": 0}
        self._seen: set[int] = set()
        self._recomputing = False

    @contextlib.contextmanager
    def recomputing(self):
        """Within the block, forwards recompute what a forward without a graph computed before
        (LOPD's shared latents over several chunks: their backward runs the composer again):
        their positions and forward FLOPs are not counted again, their backward FLOPs are, as
        for an activation-checkpointing recompute."""
        self._recomputing = True
        try:
            yield
        finally:
            self._recomputing = False

    def watch(self, model: nn.Module) -> None:
        """Count ``model``'s decoder positions, attention products and every linear layer (its
        LoRA matrices included), once per backbone."""
        hf = base_model(model)
        if id(hf) in self._seen:
            return
        self._seen.add(id(hf))
        body, head = hf.get_decoder(), hf.get_output_embeddings()
        if not self.params["body"]:  # for the report: the matmul weights, not the embedding lookup
            self.params["body"] = sum(p.numel() for n, p in body.named_parameters()
                                      if "lora_" not in n and "embed_tokens" not in n)
            self.params["head"] = head.weight.numel()
        c = hf.config
        width = c.num_attention_heads * (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        body.register_forward_hook(functools.partial(self._body, c.num_hidden_layers, width), with_kwargs=True)
        head.register_forward_hook(self._head)
        for module in hf.modules():
            if isinstance(module, nn.Linear):
                module.register_forward_hook(self._linear)

    def watch_compressor(self, compressor: nn.Module) -> None:
        """Count a QFormer compressor's linear layers and attention (projections and products)."""
        for module in compressor.modules():
            if isinstance(module, nn.MultiheadAttention):
                module.register_forward_hook(self._attention)
            elif isinstance(module, nn.Linear):  # an attention's out_proj is never called as a module
                module.register_forward_hook(self._linear)

    def _add(self, forward: float, input_grad: bool, weight_grad: bool) -> None:
        """A matmul whose forward costs ``forward``; when autograd records it, its backward adds the
        same again for the input's gradient (``input_grad``) and for the weight's (``weight_grad``)."""
        if not self._recomputing:
            self.forward_flops += forward
        if _recorded():
            self.backward_flops += forward * (input_grad + weight_grad)

    def _body(self, layers: int, width: int, module, args, kwargs, output) -> None:
        x = args[0] if args else next(kwargs[k] for k in ("input_ids", "inputs_embeds") if kwargs.get(k) is not None)
        B, S = x.shape[:2]
        if not self._recomputing:
            self.tokens[("body", _recorded())] += B * S  # (B, S) ids, or (B, S, d) embeddings
        if _in_backward():
            return
        cache = next((kwargs[k] for k in ("past_key_values", "cache") if kwargs.get(k) is not None), None)
        past = int(cache.get_seq_length()) - S if cache is not None else 0  # the cache holds this call's keys already
        pairs = B * (S * past + S * (S + 1) // 2)  # query-key pairs under the causal mask
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        backward = hidden.requires_grad  # then the gradients of both operands of QK^T and PV
        self._add(layers * 4 * width * pairs, backward, backward)

    def _head(self, module, args, output) -> None:
        self.tokens[("head", _recorded())] += args[0].shape[:-1].numel()

    def _linear(self, module: nn.Linear, args, output) -> None:
        if not _in_backward():
            x = args[0]
            forward = 2 * module.weight.numel() * (x.numel() // module.in_features)
            self._add(forward, x.requires_grad, module.weight.requires_grad)

    def _attention(self, module: nn.MultiheadAttention, args, output) -> None:
        if _in_backward():
            return
        query, key = args[0], args[1]
        d = module.embed_dim
        (B, Lq), Lk = (query.shape[:2], key.shape[1]) if module.batch_first else (query.shape[1::-1], key.shape[0])
        w = (module.in_proj_weight if module.in_proj_weight is not None else module.q_proj_weight).requires_grad
        self._add(2 * 2 * d * d * B * Lq, query.requires_grad, w)  # the query's projection and the output's
        self._add(2 * d * (module.kdim + module.vdim) * B * Lk, key.requires_grad, w)  # key and value projections
        backward = output[0].requires_grad
        self._add(2 * 2 * d * B * Lq * Lk, backward, backward)  # scores and the weighted sum, every head

    def head_linear(self, fn):
        """``fn`` (``torch.nn.functional.linear`` as the hidden-state losses call it: the LM head on
        a chunk of supervised positions) counting its positions and FLOPs; the call that
        recomputes a chunk inside a backward pass is not counted."""
        @functools.wraps(fn)
        def wrapper(x, weight, bias=None):
            if not _in_backward():
                trained = _recorded() and (x.requires_grad or weight.requires_grad)
                self.tokens[("head", trained)] += x.shape[0]
                self._add(2 * weight.numel() * x.shape[0], x.requires_grad, weight.requires_grad)
            return fn(x, weight, bias)
        return wrapper

    def closed_form_head(self, fn):
        """``fn`` (a loss of one chunk from hidden states, its head matmuls and gradients in closed
        form: :func:`stages.core.losses.kd._forward_kl_rows` or
        ``stages.core.losses.head._topm_tail_rows``, whose last argument says which of the student
        and the teacher want a gradient) counting its positions and FLOPs as the autograd path's:
        both heads' forward, and each wanted gradient a head backward for the input's gradient."""
        @functools.wraps(fn)
        def wrapper(student_cd, teacher_cd, student_head, *rest):
            rows, matmul = student_cd.shape[0], 2 * student_head.weight_Vd.numel() * student_cd.shape[0]
            for wanted in rest[-1]:
                self.tokens[("head", wanted)] += rows
                self.forward_flops += matmul
                self.backward_flops += matmul * wanted
            return fn(student_cd, teacher_cd, student_head, *rest)
        return wrapper

    def timed(self, name: str, fn):
        """``fn`` with its wall time (device-synchronised) added to ``seconds[name]``, its CPU
        time to ``cpu[name]``."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            sync(self.device)
            t0 = now()
            out = fn(*args, **kwargs)
            sync(self.device)
            wall, cpu = since(t0)
            self.seconds[name] = self.seconds.get(name, 0.0) + wall
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu
            return out
        return wrapper

    def flops(self) -> float:
        """The matmul FLOPs counted so far, forward and backward (module docstring)."""
        return self.forward_flops + self.backward_flops

    def reset(self) -> None:
        self.tokens = dict.fromkeys(self.tokens, 0)
        self.seconds, self.cpu = {}, {}
        self.forward_flops = self.backward_flops = 0.0
