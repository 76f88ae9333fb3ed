"""local_search: BM25 over a JSONL corpus, one index shared by every episode."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from agent_env import FunctionCallEnvironment, ToolContext
from agent_env.errors import SearchIndexError
from agent_env.tools.local_search import Document, LocalSearchTool, SearchIndex
from agent_protocol.types import Action, ToolCall

DATA = Path(__file__).resolve().parents[1] / "data" / "agent_env"


@pytest.fixture(scope="module")
def index() -> SearchIndex:
    return SearchIndex.from_jsonl(DATA / "corpus.jsonl")


def test_the_best_document_ranks_first(index: SearchIndex) -> None:
    assert len(index) == 10
    hits = index.search("capital of Germany", k=3)
    assert hits[0].document.id == "berlin"
    assert [hit.rank for hit in hits] == list(range(1, len(hits) + 1))
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))
    assert index.search("wrought-iron tower", k=1)[0].document.title == "Eiffel Tower"


def test_documents_sharing_no_term_are_left_out(index: SearchIndex) -> None:
    assert index.search("zzyzx quux", k=5) == []
    assert len(index.search("Paris", k=100)) == 3  # k larger than the corpus is clamped


def test_search_r1_contents_field_is_read() -> None:
    index = SearchIndex.from_jsonl(DATA / "corpus_search_r1.jsonl")
    assert index.search("port on the Mediterranean")[0].document.id == "1"


def test_tool_output_reads_like_search_r1(index: SearchIndex) -> None:
    search = LocalSearchTool(index, max_chars_per_document=30)
    text = asyncio.run(search.call(search.parse_arguments({"query": "largest planet", "top_k": 1}), ToolContext()))
    assert text == "Doc 1 (Title: Jupiter) Jupiter is the fifth planet fr..."
    none = asyncio.run(search.call(search.parse_arguments({"query": "qwxz"}), ToolContext()))
    assert none == "No documents match 'qwxz'."


def test_arguments_are_validated(index: SearchIndex) -> None:
    env = FunctionCallEnvironment(tools=[LocalSearchTool(index)])
    calls = (
        ToolCall(id="a", name="local_search", arguments={"query": "river", "top_k": 50}),
        ToolCall(id="b", name="local_search", arguments={}),
    )
    too_many, missing = asyncio.run(env.step(Action(tool_calls=calls))).observations
    assert too_many.code == "invalid_arguments" and "top_k" in too_many.content
    assert missing.code == "invalid_arguments" and "query" in missing.content


def test_one_index_serves_concurrent_episodes(index: SearchIndex) -> None:
    tool = LocalSearchTool(index)

    async def episode(query: str) -> str:
        env = FunctionCallEnvironment(tools=[tool])
        result = await env.step(
            Action(tool_calls=(ToolCall(id="s", name="local_search", arguments={"query": query, "top_k": 1}),))
        )
        return result.observations[0].content

    async def main() -> list[str]:
        queries = ["Nobel Prizes radioactivity", "highest mountain", "Guido van Rossum"] * 4
        return list(await asyncio.gather(*(episode(q) for q in queries)))

    results = asyncio.run(main())
    assert [r.split(")")[0] for r in results[:3]] == [
        "Doc 1 (Title: Marie Curie",
        "Doc 1 (Title: Mount Everest",
        "Doc 1 (Title: Python (programming language",
    ]
    assert results[3:6] == results[:3]


def test_bad_corpora_raise_with_the_location(tmp_path: Path) -> None:
    with pytest.raises(SearchIndexError, match="cannot read corpus"):
        SearchIndex.from_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(SearchIndexError, match=r"bad.jsonl:2: not valid JSON"):
        SearchIndex.from_jsonl(bad)
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(SearchIndexError, match=r":1: no string field named text or contents or content"):
        SearchIndex.from_jsonl(bad)
    with pytest.raises(SearchIndexError, match="empty corpus"):
        SearchIndex([])


def test_documents_can_be_given_directly() -> None:
    index = SearchIndex([Document(id="a", text="apples are red"), Document(id="b", text="bananas are yellow")])
    assert index.search("yellow fruit")[0].document.id == "b"
