"""HotpotQA's public format read into tasks: the ``dataset.loader`` of this recipe.

The official files (``hotpot_train_v1.1.json``, ``hotpot_dev_distractor_v1.json``, ...) are one JSON
array of records; a JSONL file of the same records (one per line, as the Hugging Face ``hotpot_qa``
set exports) reads too. A record carries ``_id``, ``question``, ``answer``, ``supporting_facts``
(``[title, sentence index]`` pairs) and ``context`` (``[title, [sentence, ...]]`` paragraphs),
plus optional ``type`` and ``level``. A task's prompt is the question, its label the answer; its
``metadata.hotpotqa`` keeps the record's id, type, level, supporting facts and paragraphs (the
``question`` corpus of the search tool) and the dataset file's absolute path (the ``dataset``
corpus: :mod:`recipes.hotpotqa.search`). Test records without an answer are refused (no reward).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from dressage.agents.base import Task
from dressage.errors import ConfigError

PROMPT = (
    "Answer the question. Use the search tool to find Wikipedia paragraphs and the open tool to read "
    "one; when you know the answer, reply with the answer alone (a few words, no tool call).\n\n"
    "Question: {question}"
)


class Paragraph(BaseModel):
    """One ``context`` entry: a title and its sentences."""

    title: str
    sentences: list[str]


class HotpotRecord(BaseModel):
    """One HotpotQA record: ``_id`` (the official files) or ``id`` (the Hugging Face export); an
    unknown key is refused, naming it."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(validation_alias=AliasChoices("_id", "id"))
    question: str
    answer: str
    supporting_facts: list[tuple[str, int]]
    context: list[Paragraph]
    type: str | None = None
    level: str | None = None

    @field_validator("context", mode="before")
    @classmethod
    def _pairs(cls, v: Any) -> Any:
        """``[[title, [sentences]], ...]`` (the official form) or ``{title: [...], sentences: [[...]]}``
        (the Hugging Face form)."""
        if isinstance(v, dict) and {"title", "sentences"} <= v.keys():
            return [{"title": t, "sentences": s} for t, s in zip(v["title"], v["sentences"], strict=True)]
        if isinstance(v, list):
            return [{"title": p[0], "sentences": p[1]} if isinstance(p, list | tuple) else p for p in v]
        return v

    @field_validator("supporting_facts", mode="before")
    @classmethod
    def _facts(cls, v: Any) -> Any:
        """The Hugging Face form ``{title: [...], sent_id: [...]}`` as pairs."""
        if isinstance(v, dict) and {"title", "sent_id"} <= v.keys():
            return list(zip(v["title"], v["sent_id"], strict=True))
        return v


def read_records(path: Path) -> list[HotpotRecord]:
    """The records of a HotpotQA file (a JSON array, or JSONL); errors name the file and record."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"dataset {path} does not exist (dataset.path is relative to the config file)"
        ) from None
    raws = _raw_records(path, text)
    records: list[HotpotRecord] = []
    for i, raw in enumerate(raws):
        try:
            records.append(HotpotRecord.model_validate(raw))
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "record"
            raise ConfigError(f"{path} record {i}: {where}: {err['msg']}") from None
    return records


def _raw_records(path: Path, text: str) -> list[Any]:
    """A JSON array's items, or a JSONL file's lines."""
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return list(data)
    out: list[Any] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {lineno}: not valid JSON ({e.msg})") from None
    return out


def load_tasks(path: Path, limit: int | None = None) -> list[Task]:
    """The tasks of HotpotQA file ``path`` (the config's ``dataset.loader``)."""
    records = read_records(Path(path))
    corpus_file = str(Path(path).resolve())
    tasks = []
    for i, r in enumerate(records[:limit] if limit is not None else records):
        meta = {
            "id": r.id,
            "type": r.type,
            "level": r.level,
            "supporting_facts": [list(f) for f in r.supporting_facts],
            "context": [[p.title, p.sentences] for p in r.context],
            "corpus_file": corpus_file,
        }
        tasks.append(
            Task(
                index=i,
                id=r.id,
                prompt=PROMPT.format(question=r.question),
                label=r.answer,
                metadata={"hotpotqa": meta},
            )
        )
    return tasks
