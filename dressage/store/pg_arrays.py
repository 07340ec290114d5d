"""PostgreSQL binary array I/O straight from and into numpy.

psycopg turns Python lists into arrays element by element, which costs more than the database
round trip for a 512-token turn. These helpers build the binary wire format of ``int4[]``,
``float4[]`` and ``bool[]`` with numpy in one vectorised step (and parse it back the same way), so
the append and read-back paths spend their time in the database, not in Python.

Binary array layout: ``ndim, has_null, elem_oid`` (int32 each), then per dimension ``length,
lower_bound``, then per element a 4-byte length followed by the value, all big-endian.
"""

from __future__ import annotations

import functools
import itertools
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from psycopg.adapt import Buffer, Dumper
from psycopg.pq import Format

INT4_OID, FLOAT4_OID, BOOL_OID = 23, 700, 16
INT4_ARRAY_OID, FLOAT4_ARRAY_OID, BOOL_ARRAY_OID = 1007, 1021, 1000
BYTEA_OID = 17

_ELEMENTS: dict[int, tuple[int, np.dtype[Any], int]] = {
    INT4_ARRAY_OID: (INT4_OID, np.dtype(">i4"), 4),
    FLOAT4_ARRAY_OID: (FLOAT4_OID, np.dtype(">f4"), 4),
    BOOL_ARRAY_OID: (BOOL_OID, np.dtype("u1"), 1),
}
_BE_INT4 = np.dtype(">i4")
_ARRAY_HEADER_BYTES = 20  # ndim, has_null, elem_oid, length, lower_bound
_EMPTY_ARRAY_BYTES = 12  # ndim = 0: no dimension words


class PgArray:
    """A one-dimensional numpy array bound as a PostgreSQL array (subclasses fix the type)."""

    __slots__ = ("data",)
    array_oid = 0

    def __init__(self, values: Any) -> None:
        self.data = encode_array(np.asarray(values), self.array_oid)


class PgInt4Array(PgArray):
    """Bound as ``int4[]``."""

    __slots__ = ()
    array_oid = INT4_ARRAY_OID


class PgFloat4Array(PgArray):
    """Bound as ``float4[]``."""

    __slots__ = ()
    array_oid = FLOAT4_ARRAY_OID


class PgBoolArray(PgArray):
    """Bound as ``bool[]``."""

    __slots__ = ()
    array_oid = BOOL_ARRAY_OID


def encode_array(values: np.ndarray, array_oid: int) -> bytes:
    """The binary wire format of a 1-D array of ``values`` for ``array_oid``."""
    elem_oid, dtype, size = _ELEMENTS[array_oid]
    if size == 4:  # int4 and float4: their int32 bit patterns, encoded as one run
        words = values.astype(dtype.newbyteorder("="), copy=False).view(np.int32)
        return encode_4byte_runs(words, ((int(values.size), elem_oid),))[0]
    n = int(values.size)
    if n == 0:
        return struct.pack(">iii", 0, 0, elem_oid)
    records: np.ndarray[Any, Any] = np.empty(n, dtype=[("len", ">i4"), ("val", dtype)])
    records["len"] = size
    records["val"] = values
    return struct.pack(">iiiii", 1, 0, elem_oid, n, 1) + records.tobytes()


def encode_4byte_runs(words: np.ndarray, runs: Sequence[tuple[int, int]]) -> list[bytes]:
    """Wire formats of consecutive arrays packed in ``words`` (int32 bit patterns), one numpy pass.

    ``runs`` gives each array's length and element type oid (``int4`` or ``float4``: a float32's
    bits viewed as int32 byte-swap the same way). The append encodes a turn's four 4-byte arrays
    this way instead of four separate passes.
    """
    pairs = np.empty((words.size, 2), dtype=_BE_INT4)  # (length word, value) pairs, big-endian
    pairs[:, 0] = 4
    pairs[:, 1] = words
    body = pairs.tobytes()
    out, start = [], 0
    for n, elem_oid in runs:
        if n:
            out.append(struct.pack(">iiiii", 1, 0, elem_oid, n, 1) + body[start : start + 8 * n])
        else:
            out.append(struct.pack(">iii", 0, 0, elem_oid))
        start += 8 * n
    return out


@functools.lru_cache(maxsize=256)
def all_true_bool_array(n: int) -> bytes:
    """The binary wire format of ``bool[]`` with ``n`` true values (the usual loss mask), cached."""
    return encode_array(np.ones(n, dtype=np.bool_), BOOL_ARRAY_OID)


def decode_array(data: Buffer, array_oid: int) -> np.ndarray:
    """Parse the binary wire format of a 1-D, NULL-free array into numpy (native byte order)."""
    dtype = _ELEMENTS[array_oid][1]
    ndim = int.from_bytes(bytes(data[0:4]), "big")
    if ndim == 0:
        return np.empty(0, dtype=np.bool_ if array_oid == BOOL_ARRAY_OID else dtype.newbyteorder("="))
    n = int.from_bytes(bytes(data[12:16]), "big")
    body = np.frombuffer(data, dtype=[("len", ">i4"), ("val", dtype)], count=n, offset=20)
    if array_oid == BOOL_ARRAY_OID:
        return body["val"].astype(np.bool_)
    return body["val"].astype(dtype.newbyteorder("="))


def decode_array_column(values: Sequence[Buffer | None], array_oid: int) -> list[np.ndarray | None]:
    """Parse many binary 1-D, NULL-free arrays of one type at once (None stays None).

    ``int4[]`` and ``float4[]`` values are joined into one buffer without their headers and read
    as (length, value) pairs in one numpy pass, so a read of a thousand turns costs a few numpy
    calls instead of a thousand parses; each returned array is a view into one native-order array.
    Other types are parsed one by one (:func:`decode_array`).
    """
    elem_dtype, size = _ELEMENTS[array_oid][1:]
    present = [v for v in values if v is not None]
    if size != 4 or not present:
        return [None if v is None else decode_array(v, array_oid) for v in values]
    lengths = np.fromiter((len(v) for v in present), dtype=np.int64, count=len(present))
    counts = np.where(lengths > _EMPTY_ARRAY_BYTES, (lengths - _ARRAY_HEADER_BYTES) // 8, 0)
    if np.any((counts > 0) & (lengths != _ARRAY_HEADER_BYTES + 8 * counts)):
        raise ValueError("not a one-dimensional NULL-free array of 4-byte elements")
    body = b"".join([memoryview(v)[_ARRAY_HEADER_BYTES:] for v in present])
    pairs = np.frombuffer(body, dtype=[("len", ">i4"), ("val", elem_dtype)])
    flat = pairs["val"].astype(elem_dtype.newbyteorder("="))
    bounds = np.zeros(len(present) + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    ends = bounds.tolist()
    arrays = iter([flat[a:b] for a, b in itertools.pairwise(ends)])
    return [None if v is None else next(arrays) for v in values]


def _dumper(array_oid: int) -> type[Dumper]:
    class _PgArrayDumper(Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj: PgArray) -> Buffer:
            return obj.data

    return _PgArrayDumper


def register_dumpers(adapters: Any) -> None:
    """Make ``adapters`` (``psycopg.adapters`` or a connection's) dump our array classes in binary."""
    for cls in (PgInt4Array, PgFloat4Array, PgBoolArray):
        adapters.register_dumper(cls, _dumper(cls.array_oid))
