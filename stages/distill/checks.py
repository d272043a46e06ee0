"""The checks of `lopd distill` that need no model: they all run before any model loads and
before anything is written (run folder, store, logger files), so a run that cannot start
fails in a second with one line and leaves nothing that blocks the next try.

:func:`preflight` is called by :class:`stages.distill.recipe.Distiller` (rank 0 of a data-parallel
run checks the run folder and the store) and by ``lopd distill --nproc N`` before it starts
torchrun.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from schemas import Task
from stages.core.data.retrieval import check_serves
from stages.core.data.store import ExperienceStore, StoreError
from stages.core.exec import isolation
from stages.core.models.backbone import DEFAULT_MODEL, resolve_model
from stages.core.run import distributed, runs
from stages.core.run.sharding import check_shard
from stages.core.run.tracking import check_logger
from stages.distill.settings import DistillConfig
from stages.engines import check_engine
from stages.envs import make_env
from stages.leakage import check_train_tasks
from stages.methods import Method, get_method
from stages.plan import check_distill_memory

# Fields that may differ between a run and its --resume: they do not change the meaning of the
# finished steps (everything else must match). Paths are compared after resolving.
RESUMABLE = runs.RESUMABLE | {"log", "allow_overlap", "new_store", "compile_decode"}
PATH_FIELDS = {"store", "out", "composer", "data_dir"}


@dataclass
class Checked:
    """What :func:`preflight` found.

    Attributes:
        config: the settings, on the main process with ``run_id`` filled (the saved one, else a
            fresh ``distill-<12 hex>``).
        method: the class of ``config.method`` (:func:`stages.methods.get_method`).
        tasks: the environment's train tasks (non-empty).
        folder: the run folder check (:func:`stages.core.run.runs.open_run`); None off the main process.
    """

    config: DistillConfig
    method: type[Method]
    tasks: list[Task]
    folder: runs.RunFolder | None


def check_store(uri: str, new_store: bool) -> None:
    """Refuse a store that does not exist unless ``new_store`` (the run then makes it); an
    existing store is opened once (read only), so a damaged one fails here too.

    Raises:
        StoreError: one line naming the path and the flag that starts an empty store.
    """
    if new_store:
        return
    try:
        ExperienceStore.open(uri, create=False)
    except StoreError as err:
        if not str(err).startswith("no experience store"):
            raise
        raise StoreError(f"no experience store at {uri} (build one with lopd collect and lopd index, "
                         "or pass --new-store to start an empty one)") from None


def train_tasks(config: DistillConfig) -> list[Task]:
    """The environment's train tasks, checked against the evaluation benchmarks.

    Raises:
        EnvError: unknown environment or unreadable task files.
        ValueError: no train tasks; tasks an evaluation benchmark scores (without ``allow_overlap``).
    """
    data_dir = Path(config.data_dir) if config.data_dir else None
    probe = make_env(config.env, data_dir=data_dir, max_turns=config.max_turns, episode_rules=config.episode_rules)
    try:
        tasks = probe.tasks("train")
    finally:
        probe.close()
    if not tasks:
        raise ValueError(f"env {config.env}: no train tasks")
    check_train_tasks(config.env, tasks, data_dir, allow_overlap=config.allow_overlap)
    return tasks


def preflight(config: DistillConfig, world_size: int = 1, is_main: bool = True) -> Checked:
    """Every check of a distill run that needs no model, in the order a user fixes them: the
    ``--model`` name (a misspelt embedded name or missing folder, without hub access), the
    logger package, the rollout engine, isolation of model code (an env that runs it), the
    method's data-parallel split over ``world_size`` processes and its sharding (``--shard``),
    the environment's train tasks, on the main process the run folder (``out`` holds another run, or a resumed
    run changes a fixed setting) and the store, and last a step's planned memory against the
    free memory (:func:`stages.plan.check_distill_memory`). Nothing is written.

    ``config``'s method options are resolved against their files already
    (:func:`stages.distill.settings.settings`, :meth:`DistillConfig.resolved`).

    Raises:
        ValueError, StoreError, EnvError, FileNotFoundError, IsolationUnavailable: one line naming
            the flag, file or field to change.
    """
    if config.model != DEFAULT_MODEL:  # the embedded model resolves by converting it: a load, left to the run
        resolve_model(config.model)
    check_logger(config.log)
    check_engine(config.engine, config.temperature)
    isolation.prepare(config.env, unsafe_exec=False)  # an env that runs model code needs isolation or LOPD_UNSAFE_EXEC
    method_cls = get_method(config.method)
    distributed.check_split(distributed.World(size=world_size), method_cls, config.tasks_per_step)
    check_shard(config, world_size)
    tasks = train_tasks(config)
    folder = None
    if is_main:
        out = Path(config.out)
        saved = runs.saved_config(out)
        run_id = config.run_id or (saved or {}).get("run_id") or f"distill-{uuid.uuid4().hex[:12]}"
        config = config.model_copy(update={"run_id": run_id})
        folder = runs.open_run(out, "distill", config, resume=config.resume, may_change=RESUMABLE,
                               path_fields=PATH_FIELDS)
        check_store(config.store, config.new_store)
        if method_cls.retrieves and not config.new_store:  # every row would get no experience
            check_serves(ExperienceStore.open(config.store, create=False), [config.env], who=f"--method {config.method}",
                         allow_empty=True)  # an empty store fills with the run's own successes
    check_distill_memory(config, world_size)  # lopd plan's estimate against the free memory
    return Checked(config, method_cls, tasks, folder)
