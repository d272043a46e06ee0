"""Arrow schema derivation and the ExperienceStore (local folder, no network)."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

import lancedb
import pyarrow as pa
import pytest
from pydantic import BaseModel

from schemas.arrow import arrow_schema, from_row, schema_diff, to_rows
from schemas.trajectory import Message, ToolCall, Trajectory, Turn
from stages.core.data.store import ExperienceStore, StoreError


def make_traj(tid: str, task_id: str = "t0", *, env: str = "code", split: str = "train",
              success: bool = True, run_id: str = "r1", prompt: str = "do it") -> Trajectory:
    return Trajectory(
        trajectory_id=tid, task_id=task_id, env=env, split=split, prompt=prompt, policy="tiny",
        messages=[Message(role="user", content=prompt),
                  Message(role="assistant", tool_calls=[ToolCall(name="f", arguments='{"x": 1}')]),
                  Message(role="tool", content="ok", name="f")],
        turns=[Turn(action='f(x=1)', tool_calls=[ToolCall(name="f", arguments='{"x": 1}')],
                    observation="ok", action_tokens=5)],
        reward=1.0 if success else 0.0, success=success, num_steps=1, num_tool_calls=1,
        run_id=run_id, created_at=datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc),
    )


# The Trajectory table schema is a contract with every store on disk: changing it needs a
# migration, so this snapshot must only change deliberately.
TOOL_CALL = "struct<name: string not null, arguments: string not null>"
EXPECTED_TRAJECTORY_COLUMNS = {
    "trajectory_id": "string", "task_id": "string", "env": "string", "split": "string",
    "prompt": "string", "policy": "string",
    "messages": f"list<item: struct<role: string not null, content: string not null, "
                f"tool_calls: list<item: {TOOL_CALL} not null> not null, name: string> not null>",
    "turns": f"list<item: struct<action: string not null, tool_calls: list<item: {TOOL_CALL} "
             f"not null> not null, observation: string not null, action_tokens: int64 not null, "
             f"token_ids: list<item: int64 not null> not null, logprobs: list<item: double not null> "
             f"not null, finish_reason: string not null, context_ids: list<item: int64 not null> not null, "
             f"context_restart: bool not null> not null>",
    "reward": "double", "success": "bool", "num_steps": "int64", "num_tool_calls": "int64",
    "run_id": "string", "git_commit": "string", "created_at": "timestamp[us, tz=UTC]",
    "info": "string", "tokenizer": "string",
}


def test_trajectory_schema_is_stable():
    schema = arrow_schema(Trajectory)
    assert {f.name: str(f.type) for f in schema} == EXPECTED_TRAJECTORY_COLUMNS
    assert not any(f.nullable for f in schema)


def test_arrow_schema_mapping_and_errors():
    class Inner(BaseModel):
        x: int

    class Model(BaseModel):
        s: str
        f: float
        b: bool
        opt: int | None = None
        lit: Literal["a", "b"]
        inner: Inner
        items: list[Inner | None]

    schema = arrow_schema(Model)
    assert schema.field("f").type == pa.float64() and schema.field("b").type == pa.bool_()
    assert schema.field("opt").nullable and not schema.field("s").nullable
    assert schema.field("lit").type == pa.string()
    assert schema.field("inner").type == pa.struct([pa.field("x", pa.int64(), nullable=False)])
    assert schema.field("items").type.value_field.nullable

    class Bad(BaseModel):
        d: dict[str, int]

    class BadUnion(BaseModel):
        u: int | str

    with pytest.raises(TypeError, match=r"Bad\.d"):
        arrow_schema(Bad)
    with pytest.raises(TypeError, match="only `X | None`"):
        arrow_schema(BadUnion)


def test_round_trip_table_and_store(tmp_path):
    trajs = [make_traj("a"), make_traj("b", success=False)]
    table = to_rows(trajs)
    assert table.schema.equals(arrow_schema(Trajectory))
    assert [from_row(Trajectory, r) for r in table.to_pylist()] == trajs

    store = ExperienceStore.open(tmp_path / "store")
    assert store.append(trajs) == 2
    reopened = ExperienceStore.open(tmp_path / "store", create=False)
    assert reopened.get(["b", "a"]) == [trajs[1], trajs[0]]


def test_schema_drift_is_reported(tmp_path):
    drifted = pa.schema([f for f in arrow_schema(Trajectory) if f.name not in ("info", "reward")]
                        + [pa.field("reward", pa.string(), nullable=False)])
    lancedb.connect(tmp_path / "old").create_table("trajectories", schema=drifted)
    with pytest.raises(StoreError) as err:
        ExperienceStore.open(tmp_path / "old")
    message = str(err.value)
    assert "info: missing" in message and "reward: expected double" in message
    assert "\n" not in message
    assert schema_diff(arrow_schema(Trajectory), arrow_schema(Trajectory)) == []


def test_open_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file, expected a directory"):
        ExperienceStore.open(tmp_path / "file")
    with pytest.raises(StoreError, match="no experience store"):
        ExperienceStore.open(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


def test_append_is_atomic_and_validated(tmp_path):
    store = ExperienceStore.open(tmp_path / "s")
    before = len(store.versions())
    good = make_traj("a").model_dump()
    bad = make_traj("b").model_dump() | {"reward": 2.0}
    with pytest.raises(StoreError, match=r"^row 1: field 'reward': "):
        store.append([good, bad])
    assert store.count() == 0 and len(store.versions()) == before

    assert store.append([good, make_traj("c")]) == 2
    assert len(store.versions()) == before + 1
    with pytest.raises(StoreError, match="row 1: trajectory_id 'a' already in store"):
        store.append([make_traj("d"), make_traj("a")])
    with pytest.raises(StoreError, match="duplicate trajectory_id 'e' in batch"):
        store.append([make_traj("e"), make_traj("e")])
    assert store.count() == 2
    assert store.append([]) == 0


def test_filters_quoting_and_order(tmp_path):
    store = ExperienceStore.open(tmp_path / "s")
    store.append([
        make_traj("1", "t1", env="o'brien"),
        make_traj("2", "t2", env="code", success=False),
        make_traj("3", "t3", env="code", split="test", run_id="r2"),
        make_traj("4", "t1", env="code"),
    ])
    assert store.count() == 4
    assert store.count(env="o'brien") == 1
    assert store.count(success=False) == 1
    assert store.count(env="code", success=True) == 2
    assert store.count(task_ids={"t1", "t3"}) == 3
    assert store.count(task_ids=set()) == 0
    assert [t.trajectory_id for t in store.query(split="test")] == ["3"]
    assert [t.trajectory_id for t in store.query(env="code")] == ["2", "3", "4"]
    assert len(store.query(limit=2)) == 2
    assert store.task_ids() == {"t1", "t2", "t3"}
    assert store.task_ids(run_id="r2") == {"t3"}
    assert store.task_ids(env="o'brien") == {"t1"}
    assert [t.trajectory_id for t in store.get(["4", "1"])] == ["4", "1"]
    with pytest.raises(StoreError, match="1 trajectory id\\(s\\) not found: nope"):
        store.get(["1", "nope"])


def test_versions_have_timestamps(tmp_path):
    store = ExperienceStore.open(tmp_path / "s")
    store.append([make_traj("a")])
    store.append([make_traj("b")])
    versions = store.versions()
    assert [v["version"] for v in versions] == sorted(v["version"] for v in versions)
    assert all(isinstance(v["timestamp"], datetime) for v in versions)
    assert versions[-1]["version"] - versions[-3]["version"] == 2
