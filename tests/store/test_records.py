"""Unit tests of the record helpers that every append depends on (keys, canonical JSON)."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from dressage.errors import InvalidRecordError
from dressage.store.records import KEY_NAMESPACE, canonical_json, deterministic_key


@pytest.mark.parametrize(
    "parts",
    [("run", "session", "turn", 0), ("ü-run", None, 3.5, "x" * 300), (), ("a\x1fb",), (2**70, -1)],
)
def test_deterministic_key_is_uuid5(parts: tuple[object, ...]) -> None:
    expected = str(uuid.uuid5(KEY_NAMESPACE, "\x1f".join(str(p) for p in parts)))
    assert deterministic_key(*parts) == expected


def test_canonical_json_is_sorted_compact_and_parses_back() -> None:
    value = {"b": [1, 2.5, None, True], "a": {"z": "ü", "y": -0.0}, "c": "x\ny"}
    data = canonical_json(value, what="v")
    assert data.startswith(b'{"a":{"y":-0.0,"z":"\xc3\xbc"},"b":')
    assert json.loads(data) == value
    assert canonical_json(dict(reversed(list(value.items()))), what="v") == data


def test_canonical_json_takes_values_orjson_does_not() -> None:
    # numpy float subclass and integers beyond 64 bits go through the standard library
    data = canonical_json({"t": np.float64(0.5), "big": 2**70}, what="v")
    assert json.loads(data) == {"t": 0.5, "big": 2**70}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"t": float("nan")}, "not valid JSON"),
        ({"t": [1.0, float("-inf")]}, "not valid JSON"),
        ({"t": np.float64("inf")}, "not valid JSON"),
        ({"t": object()}, "not valid JSON"),
        ({"t": "a\x00b"}, "NUL"),
        ({"t\x00": 1}, "NUL"),
        ({"t": np.float64(1.0), "s": "a\x00b"}, "NUL"),  # through the standard-library path
        ({"t": "\udc80"}, "invalid UTF-8"),
        ({"t": "x" * 100}, "over the limit"),
    ],
)
def test_canonical_json_refuses_what_the_log_cannot_hold(value: object, match: str) -> None:
    with pytest.raises(InvalidRecordError, match=match):
        canonical_json(value, what="v", max_bytes=64)
