"""Export a run as a self-contained, verifiable archive directory (before ``drop``).

Layout of an export directory::

    manifest.json          run name, config, schema revision, counts, sha256 + size of every file
    events.jsonl           the log itself, in position order
    sessions.jsonl  tasks.jsonl  policy_versions.jsonl  train_steps.jsonl  artifacts.jsonl
    turns.jsonl            one line per turn with its scalar fields, in position order
    arrays.npz             per-token arrays of every turn, concatenated, with offsets
    artifacts/<sha256>     the artifact blobs, content-addressed

``arrays.npz`` holds ``context_ids``/``context_offsets``, ``generated_ids``/``generated_offsets``
(``logprobs``, ``loss_mask`` and ``policy_versions`` share the generated offsets) and
``experts``/``experts_offsets``: each turn's routed experts as raw little-endian bytes, whose
shape and dtype are in ``turns.jsonl``, so every array comes back exactly as it was stored.
Turn ``i`` (the ``i``-th line of ``turns.jsonl``) owns ``x[offsets[i]:offsets[i + 1]]``.
The manifest is written last: a directory without one is an interrupted export.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select

from dressage.errors import StoreError, VerificationError
from dressage.store import schema as t
from dressage.store.db import READONLY_OPTION, current_revision
from dressage.store.event_store import EventStore
from dressage.store.records import Event, Turn

FORMAT = "dressage-run-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_TURN_SCALARS = (
    "id",
    "session_id",
    "turn_index",
    "thread_index",
    "parent_turn_id",
    "route",
    "segment_index",
    "segment_offset",
    "boundary_reason",
    "finish_reason",
    "sampling_params",
    "request_fingerprint",
    "content_hash",
    "latency_ms",
    "info",
    "position",
)


class ExportVerificationError(StoreError, VerificationError):
    """An export directory does not match its manifest (missing, extra or altered files)."""


def _jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` as JSON lines (sorted keys, UTF-8); return how many were written."""
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True, ensure_ascii=False, default=_json_default) + "\n")
            n += 1
    return n


def _json_default(value: Any) -> Any:
    """JSON for values the database drivers return (numpy scalars, Decimal, bytes)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return float(value) if hasattr(value, "as_integer_ratio") else str(value)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _table_rows(store: EventStore, table: Any, run_id: int, order: list[Any]) -> list[dict[str, Any]]:
    """All rows of ``table`` for a run (the store API has no listing for tasks or all train steps)."""
    with store.db.engine.connect().execution_options(**{READONLY_OPTION: True}) as conn:
        rows = conn.execute(select(table).where(table.c.run_id == run_id).order_by(*order)).mappings()
        return [_without_run_id(dict(row)) for row in rows]


def _without_run_id(row: dict[str, Any]) -> dict[str, Any]:
    """Drop the database-local run id: an export names its run, ids differ between databases."""
    return {k: v for k, v in row.items() if k != "run_id"}


def _event_row(e: Event) -> dict[str, Any]:
    return _without_run_id(asdict(e))


def _turn_arrays(turns: list[Turn]) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Concatenate per-token arrays with offsets; return the arrays and each turn's scalar row."""

    def offsets(sizes: list[int]) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)

    def cat(parts: list[np.ndarray], dtype: str) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    rows: list[dict[str, Any]] = []
    experts: list[np.ndarray] = []
    for turn in turns:
        row = {name: getattr(turn, name) for name in _TURN_SCALARS}
        row.update(
            n_context=int(turn.context_ids.size),
            n_generated=int(turn.generated_ids.size),
            n_trained=int(turn.loss_mask.sum()),
        )
        ex = turn.routed_experts
        row["experts_shape"] = list(ex.shape) if ex is not None else None
        row["experts_dtype"] = ex.dtype.name if ex is not None else None
        raw = np.ascontiguousarray(ex).view(np.uint8).reshape(-1) if ex is not None else np.zeros(0, np.uint8)
        experts.append(raw)
        rows.append(row)
    arrays = {
        "context_ids": cat([x.context_ids for x in turns], "int32"),
        "context_offsets": offsets([x.context_ids.size for x in turns]),
        "generated_ids": cat([x.generated_ids for x in turns], "int32"),
        "logprobs": cat([x.logprobs for x in turns], "float32"),
        "loss_mask": cat([x.loss_mask for x in turns], "bool"),
        "policy_versions": cat([x.policy_versions for x in turns], "int32"),
        "generated_offsets": offsets([x.generated_ids.size for x in turns]),
        "experts": cat(experts, "uint8"),
        "experts_offsets": offsets([x.size for x in experts]),
    }
    return arrays, rows


