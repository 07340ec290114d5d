"""SWE-bench / SWE-Gym task instances: the public record format and its readers.

A record is one instance as the Hugging Face datasets ``princeton-nlp/SWE-bench`` (and its Lite and
Verified subsets) and ``SWE-Gym/SWE-Gym`` publish it: ``instance_id``, ``repo`` (``owner/name``),
``base_commit``, ``problem_statement``, the gold ``patch`` and the ``test_patch``, and
``FAIL_TO_PASS`` / ``PASS_TO_PASS`` (JSON strings in the published files, lists in a local one:
both are read). The optional fields are the others those datasets carry (``hints_text``,
``created_at``, ``version``, ``environment_setup_commit``) and the ones SWE-bench 5's harness reads
from an instance (``image``, ``eval_script``, ``log_parser``, ``eval_type``). Two fields are this
recipe's own: ``repo_url`` (where to clone the repository from; see :mod:`recipes.swe.checkout`)
and ``test_cmd`` (the test command when the record has no ``eval_script``). Any other field is an
error naming it, so a typo never silently drops data.

Files: JSON Lines (``.jsonl``, what ``datasets``' ``to_json`` writes), a JSON array (``.json``) or
Parquet (``.parquet``, the files on the Hub), read with pyarrow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dressage.errors import ConfigError
from recipes.extras import require


class SweRecord(BaseModel):
    """One task instance (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(min_length=1)
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="owner/name on GitHub")
    base_commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="the full commit id")
    problem_statement: str = Field(min_length=1)
    patch: str
    test_patch: str = Field(min_length=1)
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    hints_text: str | None = None
    created_at: str | None = None
    version: str | None = None
    environment_setup_commit: str | None = None
    image: str | None = None
    eval_script: str | None = None
    log_parser: str | None = None
    eval_type: str | None = None
    repo_url: str | None = None
    test_cmd: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        """The published datasets store these lists as JSON strings."""
        if isinstance(v, str):
            try:
                return json.loads(v)
            except json.JSONDecodeError as e:
                raise ValueError(f"not a JSON list of test names ({e.msg})") from None
        return v

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _some(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("must name at least one test (an instance no test checks cannot be graded)")
        return v


def _raw_records(path: Path) -> list[tuple[str, Any]]:
    """(where, raw value) for each record of ``path``, by its suffix."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return [(f"row {i}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"dataset {path} does not exist (dataset.path is relative to the config file)"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"cannot read dataset {path}: {e}") from None
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, list):
            raise ConfigError(f"{path}: a .json dataset must be an array of instances")
        return [(f"item {i}", r) for i, r in enumerate(data)]
    if suffix != ".jsonl":
        raise ConfigError(f"dataset {path}: SWE instances are read from .jsonl, .json or .parquet files")
    out: list[tuple[str, Any]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append((f"line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
    return out


def read_records(path: str | Path, limit: int | None = None) -> list[SweRecord]:
    """The instances of ``path`` (at most ``limit``); a bad record is a :class:`ConfigError` naming it
    and the field."""
    p = Path(path)
    records: list[SweRecord] = []
    for where, raw in _raw_records(p):
        if not isinstance(raw, dict):
            raise ConfigError(f"{p} {where}: each instance must be a JSON object")
        try:
            records.append(SweRecord.model_validate(raw))
        except ValidationError as e:
            msgs = "; ".join(
                f"{'.'.join(str(x) for x in err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
                for err in e.errors()
            )
            raise ConfigError(f"{p} {where}: {msgs}") from None
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise ConfigError(f"dataset {p} has no instances")
    seen: set[str] = set()
    for r in records:
        if r.instance_id in seen:
            raise ConfigError(f"{p}: instance_id {r.instance_id!r} appears twice")
        seen.add(r.instance_id)
    return records


def patch_paths(patch: str) -> list[str]:
    """The paths a unified diff touches (both sides of a rename), in order, by ``unidiff``."""
    patch_set = require("unidiff", "swe").PatchSet

    out: list[str] = []
    for f in patch_set(patch):
        for name in (f.source_file, f.target_file):
            path = name.split("/", 1)[1] if name.startswith(("a/", "b/")) else name
            if name != "/dev/null" and path not in out:
                out.append(path)
    return out
