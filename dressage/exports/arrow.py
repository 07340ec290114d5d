"""Numpy arrays to Arrow list columns without per-element Python objects.

A batch of turns becomes one flat values array plus offsets per list level, the way Arrow stores
lists, so a row group of many thousand turns costs a few ``np.concatenate`` calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def _offsets(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Arrow list offsets (int32) of rows of ``sizes`` elements."""
    out = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(np.asarray(sizes, dtype=np.int64), out=out[1:])
    if out[-1] > np.iinfo(np.int32).max:
        raise ValueError("a row group holds more than 2**31 list elements; export with smaller batches")
    return out.astype(np.int32)


def list_column(parts: Sequence[np.ndarray | None], value_type: pa.DataType) -> pa.Array:
    """One ``list<value_type>`` column: row ``i`` is ``parts[i]`` (None: a null row)."""
    np_type = value_type.to_pandas_dtype()
    sizes = [0 if p is None else int(p.size) for p in parts]
    flat = (
        np.concatenate([np.asarray(p, dtype=np_type).reshape(-1) for p in parts if p is not None])
        if any(p is not None for p in parts)
        else np.zeros(0, dtype=np_type)
    )
    values = pa.array(flat, type=value_type)
    mask = pa.array([p is None for p in parts], type=pa.bool_()) if any(p is None for p in parts) else None
    return pa.ListArray.from_arrays(pa.array(_offsets(sizes), pa.int32()), values, mask=mask)


def cube_column(parts: Sequence[np.ndarray | None]) -> pa.Array:
    """``list<list<list<int32>>>``: each row a ``[tokens, layers, top_k]`` array (None: null)."""
    present = [p for p in parts if p is not None]
    flat = (
        np.concatenate([p.astype(np.int32).reshape(-1) for p in present])
        if present
        else np.zeros(0, np.int32)
    )
    inner_sizes = np.concatenate(
        [np.full(p.shape[0] * p.shape[1], p.shape[2], np.int64) for p in present] or [np.zeros(0, np.int64)]
    )
    middle_sizes = np.concatenate(
        [np.full(p.shape[0], p.shape[1], np.int64) for p in present] or [np.zeros(0, np.int64)]
    )
    outer_sizes = [0 if p is None else int(p.shape[0]) for p in parts]
    inner = pa.ListArray.from_arrays(pa.array(_offsets(inner_sizes), pa.int32()), pa.array(flat, pa.int32()))
    middle = pa.ListArray.from_arrays(pa.array(_offsets(middle_sizes), pa.int32()), inner)
    mask = pa.array([p is None for p in parts], type=pa.bool_()) if any(p is None for p in parts) else None
    return pa.ListArray.from_arrays(pa.array(_offsets(outer_sizes), pa.int32()), middle, mask=mask)


def cube_from_column(
    value: list[list[list[int]]] | None, shape: list[int] | None, dtype: str | None
) -> np.ndarray | None:
    """The ``[tokens, layers, top_k]`` array of one row of a :func:`cube_column` (its shape and
    dtype come from their own columns, so an empty array keeps its layers and top-k)."""
    if value is None or shape is None or dtype is None:
        return None
    return np.asarray(value, dtype=np.int64).astype(dtype).reshape(tuple(shape))
