"""Retrieval quality of the index fields on a BFCL store: which one finds useful experiences.

For every successful trajectory of the store (one query per task), the top 3 experiences of
OTHER tasks are retrieved (as LOPD's cold start does) and scored:

- function hit@3: some retrieved experience calls a function the query's own trajectory calls;
- category precision@3: share of retrieved experiences of the query's BFCL category (simple,
  multiple, parallel, parallel_multiple: the shape of the call to write).

Fields compared (``lopd index --field``): ``task`` (task text on both sides, symmetric) and
``trace`` (documents: task + observation-lite trace; queries: the task after an instruction
prompt; A.3 of the LOPD paper). Each is indexed into a copy of the store; the store itself is
not touched.

Usage: ``PYTHONPATH=. python benchmarks/retrieval_quality.py --store runs/study-bfcl-cpu-prep/store``
(the study's reference store: ``examples/study/run.sh`` makes it). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from stages.core.data.retrieval import Retriever
from stages.core.data.store import ExperienceStore
from stages.index import IndexConfig, run


def _functions(traj) -> set[str]:
    return {c.name for m in traj.messages if m.role == "assistant" for c in m.tool_calls}


def _category(task_id: str) -> str:
    return task_id.rsplit("_", 1)[0]


def score(store_dir: Path, field: str) -> dict[str, float]:
    """Index a copy of ``store_dir`` with ``field`` and score every query; returns the metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(store_dir, copy)
        t0 = time.perf_counter()
        run(IndexConfig(store=str(copy), field=field, rebuild=True, progress=False))
        index_s = time.perf_counter() - t0
        store = ExperienceStore.open(copy)
        trajs = [t for t in store.get(store.trajectory_ids()) if t.success]
        queries = list({t.task_id: t for t in trajs}.values())
        retriever = Retriever(store)
        hits = same_category = returned = 0
        t0 = time.perf_counter()
        for q in queries:
            found = retriever.retrieve(q.prompt, 3, env=q.env, exclude_task_ids={q.task_id})
            hits += any(_functions(e.trajectory) & _functions(q) for e in found)
            same_category += sum(_category(e.trajectory.task_id) == _category(q.task_id) for e in found)
            returned += len(found)
        query_s = time.perf_counter() - t0
    return {"queries": len(queries), "function_hit@3": hits / len(queries),
            "category_precision@3": same_category / max(returned, 1),
            "index_s": index_s, "ms_per_query": 1000 * query_s / len(queries)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--fields", nargs="+", default=["task", "trace"])
    args = parser.parse_args()
    print("| field | queries | function hit@3 | category precision@3 | index s | ms / query |")
    print("|---|---|---|---|---|---|")
    for field in args.fields:
        m = score(args.store, field)
        print(f"| {field} | {m['queries']} | {m['function_hit@3']:.3f} | {m['category_precision@3']:.3f} "
              f"| {m['index_s']:.0f} | {m['ms_per_query']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
