"""The ``lopd index`` stage: embed new trajectories, then (re)build the retrieval indices.

Incremental: only trajectories without an embedding are embedded. Indices are rebuilt when
rows were added (or are missing): a cosine ANN index once the store holds ``ann_threshold``
embeddings (exact search below that), and a native full-text index on the embedded text.
"""
from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from stages.settings import DEFAULT_STORE


class IndexConfig(BaseModel):
    """Options of ``lopd index``: the flags, each described by its field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str = Field(DEFAULT_STORE, description="Experience store directory or URI (must exist).")
    embedder: str | None = Field(None, description=(
        "minilm (packaged all-MiniLM-L6-v2) or a sentence-transformers id/path; another than the store's needs "
        "--rebuild. (default: the store's, else minilm)"))
    field: Literal["task", "trajectory", "trace"] | None = Field(None, description=(
        "What to embed: task (the task text), trajectory (the transcript), or trace (task + observation-lite "
        "trace, searched with an instruction-prefixed task query: asymmetric, A.3). (default: the store's, else task)"))
    batch_size: int = Field(default=32, ge=1, description="Texts per embedder batch.")
    rows_per_write: int = Field(default=2048, ge=1, description="Embeddings per table append (one table version each).")
    ann_threshold: int = Field(default=10_000, ge=1, description=(
        "Build an ANN index from this many rows on (exact search below)."))
    max_chars: int = Field(default=4000, ge=1, description="Text length cut for --field trajectory and trace (characters).")
    rebuild: bool = Field(False, json_schema_extra={"flag": "--rebuild"}, description=(
        "Drop all embeddings and indexes first (to change embedder or field)."))
    progress: bool = Field(True, description="Show a progress bar (the summary table prints either way).")


class IndexReport(BaseModel):
    """What an index run did.

    Attributes:
        store, embedder, field: what was indexed, and how.
        embedded: rows embedded by this run.
        total: embedding rows in the store after the run.
        indices: indices present, e.g. ``["IVF_HNSW_SQ(vector)", "FTS(text)"]``.
        seconds: wall time of the run.
    """

    model_config = ConfigDict(frozen=True)

    store: str
    embedder: str
    field: str
    embedded: int
    total: int
    indices: list[str]
    seconds: float


def run(config: IndexConfig) -> IndexReport:
    """Embed the store's new trajectories and rebuild its indices.

    Raises:
        StoreError: the store does not exist, or it was indexed with another embedder/field
            and ``rebuild`` is not set.
    """
    # the store and embedder libraries load here, once the settings are valid (a refusal stays fast)
    from stages.core.data.retrieval import (
        build_indices, drop_embeddings, embeddings_info, index_new, load_embedder, open_embeddings,
    )
    from stages.core.data.store import ExperienceStore

    start = time.perf_counter()
    store = ExperienceStore.open(config.store, create=False)
    info = None if config.rebuild else embeddings_info(store)
    # the embedder loads before a rebuild drops anything: a bad --embedder leaves the store as it was
    embedder = load_embedder(config.embedder or (info.embedder if info else None),
                             batch_size=config.batch_size)
    if config.rebuild:
        drop_embeddings(store)
    field = config.field or (info.field if info else "task")
    with Progress(TextColumn("embedding"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), disable=not config.progress, transient=True) as bar:
        task = bar.add_task("embed", total=None)
        embedded = index_new(
            store, embedder, field=field, batch_size=config.batch_size,
            rows_per_write=config.rows_per_write, max_chars=config.max_chars,
            on_progress=lambda done, total: bar.update(task, completed=done, total=total))
    table = open_embeddings(store)
    indices = build_indices(table, config.ann_threshold, changed=embedded > 0) if table else []
    if store.count():
        store.index_ids()  # fast lookups of the retrieved trajectories
    report = IndexReport(store=store.uri, embedder=embedder.name, field=field,
                         embedded=embedded, total=table.count_rows() if table else 0,
                         indices=indices, seconds=round(time.perf_counter() - start, 3))
    summary = Table(title=f"index {store.uri}")  # printed with or without the progress bar
    for col in ("embedded now", "rows indexed", "embedder", "field", "indexes", "wall s"):
        summary.add_column(col)
    summary.add_row(str(report.embedded), str(report.total), report.embedder, report.field,
                    ", ".join(report.indices) or "exact search only", f"{report.seconds:.1f}")
    Console().print(summary)
    return report
