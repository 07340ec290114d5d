"""The search and open-page tools over a BM25 index (bm25s) of HotpotQA paragraphs.

The corpus is built from the records' ``context`` paragraphs (one document per title: the title and
its sentences; a title seen twice keeps its first paragraph). Scope ``dataset`` indexes every
paragraph of the dataset file (``metadata.hotpotqa.corpus_file``), once per process and file;
scope ``question`` indexes the task's own paragraphs (HotpotQA's distractor setting).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.extras import require

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the Wikipedia paragraphs; returns the best titles with their first sentence.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "Keywords to search for."}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "open",
            "description": "Open the paragraph with this exact title; returns its numbered sentences.",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "description": "A title from the search results."}
                },
                "required": ["title"],
            },
        },
    },
]
"""The tools' OpenAI function schemas."""


@dataclass(frozen=True)
class Page:
    """One paragraph: its title and sentences."""

    title: str
    sentences: tuple[str, ...]

    def text(self) -> str:
        """Title and sentences as one text (what BM25 indexes)."""
        return self.title + ". " + "".join(self.sentences)


class SearchIndex:
    """BM25 (bm25s, Lucene's variant) over pages; ``search`` and ``open`` are the tools."""

    def __init__(self, pages: list[Page], top_k: int = 3) -> None:
        """Index ``pages`` (their order is the document id)."""
        bm25s = require("bm25s", "hotpotqa")
        self.pages = pages
        self.by_title = {p.title: p for p in pages}
        self.top_k = top_k
        self._bm25s = bm25s
        self._index = bm25s.BM25()
        self._index.index(
            bm25s.tokenize([p.text() for p in pages], stopwords="en", show_progress=False),
            show_progress=False,
        )

    def search(self, query: str) -> str:
        """The tool ``search``: the ``top_k`` best pages for ``query``, each with its first sentence."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return f"No results for {query!r}: use content words."
        docs, scores = self._index.retrieve(tokens, k=min(self.top_k, len(self.pages)), show_progress=False)
        hits = [(int(d), float(s)) for d, s in zip(docs[0], scores[0], strict=True) if float(s) > 0]
        if not hits:
            return f"No results for {query!r}."
        lines = [
            f"{n}. {self.pages[d].title}: {self.pages[d].sentences[0].strip()}"
            for n, (d, _) in enumerate(hits, 1)
        ]
        return f"Results for {query!r}:\n" + "\n".join(lines)

    def open(self, title: str) -> str:
        """The tool ``open``: the page titled ``title`` with numbered sentences."""
        page = self.by_title.get(title) or self.by_title.get(title.strip())
        if page is None:
            return f"No page titled {title!r}; use a title from the search results."
        return page.title + "\n" + "\n".join(f"[{i}] {s.strip()}" for i, s in enumerate(page.sentences))

    def call(self, name: str, arguments: str) -> str:
        """Run tool ``name`` with its JSON ``arguments``; a malformed call is answered with an error text."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return f"error: the arguments are not JSON ({e.msg})"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        if name == "search" and isinstance(args.get("query"), str):
            return self.search(args["query"])
        if name == "open" and isinstance(args.get("title"), str):
            return self.open(args["title"])
        return f"error: unknown tool or missing argument: {name}({arguments[:200]})"


def pages_of(context: list[list[Any]]) -> list[Page]:
    """The pages of ``[[title, [sentence, ...]], ...]`` paragraphs, first of each title kept."""
    seen: dict[str, Page] = {}
    for title, sentences in context:
        seen.setdefault(str(title), Page(str(title), tuple(str(s) for s in sentences)))
    return list(seen.values())


@functools.lru_cache(maxsize=8)
def dataset_index(corpus_file: str, mtime_ns: int, top_k: int) -> SearchIndex:
    """The index of every paragraph of HotpotQA file ``corpus_file`` (cached per file version)."""
    from recipes.hotpotqa.loader import read_records

    context = [[p.title, p.sentences] for r in read_records(Path(corpus_file)) for p in r.context]
    return SearchIndex(pages_of(context), top_k)


def index_for(meta: dict[str, Any], scope: str, top_k: int) -> SearchIndex:
    """The index a task searches: its dataset's (``dataset``) or its own paragraphs (``question``)."""
    if scope == "question":
        return SearchIndex(pages_of(meta["context"]), top_k)
    path = Path(meta["corpus_file"])
    if not path.is_file():
        raise FileNotFoundError(
            f"the HotpotQA corpus file {path} is gone; set corpus: question or restore it"
        )
    return dataset_index(str(path), path.stat().st_mtime_ns, top_k)
