"""Where Dressage keeps derived artefacts (built tokenizers, downloaded templates).

One helper so every loader agrees on the cache root: ``$DRESSAGE_CACHE_DIR`` when set, else
``~/.cache/dressage``. Each kind of artefact lives in its own sub-folder of that root.
"""

from __future__ import annotations

import os
from pathlib import Path

from dressage.config import load_settings


def cache_root() -> Path:
    """Return the Dressage cache root (``$DRESSAGE_CACHE_DIR`` or ``~/.cache/dressage``)."""
    configured = load_settings().cache_dir
    if configured:
        return configured.expanduser()
    return Path.home() / ".cache" / "dressage"


def cache_subdir(name: str, override: str | os.PathLike[str] | None = None) -> Path:
    """Return (and create) the cache folder for one kind of artefact; ``override`` wins when given."""
    path = Path(override).expanduser() if override is not None else cache_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
