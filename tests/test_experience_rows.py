"""A run's experience memory: tagged step rows, one-transaction append + embedding, stale-row removal."""
from __future__ import annotations

import json

from stages.core.data import experience_rows
from stages.core.data.retrieval import open_embeddings
from stages.core.data.store import ExperienceStore
from tests.test_coldstart import make_traj
from tests.test_index import HashEmbedder


def test_append_steps_then_drop_rows_after(tmp_path):
    store = ExperienceStore.open(tmp_path / "store")
    store.append([make_traj("other-run-row", 1, 2).model_copy(update={"run_id": "other"})])
    embedder = HashEmbedder()
    for step in (1, 2, 3):
        played = [make_traj(f"raw-{i}", i, step).model_copy(update={"run_id": "run"}) for i in range(2)]
        rows = experience_rows.tag_step_rows(played, "run", step)
        assert [r.trajectory_id for r in rows] == [experience_rows.step_row_id("run", step, i) for i in range(2)]
        assert all(json.loads(r.info)[experience_rows.STEP_KEY] == step for r in rows)
        assert played[0].trajectory_id == "raw-0"  # inputs untouched
        assert experience_rows.append_step(store, rows, embedder) == 2
    assert store.count() == 7 and open_embeddings(store).count_rows() == 7  # the older row embedded too
    assert experience_rows.drop_rows_after(store, "run", 1) == 4
    assert sorted(store.trajectory_ids()) == ["other-run-row", "run-000001-0000", "run-000001-0001"]
    assert open_embeddings(store).count_rows() == 3
    assert experience_rows.drop_rows_after(store, "run", 1) == 0
