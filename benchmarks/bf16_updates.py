"""Do bfloat16 runs keep small updates? Three reproductions on SmolLM2-135M, on the CPU (bf16 there
is the arithmetic of a GPU run, slower):

1. ``lopd sft`` (full fine-tuning, lr 5e-5, batch 4) for 2 steps in float32 and in bfloat16 on the
   same synthetic warm-start rows: of the weight entries the float32 run moves, the fraction that
   the bfloat16 run leaves where it started, and the cosine of the two runs' updates.
2. A full fine-tuning EMA teacher (:func:`stages.core.models.assembly.frozen_teacher_copy` of the
   student :func:`stages.core.models.assembly.load_student` gives, moved by
   :func:`stages.core.models.assembly.ema_update_`) after 20 steps at each method's rate (SDPO
   0.05, SDFT 0.01, OPSD 0.001), the student moving 1% of each weight per step: the fraction of
   the entries a float64 EMA moves that stay put.
3. The composer (:class:`stages.core.models.composer.Composer`, default settings) on the backbone
   in the run dtype, one AdamW step at distill's default lr 1e-5 on a fixed random projection of its
   latents:
   the fraction of compressor entries the float32 run moves that the bfloat16 run does not.

Usage (about 15 minutes on one busy core)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/bf16_updates.py [--only sft|ema|composer]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from rich.console import Console

from schemas import Message, ToolCall, Trajectory, Turn
from stages import sft
from stages.core.data.store import ExperienceStore
from stages.core.models.assembly import ema_update_, frozen_teacher_copy, load_student
from stages.core.models.backbone import load_policy
from stages.core.models.composer import Composer

MODEL = "smollm2-135m"


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def _stuck(moved_ref: torch.Tensor, delta: torch.Tensor) -> float:
    """Fraction of the entries where ``moved_ref`` is True whose ``delta`` is exactly 0."""
    return float((moved_ref & (delta == 0)).sum()) / max(int(moved_ref.sum()), 1)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def _trajectory(i: int) -> Trajectory:
    a, b = 3 + i, 11 + 2 * i
    call = ToolCall(name="add", arguments=json.dumps({"a": a, "b": b}))
    action1 = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    action2 = f"The sum of {a} and {b} is {a + b}."
    messages = [Message(role="system", content="You are a helpful assistant with an add tool."),
                Message(role="user", content=f"What is {a}+{b}? Use the add tool."),
                Message(role="assistant", content=action1, tool_calls=[call]),
                Message(role="tool", content=str(a + b), name="add"), Message(role="assistant", content=action2)]
    return Trajectory(trajectory_id=f"ref-{i}", task_id=f"add-{i}", env="toy", split="warmup",
                      prompt=messages[1].content, policy="reference", messages=messages,
                      turns=[Turn(action=action1, tool_calls=[call], observation=str(a + b), action_tokens=30),
                             Turn(action=action2, action_tokens=12)],
                      reward=1.0, success=True, num_steps=2, num_tool_calls=1, run_id="bench",
                      info=json.dumps({"tools": []}))


def sft_updates(work: Path) -> dict[str, float]:
    store = work / "store"
    ExperienceStore.open(str(store)).append([_trajectory(i) for i in range(8)])
    initial = _flat(load_policy(MODEL, dtype="float32", device="cpu")[0])
    deltas = {}
    for dtype in ("float32", "bfloat16"):
        folder = sft.run(sft.SftConfig(store=str(store), out=str(work / dtype), steps=2, device="cpu", dtype=dtype),
                         Console(quiet=True))
        final = load_policy(str(folder), dtype="float32", device="cpu")[0]
        # a student saved in bf16 started from the bf16 rounding of the initial weights
        start = initial.to(torch.bfloat16).double() if _saved_dtype(folder) == "bfloat16" else initial
        deltas[dtype] = _flat(final) - start
    moved = deltas["float32"] != 0
    return {"sft_moved_entries_fp32": int(moved.sum()),
            "sft_stuck_fraction_bf16": _stuck(moved, deltas["bfloat16"]),
            "sft_update_cosine": _cosine(deltas["float32"], deltas["bfloat16"])}


def _saved_dtype(folder: Path) -> str:
    config = json.loads((Path(folder) / "config.json").read_text())
    return config.get("dtype") or config.get("torch_dtype")


def ema_teachers() -> dict[str, float]:
    result = {}
    for name, rate in (("sdpo", 0.05), ("sdft", 0.01), ("opsd", 0.001)):
        student = load_student(MODEL, 0, None, device="cpu", dtype="bfloat16")[0]
        teacher = frozen_teacher_copy(student)
        reference = [p.detach().double().clone() for p in student.parameters()]
        start = _flat(teacher)
        with torch.no_grad():
            for _ in range(20):
                for p in student.parameters():  # the student moves 1% of each weight per step
                    p.add_(p.abs() * 0.01)
                ema_update_(teacher, student, rate)
                for r, p in zip(reference, student.parameters()):
                    r.mul_(1 - rate).add_(p.double(), alpha=rate)
        moved = torch.cat([r.flatten() for r in reference]) != start
        result[f"ema_{name}_{rate}_stuck_fraction"] = _stuck(moved, _flat(teacher) - start)
        result["ema_teacher_dtype"] = str(next(teacher.parameters()).dtype)
    return result


def composer_updates() -> dict[str, float]:
    deltas, dtypes = {}, {}
    for dtype in ("float32", "bfloat16"):
        backbone = load_policy(MODEL, dtype=dtype, device="cpu")[0]
        torch.manual_seed(0)
        composer = Composer(backbone)
        params = list(composer.compressor.parameters())
        start = torch.cat([p.detach().double().flatten() for p in params])
        optimizer = torch.optim.AdamW(composer.trainable_parameters(), lr=1e-5, weight_decay=0.0)
        ids = torch.randint(100, 20000, (3, 64), generator=torch.Generator().manual_seed(1))
        latents = composer.encode(ids, torch.ones_like(ids, dtype=torch.bool)).float()
        target = torch.randn(latents.shape, generator=torch.Generator().manual_seed(2))
        (latents * target).sum().backward()  # a squared norm after the LayerNorm readout would be constant
        optimizer.step()
        deltas[dtype] = torch.cat([p.detach().double().flatten() for p in params]) - start
        dtypes[dtype] = str(params[0].dtype)
    moved = deltas["float32"] != 0
    return {"composer_compressor_dtype_bf16_run": dtypes["bfloat16"],
            "composer_stuck_fraction_bf16": _stuck(moved, deltas["bfloat16"]),
            "composer_update_cosine": _cosine(deltas["float32"], deltas["bfloat16"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("sft", "ema", "composer"))
    only = parser.parse_args().only
    result: dict[str, float] = {}
    if only in (None, "composer"):
        result.update(composer_updates())
    if only in (None, "ema"):
        result.update(ema_teachers())
    if only in (None, "sft"):
        with tempfile.TemporaryDirectory() as work:
            result.update(sft_updates(Path(work)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
