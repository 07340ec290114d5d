"""Datasets: JSONL task files, one JSON object per line.

Fields of a row (unknown fields are errors, so a typo never silently drops data):

- ``prompt`` (string) **or** ``messages`` (OpenAI chat messages) -- exactly one;
- ``label``: anything the reward compares against (string, number, list, object);
- ``metadata``: free-form object (e.g. ``test_command`` for the ``tests`` reward);
- ``files``: ``{path: text}`` written into the sandbox workspace before the agent starts;
- ``tests``: ``{path: text}`` written only when the ``tests`` reward runs (hidden from the agent);
- ``id``: optional stable identifier.

Blank lines and lines starting with ``//`` are skipped. Every error names the file and line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dressage.agents.base import Task
from dressage.errors import ConfigError
from dressage.store import TaskSpec


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Any = None


class TaskRow(BaseModel):
    """The schema of one JSONL line."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    prompt: str | None = None
    messages: list[_Message] | None = None
    label: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    tests: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_input(self) -> TaskRow:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must not be empty")
        return self


def load_tasks(path: str | Path, limit: int | None = None) -> list[Task]:
    """Read a JSONL task file into :class:`Task` objects numbered from 0."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(
            f"dataset {p} does not exist (dataset.path is relative to the config file)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read dataset {p}: {e}") from None
    tasks: list[Task] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p} line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p} line {lineno}: each line must be a JSON object")
        try:
            row = TaskRow.model_validate(data)
        except ValidationError as e:
            msgs = "; ".join(
                f"{'.'.join(str(x) for x in err['loc']) or 'row'}: {err['msg'].removeprefix('Value error, ')}"
                for err in e.errors()
            )
            raise ConfigError(f"{p} line {lineno}: {msgs}") from None
        tasks.append(
            Task(
                index=len(tasks),
                id=row.id,
                prompt=row.prompt,
                messages=[m.model_dump(exclude_none=True) for m in row.messages] if row.messages else None,
                label=row.label,
                metadata=row.metadata,
                files=row.files,
                tests=row.tests,
            )
        )
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise ConfigError(f"dataset {p} has no tasks")
    return tasks


def dataset_digest(tasks: list[Task]) -> str:
    """sha256 of the tasks' canonical JSON: recorded in the run snapshot to detect a changed dataset."""
    h = hashlib.sha256()
    for t in tasks:
        h.update(json.dumps(t.to_payload(), sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def task_specs(tasks: list[Task]) -> list[TaskSpec]:
    """Queue entries for the store (the payload holds the whole task)."""
    return [TaskSpec(task_index=t.index, payload=t.to_payload()) for t in tasks]
