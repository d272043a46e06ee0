"""Experiment logging of a training run through a real logger: TensorBoard or Weights & Biases.

``metrics.jsonl`` in the run folder is always written (it is what `lopd report` and resume read);
a logger is an extra copy for the tools researchers already watch. :func:`check_logger` runs
before any model loads, so a missing package costs nothing and leaves no run folder behind.

W&B runs offline (files under ``OUT/wandb``, `wandb sync` later) unless ``WANDB_MODE`` is set or
``WANDB_API_KEY`` is present: a training node without network never blocks on a login.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any, Literal

Logger = Literal["none", "tensorboard", "wandb"]
LOGGERS: tuple[str, ...] = ("none", "tensorboard", "wandb")
# per logger: (the pip extra, the modules that must import); torch ships torch.utils.tensorboard,
# whose SummaryWriter imports the separate `tensorboard` package
_PACKAGE = {"tensorboard": ("tensorboard", ("tensorboard", "torch.utils.tensorboard")), "wandb": ("wandb", ("wandb",))}


def check_logger(kind: str) -> None:
    """Raise a one-line ``ValueError`` when logger ``kind``'s package is not importable.

    Raises:
        ValueError: unknown ``kind``, or its package is missing (names the extra to install).
    """
    if kind not in LOGGERS:
        raise ValueError(f"log {kind!r}: choose one of {', '.join(LOGGERS)}")
    if kind == "none":
        return
    extra, modules = _PACKAGE[kind]
    for module in modules:  # imported here, so that a broken install fails before any model loads too
        try:
            importlib.import_module(module)
        except ImportError as err:
            found = _findable(module)
            raise ValueError(f"--log {kind} needs the `{extra}` package"
                             + (f" (installed, but importing {module} fails: {err})" if found else "")
                             + f": pip install -e '.[{extra}]' (or --log none; metrics.jsonl is written either way)"
                             ) from None


def _findable(module: str) -> bool:
    """Whether ``module`` can be found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None
        return False


class RunLogger:
    """Scalars (and sample rollouts) of each step to the chosen logger; ``kind="none"`` does nothing.

    Args:
        kind: one of :data:`LOGGERS`.
        out: the run folder (TensorBoard writes ``out/tensorboard``, W&B ``out/wandb``).
        run_id: the run's name (W&B run id, so a resumed run appends to the same W&B run).
        settings: the run's settings (W&B config).
        prefix: scalar name prefix, e.g. ``distill``.

    Raises:
        ValueError: see :func:`check_logger`.
    """

    def __init__(self, kind: str, out: Path, run_id: str, settings: dict[str, Any], prefix: str) -> None:
        check_logger(kind)
        self.kind, self.prefix, self._sink = kind, prefix, None
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._sink = SummaryWriter(str(Path(out) / "tensorboard"))
        elif kind == "wandb":
            import wandb

            mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            (Path(out) / "wandb").mkdir(parents=True, exist_ok=True)
            self._sink = wandb.init(project=os.environ.get("WANDB_PROJECT", "lopd"), name=run_id, id=run_id,
                                    resume="allow", dir=str(out), mode=mode, config=settings)

    def log(self, row: dict[str, Any], step: int) -> None:
        """Log the numeric entries of ``row`` at ``step``."""
        scalars = {f"{self.prefix}/{k}": float(v) for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.kind == "tensorboard":
            for k, v in scalars.items():
                self._sink.add_scalar(k, v, step)
            self._sink.flush()
        elif self.kind == "wandb":
            self._sink.log(scalars, step=step)

    def log_samples(self, samples: list[dict[str, Any]], markdown: str, step: int) -> None:
        """Log a step's sample rollouts: TensorBoard gets ``markdown`` as the text summary
        ``PREFIX/samples``, W&B a table ``PREFIX/samples`` with one row per sample (the step and
        each sample's values; keys of the first sample are the columns)."""
        if not samples:
            return
        if self.kind == "tensorboard":
            self._sink.add_text(f"{self.prefix}/samples", markdown, step)
            self._sink.flush()
        elif self.kind == "wandb":
            import wandb

            columns = ["step", *samples[0]]
            table = wandb.Table(columns=columns, data=[[step, *(s.get(c) for c in columns[1:])] for s in samples])
            self._sink.log({f"{self.prefix}/samples": table}, step=step)

    def close(self) -> None:
        """Flush and close the logger."""
        if self.kind == "tensorboard":
            self._sink.close()
        elif self.kind == "wandb":
            self._sink.finish()
