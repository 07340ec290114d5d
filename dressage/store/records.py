"""Typed records that go into and come out of the event log, with their validation and hashing.

Validation happens before any write, so bad input (wrong array lengths, oversized payloads,
invalid UTF-8, NUL characters) raises :class:`InvalidRecordError` and leaves the log unchanged.
Content hashes are computed over a canonical byte encoding that is the same on every backend,
so a retried append can be compared with what is stored.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict

import lz4.frame
import numpy as np
import orjson

from dressage.errors import IdempotencyConflictError, InvalidRecordError
from dressage.store.pg_arrays import (
    BOOL_ARRAY_OID,
    FLOAT4_OID,
    INT4_OID,
    all_true_bool_array,
    encode_4byte_runs,
    encode_array,
)

ROUTES = ("append", "branch", "create")
SESSION_STATUSES = ("running", "finished", "failed", "abandoned")
TERMINAL_STATUSES = ("finished", "failed", "abandoned")
MAX_TOKENS_PER_TURN = 1 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_LOGPROB = 1e-3
"""The largest logprob a turn may carry: log-probabilities are <= 0, engines round a little above."""
KEY_NAMESPACE = uuid.UUID("6f1c8a52-4d0e-4c55-9a55-6b7d2a1f0d11")


_KEY_NAMESPACE_BYTES = KEY_NAMESPACE.bytes


def deterministic_key(*parts: object) -> str:
    """A uuid5 idempotency key from ``parts`` (e.g. run, session, turn index).

    The same string as ``str(uuid.uuid5(KEY_NAMESPACE, "\\x1f".join(map(str, parts))))`` (tested),
    built from the SHA-1 digest directly: ``uuid.UUID`` objects cost a third of a turn's preparation.
    """
    name = "\x1f".join(map(str, parts)).encode()
    return _uuid5_string(hashlib.sha1(_KEY_NAMESPACE_BYTES + name, usedforsecurity=False).digest())


def turn_key(run_name: str, session_id: str, turn_index: int) -> str:
    """``deterministic_key(run_name, session_id, "turn", turn_index)``: the default key of a turn.

    The SHA-1 state after the session's prefix is cached, so each turn hashes only its index.
    """
    h = _turn_key_prefix(run_name, session_id).copy()
    h.update(b"%d" % turn_index)
    return _uuid5_string(h.digest())


@functools.lru_cache(maxsize=1024)
def _turn_key_prefix(run_name: str, session_id: str) -> Any:
    """SHA-1 over the namespace and ``run\\x1fsession\\x1fturn\\x1f`` (one per live session)."""
    prefix = f"{run_name}\x1f{session_id}\x1fturn\x1f".encode()
    return hashlib.sha1(_KEY_NAMESPACE_BYTES + prefix, usedforsecurity=False)


def _uuid5_string(sha1_digest: bytes) -> str:
    """The RFC 4122 version-5 UUID string of a SHA-1 digest (what :func:`uuid.uuid5` formats)."""
    n = int.from_bytes(sha1_digest[:16], "big")
    n = (n & ~(0xF000 << 64) & ~(0xC000 << 48)) | (0x5000 << 64) | (0x8000 << 48)
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def canonical_json(value: object, *, what: str, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """Serialise ``value`` canonically (sorted keys, compact, UTF-8), rejecting what the log cannot hold.

    Rejected: non-JSON values, NaN/inf, invalid UTF-8 (lone surrogates), NUL characters (PostgreSQL
    ``jsonb`` and ``text`` cannot hold them) and documents over ``max_bytes``. Plain JSON values are
    serialised by orjson (several times faster than :func:`json.dumps` on the append path); values
    orjson does not take (float or int subclasses, integers beyond 64 bits) go through
    :func:`json.dumps`. Either way the bytes depend only on the value, so hashes are stable.
    """
    plain = _plain_json(value, what)
    try:
        if not plain:
            raise TypeError("not a plain JSON value")
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError as e:  # orjson.JSONEncodeError is a TypeError
        if "surrogates" in str(e):
            raise InvalidRecordError(f"{what} contains invalid UTF-8 (a lone surrogate); fix the text") from e
        data = _json_dumps_bytes(value, what)
    if b"\\u0000" in data:
        raise InvalidRecordError(f"{what} contains a NUL character, which the log cannot store; remove it")
    if len(data) > max_bytes:
        raise InvalidRecordError(f"{what} is {len(data)} bytes, over the limit of {max_bytes} bytes")
    return data


_JSON_SCALARS = (str, int, bool, type(None))


def _plain_json(value: object, what: str) -> bool:
    """True when ``value`` holds only exact JSON types; raises on NaN/inf anywhere inside it."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float and isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRecordError(
                f"{what} is not valid JSON for the log: {value!r} is not a finite number"
            )
        return True
    if kind is dict and isinstance(value, dict):
        plain = True
        for k, v in value.items():
            plain = _plain_json(v, what) and type(k) in _JSON_SCALARS and plain
        return plain
    if (kind is list or kind is tuple) and isinstance(value, list | tuple):
        plain = True
        for v in value:
            plain = _plain_json(v, what) and plain
        return plain
    return False


