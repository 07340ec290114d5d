"""Read the history of an offline W&B run from its ``run-<id>.wandb`` file.

wandb 0.31 reads these files only inside its Go core (``wandb sync``); its records are its own
protobuf messages (``wandb.proto.wandb_internal_pb2.Record``), which this reader decodes after
undoing the file's framing: a 7-byte header (``:W&B``, magic ``0xBEE1``, version), then LevelDB log
blocks of 32 KiB whose chunks carry a CRC-32C, a length and a type (full, first, middle, last).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of the file, decoded with wandb's own protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, hex(magic), version)
    out, pending, pos = [], b"", 7
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # the block's tail is zero padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The run's logged rows (``run.log`` calls) as dicts, with ``_step``."""
    [path] = run_dir.glob("run-*.wandb")
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            row = {"_step": record.history.step.num}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows
