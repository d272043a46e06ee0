"""Device and dtype of a whole distill step (issue 19): the models, the losses and every tensor the
project's code creates during a step follow the run's ``--device`` / ``--dtype``.

The step runs on the CPU in float64: a hard-coded float32 (a ``torch.float32`` literal, a
``.float()``, a factory without ``dtype=`` that defaults to float32) shows up as a float32 tensor.
On the CPU a tensor made without ``device=`` lands on the right device by luck, so the watcher
also refuses every tensor factory called from ``stages/`` without an explicit ``device=``: that is
the tensor that would stay on the CPU on a GPU. (A real run with ``device="meta"`` cannot work:
the step reads values back, ``.item()`` / ``.tolist()`` / ``nonzero``, which meta tensors do not
have.)
"""
from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._pytree import tree_flatten

import stages
from stages.distill.recipe import DistillConfig, Distiller
from tests.test_distill import ENV, _hash_embedder, assets  # noqa: F401 (fixtures)

STAGES_DIR = str(Path(stages.__file__).parent)
TORCH_DIR = Path(torch.__file__).parent
# torch's Python shims between a caller and the op (their caller is the one that asked for it)
SHIMS = {str(TORCH_DIR / f) for f in ("overrides.py", "_tensor.py", "functional.py", "nn/functional.py",
                                      "_jit_internal.py", "utils/_device.py")}
FACTORIES = _device_constructors()


class StepWatch(TorchFunctionMode):
    """Every torch call made directly from ``stages/`` code that makes a tensor without
    ``device=`` (a factory), off ``device``, or of a floating dtype other than ``dtype`` that none
    of its inputs had (a cast or a literal: transformers' ``generate`` hands logits processors
    float32 scores whatever the model's dtype; the project's code keeps what it is given), is
    recorded with file and line."""

    def __init__(self, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.device, self.dtype = device, dtype
        self.problems: set[str] = set()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename in SHIMS:
            frame = frame.f_back
        if frame is None or not frame.f_code.co_filename.startswith(STAGES_DIR):
            return out
        self.calls += 1
        where = f"{Path(frame.f_code.co_filename).relative_to(STAGES_DIR)}:{frame.f_lineno}"
        name = getattr(func, "__name__", str(func))
        if func in FACTORIES and "device" not in kwargs:
            self.problems.add(f"{where}: torch.{name} without device=")
        given = {t.dtype for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            if t.device != self.device:
                self.problems.add(f"{where}: {name} made a tensor on {t.device}")
            if t.is_floating_point() and t.dtype not in (self.dtype, *given):
                self.problems.add(f"{where}: {name} made a {t.dtype} tensor")
        return out


def _config(assets, tmp_path, method: str) -> DistillConfig:
    model_dir, composer_dir, store_template = assets
    shutil.copytree(store_template, tmp_path / "store")
    values = dict(method=method, env=ENV, store=str(tmp_path / "store"), out=str(tmp_path / method),
                  model=str(model_dir), lr=1e-2, steps=1, tasks_per_step=2, group_size=2, max_new_tokens=8,
                  temperature=1.0, student_lora_rank=4, micro_batch=2, max_len=256, run_id=f"{method}-f64",
                  device="cpu", dtype="float64")
    if method == "lopd":
        values.update(composer=str(composer_dir), J=2, K=4, M=5)
    return DistillConfig(**values).resolved()


@pytest.mark.parametrize("method", ["lopd", "grpo", "opsd"])
def test_a_float64_step_keeps_every_tensor_on_the_models_dtype_and_device(assets, tmp_path, method):
    trainer = Distiller(_config(assets, tmp_path, method))
    device, dtype = torch.device("cpu"), torch.float64
    method_ = trainer.method
    modules = {"student": trainer.student.model}
    for name in ("composer", "anchor", "reference"):  # LOPD's phi and phi_0, GRPO's KL reference
        if getattr(method_, name, None) is not None:
            modules[name] = getattr(method_, name)
    if hasattr(method_, "teacher"):  # OPSD's frozen teacher (the student's backbone, adapters off)
        modules["teacher"] = method_.teacher.model
    for name, module in modules.items():
        params = list(module.parameters()) + list(getattr(module, "backbone", module).parameters())
        assert {(p.device, p.dtype) for p in params} == {(device, dtype)}, name

    losses = []
    loss_of = method_.loss

    def recorded_loss(*args, **kwargs):
        loss, metrics = loss_of(*args, **kwargs)
        losses.append(loss)
        return loss, metrics

    method_.loss = recorded_loss
    watch = StepWatch(device, dtype)
    with watch:
        row = trainer.train_step(1)
    assert watch.calls > 100  # the watcher saw the step's own torch calls
    assert sorted(watch.problems) == [], "\n".join(sorted(watch.problems))
    assert losses and all((loss.device, loss.dtype) == (device, dtype) for loss in losses)
    assert row["action_tokens"] > 0 and math.isfinite(row["loss"])
    state = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and {(v.device, v.dtype) for v in state} == {(device, dtype)}  # AdamW moments


def test_the_watcher_sees_a_cast_to_float32_and_a_factory_without_device():
    """The check can fail: calls made from stages/ code that break the rules are reported, the
    same calls made elsewhere are not."""
    watch = StepWatch(torch.device("cpu"), torch.float64)
    x = torch.ones(3, dtype=torch.float64)
    source = "y = x.float() * 2\nz = torch.ones(2, dtype=torch.float64)\nw = torch.log_softmax(y, 0)\n"
    with watch:
        exec(compile(source, "tests/elsewhere.py", "exec"), {"torch": torch, "x": x})
    assert watch.problems == set() and watch.calls == 0
    with watch:
        exec(compile(source, f"{STAGES_DIR}/fake.py", "exec"), {"torch": torch, "x": x})
    assert watch.problems == {"fake.py:1: float made a torch.float32 tensor",
                              "fake.py:2: torch.ones without device="}  # line 3 keeps the float32 it got