def _json_dumps_bytes(value: object, what: str) -> bytes:
    """The canonical JSON of a value orjson does not take, by the standard library (or a clear error)."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidRecordError(f"{what} is not valid JSON for the log: {e}") from e
    try:  # a NUL comes out escaped (\\u0000): canonical_json checks for it on both paths
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRecordError(
            f"{what} contains invalid UTF-8 (a lone surrogate at {e.start}); fix the text"
        ) from e


def check_text(value: str | None, *, what: str, max_chars: int = 65_536) -> None:
    """Reject text the log cannot hold (invalid UTF-8, NUL, too long)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidRecordError(f"{what} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidRecordError(f"{what} contains a NUL character, which the log cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRecordError(f"{what} contains invalid UTF-8 (a lone surrogate at {e.start})") from e
    if len(value) > max_chars:
        raise InvalidRecordError(f"{what} is {len(value)} characters, over the limit of {max_chars}")


_INT32 = np.iinfo(np.int32)
_FITS_INT32 = frozenset(np.dtype(t) for t in ("int8", "int16", "int32", "uint8", "uint16"))


def _as_array(values: object, dtype: str, *, what: str) -> np.ndarray:
    """``values`` as a C-contiguous little-endian 1-D array of ``dtype`` (the hash reads its buffer)."""
    target = _LITTLE_ENDIAN[dtype]
    if (
        type(values) is np.ndarray
        and values.dtype == target
        and values.ndim == 1
        and values.flags.c_contiguous
    ):
        arr = values  # already what the log stores: no conversion, no copy
    else:
        try:
            arr = np.asarray(values)
        except (TypeError, ValueError) as e:
            raise InvalidRecordError(f"{what} is not an array of numbers: {e}") from e
        if arr.ndim != 1:
            raise InvalidRecordError(f"{what} must be one-dimensional, got shape {arr.shape}")
        if dtype == "int32" and arr.size and arr.dtype not in _FITS_INT32:
            # Only wider or non-integer inputs need the (costly) value checks.
            if arr.dtype.kind not in "iu":
                raise InvalidRecordError(f"{what} must hold integers, got {arr.dtype}")
            if arr.min() < _INT32.min or arr.max() > _INT32.max:
                raise InvalidRecordError(f"{what} has values outside the int32 range")
        arr = np.ascontiguousarray(arr.astype(target, copy=False))
    if arr.size > MAX_TOKENS_PER_TURN:
        raise InvalidRecordError(f"{what} has {arr.size} entries, over the limit of {MAX_TOKENS_PER_TURN}")
    return arr


@functools.lru_cache(maxsize=256)
def _all_true(n: int) -> bytes:
    """``n`` true bytes: the default loss mask of ``n`` generated tokens."""
    return b"\x01" * n


_LITTLE_ENDIAN = {"int32": np.dtype("<i4"), "float32": np.dtype("<f4"), "bool": np.dtype(np.bool_)}


@dataclass
class NewTurn:
    """One LLM call as the proxy records it (the input of :meth:`EventStore.turns.append`).

    ``context_ids`` are the tokens added since the lineage's previous turn (or the whole prompt
    when a new segment starts); they are never trained on. ``generated_ids`` are the engine's
    sampled ids with one logprob, one policy version and one loss-mask bit each.
    ``routed_experts`` is ``[n_tokens, layers, top_k]`` as the engine returned it.
    """

    session_id: str
    turn_index: int
    context_ids: Sequence[int] | np.ndarray
    generated_ids: Sequence[int] | np.ndarray
    logprobs: Sequence[float] | np.ndarray
    policy_versions: Sequence[int] | np.ndarray
    loss_mask: Sequence[bool] | np.ndarray | None = None
    thread_index: int = 0
    parent_turn_id: str | None = None
    route: str = "append"
    segment_index: int = 0
    segment_offset: int = 0
    boundary_reason: str | None = None
    routed_experts: np.ndarray | None = None
    finish_reason: str | None = None
    sampling_params: Mapping[str, object] = field(default_factory=dict)
    request_fingerprint: str | None = None
    latency_ms: float | None = None
    info: Mapping[str, object] = field(default_factory=dict)
    key: str | None = None

    @classmethod
    def from_turn(
        cls,
        turn: Turn,
        session_id: str,
        *,
        info: Mapping[str, object] | None = None,
        parent_turn_id: str | None = None,
        request_fingerprint: str | None = None,
        latency_ms: float | None = None,
        key: str | None = None,
    ) -> NewTurn:
        """A copy of the recorded ``turn`` for ``session_id`` (e.g. a fork replaying its parent's turns).

        The copy keeps the turn's tokens, logprobs, versions, loss mask, placement (index, lineage,
        route, segment, offset, boundary), routed experts, finish reason and sampling parameters.
        What belongs to the new record alone is the caller's: ``parent_turn_id``,
        ``request_fingerprint``, ``latency_ms`` and ``key`` (``None`` unless given) and ``info``
        (the turn's own info unless given).
        """
        return cls(
            session_id=session_id,
            turn_index=turn.turn_index,
            context_ids=turn.context_ids,
            generated_ids=turn.generated_ids,
            logprobs=turn.logprobs,
            policy_versions=turn.policy_versions,
            loss_mask=turn.loss_mask,
            thread_index=turn.thread_index,
            parent_turn_id=parent_turn_id,
            route=turn.route,
            segment_index=turn.segment_index,
            segment_offset=turn.segment_offset,
            boundary_reason=turn.boundary_reason,
            routed_experts=turn.routed_experts,
            finish_reason=turn.finish_reason,
            sampling_params=turn.sampling_params,
            request_fingerprint=request_fingerprint,
            latency_ms=latency_ms,
            info=turn.info if info is None else info,
            key=key,
        )


@dataclass(slots=True)
class PreparedTurn:
    """A validated :class:`NewTurn`: normalised arrays, compressed experts, content hash."""

    key: str
    row: dict[str, Any]
    arrays: dict[str, np.ndarray]
    content_hash: str
    event_payload: dict[str, Any]
    wire: dict[str, bytes]
    """The per-token arrays in PostgreSQL's binary array format (what the PostgreSQL append sends)."""
    json_bytes: dict[str, bytes]
    """Canonical JSON of ``sampling_params``, ``info`` (serialised for hashing) and ``event_payload``."""

    def row_with_lists(self) -> dict[str, object]:
        """The row with per-token arrays as Python lists (for the generic SQLAlchemy insert)."""
        return {**self.row, **{k: v.tolist() for k, v in self.arrays.items()}}


@dataclass(slots=True)
class _ValidTurn:
    """A :class:`NewTurn` whose fields passed :func:`_validate_turn`: arrays in their stored dtypes."""

    context: np.ndarray
    generated: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    mask: np.ndarray
    words: np.ndarray
    """context, generated, versions and the logprobs' int32 bit patterns in one buffer."""
    n_trained: int
    experts_blob: bytes | None
    experts_raw: bytes
    experts_shape: list[int] | None
    experts_dtype: str | None
    sampling: dict[str, object]
    info: dict[str, Any]
    sampling_json: bytes
    info_json: bytes


def prepare_turn(
    run_name: str, rec: NewTurn, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> PreparedTurn:
    """Validate ``rec`` and build the row to insert; raises :class:`InvalidRecordError` on bad input.

    Both backends' appenders take the prepared turn: one validation path, one content hash.
    """
    valid = _validate_turn(rec, max_payload_bytes)
    if not rec.key:
        key = turn_key(run_name, rec.session_id, rec.turn_index)  # a uuid string: nothing to check
    else:
        key = rec.key
        check_text(key, what="key", max_chars=128)
    return _encode_turn(key, rec, valid, _turn_content_hash(rec, valid))


def _validate_turn(rec: NewTurn, max_payload_bytes: int) -> _ValidTurn:
    """Check every field of ``rec``; return its arrays, experts and JSON parts in stored form."""
    check_text(rec.session_id, what="session_id", max_chars=64)
    if not isinstance(rec.turn_index, int) or rec.turn_index < 0:
        raise InvalidRecordError(f"turn_index must be a non-negative integer, got {rec.turn_index!r}")
    if rec.route not in ROUTES:
        raise InvalidRecordError(f"route must be one of {ROUTES}, got {rec.route!r}")
    for name in ("segment_index", "segment_offset", "thread_index"):
        value = getattr(rec, name)
        if not isinstance(value, int) or value < 0:
            raise InvalidRecordError(f"{name} must be a non-negative integer, got {value!r}")
    for name in ("boundary_reason", "finish_reason", "request_fingerprint", "parent_turn_id"):
        check_text(getattr(rec, name), what=name, max_chars=64)
    if rec.latency_ms is not None and not math.isfinite(rec.latency_ms):
        raise InvalidRecordError("latency_ms must be finite")
    context, generated, logprobs, versions, mask, words, n_trained = _validate_arrays(rec)
    experts_blob, experts_raw, experts_shape, experts_dtype = _validate_experts(rec.routed_experts)
    sampling = dict(rec.sampling_params)
    info = dict(rec.info)
    return _ValidTurn(
        context=context,
        generated=generated,
        logprobs=logprobs,
        versions=versions,
        mask=mask,
        words=words,
        n_trained=n_trained,
        experts_blob=experts_blob,
        experts_raw=experts_raw,
        experts_shape=experts_shape,
        experts_dtype=experts_dtype,
        sampling=sampling,
        info=info,
        sampling_json=canonical_json(sampling, what="sampling_params", max_bytes=max_payload_bytes),
        info_json=canonical_json(info, what="turn info", max_bytes=max_payload_bytes),
    )


def _validate_arrays(
    rec: NewTurn,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The per-token arrays of ``rec``, checked: sizes agree, ids non-negative, logprobs <= 1e-3."""
    context = _as_array(rec.context_ids, "int32", what="context_ids")
    generated = _as_array(rec.generated_ids, "int32", what="generated_ids")
    logprobs = _as_array(rec.logprobs, "float32", what="logprobs")
    versions = _as_array(rec.policy_versions, "int32", what="policy_versions")
    # The four 4-byte arrays in one buffer (logprobs as their int32 bit patterns): one sign check
    # of the ints and one wire encoding for all four.
    words = np.concatenate((context, generated, versions, logprobs.view(np.int32)))
    ints = words[: words.size - logprobs.size]
    if ints.size and ints.min() < 0:
        if versions.size and versions.min() < 0:
            raise InvalidRecordError("policy_versions must be non-negative")
        raise InvalidRecordError("token ids must be non-negative")
    mask = (
        np.frombuffer(_all_true(generated.size), dtype=np.bool_)  # read-only, shared
        if rec.loss_mask is None
        else _as_array(rec.loss_mask, "bool", what="loss_mask")
    )
    n_trained = generated.size if rec.loss_mask is None else int(np.count_nonzero(mask))
    n = generated.size
    for name, arr in (("logprobs", logprobs), ("policy_versions", versions), ("loss_mask", mask)):
        if arr.size != n:
            raise InvalidRecordError(
                f"{name} has {arr.size} entries but generated_ids has {n}; every generated token needs one"
            )
    if n and not logprobs.max() <= MAX_LOGPROB:  # max propagates NaN, which fails the comparison too
        if np.isnan(logprobs).any():
            raise InvalidRecordError("logprobs contain NaN")
        raise InvalidRecordError(
            f"logprobs must be log-probabilities, at most {MAX_LOGPROB} (<= 0 up to rounding); "
            f"got {float(logprobs.max())}"
        )
    if context.size + n == 0:
        raise InvalidRecordError("a turn must carry at least one token")
    return context, generated, logprobs, versions, mask, words, n_trained


def _validate_experts(experts: np.ndarray | None) -> tuple[bytes | None, bytes, list[int] | None, str | None]:
    """Routed experts as (lz4 blob, raw bytes, shape, dtype), in the smallest dtype holding every id."""
    if experts is None:
        return None, b"", None, None
    ex = np.asarray(experts)
    if ex.ndim != 3:
        raise InvalidRecordError(f"routed_experts must be [tokens, layers, top_k], got shape {ex.shape}")
    if ex.dtype.kind not in "iu":
        raise InvalidRecordError(f"routed_experts must hold integers, got {ex.dtype}")
    top = int(ex.max()) if ex.size else 0
    if ex.size and (int(ex.min()) < 0 or top > np.iinfo(np.int32).max):
        raise InvalidRecordError("routed_experts must hold non-negative expert ids")
    # The smallest dtype that holds every id (MoE models have at most a few hundred experts).
    dtype = "uint8" if top < 256 else ("int16" if top < 32768 else "int32")
    ex = np.ascontiguousarray(ex.astype(dtype, copy=False))
    raw = ex.tobytes()
    return lz4.frame.compress(raw, compression_level=0), raw, [int(d) for d in ex.shape], dtype


def _turn_content_hash(rec: NewTurn, v: _ValidTurn) -> str:
    """sha256 over the turn's fields and arrays: what a re-sent key must match.

    The header's key names are part of stored hashes: they stay as they are when fields are renamed.
    """
    # Our own fields, already validated: plain JSON types, so orjson directly.
    header = orjson.dumps(
        {
            "session_id": rec.session_id,
            "turn_index": rec.turn_index,
            "lineage_index": rec.thread_index,  # the hash keeps the field's first name
            "parent_turn_id": rec.parent_turn_id,
            "route": rec.route,
            "segment_index": rec.segment_index,
            "segment_offset": rec.segment_offset,
            "boundary_reason": rec.boundary_reason,
            "finish_reason": rec.finish_reason,
            "request_fingerprint": rec.request_fingerprint,
            "experts_shape": v.experts_shape,
            "experts_dtype": v.experts_dtype,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    h = hashlib.sha256()
    # Each part behind its length; the arrays as little-endian bytes (hashed in place, no copies).
    parts: tuple[bytes | np.ndarray, ...] = (
        header,
        v.sampling_json,
        v.info_json,
        v.context,
        v.generated,
        v.logprobs,
        v.mask,
        v.versions,
        v.experts_raw,
    )
    for part in parts:
        if isinstance(part, bytes):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
        else:
            h.update(part.nbytes.to_bytes(8, "little"))
            h.update(part.data)
    return h.hexdigest()


def _encode_turn(key: str, rec: NewTurn, v: _ValidTurn, content_hash: str) -> PreparedTurn:
    """The turn row, its event payload and the arrays in PostgreSQL's binary wire format."""
    n = v.generated.size
    context_wire, generated_wire, versions_wire, logprobs_wire = encode_4byte_runs(
        v.words, ((v.context.size, INT4_OID), (n, INT4_OID), (v.versions.size, INT4_OID), (n, FLOAT4_OID))
    )
    wire = {
        "context_ids": context_wire,
        "generated_ids": generated_wire,
        "logprobs": logprobs_wire,
        "loss_mask": all_true_bool_array(n)
        if rec.loss_mask is None
        else encode_array(v.mask, BOOL_ARRAY_OID),
        "policy_versions": versions_wire,
    }
    row = {
        "id": key,
        "session_id": rec.session_id,
        "turn_index": rec.turn_index,
        "thread_index": rec.thread_index,
        "parent_turn_id": rec.parent_turn_id,
        "route": rec.route,
        "segment_index": rec.segment_index,
        "segment_offset": rec.segment_offset,
        "boundary_reason": rec.boundary_reason,
        "n_context": int(v.context.size),
        "n_generated": int(n),
        "n_trained": int(v.n_trained),
        "min_policy_version": int(v.versions.min()) if n else None,
        "max_policy_version": int(v.versions.max()) if n else None,
        "experts": v.experts_blob,
        "experts_shape": v.experts_shape,
        "experts_dtype": v.experts_dtype,
        "experts_codec": "lz4" if v.experts_blob is not None else None,
        "finish_reason": rec.finish_reason,
        "sampling_params": v.sampling,
        "request_fingerprint": rec.request_fingerprint,
        "content_hash": content_hash,
        "latency_ms": rec.latency_ms,
        "info": v.info,
    }
    # The turn row (same run and position, id = the event's key) holds everything else; a small
    # payload keeps the append cheap (PostgreSQL parses it into jsonb: ~10 us for nine fields).
    payload = {"turn_index": rec.turn_index, "n_generated": int(n)}
    arrays = {
        "context_ids": v.context,
        "generated_ids": v.generated,
        "logprobs": v.logprobs,
        "loss_mask": v.mask,
        "policy_versions": v.versions,
    }
    json_bytes = {
        "sampling_params": v.sampling_json,
        "info": v.info_json,
        "event_payload": orjson.dumps(payload, option=orjson.OPT_SORT_KEYS),
    }
    return PreparedTurn(
        key=key,
        row=row,
        arrays=arrays,
        content_hash=content_hash,
        event_payload=payload,
        wire=wire,
        json_bytes=json_bytes,
    )


def decode_experts(
    blob: bytes | None, shape: Sequence[int] | None, dtype: str | None, codec: str | None
) -> np.ndarray | None:
    """Turn a stored experts blob back into a ``[tokens, layers, top_k]`` array."""
    if blob is None or shape is None or dtype is None:
        return None
    raw = lz4.frame.decompress(bytes(blob)) if codec == "lz4" else bytes(blob)
    return np.frombuffer(raw, dtype=dtype).reshape(tuple(shape))


def check_duplicate(stored_position: int, stored_hash: str, key: str, content_hash: str) -> AppendResult:
    """The stored append for a re-sent ``key``; raises when its content differs (non-determinism)."""
    if stored_hash != content_hash:
        raise IdempotencyConflictError(
            f"key {key} was already recorded at position {stored_position} with different content "
            f"(stored hash {stored_hash[:12]}, new {content_hash[:12]}): the writer is not deterministic"
        )
    return AppendResult(position=int(stored_position), key=key, duplicate=True)


@dataclass(frozen=True)
class Run:
    """A run: one RL experiment with its frozen config snapshot."""

    id: int
    name: str
    config: dict[str, Any]
    config_hash: str
    created_at: float


@dataclass(frozen=True)
class RunSummary:
    """Counts of a run: sessions by status, turns, tokens, trained tokens, mean reward, last position.

    ``sessions`` counts every session by status, eval ones included; ``eval_sessions`` counts the
    eval sessions alone; ``trained_tokens`` counts training sessions' tokens only (eval sessions are
    never trained). ``mean_reward`` is over the finished sessions of training tasks and
    ``eval_mean_reward`` over the finished eval sessions (of every policy version); None without any.
    """

    run: str
    sessions: dict[str, int]
    turns: int
    tokens: int
    trained_tokens: int
    mean_reward: float | None
    last_position: int
    eval_sessions: dict[str, int] = field(default_factory=dict)
    eval_mean_reward: float | None = None


@dataclass(frozen=True)
class Event:
    """One row of a run's log."""

    run_id: int
    position: int
    kind: str
    session_id: str | None
    key: str
    content_hash: str
    payload: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed; ``duplicate`` is True when the key was already recorded."""

    position: int
    key: str
    duplicate: bool


class SessionHead(NamedTuple):
    """What a proxy checks its cached session state against, per request (one indexed read)."""

    status: str
    turns: int
    """Turns recorded: ``max(turn_index) + 1``, 0 without turns."""
    attempt: int
    """The attempt that owns the session (in-flight resume hands it to a later one)."""


@dataclass(frozen=True)
class Session:
    """A session (trajectory) as the sessions projection holds it."""

    id: str
    run_id: int
    task_id: int | None
    attempt: int
    agent: str | None
    sandbox: str | None
    status: str
    reward: float | None
    finish_reason: str | None
    error: str | None
    info: dict[str, Any]
    created_at: float
    finished_at: float | None
    parent_session_id: str | None = None
    """The session this one was forked from (``dressage-worker fork``); None for a root."""
    fork_turn: int | None = None
    """How many of the parent's turns this session starts with (replayed from the log)."""


class SessionOpening(TypedDict, total=False):
    """What a session is when it opens: the keyword fields of opening one, shared by the store, the
    proxy contract and its implementations (``attempt`` 1 when not given)."""

    task_id: int | None
    attempt: int
    agent: str | None
    sandbox: str | None
    info: Mapping[str, object] | None
    parent_session_id: str | None
    fork_turn: int | None


class SessionOutcome(TypedDict, total=False):
    """How a session ended beyond its status: the keyword fields of finalizing it, shared by the
    store, the proxy contract and its implementations (``info`` replaces the session's info;
    ``attempt`` refuses the finalize when another attempt took the session over)."""

    reward: float | None
    finish_reason: str | None
    error: str | None
    info: Mapping[str, object] | None
    attempt: int | None


@dataclass(frozen=True)
class Turn:
    """A recorded turn with its per-token arrays as numpy."""

    id: str
    session_id: str
    turn_index: int
    thread_index: int
    parent_turn_id: str | None
    route: str
    segment_index: int
    segment_offset: int
    boundary_reason: str | None
    context_ids: np.ndarray
    generated_ids: np.ndarray
    logprobs: np.ndarray
    loss_mask: np.ndarray
    policy_versions: np.ndarray
    routed_experts: np.ndarray | None
    finish_reason: str | None
    sampling_params: dict[str, object]
    request_fingerprint: str | None
    content_hash: str
    latency_ms: float | None
    info: dict[str, Any]
    position: int


@dataclass(frozen=True)
class TaskSpec:
    """One dataset row to enqueue: its index (= group index) and payload."""

    task_index: int
    payload: dict[str, Any]


@dataclass(frozen=True)
class TaskLease:
    """A claimed (task, sample) held until ``expires_at`` by ``owner``."""

    task_id: int
    run_id: int
    task_index: int
    group_index: int
    sample_index: int
    attempt: int
    payload: dict[str, Any]
    owner: str
    expires_at: float
    kind: str = "train"
    eval_version: int | None = None


@dataclass(frozen=True)
class TaskPair:
    """Where a (task, sample) queue entry sits: its task, group and sample indexes and its kind."""

    id: int
    task_index: int
    group_index: int
    sample_index: int
    kind: str


@dataclass(frozen=True)
class TaskState:
    """One (task, sample) pair of the queue and where it stands."""

    task_id: int
    task_index: int
    sample_index: int
    state: str
    kind: str
    eval_version: int | None


@dataclass(frozen=True)
class ConsumerCheckpoint:
    """How far a consumer (e.g. ``train:main``) has read a run, and its last step."""

    consumer: str
    position: int
    step: int
    state: dict[str, Any]


@dataclass(frozen=True)
class TrainStep:
    """The manifest of optimizer step ``step`` of a consumer."""

    consumer: str
    step: int
    position: int
    batch_hash: str
    manifest: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class ArtifactRef:
    """A content-addressed blob recorded in the log."""

    id: int
    session_id: str | None
    name: str
    sha256: str
    size: int
    media_type: str
    uri: str
