"""One registry style for the named parts of lopd: methods, environments, benchmarks, engines and
latent placements.

A :class:`Registry` maps a name to its implementation (a class, a factory or an instance). An
implementation is added with :meth:`Registry.add` or the :meth:`Registry.register` decorator;
one that lives in a module imported only when needed is named in ``modules`` (name -> module
path: the module registers it when imported). Looking up an unknown name raises the registry's
error, whose message lists the known names.
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


# The names other trainers (transformers' TrainingArguments, TRL, verl) and torch give to lopd's
# settings and values, which spelling distance does not find ('learning_rate' is far from 'lr').
USUAL_NAMES = {
    "learning_rate": "lr", "lr_rate": "lr", "max_steps": "steps", "num_steps": "steps", "total_steps": "steps",
    "train_steps": "steps", "per_device_train_batch_size": "micro_batch", "micro_batch_size": "micro_batch",
    "train_batch_size": "batch_size", "max_grad_norm": "grad_clip", "gradient_clipping": "grad_clip",
    "clip_grad_norm": "grad_clip", "output_dir": "out", "save_steps": "checkpoint_every",
    "save_total_limit": "keep_checkpoints", "gradient_checkpointing": "activation_checkpointing",
    "model_name_or_path": "model", "model_name": "model", "torch_dtype": "dtype", "lora_r": "lora_rank",
    "max_length": "max_len", "max_seq_length": "max_len", "max_completion_length": "max_new_tokens",
    "num_generations": "group_size", "seed_value": "seed", "resume_from_checkpoint": "resume",
    "report_to": "log", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16",
    "float": "float32", "double": "float64",
}


def did_you_mean(key: object, names: Iterable[str]) -> str:
    """``"did you mean 'bfcl'? "`` for the name of ``names`` that ``key`` usually means
    (:data:`USUAL_NAMES`, e.g. ``learning_rate`` -> ``lr``) or else is closest to (difflib),
    else ``""`` (also for a ``key`` that is no string, e.g. a number read from a config file)."""
    if not isinstance(key, str):
        return ""
    names = sorted(names)
    usual = USUAL_NAMES.get(key.lower().replace("-", "_"))
    close = [usual] if usual in names else difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


class Registry(Mapping[str, T], Generic[T]):
    """Name -> implementation, read like a dict (``registry[name]``, ``in``, ``items()``).

    Args:
        what: what a name names, as the error message says it (``"method"``, ``"--env"``).
        error: the exception class an unknown name raises (default ValueError).
        modules: names whose implementation a module registers when imported (lazy entries).
        load: called once before the first lookup (e.g. imports a package whose modules
            register themselves).
        unknown: the message of an unknown name, formatted with ``name`` (repr), ``known``
            (the names, comma-separated) and ``hint`` (``"did you mean 'bfcl'? "`` for the
            closest known name, else empty); default ``unknown <what> <name> (known: <known>)``.
        sort: list the known names sorted (else in the order they were added).
    """

    def __init__(self, what: str, *, error: type[Exception] = ValueError, modules: Mapping[str, str] | None = None,
                 load: Callable[[], object] | None = None, unknown: str | None = None, sort: bool = True):
        self.what = what
        self.error = error
        self._modules = dict(modules or {})
        self._load = load
        self._unknown = unknown or "unknown {what} {name} ({hint}known: {known})"
        self._sort = sort
        self._entries: dict[str, T] = {}

    def add(self, name: str, impl: T) -> T:
        """Register ``impl`` under ``name`` (a later entry of the same name replaces it); returns it."""
        self._entries[name] = impl
        return impl

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""
        return lambda impl: self.add(name, impl)

    def names(self) -> list[str]:
        """The known names (sorted, unless the registry keeps the order they were added in)."""
        self._loaded()
        names = list(dict.fromkeys([*self._entries, *self._modules]))
        return sorted(names) if self._sort else names

    def get_or_raise(self, name: str) -> T:
        """The implementation of ``name``.

        Raises:
            the registry's error: an unknown name (the message lists the known ones).
        """
        self._loaded()
        if name not in self._entries and name in self._modules:
            importlib.import_module(self._modules[name])
        if name not in self._entries:
            raise self.error(self._unknown.format(what=self.what, name=repr(name), known=", ".join(self.names()),
                                                  hint=did_you_mean(name, self.names())))
        return self._entries[name]

    def _loaded(self) -> None:
        if self._load is not None:
            self._load()

    def __getitem__(self, name: str) -> T:
        return self.get_or_raise(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
