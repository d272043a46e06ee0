"""One writer per trajectory id: concurrent appends of the same ids (two processes racing, a
writer killed with SIGKILL while it holds the append lock, two handles in one process, an
object-storage store) commit each id once and leave the store openable."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from stages.core.data.store import APPEND_LOCK, ExperienceStore, StoreError
from tests.test_store import make_traj

ROOT = Path(__file__).resolve().parents[1]
N = 20

# A writer process: opens the store, prints "ready", waits for the start file to exist, appends N
# trajectories with the ids of the test (the same in every writer), prints "ok" or the StoreError. With a `hold`
# argument its table's add() prints "holding" and sleeps while the append lock is held:
# "before" = before the commit, "after" = after it.
WRITER = textwrap.dedent("""
    import sys, time
    from stages.core.data.store import ExperienceStore, StoreError
    from tests.test_store import make_traj
    import os
    uri, start, hold = sys.argv[1], sys.argv[2], sys.argv[3]
    store = ExperienceStore.open(uri)
    if hold != "none":
        real = store.table.add
        def add(data, *args, **kwargs):
            if hold == "after":
                real(data, *args, **kwargs)
            print("holding", flush=True)
            time.sleep(600)
        store.table.add = add
    rows = [make_traj(f"id-{i}", task_id=f"t{i}") for i in range(%d)]
    print("ready", flush=True)
    while not os.path.exists(start):
        time.sleep(0.001)
    try:
        store.append(rows)
        print("ok", flush=True)
    except StoreError as err:
        print("StoreError:", err, flush=True)
""" % N)


def _writer(uri: Path, start: Path, hold: str = "none") -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(uri), str(start), hold], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ids(uri: Path) -> list[str]:
    return ExperienceStore.open(uri, create=False).trajectory_ids()


def test_two_processes_racing_the_same_ids_commit_each_once(tmp_path):
    uri = tmp_path / "store"
    ExperienceStore.open(uri)
    start = tmp_path / "start"
    writers = [_writer(uri, start) for _ in range(2)]
    for w in writers:
        assert w.stdout.readline().strip() == "ready", w.stderr.read()
    start.touch()  # both append from now on
    outputs = [w.communicate(timeout=120) for w in writers]
    results = sorted((out.strip().splitlines()[-1] for out, _ in outputs), key=lambda r: r != "ok")
    assert all(w.returncode == 0 for w in writers), [err for _, err in outputs]
    assert results[0] == "ok" and results[1].startswith("StoreError:") and "already in store" in results[1]
    ids = _ids(uri)
    assert len(ids) == N and sorted(set(ids)) == sorted(f"id-{i}" for i in range(N))
    assert ExperienceStore.open(uri).count() == N


@pytest.mark.parametrize("hold", ["before", "after"])
def test_a_writer_killed_holding_the_lock_leaves_one_copy(tmp_path, hold):
    """A writer SIGKILLed inside its append (before or after its commit) releases the lock: the
    waiting append goes on, and the store opens with each id once."""
    uri = tmp_path / "store"
    ExperienceStore.open(uri)
    start = tmp_path / "start"
    start.touch()
    holder = _writer(uri, start, hold)
    assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
    assert holder.stdout.readline().strip() == "holding", holder.stderr.read()
    assert (uri / APPEND_LOCK).is_file()
    outcome: list[BaseException | int] = []

    def second_append() -> None:
        try:
            outcome.append(ExperienceStore.open(uri).append([make_traj(f"id-{i}", task_id=f"t{i}") for i in range(N)]))
        except StoreError as err:
            outcome.append(err)

    waiter = threading.Thread(target=second_append)
    waiter.start()
    waiter.join(timeout=1.5)
    assert waiter.is_alive() and not outcome  # blocked on the holder's lock
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    waiter.join(timeout=60)
    assert not waiter.is_alive() and len(outcome) == 1
    if hold == "before":  # the killed writer committed nothing: the waiting one writes the rows
        assert outcome[0] == N
    else:  # the killed writer's commit stands: the waiting one finds the ids taken
        assert isinstance(outcome[0], StoreError) and "already in store" in str(outcome[0])
    ids = _ids(uri)
    assert len(ids) == N and len(set(ids)) == N


def test_two_handles_in_one_process_and_threads(tmp_path):
    uri = tmp_path / "store"
    stores = [ExperienceStore.open(uri) for _ in range(4)]
    rows = [make_traj(f"id-{i}", task_id=f"t{i}") for i in range(N)]
    results: list[object] = []
    barrier = threading.Barrier(len(stores))

    def run(store: ExperienceStore) -> None:
        barrier.wait()
        try:
            results.append(store.append(rows))
        except StoreError as err:
            results.append(err)

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert sorted(map(str, results)).count(str(N)) == 1
    assert sum(isinstance(r, StoreError) for r in results) == len(stores) - 1
    assert sorted(_ids(uri)) == sorted(t.trajectory_id for t in rows)


def test_object_storage_merge_insert_skips_ids_already_there():
    """No file lock on object storage: the merge-insert on trajectory_id writes each id once."""
    store = ExperienceStore.open("memory://writers")
    store.append([make_traj("a"), make_traj("b")])
    with pytest.raises(StoreError, match="trajectory_id 'b' already in store"):
        store.append([make_traj("c"), make_traj("b")])
    assert sorted(store.trajectory_ids()) == ["a", "b"]
    # another writer (its own table handle) commits "d" between this append's check and its commit
    real_lookup, other = store._lookup, store.db.open_table("trajectories")

    def racing_lookup(ids, columns=None):
        found = real_lookup(ids, columns)
        if "d" in ids:
            row = store.table.search().where("trajectory_id = 'a'").limit(1).to_arrow()
            other.add(row.set_column(row.schema.get_field_index("trajectory_id"), "trajectory_id", pa.array(["d"])))
        return found

    store._lookup = racing_lookup
    with pytest.raises(StoreError, match="1 of 2 trajectory ids were appended by another writer"):
        store.append([make_traj("d"), make_traj("e")])
    assert sorted(store.trajectory_ids()) == ["a", "b", "d", "e"]
