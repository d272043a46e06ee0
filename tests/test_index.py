"""Embedding, indexing and retrieval (hashing embedder in-process; one MiniLM test, offline)."""
from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from stages import index as index_stage
from stages.core.data import retrieval  # index_stage.run loads its embedder from here
from stages.core.data.embedders import MiniLMEmbedder
from stages.core.data.retrieval import (
    QUERY_PROMPT,
    Embedder,
    Retriever,
    build_indices,
    index_text,
    index_new,
    observation_lite,
    open_embeddings,
    query_text,
)
from stages.core.data.store import ExperienceStore, StoreError
from tests.test_store import make_traj


class HashEmbedder:
    """Deterministic bag-of-words embedder: each word hashed (md5) to one of ``dim`` buckets."""

    name = "hash-bow"

    def __init__(self, dim: int = 512):
        self.dim = dim
        self.calls = 0

    def embed(self, texts: list[str], role: str = "text") -> np.ndarray:
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


# (trajectory_id, task_id, prompt, success); similarity to QUERY decreases down the list.
QUERY = "alpha beta gamma delta"
ROWS = [
    ("t-a", "task1", "alpha beta gamma delta", True),
    ("t-b", "task2", "alpha beta gamma zeta", True),
    ("t-c", "task3", "alpha beta kappa zeta", True),
    ("t-d", "task4", "alpha lambda kappa zeta", True),
    ("t-e", "task1", "alpha beta gamma delta", False),
    ("t-f", "task5", "omega sigma tau", True),
]


@pytest.fixture
def store(tmp_path):
    store = ExperienceStore.open(tmp_path / "store")
    store.append([make_traj(tid, task, prompt=prompt, success=ok) for tid, task, prompt, ok in ROWS])
    return store


@pytest.fixture
def indexed(store, monkeypatch):
    monkeypatch.setattr(retrieval, "load_embedder", lambda name, batch_size: HashEmbedder())
    index_stage.run(index_stage.IndexConfig(store=store.uri, progress=False))
    return store


def ids(experiences):
    return [e.trajectory.trajectory_id for e in experiences]


def test_hash_embedder_satisfies_protocol():
    assert isinstance(HashEmbedder(), Embedder)


def test_ordering_by_similarity(indexed):
    got = Retriever(indexed, HashEmbedder()).retrieve(QUERY, 4)
    assert ids(got) == ["t-a", "t-b", "t-c", "t-d"]
    assert [e.rank for e in got] == [0, 1, 2, 3]
    assert got[0].score == pytest.approx(1.0, abs=1e-5)
    assert got[0].score > got[1].score > got[2].score > got[3].score


def test_success_filter(indexed):
    retriever = Retriever(indexed, HashEmbedder())
    assert "t-e" not in ids(retriever.retrieve(QUERY, 6))
    with_failures = retriever.retrieve(QUERY, 2, success_only=False)
    # t-a and t-e are identical prompts: the tie is broken by trajectory_id.
    assert ids(with_failures) == ["t-a", "t-e"]


def test_exclusion_by_id_and_task(indexed):
    retriever = Retriever(indexed, HashEmbedder())
    assert ids(retriever.retrieve(QUERY, 2, exclude_ids={"t-a"})) == ["t-b", "t-c"]
    got = retriever.retrieve(QUERY, 3, success_only=False, exclude_task_ids={"task1", "task2"})
    assert ids(got) == ["t-c", "t-d", "t-f"]
    assert retriever.retrieve(QUERY, 3, env="other") == []
    with pytest.raises(ValueError, match="task_text is empty"):
        retriever.retrieve("  ", 3)


def test_fts_and_hybrid_top_hit(indexed):
    retriever = Retriever(indexed, HashEmbedder())
    assert ids(retriever.retrieve("lambda", 1, mode="fts")) == ["t-d"]
    assert ids(retriever.retrieve("sigma tau", 1, mode="hybrid")) == ["t-f"]
    assert "t-d" not in ids(retriever.retrieve("lambda", 3, mode="fts", exclude_ids={"t-d"}))


def test_incremental_index_and_new_rows_retrievable(store, monkeypatch):
    embedder = HashEmbedder()
    monkeypatch.setattr(retrieval, "load_embedder", lambda name, batch_size: embedder)
    config = index_stage.IndexConfig(store=store.uri, progress=False, ann_threshold=4)
    first = index_stage.run(config)
    assert (first.embedded, first.total, embedder.calls) == (len(ROWS), len(ROWS), len(ROWS))
    assert "FTS(text)" in first.indices and any("vector" in i for i in first.indices)
    assert index_stage.run(config).embedded == 0

    store.append([make_traj("t-new", "task9", prompt="omega psi chi"),
                  make_traj("t-new2", "task9", prompt="psi chi")])
    assert index_new(store, embedder) == 2
    assert embedder.calls == len(ROWS) + 2
    got = Retriever(store, embedder).retrieve("omega psi chi", 1)
    assert ids(got) == ["t-new"]
    assert open_embeddings(store).count_rows() == len(ROWS) + 2


def test_no_progress_hides_the_bar_only_the_summary_still_prints(store, monkeypatch, capsys):
    monkeypatch.setattr(retrieval, "load_embedder", lambda name, batch_size: HashEmbedder())
    report = index_stage.run(index_stage.IndexConfig(store=store.uri, progress=False))
    out = capsys.readouterr().out
    assert "rows indexed" in out and report.embedder in out and "FTS(text)" in out
    assert "embedding" not in out  # the bar's label


