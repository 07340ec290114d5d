"""Binary PostgreSQL results decoded column by column, per-token arrays straight into numpy.

psycopg's cursor calls a Python loader for every value of every row; for a read of a thousand
turns that is tens of thousands of calls and most of the client's time. Here a binary
``PGresult`` is read one column at a time: fixed-width integers of a whole column in one
``numpy.frombuffer``, ``int4[]``/``float4[]`` columns in one numpy gather
(:func:`~dressage.store.pg_arrays.decode_array_column`), text and ``jsonb`` by a plain decode. Only
the column types the log's hot reads return are known; another one is an error, not a guess.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson
from psycopg import pq

from dressage.store.pg_arrays import (
    BOOL_ARRAY_OID,
    BOOL_OID,
    BYTEA_OID,
    FLOAT4_ARRAY_OID,
    INT4_ARRAY_OID,
    INT4_OID,
    decode_array_column,
)

INT8_OID, TEXT_OID, VARCHAR_OID, FLOAT8_OID, JSONB_OID = 20, 25, 1043, 701, 3802
_INT_DTYPES = {INT4_OID: ">i4", INT8_OID: ">i8"}
_FLOAT8 = struct.Struct(">d")

Column = list[Any]
"""One decoded result column, a value per row: int, str, float, JSON value, bytes or numpy array
by the column's type, None for NULL."""


def _scalars(values: Sequence[bytes | None], decode: Callable[[bytes], object]) -> Column:
    return [None if v is None else decode(v) for v in values]


def _ints(values: Sequence[bytes | None], oid: int) -> Column:
    """A whole integer column in one numpy call when it holds no NULL."""
    if None in values:
        return _scalars(values, lambda v: int.from_bytes(v, "big", signed=True))
    ints: Column = np.frombuffer(b"".join(values), dtype=_INT_DTYPES[oid]).tolist()  # type: ignore[arg-type]
    return ints


def _jsonb(value: bytes) -> object:
    """``jsonb``'s binary format: a version byte (1), then the JSON text."""
    if value[:1] != b"\x01":
        raise ValueError(f"unknown jsonb binary format version {value[:1]!r}")
    return orjson.loads(value[1:])


_DECODERS: dict[int, Callable[[bytes], object]] = {
    TEXT_OID: bytes.decode,
    VARCHAR_OID: bytes.decode,
    FLOAT8_OID: lambda v: _FLOAT8.unpack(v)[0],
    JSONB_OID: _jsonb,
    BYTEA_OID: bytes,
    BOOL_OID: lambda v: v == b"\x01",
}


def decode_column(values: Sequence[bytes | None], oid: int) -> Column:
    """The Python (or numpy, for arrays) values of one binary result column of type ``oid``."""
    if oid in _INT_DTYPES:
        return _ints(values, oid)
    if oid in (INT4_ARRAY_OID, FLOAT4_ARRAY_OID, BOOL_ARRAY_OID):
        return decode_array_column(values, oid)
    decoder = _DECODERS.get(oid)
    if decoder is None:
        raise TypeError(f"no binary decoder for PostgreSQL type oid {oid}")
    return _scalars(values, decoder)


def result_columns(res: pq.abc.PGresult) -> dict[str, Column]:
    """Every column of a binary ``res`` by name, decoded (see :func:`decode_column`)."""
    n = res.ntuples
    columns: dict[str, Column] = {}
    for c in range(res.nfields):
        name = (res.fname(c) or b"").decode()
        columns[name] = decode_column([res.get_value(i, c) for i in range(n)], res.ftype(c))
    return columns


def result_rows(res: pq.abc.PGresult) -> list[dict[str, object]]:
    """The rows of a binary ``res`` as dicts (decoded column by column, see :func:`result_columns`)."""
    columns = result_columns(res)
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]
