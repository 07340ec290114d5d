"""Hashes of the exact tensors of a batch, the step manifest, and drift diagnosis for replay.

Every array is hashed as ``name | dtype | shape | little-endian bytes`` (each part length-prefixed),
so a change of value, dtype or shape changes the hash. The batch hash covers every sample's
arrays in batch order; the manifest keeps a short hash per sample field, which lets a replay name
the first sample and field that drifted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dressage.training.samples import TrainSample

FIELD_HASH_CHARS = 16


def _update(h: Any, name: str, arr: np.ndarray) -> None:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    for part in (name.encode(), arr.dtype.str.encode(), repr(tuple(arr.shape)).encode(), arr.tobytes()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)


def field_hashes(sample: TrainSample) -> dict[str, str]:
    """A short sha256 of each of the sample's tensors."""
    out = {}
    for name, arr in sample.tensors().items():
        h = hashlib.sha256()
        _update(h, name, arr)
        out[name] = h.hexdigest()[:FIELD_HASH_CHARS]
    return out


def batch_hash(samples: Sequence[TrainSample]) -> str:
    """sha256 over every tensor of every sample, in batch order."""
    h = hashlib.sha256()
    h.update(len(samples).to_bytes(8, "little"))
    for s in samples:
        for name, arr in s.tensors().items():
            _update(h, name, arr)
    return h.hexdigest()


def sample_entries(samples: Sequence[TrainSample]) -> list[dict[str, Any]]:
    """Manifest entries: provenance plus per-field hashes, one per sample."""
    return [{**s.describe(), "hashes": field_hashes(s)} for s in samples]


def first_drift(recorded: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]) -> str:
    """Describe the first differing sample and field between two manifests' sample lists."""
    for i, (a, b) in enumerate(zip(recorded, current, strict=False)):
        where = f"sample {i} (session {a.get('session')} segment {a.get('segment')})"
        for key in ("session", "segment", "turns", "response"):
            if a.get(key) != b.get(key):
                return f"{where}: {key} was {a.get(key)!r}, now {b.get(key)!r}"
        ha, hb = a.get("hashes", {}), b.get("hashes", {})
        for name in sorted(
            set(ha) | set(hb), key=lambda n: (n not in ha, list(ha).index(n) if n in ha else 0)
        ):
            if ha.get(name) != hb.get(name):
                return f"{where}: field {name} differs (hash {ha.get(name)} recorded, {hb.get(name)} now)"
    if len(recorded) != len(current):
        return f"the step had {len(recorded)} samples, now {len(current)}"
    return "samples are identical; the difference is in the step's decisions or configuration"