def test_no_embeddings_errors(store):
    with pytest.raises(StoreError, match=r"has no embeddings: run `lopd index --store .*` first"):
        Retriever(store, HashEmbedder())
    table_store = store
    index_new(table_store, HashEmbedder())
    with pytest.raises(StoreError, match="no full-text index"):
        Retriever(table_store, HashEmbedder()).retrieve(QUERY, 1, mode="fts")
    assert build_indices(open_embeddings(table_store)) == ["FTS(text)"]


def test_embedder_mismatch_is_refused(indexed):
    class Other(HashEmbedder):
        name = "other"

    with pytest.raises(StoreError, match="made with 'hash-bow', not 'other'"):
        Retriever(indexed, Other())
    with pytest.raises(StoreError, match="--rebuild"):
        index_new(indexed, Other())


def test_minilm_semantics():
    embedder = MiniLMEmbedder()
    vectors = embedder.embed(["book a flight to Paris", "reserve a plane ticket to Paris",
                              "sort a list of integers"])
    assert vectors.shape == (3, embedder.dim) == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_field_change_needs_rebuild(indexed):
    config = index_stage.IndexConfig(store=indexed.uri, progress=False, field="trajectory")
    with pytest.raises(StoreError, match="--rebuild"):
        index_stage.run(config)
    report = index_stage.run(config.model_copy(update={"rebuild": True}))
    assert (report.field, report.embedded, report.total) == ("trajectory", len(ROWS), len(ROWS))
    assert index_stage.run(index_stage.IndexConfig(store=indexed.uri, progress=False)).field == "trajectory"
    top = Retriever(indexed, HashEmbedder()).retrieve("reward=1.000 lambda", 1, mode="fts")
    assert ids(top) == ["t-d"]


class RecordingEmbedder(HashEmbedder):
    """HashEmbedder that remembers every text it embedded."""

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []

    def embed(self, texts, role="text"):
        self.texts += texts
        return super().embed(texts)


def test_trace_field_is_asymmetric_and_query_embeddings_are_cached(store, monkeypatch):
    """A.3 of the LOPD paper: documents = task + observation-lite trace, queries = the task after
    an instruction prompt; a task's query embedding is computed once."""
    traj = make_traj("x", prompt="Weather in Paris?")
    turn = traj.turns[0].model_copy(update={"observation": "sunny,\n  21 degrees " + "x" * 300})
    traj = traj.model_copy(update={"turns": [turn]})
    text = index_text(traj, "trace")
    assert text == observation_lite(traj)
    task, step = text.split("\n")
    assert task == "Task: Weather in Paris?"
    assert step.startswith("1. f(x=1) -> sunny, 21 degrees x") and len(step) == len("1. f(x=1) -> ") + 120
    assert index_text(traj, "task") == "Weather in Paris?"
    assert query_text("Weather?", "trace") == QUERY_PROMPT + "Weather?" and query_text("Weather?", "task") == "Weather?"

    docs = RecordingEmbedder()
    monkeypatch.setattr(retrieval, "load_embedder", lambda name, batch_size: docs)
    index_stage.run(index_stage.IndexConfig(store=store.uri, field="trace", progress=False))
    assert len(docs.texts) == len(ROWS) and all(t.startswith("Task: ") and "\n1. f(x=1) -> ok" in t for t in docs.texts)
    queries = RecordingEmbedder()
    retriever = Retriever(store, queries)
    for _ in range(3):
        got = retriever.retrieve(QUERY, 2, exclude_task_ids={"task1"})
    assert ids(got) == ["t-b", "t-c"]
    assert queries.texts == [QUERY_PROMPT + QUERY]  # embedded once, with the instruction


def test_index_adds_a_trajectory_id_index_and_later_rows_are_still_found(indexed):
    indices = indexed.table.list_indices()
    assert any(i.columns == ["trajectory_id"] and i.index_type == "BTree" for i in indices), indices
    indexed.append([make_traj("late", "task9", prompt="alpha late")])
    assert [t.trajectory_id for t in indexed.get(["late", "t-a"])] == ["late", "t-a"]


def test_a_bad_embedder_is_one_line_and_a_rebuild_with_it_drops_nothing(indexed, monkeypatch, tmp_path):
    """The embedder loads before --rebuild drops the embeddings: a path that does not exist, or
    a folder that is no model, fails with one line and the store keeps its index."""
    monkeypatch.undo()  # the real load_embedder
    for bad in (str(tmp_path / "nope"), str(tmp_path)):
        config = index_stage.IndexConfig(store=indexed.uri, progress=False, embedder=bad, rebuild=True)
        with pytest.raises(FileNotFoundError, match=f"--embedder '{re.escape(bad)}'") as err:
            index_stage.run(config)
        assert "\n" not in str(err.value)
        assert open_embeddings(indexed).count_rows() == len(ROWS)


def test_indexing_again_with_nothing_new_writes_no_version(indexed, monkeypatch):
    """A second `lopd index` (a rerun of `make demo` with nothing to do) leaves both tables' versions."""
    monkeypatch.setattr(retrieval, "load_embedder", lambda name, batch_size: HashEmbedder())
    before = (len(indexed.versions()), retrieval.open_embeddings(indexed).version)
    index_stage.run(index_stage.IndexConfig(store=indexed.uri, progress=False))
    assert (len(ExperienceStore.open(indexed.uri, create=False).versions()),
            retrieval.open_embeddings(indexed).version) == before
    indexed.append([make_traj("t-new", "task9", prompt="alpha omega", success=True)])
    assert indexed.index_ids() is True and indexed.index_ids() is False  # new rows: the ids index again, once
