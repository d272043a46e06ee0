"""The experience store: trajectories in a LanceDB database (local folder or object storage).

Table ``trajectories`` has exactly the schema :func:`schemas.arrow.arrow_schema` derives from
:class:`schemas.trajectory.Trajectory`. Every :meth:`ExperienceStore.append` is one Lance
transaction, i.e. one table version (see :meth:`ExperienceStore.versions`). Sibling tables
(the ``embeddings`` table of :mod:`stages.core.data.retrieval`) live in the same database.

The connection is opened with ``read_consistency_interval=0``: every read sees the latest
committed version, also when another process or another table handle has written since.

One writer per trajectory id: an append checks its ids and commits while it holds an exclusive
``flock`` on the store's ``.append.lock`` file (local stores), so two processes appending the
same ids cannot both commit them. The kernel releases the lock when its holder dies, also by
SIGKILL, and a Lance commit is atomic: a killed writer leaves its batch committed whole or not
at all. Object-storage stores (no file locks) append with LanceDB's merge-insert on
``trajectory_id`` (insert only the ids not present at commit time).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import ValidationError

from schemas.arrow import arrow_schema, from_row, schema_diff, to_rows
from schemas.trajectory import Trajectory

if TYPE_CHECKING:  # lancedb loads where a store opens: a missing store is refused without it (seconds)
    import lancedb

# lancedb warns on every fork once loaded; our forks (sandbox, environment workers) exec a fresh
# interpreter at once and never touch lancedb's state in the child.
warnings.filterwarnings("ignore", message="lancedb fork support is experimental", category=RuntimeWarning)

TRAJECTORIES = "trajectories"
# the lock file every append of a local store holds (flock), next to the tables
APPEND_LOCK = ".append.lock"
# Ids per `IN (...)` clause when looking rows up by id.
_ID_CHUNK = 1000


class StoreError(Exception):
    """A problem with the experience store; the message is one line naming the store/row/field."""


class StoreCorruptError(StoreError):
    """A table whose data files are missing or damaged; `lopd store restore` can bring back an
    earlier, readable version (the message names the store, the table and the command)."""


def lance_failure(err: BaseException) -> str | None:
    """A short reason when ``err`` is Lance failing to read a table's files, else ``None``.

    Lance reports a deleted data file as ``RuntimeError('lance error: Not found: <path>, ...')``,
    a truncated one as ``RuntimeError('... failed to fill whole buffer ...')`` and one with
    foreign bytes as ``ValueError('... does not appear to be a Lance file ...')``.
    """
    if not isinstance(err, (RuntimeError, ValueError, OSError)):
        return None
    text = str(err)
    if "does not appear to be a Lance file" in text:
        return "a data file is damaged: it is not a Lance file"
    if "failed to fill whole buffer" in text:
        return "a data file is truncated"
    if "lance error" not in text.lower() and "LanceError" not in text:
        return None
    missing = re.search(r"Not found: (\S+?),? ", text + " ")
    if missing:
        return f"data file {Path(missing.group(1)).name} is missing"
    detail = text.splitlines()[0].split(", /")[0].removeprefix("lance error: ")  # drop the Rust source location
    return f"cannot read its files ({detail})"


def unreadable_message(uri: str, table: str, reason: str) -> str:
    """The one-line error for a damaged table: store, table, reason and the recovery commands."""
    flag = "" if table == TRAJECTORIES else f" --table {table}"
    return (f"store {uri}: table '{table}' is unreadable ({reason}); list its versions with "
            f"`lopd store versions --store {uri}{flag}` and bring back the newest readable one with "
            f"`lopd store restore --store {uri}{flag}`")


def check_readable(table: lancedb.table.Table, uri: str, name: str, columns: list[str] | None = None) -> None:
    """Scan ``columns`` (default: the first column) of every row, which opens every data file.

    Raises:
        StoreCorruptError: a data file is missing, truncated or not a Lance file.
    """
    columns = columns or [table.schema.names[0]]
    try:
        for _ in table.search().select(columns).limit(None).to_batches():
            pass
    except (RuntimeError, ValueError, OSError) as err:
        reason = lance_failure(err)
        if reason is None:
            raise
        raise StoreCorruptError(unreadable_message(uri, name, reason)) from None


def _guarded(method: Callable) -> Callable:
    """Turn Lance's read failures inside a store method into :class:`StoreCorruptError`."""

    @functools.wraps(method)
    def wrapper(self: ExperienceStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (RuntimeError, ValueError, OSError) as err:
            reason = lance_failure(err)
            if reason is None:
                raise
            raise StoreCorruptError(unreadable_message(self._uri, TRAJECTORIES, reason)) from None

    return wrapper


def sql_str(value: str) -> str:
    """``value`` as a quoted SQL string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def sql_in(column: str, values: Iterable[str], negate: bool = False) -> str:
    """``column [NOT] IN ('a', 'b')``; an empty ``values`` gives ``false`` (``true`` if negated)."""
    values = sorted(set(values))
    if not values:
        return "true" if negate else "false"
    return f"{column} {'NOT IN' if negate else 'IN'} ({', '.join(map(sql_str, values))})"


def where_clause(**filters: Any) -> str | None:
    """AND of equality filters (``None`` values skipped), e.g. ``env='bfcl' AND success=true``.

    A value that is a set/list/tuple becomes an ``IN`` list. Returns ``None`` when no filter
    is set.
    """
    parts = []
    for column, value in filters.items():
        if value is None:
            continue
        if isinstance(value, (set, frozenset, list, tuple)):
            parts.append(sql_in(column, value))
        elif isinstance(value, bool):
            parts.append(f"{column} = {str(value).lower()}")
        elif isinstance(value, str):
            parts.append(f"{column} = {sql_str(value)}")
        else:
            raise TypeError(f"filter {column!r}: unsupported value {value!r}")
    return " AND ".join(parts) or None


def _is_remote(uri: str) -> bool:
    return "://" in uri


def _validation_message(err: ValidationError) -> str:
    errors = err.errors()
    loc = ".".join(str(p) for p in errors[0]["loc"]) or "<row>"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"field '{loc}': {errors[0]['msg']}{more}"


def _upgrade_turns(uri: str, db: lancedb.DBConnection, table: lancedb.table.Table,
                   expected: pa.Schema) -> lancedb.table.Table:
    """Rewrite a store of an earlier release whose rows lack this release's fields.

    Rows are read, validated into :class:`Trajectory` (new fields take their defaults: empty
    token ids, so training re-tokenizes those rows) and written back as ONE new table version
    (Lance overwrite); the earlier versions stay in the table's history. Embeddings are keyed
    by trajectory id and stay valid.
    """
    rows = [from_row(Trajectory, r) for r in table.to_arrow().to_pylist()]
    table = db.create_table(TRAJECTORIES, to_rows(rows, Trajectory) if rows else None,
                            schema=expected, mode="overwrite")
    warnings.warn(f"store {uri}: upgraded table '{TRAJECTORIES}' ({len(rows)} rows) to this "
                  "release's schema (turns now keep their sampled token ids); earlier versions "
                  "stay in the table's history", stacklevel=3)
    return table


class ExperienceStore:
    """Append-only store of :class:`Trajectory` rows, with filters and versions.

    Create with :meth:`open`, not the constructor.
    """

    def __init__(self, uri: str, db: lancedb.DBConnection, table: lancedb.table.Table):
        self._uri = uri
        self._db = db
        self._table = table

    @staticmethod
    def check_location(uri: str | Path, create: bool = True) -> None:
        """The checks of :meth:`open` that need neither lancedb nor a read (a refusal stays fast).

        Raises:
            StoreError: a local ``uri`` is a file, or (``create`` False) no folder.
        """
        uri = str(uri)
        if not _is_remote(uri):
            path = Path(uri)
            if path.is_file():
                raise StoreError(f"store path {uri} is a file, expected a directory")
            if not create and not path.is_dir():
                raise StoreError(f"no experience store at {uri} (`lopd collect --env ENV --store {uri}` makes one)")

    @classmethod
    def open(cls, uri: str | Path, create: bool = True) -> ExperienceStore:
        """Open (and with ``create`` make) the store at a local path or URI (``s3://...``).

        The ``trajectory_id`` column of every row is read once, so a store whose data files
        were deleted, truncated or overwritten fails here rather than halfway through a stage.

        Raises:
            StoreError: the path is a file; the store does not exist and ``create`` is False;
                the ``trajectories`` table's schema differs from ``arrow_schema(Trajectory)``
                (the message lists the differing fields).
            StoreCorruptError: the table's files are missing or damaged (the message names the
                ``lopd store`` commands that list and restore earlier versions).
        """
        uri = str(uri)
        cls.check_location(uri, create)
        import lancedb

        db = lancedb.connect(uri, read_consistency_interval=timedelta(0))
        expected = arrow_schema(Trajectory)
        try:
            table = db.open_table(TRAJECTORIES)
        except (RuntimeError, ValueError, OSError) as err:
            reason = lance_failure(err)
            if reason is not None:
                raise StoreCorruptError(unreadable_message(uri, TRAJECTORIES, reason)) from None
            if not isinstance(err, ValueError):
                raise
            if not create:
                raise StoreError(f"no experience store at {uri} (no '{TRAJECTORIES}' table; "
                                 f"`lopd collect --env ENV --store {uri}` makes one)") from None
            table = db.create_table(TRAJECTORIES, schema=expected, exist_ok=True)
        diffs = schema_diff(expected, table.schema)
        if diffs and all(d.startswith("turns:") or d.endswith(")") and ": missing (" in d for d in diffs):
            table = _upgrade_turns(uri, db, table, expected)
            diffs = schema_diff(expected, table.schema)
        if diffs:
            raise StoreError(
                f"store {uri}: table '{TRAJECTORIES}' does not match the Trajectory schema: "
                + "; ".join(diffs)
            )
        check_readable(table, uri, TRAJECTORIES, ["trajectory_id"])
        return cls(uri, db, table)

    @property
    def uri(self) -> str:
        """The location the store was opened from."""
        return self._uri

    @property
    def db(self) -> lancedb.DBConnection:
        """The LanceDB connection (for sibling tables such as ``embeddings``)."""
        return self._db

    @property
    def table(self) -> lancedb.table.Table:
        """The ``trajectories`` LanceDB table."""
        return self._table

    @contextlib.contextmanager
    def _append_lock(self):
        """Hold the store's exclusive append lock (local stores; a no-op for object storage).

        Blocks until no other process or store handle holds it. ``flock`` locks belong to the
        open file, so the kernel releases this one when the holder exits or is killed.
        """
        if _is_remote(self._uri):
            yield
            return
        fd = os.open(Path(self._uri) / APPEND_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    @_guarded
    def append(self, trajectories: Sequence[Trajectory | dict]) -> int:
        """Validate and append trajectories in one transaction; returns the number of rows.

        Concurrent appends of the same ids (two processes, or two handles) commit each id once:
        the check and the commit run under the store's append lock (local stores), or as a
        merge-insert on ``trajectory_id`` (object storage).

        Raises:
            StoreError: a row is invalid (``row 3: field 'reward': ...``) or its
                ``trajectory_id`` repeats one in the batch or in the store. Nothing is written,
                except on object storage when another writer committed some of the ids between
                the check and the commit: the other rows are written and the message says so.
        """
        rows: list[Trajectory] = []
        for i, item in enumerate(trajectories):
            if isinstance(item, Trajectory):
                rows.append(item)
                continue
            try:
                rows.append(Trajectory.model_validate(item))
            except ValidationError as err:
                raise StoreError(f"row {i}: {_validation_message(err)}") from None
        if not rows:
            return 0
        seen: set[str] = set()
        for i, t in enumerate(rows):
            if t.trajectory_id in seen:
                raise StoreError(f"row {i}: duplicate trajectory_id {t.trajectory_id!r} in batch")
            seen.add(t.trajectory_id)
        ids = [t.trajectory_id for t in rows]
        with self._append_lock():
            existing = self._lookup(ids, columns=["trajectory_id"])
            if existing.num_rows:
                dup = existing.column("trajectory_id")[0].as_py()
                raise StoreError(f"row {ids.index(dup)}: trajectory_id {dup!r} already in store")
            if not _is_remote(self._uri):
                self._table.add(to_rows(rows, Trajectory))
                return len(rows)
            merge = self._table.merge_insert("trajectory_id").when_not_matched_insert_all()
            inserted = merge.execute(to_rows(rows, Trajectory)).num_inserted_rows
        if inserted != len(rows):
            raise StoreError(f"store {self._uri}: {len(rows) - inserted} of {len(rows)} trajectory ids were "
                             f"appended by another writer at the same time; the other {inserted} rows were written")
        return len(rows)

    @_guarded
    def count(self, *, env: str | None = None, split: str | None = None,
              success: bool | None = None, task_ids: Iterable[str] | None = None,
              run_id: str | None = None) -> int:
        """Number of trajectories matching all given filters (``None`` = no filter)."""
        where = where_clause(env=env, split=split, success=success, run_id=run_id,
                             task_id=None if task_ids is None else set(task_ids))
        return self._table.count_rows(where)

    @_guarded
    def query(self, *, env: str | None = None, split: str | None = None,
              success: bool | None = None, task_ids: Iterable[str] | None = None,
              run_id: str | None = None, limit: int | None = None) -> list[Trajectory]:
        """Trajectories matching all given filters, in insertion order, at most ``limit``."""
        where = where_clause(env=env, split=split, success=success, run_id=run_id,
                             task_id=None if task_ids is None else set(task_ids))
        q = self._table.search().limit(limit)
        if where:
            q = q.where(where)
        return [from_row(Trajectory, r) for r in q.to_arrow().to_pylist()]

    @_guarded
    def get(self, trajectory_ids: Sequence[str]) -> list[Trajectory]:
        """The trajectories with these ids, in the given order.

        Raises:
            StoreError: some ids are not in the store (the first few are named).
        """
        by_id = {r["trajectory_id"]: r for r in self._lookup(trajectory_ids).to_pylist()}
        missing = [i for i in trajectory_ids if i not in by_id]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise StoreError(f"store {self._uri}: {len(missing)} trajectory id(s) not found: {shown}")
        return [from_row(Trajectory, by_id[i]) for i in trajectory_ids]

    @_guarded
    def trajectory_ids(self) -> list[str]:
        """All trajectory ids, in insertion order."""
        q = self._table.search().select(["trajectory_id"]).limit(None)
        return q.to_arrow().column("trajectory_id").to_pylist()

    @_guarded
    def run_counts(self) -> dict[str, int]:
        """``{run id: trajectories}`` of every run with rows in the store, in order of first row."""
        q = self._table.search().select(["run_id"]).limit(None)
        counts: dict[str, int] = {}
        for run_id in q.to_arrow().column("run_id").to_pylist():
            counts[run_id] = counts.get(run_id, 0) + 1
        return counts

    @_guarded
    def task_ids(self, run_id: str | None = None, env: str | None = None) -> set[str]:
        """Distinct task ids with at least one trajectory (optionally of one run / env)."""
        q = self._table.search().select(["task_id"]).limit(None)
        where = where_clause(run_id=run_id, env=env)
        if where:
            q = q.where(where)
        return set(q.to_arrow().column("task_id").to_pylist())

    @_guarded
    def versions(self) -> list[dict]:
        """Table versions, oldest first: ``[{"version": int, "timestamp": datetime}, ...]``

        Timestamps are as LanceDB reports them (naive datetimes).
        """
        return [{"version": v["version"], "timestamp": v["timestamp"]}
                for v in self._table.list_versions()]

    @_guarded
    def index_ids(self) -> bool:
        """(Re)build a BTREE index on ``trajectory_id`` so that :meth:`get` reads only the rows it
        wants: a store written one task per transaction has one data file per task, and without
        the index every lookup opens all of them (801 files: 0.46 s per lookup, 0.03 s with it).
        Rows appended later are searched without the index until the next call. An index that
        already covers every row is left as it is (no new version of the table); returns whether
        it was (re)built."""
        for index in self._table.list_indices():
            if list(index.columns) == ["trajectory_id"]:
                stats = self._table.index_stats(index.name)
                if stats is not None and stats.num_unindexed_rows == 0:
                    return False
        self._table.create_scalar_index("trajectory_id", index_type="BTREE", replace=True)
        return True

    def _lookup(self, ids: Sequence[str], columns: list[str] | None = None) -> pa.Table:
        """Rows whose trajectory_id is in ``ids`` (any order), queried in chunks."""
        parts = []
        for start in range(0, len(ids), _ID_CHUNK):
            q = self._table.search().where(sql_in("trajectory_id", ids[start:start + _ID_CHUNK]))
            if columns:
                q = q.select(columns)
            parts.append(q.limit(None).to_arrow())
        if not parts:
            return pa.table({"trajectory_id": pa.array([], pa.string())})
        return pa.concat_tables(parts)
