"""The experience memory of a training run: the rows a run appends to its store, step by step.

Store consistency (the choice made for self-evolving memory): step N's trajectories are tagged
with the run id, ``info["distill_step"] = N`` (:data:`STEP_KEY`) and deterministic ids
``<run_id>-<N>-<i>`` (:func:`tag_step_rows`), then appended in ONE store transaction at the end
of step N and, when the run's method retrieves (LOPD), embedded (:func:`append_step`; the
other methods leave them for ``lopd index``); the checkpoint of step N (if any) is written
after that append. On resume from checkpoint C, :func:`drop_rows_after` deletes this run's
rows (and their embeddings) of steps > C, so the store holds exactly the rows it held when
checkpoint C was written and the replayed steps never duplicate rows. Rows of other runs are
never touched. A kill between the append and the embedding leaves rows without embeddings:
the next embedding :func:`append_step` (or ``index_new``) embeds them.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from schemas import Trajectory

if TYPE_CHECKING:  # retrieval loads transformers and the store lancedb: imported where rows are written
    from stages.core.data.retrieval import Embedder, IndexField
    from stages.core.data.store import ExperienceStore

STEP_KEY = "distill_step"


def step_row_id(run_id: str, step: int, index: int) -> str:
    """Deterministic trajectory id of the ``index``-th row appended at ``step`` of a run."""
    return f"{run_id}-{step:06d}-{index:04d}"


def tag_step_rows(trajectories: Sequence[Trajectory], run_id: str, step: int) -> list[Trajectory]:
    """Copies of a step's trajectories with deterministic ids and ``info[STEP_KEY] = step``.

    Args:
        trajectories: the step's rows, in their (deterministic) rollout order.
        run_id: the training run's id.
        step: 1-based step number.

    Returns:
        New Trajectory objects (the inputs are not modified); the i-th gets
        :func:`step_row_id` ``(run_id, step, i)``.

    Raises:
        json.JSONDecodeError: a trajectory's ``info`` is not a JSON object string.
    """
    return [t.model_copy(update={"trajectory_id": step_row_id(run_id, step, i),
                                 "info": json.dumps({**json.loads(t.info), STEP_KEY: step})})
            for i, t in enumerate(trajectories)]


def append_step(store: ExperienceStore, trajectories: Sequence[Trajectory], embedder: Embedder | None, *,
                field: IndexField = "task") -> int:
    """Append a step's trajectories in one transaction, then embed every unembedded row.

    Args:
        trajectories: rows tagged with :func:`tag_step_rows`.
        embedder: the store's embedder, or None: append without embedding (``index_new`` later);
            field: the indexed field (see ``index_new``).

    Returns:
        The number of rows appended.

    Raises:
        StoreError: an invalid or repeated row (nothing is appended), or embeddings of another
            embedder / field in the store.
    """
    added = store.append(trajectories)
    if embedder is not None:
        from stages.core.data.retrieval import index_new

        index_new(store, embedder, field=field)
    return added


def drop_rows_after(store: ExperienceStore, run_id: str, step: int) -> int:
    """Delete run ``run_id``'s trajectories (and embeddings) of steps > ``step``.

    Rows are recognised by ``info[STEP_KEY]``; other runs' rows are never touched.

    Returns:
        The number of trajectories deleted.
    """
    stale = [t.trajectory_id for t in store.query(run_id=run_id)
             if json.loads(t.info).get(STEP_KEY, 0) > step]
    if stale:
        from stages.core.data.retrieval import open_embeddings
        from stages.core.data.store import sql_in

        where = sql_in("trajectory_id", stale)
        embeddings = open_embeddings(store)
        if embeddings is not None:  # embeddings first: a crash here leaves rows to re-embed
            embeddings.delete(where)
        store.table.delete(where)
    return len(stale)
