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


def tensor_digest(name: str, arr: np.ndarray) -> bytes:
    """sha256 of one named tensor: ``name | dtype | shape | little-endian bytes``, length-prefixed."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    header = b"".join(
        len(part).to_bytes(8, "little") + part
        for part in (name.encode(), arr.dtype.str.encode(), repr(tuple(arr.shape)).encode())
    )
    h = hashlib.sha256(header + arr.nbytes.to_bytes(8, "little"))  # one update: the same digest
    h.update(memoryview(arr.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]  # the buffer, no copy
    return h.digest()


def field_digests(sample: TrainSample) -> dict[str, bytes]:
    """The full sha256 of each of the sample's tensors, in the sample's field order."""
    return {name: tensor_digest(name, arr) for name, arr in sample.tensors().items()}


def short_hashes(digests: Mapping[str, bytes]) -> dict[str, str]:
    """The manifest's short form of per-tensor digests (the first hex characters)."""
    return {name: d.hex()[:FIELD_HASH_CHARS] for name, d in digests.items()}


def batch_hash(samples: Sequence[TrainSample], digests: Sequence[Mapping[str, bytes]] | None = None) -> str:
    """sha256 over every tensor of every sample, in batch order.

    It hashes the per-tensor digests (name and full sha256 of each tensor, in order), so every byte
    of every tensor is covered while each tensor is read once; pass ``digests`` (from
    :func:`field_digests`) to reuse the ones the manifest entries were built from.
    """
    if digests is None:
        digests = [field_digests(s) for s in samples]
    h = hashlib.sha256()
    h.update(len(samples).to_bytes(8, "little"))
    for per_sample in digests:
        h.update(len(per_sample).to_bytes(8, "little"))
        for name, digest in per_sample.items():
            h.update(len(name).to_bytes(8, "little"))
            h.update(name.encode())
            h.update(digest)
    return h.hexdigest()


def sample_entries(
    samples: Sequence[TrainSample], digests: Sequence[Mapping[str, bytes]] | None = None
) -> list[dict[str, object]]:
    """Manifest entries: provenance plus per-field hashes, one per sample."""
    if digests is None:
        digests = [field_digests(s) for s in samples]
    return [{**s.describe(), "hashes": short_hashes(per)} for s, per in zip(samples, digests, strict=True)]


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
