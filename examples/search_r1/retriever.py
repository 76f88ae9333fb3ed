"""`RetrievalServerTool`: the search tool backed by a shared retrieval server, for a Wikipedia-scale index.

Search-R1 serves its index (E5 embeddings + FAISS over the 21M-passage 2018 Wikipedia dump) from one process,
`search_r1/search/retrieval_server.py`, which every rollout worker queries over HTTP:

    POST <url>  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->          {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 0.8}, ...]]}

This tool speaks that protocol and formats the hits exactly as `LocalSearchTool` does (``Doc 1 (Title: ...)
text``), under the same name and arguments, so a recipe can switch between the in-process BM25 index and the
server without changing what the model sees. A server that is down, slow or answers garbage becomes a
``tool_error`` / ``timeout`` observation, never an exception out of the episode. Standard library only.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Annotated, Any

import msgspec

from agent_env import ToolBase, ToolContext, ToolError
from agent_env.schema import convert_arguments, struct_schema

__all__ = ["RetrievalServerTool"]


class SearchArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    query: Annotated[str, msgspec.Meta(description="What to search for, in a few keywords.", min_length=1)]
    top_k: Annotated[int, msgspec.Meta(description="How many documents to return.", ge=1, le=10)] = 3


class RetrievalServerTool(ToolBase):
    """Search through a Search-R1 retrieval server at `url` (e.g. ``http://retriever:8000/retrieve``)."""

    def __init__(
        self, url: str, *, name: str = "local_search", max_chars_per_document: int = 1000, timeout_s: float = 30.0
    ) -> None:
        self.url = url
        self.name = name
        self.description = "Search the local document collection and return the most relevant passages."
        self.parameters = struct_schema(SearchArguments)
        self.max_chars_per_document = max_chars_per_document
        self.timeout_s = timeout_s

    def parse_arguments(self, arguments: dict[str, Any]) -> SearchArguments:
        return convert_arguments(arguments, SearchArguments)

    async def call(self, arguments: SearchArguments, context: ToolContext) -> str:
        payload = {"queries": [arguments.query], "topk": arguments.top_k, "return_scores": True}
        body = await asyncio.to_thread(self._post, payload)
        try:
            hits = body["result"][0]
            documents = [hit["document"]["contents"] if "document" in hit else hit["contents"] for hit in hits]
        except (KeyError, IndexError, TypeError) as e:
            raise ToolError(f"the retrieval server answered in an unexpected shape ({type(e).__name__}: {e})") from e
        if not documents:
            return f"No documents match {arguments.query!r}."
        return "\n\n".join(self._format(rank, str(text)) for rank, text in enumerate(documents, start=1))

    def _post(self, payload: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as e:
            raise ToolError(f"the retrieval server at {self.url} failed: {e}", hint="Try again later.") from e

    def _format(self, rank: int, contents: str) -> str:
        title, _, text = contents.partition("\n")
        title = title.strip().strip('"')
        if len(text) > self.max_chars_per_document:
            text = text[: self.max_chars_per_document] + "..."
        return f"Doc {rank} (Title: {title}) {text}"