def export_run(store: EventStore, run: str, out_dir: Path | str) -> dict[str, Any]:
    """Write run ``run`` to ``out_dir`` (absent or empty) and return the manifest.

    Reads the log in separate read transactions: export a run that no worker is writing to (its
    sessions are finalized), or the archive is a consistent prefix only per table.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"export directory {out} exists and is not empty; choose a new directory")
    r = store.runs.get(run)
    out.mkdir(parents=True, exist_ok=True)
    (out / "artifacts").mkdir()

    last_position = 0

    def events() -> Iterator[dict[str, Any]]:
        nonlocal last_position
        for e in store.events.tail(r):  # streamed in batches, position order
            last_position = e.position
            yield _event_row(e)

    sessions = store.sessions.list(r)
    turns = sorted(store.turns.read(r), key=lambda x: x.position)
    arrays, turn_rows = _turn_arrays(turns)
    artifacts = store.artifacts.list(r)
    counts = {
        "events": _jsonl(out / "events.jsonl", events()),
        "sessions": _jsonl(out / "sessions.jsonl", (_without_run_id(asdict(s)) for s in sessions)),
        "tasks": _jsonl(out / "tasks.jsonl", _table_rows(store, t.tasks, r.id, [t.tasks.c.id])),
        "turns": _jsonl(out / "turns.jsonl", turn_rows),
        "policy_versions": _jsonl(
            out / "policy_versions.jsonl",
            _table_rows(store, t.policy_versions, r.id, [t.policy_versions.c.version]),
        ),
        "train_steps": _jsonl(
            out / "train_steps.jsonl",
            _table_rows(store, t.train_steps, r.id, [t.train_steps.c.consumer, t.train_steps.c.step]),
        ),
        "artifacts": _jsonl(
            out / "artifacts.jsonl",
            (asdict(a) | {"path": f"artifacts/{a.sha256}"} for a in artifacts),
        ),
        "tokens": int(arrays["context_ids"].size + arrays["generated_ids"].size),
        "trained_tokens": int(arrays["loss_mask"].sum()),
    }
    np.savez(out / "arrays.npz", allow_pickle=False, **arrays)
    for ref in artifacts:
        blob = out / "artifacts" / ref.sha256
        if not blob.exists():
            blob.write_bytes(store.artifacts.get(ref))

    files = {
        p.relative_to(out).as_posix(): {"sha256": _sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "run": r.name,
        "config": r.config,
        "config_hash": r.config_hash,
        "run_created_at": r.created_at,
        "exported_at": time.time(),
        "backend": store.db.dialect,
        "schema_revision": current_revision(store.db.engine),
        "last_position": last_position,
        "counts": counts,
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return manifest


def verify_export(export_dir: Path | str) -> dict[str, Any]:
    """Re-hash every file of an export against its manifest; return the manifest when all match.

    Raises :class:`ExportVerificationError` listing missing, altered and unexpected files.
    """
    root = Path(export_dir)
    try:
        manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportVerificationError(
            f"{root} has no readable {MANIFEST} ({e}); it is not an export or the export was interrupted"
        ) from e
    if manifest.get("format") != FORMAT:
        raise ExportVerificationError(f"{root / MANIFEST} is not a {FORMAT} manifest")
    expected: dict[str, dict[str, Any]] = manifest.get("files", {})
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {MANIFEST}
    problems = [f"missing {name}" for name in sorted(set(expected) - present)]
    problems += [f"unexpected {name}" for name in sorted(present - set(expected))]
    for name in sorted(set(expected) & present):
        if _sha256_file(root / name) != expected[name]["sha256"]:
            problems.append(f"altered {name}")
    if problems:
        shown = ", ".join(problems[:10]) + (f" and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise ExportVerificationError(f"export {root} does not match its manifest: {shown}")
    return manifest


def load_export_turns(export_dir: Path | str) -> list[dict[str, Any]]:
    """Each turn of an export as its scalar row plus its per-token numpy arrays (exact dtypes)."""
    root = Path(export_dir)
    rows = [json.loads(line) for line in (root / "turns.jsonl").read_text(encoding="utf-8").splitlines()]
    with np.load(root / "arrays.npz", allow_pickle=False) as z:
        a = {k: z[k] for k in z.files}
    out = []
    for i, row in enumerate(rows):
        c0, c1 = a["context_offsets"][i : i + 2]
        g0, g1 = a["generated_offsets"][i : i + 2]
        e0, e1 = a["experts_offsets"][i : i + 2]
        experts = None
        if row["experts_shape"] is not None:
            raw = a["experts"][e0:e1].tobytes()
            experts = np.frombuffer(raw, dtype=row["experts_dtype"]).reshape(row["experts_shape"])
        out.append(
            row
            | {
                "context_ids": a["context_ids"][c0:c1],
                "generated_ids": a["generated_ids"][g0:g1],
                "logprobs": a["logprobs"][g0:g1],
                "loss_mask": a["loss_mask"][g0:g1],
                "policy_versions": a["policy_versions"][g0:g1],
                "routed_experts": experts,
            }
        )
    return out
