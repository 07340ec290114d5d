"""Unit tests of the record helpers that every append depends on (keys, canonical JSON)."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from dressage.errors import InvalidRecordError
from dressage.store.pg_arrays import (
    BOOL_ARRAY_OID,
    FLOAT4_ARRAY_OID,
    INT4_ARRAY_OID,
    decode_array,
    decode_array_column,
    encode_array,
)
from dressage.store.records import (
    KEY_NAMESPACE,
    NewTurn,
    canonical_json,
    deterministic_key,
    prepare_turn,
    turn_key,
)
from dressage.store.turn_io import APPEND_PARAM_NAMES, PG_APPEND_TURN_SQL, pg_append_values


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


@pytest.mark.parametrize(
    ("run", "session", "index"), [("run", "s", 0), ("ü-run", "x" * 64, 10**9), ("r\x1f", "", 7)]
)
def test_turn_key_is_the_turn_s_deterministic_key(run: str, session: str, index: int) -> None:
    expected = str(uuid.uuid5(KEY_NAMESPACE, f"{run}\x1f{session}\x1fturn\x1f{index}"))
    assert turn_key(run, session, index) == expected == deterministic_key(run, session, "turn", index)
    assert turn_key(run, session, index + 1) != expected  # the cached prefix is not the whole key


def _record(**kw: object) -> NewTurn:
    fields: dict[str, object] = {
        "session_id": "s-1",
        "turn_index": 7,
        "context_ids": [1, 2, 3],
        "generated_ids": [40, 50],
        "logprobs": [-0.5, -0.25],
        "policy_versions": [3, 4],
        "loss_mask": [True, False],
        "sampling_params": {"temperature": 0.7},
        "info": {"a": "ü"},
        "routed_experts": np.arange(40, dtype=np.uint8).reshape(5, 4, 2),
        "finish_reason": "stop",
    }
    fields.update(kw)
    return NewTurn(**fields)  # type: ignore[arg-type]


def test_content_hash_is_pinned_and_independent_of_input_layout() -> None:
    # The hash stored with every turn: a change here makes re-sends of logged turns conflict.
    expected = "a06d35628bc69bd86c2b1051122204924ae3b525afbfcbbb9becfa6322188598"
    assert prepare_turn("run-x", _record()).content_hash == expected
    strided = np.array([1, 0, 2, 0, 3, 0], dtype=np.int64)[::2]  # wider dtype, not contiguous
    big_endian = np.array([-0.5, -0.25], dtype=">f4")
    same = _record(context_ids=strided, logprobs=big_endian, loss_mask=np.array([1, 0], dtype=np.uint8) == 1)
    assert prepare_turn("run-x", same).content_hash == expected
    assert prepare_turn("run-x", _record(loss_mask=[True, True])).content_hash != expected
    assert (
        prepare_turn("run-x", _record(loss_mask=None)).content_hash
        == prepare_turn("run-x", _record(loss_mask=[True, True])).content_hash
    )


@pytest.mark.parametrize(
    ("values", "oid"),
    [
        (np.array([0, -1, 2**31 - 1, -(2**31)], dtype=np.int32), INT4_ARRAY_OID),
        (np.array([-0.0, -1.5, np.float32(-1e-30)], dtype=np.float32), FLOAT4_ARRAY_OID),
        (np.array([True, False, True]), BOOL_ARRAY_OID),
        (np.empty(0, dtype=np.int32), INT4_ARRAY_OID),
    ],
)
def test_binary_arrays_round_trip(values: np.ndarray, oid: int) -> None:
    back = decode_array(encode_array(values, oid), oid)
    assert back.dtype == values.dtype and back.tobytes() == values.tobytes()


def test_append_values_follow_the_statement_s_parameter_order() -> None:
    prep = prepare_turn("run-x", _record(latency_ms=12.5, boundary_reason="start"))
    by_name = dict(zip(APPEND_PARAM_NAMES, pg_append_values(prep, 42, 1.25), strict=True))
    row = prep.row
    assert by_name["run_id"] == b"42" and by_name["created_at"] == b"1.25"
    assert by_name["id"] == prep.key.encode() and by_name["content_hash"] == prep.content_hash.encode()
    assert json.loads(by_name["event_payload"] or b"") == prep.event_payload
    assert json.loads(by_name["sampling_params"] or b"") == {"temperature": 0.7}
    assert json.loads(by_name["info"] or b"") == {"a": "ü"}
    assert by_name["experts"] == row["experts"]
    for name in ("context_ids", "generated_ids", "policy_versions"):
        assert decode_array(by_name[name] or b"", INT4_ARRAY_OID).tolist() == prep.arrays[name].tolist()
    assert decode_array(by_name["logprobs"] or b"", FLOAT4_ARRAY_OID).tolist() == [-0.5, -0.25]
    assert decode_array(by_name["loss_mask"] or b"", BOOL_ARRAY_OID).tolist() == [True, False]
    assert decode_array(by_name["experts_shape"] or b"", INT4_ARRAY_OID).tolist() == [5, 4, 2]
    for name in (
        "session_id",
        "turn_index",
        "thread_index",
        "route",
        "segment_index",
        "segment_offset",
        "boundary_reason",
        "n_context",
        "n_generated",
        "n_trained",
        "min_policy_version",
        "max_policy_version",
        "experts_dtype",
        "experts_codec",
        "finish_reason",
        "latency_ms",
    ):
        assert by_name[name] == str(row[name]).encode(), name
    assert by_name["parent_turn_id"] is None and by_name["request_fingerprint"] is None
    for i in range(len(APPEND_PARAM_NAMES)):
        assert f"${i + 1}" in PG_APPEND_TURN_SQL
    assert f"${len(APPEND_PARAM_NAMES) + 1}" not in PG_APPEND_TURN_SQL


def test_append_values_of_a_turn_without_generated_tokens() -> None:
    prep = prepare_turn("run-x", _record(generated_ids=[], logprobs=[], policy_versions=[], loss_mask=None))
    by_name = dict(zip(APPEND_PARAM_NAMES, pg_append_values(prep, 1, 0.0), strict=True))
    assert decode_array(by_name["context_ids"] or b"", INT4_ARRAY_OID).tolist() == [1, 2, 3]
    for name, oid in (
        ("generated_ids", INT4_ARRAY_OID),
        ("logprobs", FLOAT4_ARRAY_OID),
        ("loss_mask", BOOL_ARRAY_OID),
    ):
        assert decode_array(by_name[name] or b"", oid).size == 0
    assert by_name["n_trained"] == b"0" and by_name["min_policy_version"] is None


def test_array_columns_decode_like_one_array_at_a_time() -> None:
    """A whole column (NULLs, empty arrays, several lengths) decodes to what each value decodes to."""
    rng = np.random.default_rng(3)
    for oid, make in (
        (INT4_ARRAY_OID, lambda n: rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int64).astype(np.int32)),
        (FLOAT4_ARRAY_OID, lambda n: -rng.random(n, dtype=np.float32)),
        (BOOL_ARRAY_OID, lambda n: rng.random(n) < 0.5),
    ):
        values = [None if n is None else encode_array(make(n), oid) for n in (0, 7, None, 1, 0, 513, None)]
        decoded = decode_array_column(values, oid)
        for value, back in zip(values, decoded, strict=True):
            if value is None:
                assert back is None
                continue
            expected = decode_array(value, oid)
            assert back is not None and back.dtype == expected.dtype and back.tobytes() == expected.tobytes()
    assert decode_array_column([None, None], INT4_ARRAY_OID) == [None, None]


def test_array_columns_refuse_what_is_not_a_flat_null_free_array() -> None:
    two_d = encode_array(np.arange(4, dtype=np.int32), INT4_ARRAY_OID)[:-4]  # a truncated element
    with pytest.raises(ValueError, match="one-dimensional NULL-free"):
        decode_array_column([two_d], INT4_ARRAY_OID)
