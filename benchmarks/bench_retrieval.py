"""Benchmark the retrieval table: add + index throughput, top-3 latency, ANN recall@3.

Synthetic data, no model: 384-d unit vectors drawn around 256 random centres (real sentence
embeddings are clustered; uniform random vectors in 384-d are all nearly equidistant, which
makes ANN recall meaningless). Queries are fresh draws around the same centres. The tables use
the production ``embeddings`` schema, index and query settings of :mod:`stages.core.data.retrieval`.

Usage: ``PYTHONPATH=. python benchmarks/bench_retrieval.py [--sizes 1000 10000 100000] [--queries 100]``.
Prints a markdown table.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from typing import get_args

import numpy as np
import pyarrow as pa

from stages.core.data.retrieval import (
    ANN_INDEX_TYPE,
    AnnIndex,
    create_ann_index,
    embeddings_schema,
    vector_query,
)
from stages.core.data.store import ExperienceStore

DIM = 384
CENTRES = 256


def clustered(rng: np.random.Generator, centres: np.ndarray, n: int, noise: float) -> np.ndarray:
    """``n`` unit vectors, each a random centre plus Gaussian noise, float32 (n, DIM)."""
    x = centres[rng.integers(0, len(centres), n)] + noise * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def rows_table(vectors: np.ndarray, offset: int) -> pa.Table:
    """Embeddings-table rows for ``vectors`` with ids ``offset..``."""
    n = len(vectors)
    ids = [f"traj{offset + i:07d}" for i in range(n)]
    return pa.table({
        "trajectory_id": ids, "task_id": ids, "env": ["bench"] * n, "split": ["train"] * n,
        "success": [True] * n, "reward": [1.0] * n, "run_id": ["bench"] * n,
        "text": [f"task {i}" for i in ids],
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM),
        "embedder": ["synthetic"] * n, "field": ["task"] * n,
    }, schema=embeddings_schema(DIM))


def top3(table, queries: np.ndarray, exact: bool) -> tuple[list[list[str]], list[float]]:
    """Top-3 ids and per-query latency (ms) for each query."""
    results, latencies = [], []
    for q in queries:
        start = time.perf_counter()
        search = vector_query(table, q, 3, exact).select(["trajectory_id"])
        ids = search.to_arrow().column("trajectory_id").to_pylist()
        latencies.append(1000 * (time.perf_counter() - start))
        results.append(ids)
    return results, latencies


def bench(n: int, n_queries: int, rng: np.random.Generator, root: str, index_type: str) -> dict:
    """One row of the result table for a store of ``n`` vectors."""
    centres = rng.standard_normal((CENTRES, DIM))
    vectors = clustered(rng, centres, n, noise=0.6)
    queries = clustered(rng, centres, n_queries, noise=0.6)
    store = ExperienceStore.open(f"{root}/store{n}")
    table = store.db.create_table("embeddings", schema=embeddings_schema(DIM))
    start = time.perf_counter()
    for lo in range(0, n, 10_000):
        table.add(rows_table(vectors[lo:lo + 10_000], lo))
    add_s = time.perf_counter() - start
    exact_ids, exact_ms = top3(table, queries, exact=True)
    start = time.perf_counter()
    create_ann_index(table, index_type)
    index_s = time.perf_counter() - start
    ann_ids, ann_ms = top3(table, queries, exact=False)
    recall = np.mean([len(set(a) & set(e)) / 3 for a, e in zip(ann_ids, exact_ids)])
    return {"rows": n, "add_rows_s": n / add_s, "index_s": index_s,
            "add_index_rows_s": n / (add_s + index_s),
            "exact_ms": (np.median(exact_ms), np.percentile(exact_ms, 95)),
            "ann_ms": (np.median(ann_ms), np.percentile(ann_ms, 95)), "recall": recall}


def main() -> None:
    """Run the benchmark for each size and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--index-type", choices=get_args(AnnIndex), default=ANN_INDEX_TYPE)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"ANN index: {args.index_type}, cosine; {args.queries} queries, top-3\n")
    print("| rows | add rows/s | ANN build s | add+build rows/s | exact p50 / p95 ms "
          "| ANN p50 / p95 ms | ANN recall@3 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as root:
        for n in args.sizes:
            r = bench(n, args.queries, rng, root, args.index_type)
            print(f"| {r['rows']:,} | {r['add_rows_s']:,.0f} | {r['index_s']:.2f} "
                  f"| {r['add_index_rows_s']:,.0f} | {r['exact_ms'][0]:.1f} / {r['exact_ms'][1]:.1f} "
                  f"| {r['ann_ms'][0]:.1f} / {r['ann_ms'][1]:.1f} | {r['recall']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
