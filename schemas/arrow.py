"""Derive Arrow (Lance) schemas from the pydantic contracts, and convert rows both ways.

This module is the single place where a pydantic model becomes a table schema, so the Lance
tables of the experience store can never drift from :mod:`schemas.trajectory`.

Mapping of field annotations:

=====================  =============================================
``str``                ``string``
``int``                ``int64``
``float``              ``float64``
``bool``               ``bool_``
``datetime``           ``timestamp("us", tz="UTC")``
``Literal["a", ...]``  ``string`` (string literals only)
``list[X]``            ``list_(X)``
nested ``BaseModel``   ``struct`` of its fields
``X | None``           ``X``, nullable
=====================  =============================================

Every other field is non-nullable. Any other annotation (``dict``, ``Any``, unions of two
types, ...) raises :class:`TypeError`.
"""
from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_SCALARS: dict[type, pa.DataType] = {
    str: pa.string(),
    bool: pa.bool_(),
    int: pa.int64(),
    float: pa.float64(),
    datetime: pa.timestamp("us", tz="UTC"),
}


def _arrow_type(annotation: Any, where: str) -> tuple[pa.DataType, bool]:
    """Return (arrow type, nullable) for one annotation; ``where`` names it in errors."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) != 1 or len(members) == len(get_args(annotation)):
            raise TypeError(f"{where}: unsupported union {annotation!r} (only `X | None`)")
        return _arrow_type(members[0], where)[0], True
    if origin is Literal:
        if not all(isinstance(v, str) for v in get_args(annotation)):
            raise TypeError(f"{where}: only string Literals are supported, got {annotation!r}")
        return pa.string(), False
    if origin is list:
        (item,) = get_args(annotation) or (None,)
        if item is None:
            raise TypeError(f"{where}: bare `list` needs an item type")
        item_type, item_nullable = _arrow_type(item, f"{where}[]")
        return pa.list_(pa.field("item", item_type, nullable=item_nullable)), False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct(_fields(annotation, prefix=f"{where}.")), False
    if isinstance(annotation, type) and annotation in _SCALARS:
        return _SCALARS[annotation], False
    raise TypeError(f"{where}: unsupported annotation {annotation!r}")


def _fields(model_cls: type[BaseModel], prefix: str = "") -> list[pa.Field]:
    fields = []
    for name, info in model_cls.model_fields.items():
        dtype, nullable = _arrow_type(info.annotation, f"{model_cls.__name__}.{prefix}{name}")
        fields.append(pa.field(name, dtype, nullable=nullable))
    return fields


def arrow_schema(model_cls: type[BaseModel]) -> pa.Schema:
    """The Arrow schema of ``model_cls`` (one column per field, nested models as structs).

    Raises:
        TypeError: a field annotation has no Arrow mapping (the message names the field).
    """
    return pa.schema(_fields(model_cls))


def schema_diff(expected: pa.Schema, actual: pa.Schema) -> list[str]:
    """Human-readable differences between two schemas, one entry per differing column.

    Types and nullability are compared (schema metadata is ignored). Returns ``[]`` when equal.
    """
    diffs = []
    actual_by_name = {f.name: f for f in actual}
    for field in expected:
        found = actual_by_name.pop(field.name, None)
        if found is None:
            diffs.append(f"{field.name}: missing (expected {field.type})")
        elif not found.equals(field):
            diffs.append(
                f"{field.name}: expected {field.type}{'' if field.nullable else ' not null'}, "
                f"found {found.type}{'' if found.nullable else ' not null'}"
            )
    diffs.extend(f"{name}: unexpected column ({f.type})" for name, f in actual_by_name.items())
    return diffs


def to_rows(models: Iterable[BaseModel], model_cls: type[BaseModel] | None = None) -> pa.Table:
    """Convert pydantic models to a table with schema ``arrow_schema(model_cls)``.

    ``model_cls`` defaults to the type of the first model; it is required for an empty input.

    Raises:
        TypeError: a model is not an instance of ``model_cls``, or the input is empty and
            ``model_cls`` is not given.
    """
    models = list(models)
    if model_cls is None:
        if not models:
            raise TypeError("to_rows: model_cls is required for an empty input")
        model_cls = type(models[0])
    for i, m in enumerate(models):
        if not isinstance(m, model_cls):
            raise TypeError(f"to_rows: row {i} is {type(m).__name__}, expected {model_cls.__name__}")
    rows = [m.model_dump(mode="python") for m in models]
    return pa.Table.from_pylist(rows, schema=arrow_schema(model_cls))


def from_row(model_cls: type[M], row: Mapping[str, Any]) -> M:
    """Validate one table row (as produced by ``pa.Table.to_pylist``) back into ``model_cls``.

    Columns that are not fields of ``model_cls`` (e.g. ``_distance`` from a vector search) are
    ignored.

    Raises:
        pydantic.ValidationError: the row does not satisfy the model.
    """
    return model_cls.model_validate({k: row[k] for k in model_cls.model_fields if k in row})
