"""What retrieval served: a store holding nothing retrievable for the tasks is refused naming the
commands that make it (evaluate --composer, distill of a retrieving method); an evaluation says
how many tasks got experiences; LOPD's metrics rows count them per step."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from stages.core.data.retrieval import check_serves
from stages.core.data.store import ExperienceStore, StoreError
from stages.engines.latent import LatentEngine
from tests.test_coldstart import make_traj


def _store(path, env: str):
    store = ExperienceStore.open(path)
    store.append([make_traj(f"t{i}", i, i + 1).model_copy(update={"env": env}) for i in range(3)]
                 + [make_traj("f", 9, 9, success=False).model_copy(update={"env": env})])
    return store


def test_a_store_of_another_env_serves_none_and_is_refused_with_the_commands(tmp_path):
    store = _store(tmp_path / "s", "toy")
    assert check_serves(store, ["toy"], who="--composer c") == {"toy": 3}
    with pytest.raises(StoreError, match=rf"^store {store.uri} serves none of the tasks of --composer c: it holds no "
                                         r"successful train trajectory of env bfcl \(its successful train trajectories "
                                         rf"by env: toy 3\); make them with `lopd collect --env bfcl --split train "
                                         rf"--store {store.uri}` .*`lopd index --store {store.uri}`"):
        check_serves(store, ["bfcl"], who="--composer c")
    with pytest.raises(StoreError, match="holds no successful train trajectory of env bfcl"):
        check_serves(store, ["bfcl"], who="--method lopd", allow_empty=True)  # not empty: another run's store
    empty = ExperienceStore.open(tmp_path / "empty")
    assert check_serves(empty, ["bfcl"], who="--method lopd", allow_empty=True) == {"bfcl": 0}
    with pytest.raises(StoreError, match="by env: none"):
        check_serves(empty, ["bfcl"], who="--composer c")


def test_the_evaluation_note_counts_tasks_with_and_without_experiences():
    engine = SimpleNamespace(retrieved={"a": ["x", "y", "z"], "b": ["x"], "c": []},
                             composer=SimpleNamespace(hparams={"J": 3}))
    assert LatentEngine.retrieval_note(engine) == "retrieval: experiences for 2 of 3 tasks (1.3 per task, J=3; 1 task got none)"
    engine.retrieved = {"a": ["x"]}
    assert LatentEngine.retrieval_note(engine) == "retrieval: experiences for 1 of 1 tasks (1.0 per task, J=3)"
