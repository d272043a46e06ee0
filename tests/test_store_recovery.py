"""A store whose newest data file is deleted, truncated or overwritten: one error line, then
`lopd store versions` / `lopd store restore` bring back the earlier rows with LanceDB's versioning."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages import store_admin
from stages.core.data.store import ExperienceStore, StoreCorruptError, StoreError
from tests.test_store import make_traj

runner = CliRunner()
DAMAGES = ["delete", "truncate", "garbage"]


def _data_files(store: Path) -> set[str]:
    return set(os.listdir(store / "trajectories.lance" / "data"))


def damaged_store(root: Path, damage: str) -> Path:
    """A store with rows a1, a2 (version 2) and b1 (version 3) whose version-3 data file is damaged."""
    path = root / f"store-{damage}"
    store = ExperienceStore.open(path)
    store.append([make_traj("a1", "t1"), make_traj("a2", "t2")])
    before = _data_files(path)
    store.append([make_traj("b1", "t3")])
    (newest,) = _data_files(path) - before
    file = path / "trajectories.lance" / "data" / newest
    if damage == "delete":
        file.unlink()
    elif damage == "truncate":
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    else:
        file.write_bytes(b"\x00garbage!" * (file.stat().st_size // 9 + 1))
    return path


def error_lines(output: str) -> list[str]:
    """The lines of CLI output that report an error."""
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("damage", DAMAGES)
def test_open_names_store_table_and_recovery(tmp_path, damage):
    path = damaged_store(tmp_path, damage)
    with pytest.raises(StoreCorruptError) as info:
        ExperienceStore.open(path, create=False)
    msg = str(info.value)
    assert "\n" not in msg and f"store {path}: table 'trajectories' is unreadable" in msg
    assert f"`lopd store restore --store {path}`" in msg
    if damage == "delete":
        assert "is missing" in msg
    # create=True must not paper over the damage either
    with pytest.raises(StoreCorruptError):
        ExperienceStore.open(path)


@pytest.mark.parametrize("damage", DAMAGES)
def test_stages_print_one_line(tmp_path, damage):
    path = damaged_store(tmp_path, damage)
    for args in (["index", "--store", str(path)],
                 ["coldstart", "--experiences", str(path), "--out", str(tmp_path / "cs")]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
        lines = error_lines(res.output)
        assert len(lines) == 1 and str(path) in lines[0] and "'trajectories'" in lines[0], res.output
        assert "lopd store restore" in lines[0] and "Traceback" not in res.output
    assert not (tmp_path / "cs").exists()


@pytest.mark.parametrize("damage", DAMAGES)
def test_restore_brings_back_the_earlier_rows(tmp_path, damage):
    path = damaged_store(tmp_path, damage)
    files_before = _data_files(path)

    listed = runner.invoke(app, ["store", "versions", "--store", str(path)])
    assert listed.exit_code == 0, listed.output
    versions = store_admin.list_versions(str(path))
    assert [(v.version, v.rows, v.readable) for v in versions] == [(1, 0, True), (2, 2, True), (3, 3, False)]
    assert all(v.timestamp is not None for v in versions) and "store restore" in listed.output

    bad = runner.invoke(app, ["store", "restore", "--store", str(path), "--version", "3"])
    assert bad.exit_code == 2 and len(error_lines(bad.output)) == 1 and "unreadable" in bad.output

    res = runner.invoke(app, ["store", "restore", "--store", str(path)])
    assert res.exit_code == 0, res.output
    assert "restored to version 2 (2 rows" in res.output and "as new version 4" in res.output
    assert "3 (3 rows, unreadable)" in res.output

    store = ExperienceStore.open(path, create=False)
    assert store.trajectory_ids() == ["a1", "a2"]
    assert [v["version"] for v in store.versions()] == [1, 2, 3, 4]  # history kept
    assert _data_files(path) == files_before  # nothing deleted
    store.append([make_traj("c1", "t4")])  # the store is writable again
    assert ExperienceStore.open(path).trajectory_ids() == ["a1", "a2", "c1"]

    again = store_admin.restore(str(path))
    assert again.restored is None and "nothing restored" in again.message()


def test_restore_a_chosen_version_and_errors(tmp_path):
    path = damaged_store(tmp_path, "delete")
    result = store_admin.restore(str(path), version=1)
    assert result.restored.version == 1 and result.new_version == 4
    assert ExperienceStore.open(path).count() == 0
    with pytest.raises(StoreError, match="has no version 9"):
        store_admin.restore(str(path), version=9)
    with pytest.raises(StoreError, match=r"no experience store at"):
        store_admin.list_versions(str(tmp_path / "nope"))
    with pytest.raises(StoreError, match=r"no table 'embeddings' \(tables: trajectories\)"):
        store_admin.list_versions(str(path), "embeddings")


def test_healthy_store_is_untouched(tmp_path):
    store = ExperienceStore.open(tmp_path / "s")
    store.append([make_traj("a1")])
    res = runner.invoke(app, ["store", "restore", "--store", str(tmp_path / "s")])
    assert res.exit_code == 0 and "nothing restored" in res.output
    assert [v["version"] for v in store.versions()] == [1, 2]
