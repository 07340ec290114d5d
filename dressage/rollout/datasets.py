"""Datasets: JSONL task files, one JSON object per line.

Fields of a row (unknown fields are errors, so a typo never silently drops data):

- ``prompt`` (string) **or** ``messages`` (OpenAI chat messages) -- exactly one;
- ``label``: anything the reward compares against (string, number, list, object);
- ``metadata``: free-form object (e.g. ``test_command`` for the ``tests`` reward);
- ``files``: ``{path: text}`` written into the sandbox workspace before the agent starts;
- ``tests``: ``{path: text}`` written only when the ``tests`` reward runs (hidden from the agent);
- ``id``: optional stable identifier.

A path a registered task kind reads (a Harbor dataset directory: :mod:`dressage.rollout.task_kinds`)
is loaded by that kind instead, and a config's ``dataset.loader`` (a dotted path, e.g. a recipe's
reader of a public dataset format: ``recipes/README.md``) reads any other format into tasks.

Blank lines and lines starting with ``//`` are skipped. Every error names the file, line and field.
The whole file is checked before a run is created: message roles must be ones the proxy serves,
``files``/``tests`` paths must stay inside the workspace (no ``..``, no absolute paths), and no text
may hold a NUL character or a lone surrogate (the log cannot store them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dressage.agents.base import Task
from dressage.errors import ConfigError, SandboxError
from dressage.paddock.base import relative_workspace_path
from dressage.rollout import task_kinds
from dressage.store import TaskSpec


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: object = None


class TaskRow(BaseModel):
    """The schema of one JSONL line."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    prompt: str | None = None
    messages: list[_Message] | None = None
    label: object = None
    metadata: dict[str, object] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    tests: dict[str, str] = Field(default_factory=dict)

    @field_validator("files", "tests")
    @classmethod
    def _inside_workspace(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            try:
                relative_workspace_path(path)
            except SandboxError as e:
                raise ValueError(str(e)) from None
        return files

    @model_validator(mode="after")
    def _one_input(self) -> TaskRow:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must not be empty")
        return self


def load_tasks(
    path: str | Path, limit: int | None = None, provider: str = "bwrap", loader: str | None = None
) -> list[Task]:
    """Read a JSONL task file (or a dataset a registered task kind reads) into :class:`Task` objects
    numbered from 0.

    ``provider`` is the run's sandbox provider (a task kind may load differently per provider: a Harbor
    task's image becomes a root filesystem on ``bwrap`` and an E2B template on ``e2b``). ``loader``
    (``dataset.loader``) is the dotted path of ``fn(path, limit) -> list[Task]`` that reads the file
    instead (:func:`load_with_loader`)."""
    p = Path(path)
    if loader is not None:
        return load_with_loader(loader, p, limit)
    kind = task_kinds.reader_of(p)
    if kind is not None:
        return kind.load(p, limit, provider)
    if p.is_dir():
        raise ConfigError(
            f"dataset {p} is a directory and no registered task kind reads it (a JSONL dataset is a file)"
        )
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
        unstorable = find_unstorable_text(data)
        if unstorable is not None:
            raise ConfigError(f"{p} line {lineno}: {unstorable}")
        try:
            row = TaskRow.model_validate(data)
        except ValidationError as e:
            msgs = "; ".join(
                f"{_field(err['loc'])}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors()
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


def load_with_loader(loader: str, path: Path, limit: int | None) -> list[Task]:
    """The tasks ``fn(path, limit)`` returns for ``loader`` = ``"pkg.mod:fn"``, checked as a JSONL
    file's are: a non-empty list of :class:`Task` numbered 0..n-1 (at most ``limit``) whose payloads
    the log can store. A loader's own :class:`ConfigError` (a missing file, a bad record) passes as is."""
    from dressage.agents.whitebox import import_object

    fn = import_object(loader, "dataset.loader")
    if not callable(fn):
        raise ConfigError(f"dataset.loader {loader!r} is not callable")
    tasks = fn(path, limit)
    if not isinstance(tasks, list) or not all(isinstance(t, Task) for t in tasks):
        raise ConfigError(f"dataset.loader {loader!r} must return a list of Task, got {type(tasks).__name__}")
    tasks = tasks[:limit] if limit is not None else tasks
    if not tasks:
        raise ConfigError(f"dataset {path} has no tasks (read by {loader})")
    for i, t in enumerate(tasks):
        if t.index != i:
            raise ConfigError(f"dataset.loader {loader!r}: task {i} has index {t.index}; number them from 0")
        unstorable = find_unstorable_text(t.to_payload())
        if unstorable is not None:
            raise ConfigError(f"{path} task {t.id or i}: {unstorable}")
    return tasks


def _field(loc: tuple[object, ...]) -> str:
    """``('messages', 0, 'role')`` -> ``messages[0].role``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "row"


def find_unstorable_text(value: object, where: str = "") -> str | None:
    """``field: problem`` for the first NUL character or lone surrogate in a row, else None.

    Checked at load (not at enqueue) so a bad row stops the command before the run is created.
    """
    if isinstance(value, str):
        if "\x00" in value:
            return f"{where or 'row'}: contains a NUL character, which the log cannot store; remove it"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where or 'row'}: contains invalid UTF-8 (a lone surrogate); fix the text"
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{where}.{k}" if where else str(k)
            found = find_unstorable_text(k, f"{sub} (the key)") or find_unstorable_text(v, sub)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = find_unstorable_text(v, f"{where}[{i}]")
            if found:
                return found
    return None


def dataset_digest(tasks: list[Task]) -> str:
    """sha256 of the tasks' canonical JSON: recorded in the run snapshot to detect a changed dataset.

    The task kind is left out: a kind's tasks carry its data under ``metadata[kind]`` already, and
    digests of runs made before tasks had a kind stay valid."""
    h = hashlib.sha256()
    for t in tasks:
        payload = {k: v for k, v in t.to_payload().items() if k != "kind"}
        h.update(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def check_reward_fits(
    tasks: list[Task],
    reward_kind: str,
    agent_kind: str,
    provider: str = "bwrap",
    templates: Mapping[str, str] | None = None,
) -> None:
    """Refuse a run config that cannot run ``tasks``: each registered task kind's check (Harbor's:
    a reward that ignores its tests, a sandbox that cannot lay out its paths, an unmapped E2B
    template, the ``oracle`` agent on tasks without a reference solution)."""
    choices = task_kinds.RunChoices(reward_kind, agent_kind, provider, templates or {})
    for kind in task_kinds.registered():
        kind.check(tasks, choices)


def task_specs(tasks: list[Task]) -> list[TaskSpec]:
    """Queue entries for the store (the payload holds the whole task)."""
    return [TaskSpec(task_index=t.index, payload=t.to_payload()) for t in tasks]
