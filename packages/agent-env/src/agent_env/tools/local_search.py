"""The `local_search` tool: BM25 over a local JSONL corpus, with `bm25s`.

`SearchIndex` is the expensive, read-only part: build it once (``SearchIndex.from_jsonl(path)``) and hand the
same index to the `LocalSearchTool` of every episode. Searching is thread-safe (a lock guards the bm25s
retriever, whose thread-safety is not documented; a query takes milliseconds).

Corpus format, one JSON object per line: ``{"id": "...", "title": "...", "text": "..."}``. The text field may
also be called ``contents`` (Search-R1's wiki dump) or ``content``; ``title`` and ``id`` are optional (the
line number stands in for a missing id).

Results read as Search-R1's retriever writes them::

    Doc 1 (Title: Paris) Paris is the capital and largest city of France...

This module knows BM25 and JSONL; it knows nothing about episodes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final

import bm25s  # type: ignore[import-untyped]
import msgspec
import structlog

from agent_env._threads import run_in_daemon_thread
from agent_env.errors import SearchIndexError
from agent_env.tool import ToolBase, ToolContext

__all__ = ["Document", "LocalSearchTool", "SearchHit", "SearchIndex"]

logger = structlog.get_logger(__name__)

_TEXT_FIELDS: Final = ("text", "contents", "content")


class Document(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    text: str
    title: str = ""


class SearchHit(msgspec.Struct, frozen=True, kw_only=True):
    document: Document
    score: float
    rank: int


class SearchIndex:
    """A BM25 index over documents; read-only once built, shareable across episodes and threads."""

    def __init__(self, documents: Sequence[Document], *, stopwords: str = "en") -> None:
        if not documents:
            raise SearchIndexError("cannot build a search index over an empty corpus")
        self.documents: tuple[Document, ...] = tuple(documents)
        self._lock = threading.Lock()
        self._tokenizer = bm25s.tokenization.Tokenizer(stopwords=stopwords)
        texts = [f"{d.title}\n{d.text}" if d.title else d.text for d in self.documents]
        ids = self._tokenizer.tokenize(texts, return_as="ids", show_progress=False, update_vocab=True)
        self._retriever = bm25s.BM25()
        self._retriever.index(ids, show_progress=False)
        logger.info("search_index_built", documents=len(self.documents))

    def __len__(self) -> int:
        return len(self.documents)

    @classmethod
    def from_jsonl(
        cls,
        path: str | Path,
        *,
        text_field: str | None = None,
        title_field: str = "title",
        id_field: str = "id",
        stopwords: str = "en",
    ) -> SearchIndex:
        """Read a JSONL corpus (see the module docstring) and index it."""
        source = Path(path)
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise SearchIndexError(f"cannot read corpus {source}: {e.strerror or e}") from e
        documents: list[Document] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{source}:{number}"
            try:
                row: Any = msgspec.json.decode(line)
            except msgspec.DecodeError as e:
                raise SearchIndexError(f"{where}: not valid JSON ({e})") from e
            if not isinstance(row, dict):
                raise SearchIndexError(f"{where}: expected a JSON object, got {type(row).__name__}")
            fields = (text_field,) if text_field else _TEXT_FIELDS
            text = next((row[f] for f in fields if isinstance(row.get(f), str)), None)
            if text is None:
                raise SearchIndexError(f"{where}: no string field named {' or '.join(fields)}")
            title = row.get(title_field)
            documents.append(
                Document(
                    id=str(row.get(id_field, number)),
                    text=text,
                    title=title if isinstance(title, str) else "",
                )
            )
        return cls(documents, stopwords=stopwords)

    def search(self, query: str, k: int = 3) -> list[SearchHit]:
        """The best `k` documents for `query` (documents that share no term with it are left out)."""
        k = max(1, min(k, len(self.documents)))
        with self._lock:
            ids = self._tokenizer.tokenize([query], return_as="ids", show_progress=False, update_vocab=False)
            results, scores = self._retriever.retrieve(ids, k=k, show_progress=False, n_threads=1)
        hits: list[SearchHit] = []
        for index, score in zip(results[0].tolist(), scores[0].tolist(), strict=True):
            if score > 0:
                hits.append(SearchHit(document=self.documents[int(index)], score=float(score), rank=len(hits) + 1))
        return hits


class LocalSearchArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    query: Annotated[str, msgspec.Meta(description="What to search for, in a few keywords.", min_length=1)]
    top_k: Annotated[int, msgspec.Meta(description="How many documents to return.", ge=1, le=10)] = 3


class LocalSearchTool(ToolBase):
    """Search a shared `SearchIndex`. One tool object may serve every episode."""

    arguments_type = LocalSearchArguments

    def __init__(
        self,
        index: SearchIndex,
        *,
        name: str = "local_search",
        max_chars_per_document: int = 1000,
        timeout_s: float | None = 10.0,
    ) -> None:
        self.index = index
        self.name = name
        self.description = "Search the local document collection and return the most relevant passages."
        self.max_chars_per_document = max_chars_per_document
        self.timeout_s = timeout_s

    async def call(self, arguments: LocalSearchArguments, context: ToolContext) -> str:
        hits = await run_in_daemon_thread(
            lambda: self.index.search(arguments.query, arguments.top_k), name=f"tool-{self.name}"
        )
        if not hits:
            return f"No documents match {arguments.query!r}."
        return "\n\n".join(self._format(hit) for hit in hits)

    def _format(self, hit: SearchHit) -> str:
        text = hit.document.text
        if len(text) > self.max_chars_per_document:
            text = text[: self.max_chars_per_document] + "..."
        title = f" (Title: {hit.document.title})" if hit.document.title else ""
        return f"Doc {hit.rank}{title} {text}"
