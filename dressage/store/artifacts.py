"""Content-addressed blob storage for artifacts (sandbox archives, agent logs).

The log keeps only sha256, size and URI (the log's rule 7, docs/architecture.md). :class:`BlobStore` is the interface an
object store can implement; :class:`LocalBlobStore` keeps blobs as files named by their hash.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

from dressage.errors import StoreError


class BlobStore(ABC):
    """Where artifact bytes live; addressed by sha256."""

    @abstractmethod
    def put(self, data: bytes) -> tuple[str, str]:
        """Store ``data``; return ``(sha256, uri)``. Storing the same bytes twice is a no-op."""

    @abstractmethod
    def get(self, uri: str) -> bytes:
        """Return the bytes at ``uri``; raise :class:`StoreError` when missing or corrupted."""


class LocalBlobStore(BlobStore):
    """Blobs as files ``<root>/<aa>/<sha256>``, written atomically (temp file, fsync, rename)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    def put(self, data: bytes) -> tuple[str, str]:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / digest[:2] / digest
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return digest, path.as_uri()

    def get(self, uri: str) -> bytes:
        if not uri.startswith("file://"):
            raise StoreError(f"LocalBlobStore cannot read {uri!r}: only file:// URIs are supported")
        path = Path(uri[len("file://") :])
        try:
            data = path.read_bytes()
        except OSError as e:
            raise StoreError(f"artifact {uri} cannot be read: {e}; was the artifact directory moved?") from e
        if hashlib.sha256(data).hexdigest() != path.name:
            raise StoreError(f"artifact {uri} is corrupted: its sha256 does not match its name")
        return data
