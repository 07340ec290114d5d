"""Sandbox checkpoints in an export (``export --checkpoints``) and back (``import``).

An export with ``--checkpoints`` holds, for its sessions:

* ``checkpoints.parquet``: one row per (session, turn) of ``sandbox_checkpoints`` without its
  database-local URIs; ``manifest_file`` and ``request_file`` name the blobs below;
* ``checkpoint_changes.parquet``: the ``workspace_changes`` rows (``sandbox_checkpoint_changes``);
* ``checkpoints/<sha256>``: every blob they need, each once: the manifests (their blob URIs
  rewritten to ``checkpoints/<sha256>``, so exporting an imported run gives the same bytes), the
  agent's requests, and every file a manifest names (a file shared by turns, sessions or runs: once).

``import`` puts the blobs into its own blob store (each checked against its name), rewrites each
manifest's blob URIs to that store's (the manifest's identity, ``manifest_sha256``, does not cover
URIs, so it is unchanged) and inserts the rows with the positions of their ``checkpoint`` events.
An export without these files imports without checkpoints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Connection, insert, select

from dressage.errors import ExportVerificationError, StoreError
from dressage.paddock.checkpoints import Manifest
from dressage.store import schema as t
from dressage.store.artifacts import BlobStore
from dressage.store.event_store import EventStore

FOLDER = "checkpoints"
CHECKPOINTS_FILE = "checkpoints.parquet"
CHANGES_FILE = "checkpoint_changes.parquet"
_meta = {"dressage.schema": "2"}

CHECKPOINTS = pa.schema(
    [
        ("session_id", pa.string()),
        ("turn_index", pa.int32()),
        ("manifest_sha256", pa.string()),
        ("manifest_file", pa.string()),
        ("files", pa.int32()),
        ("bytes", pa.int64()),
        ("hashed_bytes", pa.int64()),
        ("request_sha256", pa.string()),
        ("request_file", pa.string()),
        ("prompt_digest", pa.string()),
        ("position", pa.int64()),
        ("created_at", pa.float64()),
    ],
    metadata=_meta,
)
CHANGES = pa.schema(
    [
        ("session_id", pa.string()),
        ("turn_index", pa.int32()),
        ("path", pa.string()),
        ("change", pa.string()),
        ("kind", pa.string()),
        ("mode", pa.int32()),
        ("size", pa.int64()),
        ("sha256", pa.string()),
    ],
    metadata=_meta,
)


def _blobs(store: EventStore) -> BlobStore:
    if store.artifacts.blobs is None:
        raise StoreError("this store has no blob store configured; open it with EventStore.open()")
    return store.artifacts.blobs


def _rows(store: EventStore, table: Any, session_ids: Sequence[str]) -> list[dict[str, Any]]:
    wanted = sorted(set(session_ids))
    out: list[dict[str, Any]] = []
    with store.db.read() as conn:
        for i in range(0, len(wanted), 500):
            q = select(table).where(table.c.session_id.in_(wanted[i : i + 500]))
            out += [dict(r) for r in conn.execute(q).mappings()]
    keys = (
        ("session_id", "turn_index", "path")
        if table is t.sandbox_checkpoint_changes
        else ("session_id", "turn_index")
    )
    return sorted(out, key=lambda r: tuple(r[k] for k in keys))


def write_checkpoints(store: EventStore, session_ids: Sequence[str], out: Path) -> dict[str, int]:
    """Write the checkpoint files of ``session_ids`` into the export folder ``out``; their counts."""
    blobs = _blobs(store)
    folder = out / FOLDER
    folder.mkdir()

    def keep(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = folder / digest
        if not path.exists():
            path.write_bytes(data)
        return digest

    rows = []
    for ck in _rows(store, t.sandbox_checkpoints, session_ids):
        manifest = Manifest.from_bytes(blobs.get(ck["manifest_uri"]))
        for sha, uri in manifest.blobs.items():
            if not (folder / sha).exists():
                keep(blobs.get(uri))
        portable = replace(manifest, blobs={sha: f"{FOLDER}/{sha}" for sha in manifest.blobs})
        data = portable.to_bytes()
        request = None if ck["request_uri"] is None else keep(blobs.get(ck["request_uri"]))
        rows.append(
            {k: ck[k] for k in CHECKPOINTS.names if k in ck}
            | {"manifest_file": keep(data), "request_file": request}
        )
    changes = _rows(store, t.sandbox_checkpoint_changes, session_ids)
    pq.write_table(pa.Table.from_pylist(rows, schema=CHECKPOINTS), out / CHECKPOINTS_FILE, compression="zstd")
    pq.write_table(pa.Table.from_pylist(changes, schema=CHANGES), out / CHANGES_FILE, compression="zstd")
    return {
        "checkpoints": len(rows),
        "checkpoint_changes": len(changes),
        "checkpoint_blobs": sum(1 for _ in folder.iterdir()),
    }


def prepare_import(store: EventStore, root: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Put an export's checkpoint blobs into this log's blob store (each checked) and return the
    rows to insert (manifests rewritten to this store's URIs); nothing when the export has none."""
    if not (root / CHECKPOINTS_FILE).exists():
        return [], []
    blobs = _blobs(store)
    uris: dict[str, str] = {}
    for blob in sorted((root / FOLDER).iterdir()) if (root / FOLDER).exists() else []:
        data = blob.read_bytes()
        if hashlib.sha256(data).hexdigest() != blob.name:
            raise ExportVerificationError(f"checkpoint blob {blob} does not hash to its name")
        _, uris[blob.name] = blobs.put(data)
    rows: list[dict[str, Any]] = []
    for row in pq.read_table(root / CHECKPOINTS_FILE).to_pylist():
        missing = [x for x in (row["manifest_file"], row["request_file"]) if x is not None and x not in uris]
        if missing:
            raise ExportVerificationError(f"checkpoint blob {missing[0]} is not in {root / FOLDER}")
        original = Manifest.from_bytes((root / FOLDER / row["manifest_file"]).read_bytes())
        absent = [sha for sha in original.blobs if sha not in uris]
        if absent:
            raise ExportVerificationError(f"checkpoint file blob {absent[0]} is not in {root / FOLDER}")
        local = replace(original, blobs={sha: uris[sha] for sha in original.blobs})
        _, manifest_uri = blobs.put(local.to_bytes())
        request = row.pop("request_file")
        del row["manifest_file"]
        rows.append(
            row | {"manifest_uri": manifest_uri, "request_uri": None if request is None else uris[request]}
        )
    return rows, pq.read_table(root / CHANGES_FILE).to_pylist()


def insert_checkpoints(
    conn: Connection, run_id: int, rows: list[dict[str, Any]], changes: list[dict[str, Any]]
) -> None:
    """Insert the prepared checkpoint rows of an imported run (in the import's transaction)."""
    if rows:
        conn.execute(insert(t.sandbox_checkpoints), [r | {"run_id": run_id} for r in rows])
    if changes:
        conn.execute(insert(t.sandbox_checkpoint_changes), changes)
