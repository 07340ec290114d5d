"""Column types that differ between PostgreSQL and SQLite.

Per-token arrays are native arrays on PostgreSQL (``int4[]``, ``float4[]``, ``bool[]``) so SQL
can ``unnest`` them, and compact JSON arrays on SQLite so views can read them with ``json_each``.
Both sides bind and return plain Python lists; numpy conversion happens in the store.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
from sqlalchemy import JSON, Boolean, Integer, SmallInteger, Text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine


def _json_text(value: object) -> str | bytes:
    """The JSON text SQLite hands back for a list column (anything else is a schema mix-up)."""
    if not isinstance(value, str | bytes):
        raise TypeError(f"a list column held {type(value).__name__}, not JSON text")
    return value


class _JsonListOnSqlite(TypeDecorator[list[object]]):
    """A list column: a native ARRAY of ``element`` on PostgreSQL, JSON text elsewhere."""

    impl = Text
    cache_ok = True
    element: type[TypeEngine[Any]] = Integer

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.ARRAY(self.element(), dimensions=1))
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: list[object] | None, dialect: Dialect) -> object:
        if value is None or dialect.name == "postgresql":
            return value
        return orjson.dumps(value).decode()

    def process_result_value(self, value: object, dialect: Dialect) -> list[object] | None:
        if value is None or dialect.name == "postgresql":
            return cast("list[object] | None", value)
        return cast("list[object]", orjson.loads(_json_text(value)))


class IntArray(_JsonListOnSqlite):
    """``int4[]`` on PostgreSQL; ``[1,2,3]`` JSON text on SQLite."""

    cache_ok = True
    element = Integer


class SmallIntArray(_JsonListOnSqlite):
    """``int2[]`` on PostgreSQL (2 bytes a value); ``[0,2,2]`` JSON text on SQLite."""

    cache_ok = True
    element = SmallInteger


class FloatArray(_JsonListOnSqlite):
    """``float4[]`` on PostgreSQL; JSON text on SQLite (float32 values written exactly)."""

    cache_ok = True
    element = postgresql.REAL


class BoolArray(_JsonListOnSqlite):
    """``bool[]`` on PostgreSQL; ``[1,0,1]`` JSON text on SQLite."""

    cache_ok = True
    element = Boolean

    def process_bind_param(self, value: list[object] | None, dialect: Dialect) -> object:
        if value is None or dialect.name == "postgresql":
            return value
        return orjson.dumps([1 if v else 0 for v in value]).decode()

    def process_result_value(self, value: object, dialect: Dialect) -> list[object] | None:
        if value is None or dialect.name == "postgresql":
            return cast("list[object] | None", value)
        return [bool(v) for v in orjson.loads(_json_text(value))]


JsonDoc = JSON().with_variant(postgresql.JSONB(), "postgresql")
"""Free-form JSON documents (payloads, configs): ``jsonb`` on PostgreSQL, JSON text on SQLite."""
