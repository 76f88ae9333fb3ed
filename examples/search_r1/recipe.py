"""Recipe: a Search-R1-style agent that answers questions by searching a local corpus with `local_search` (BM25).

    uv run apps/serve --model Qwen/Qwen3-4B --engine vllm --recipe examples/search_r1/recipe.py
    uv run apps/train --backend openrlhf --recipe examples/search_r1/recipe.py --pretrain Qwen/Qwen3-4B --dry-run

The model may search as often as it likes (up to `MAX_TURNS` turns), then gives its answer inside
``<answer>...</answer>``; the reward is Search-R1's exact match: 1.0 when the answer equals one of the row's
`golden_answers` after SQuAD normalization (case, punctuation, articles), else 0.0.

Data (both read when the first session is made, so importing this file is cheap):

- the corpus, ``{"id", "title", "text"|"contents"}`` per line: by default the ~3,000 passages shipped in
  `data/corpus.jsonl` (built by `build_data.py`); ``SEARCH_R1_CORPUS=/path/wiki-18.jsonl`` points at another one,
  e.g. Search-R1's Wikipedia dump;
- the questions, ``{"question", "golden_answers", ...}`` per line in ``<dir>/<split>.jsonl`` (the NQ / HotpotQA
  shape of FlashRAG's datasets): by default `data/`; ``SEARCH_R1_DATA=/path/nq`` points at another directory.

``SEARCH_R1_RETRIEVER_URL=http://host:8000/retrieve`` replaces the in-process BM25 index with a shared Search-R1
retrieval server (`retriever.py`), the usual setup for a Wikipedia-scale index; the model sees the same tool.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from agent_env import FunctionCallEnvironment, LocalSearchTool, MatchingReward, RewardPipeline, SearchIndex, ToolBase
from agent_runtime import Recipe, RecipeError

HERE: Final = Path(__file__).resolve().parent
MAX_TURNS: Final = 6

SYSTEM_PROMPT: Final = (
    "Answer the given question. You can search a document collection with the `local_search` tool as many times "
    "as you want; reason about what each search returns. The collection is the only source you may trust. When "
    "you know the answer, reply with it inside <answer> and </answer>, a few words without explanation, for "
    "example <answer> Beijing </answer>."
)


@functools.cache
def search_index(corpus: Path) -> SearchIndex:
    """The BM25 index over `corpus`, built once per process and shared by every episode."""
    return SearchIndex.from_jsonl(corpus)


def retrieval_server_tool(url: str) -> ToolBase:
    """`RetrievalServerTool(url)` from `retriever.py` beside this file (imported by path: the apps load recipes by
    path, so the repository root need not be importable)."""
    spec = importlib.util.spec_from_file_location("_search_r1_retriever", HERE / "retriever.py")
    if spec is None or spec.loader is None:
        raise RecipeError(f"cannot import {HERE / 'retriever.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the module's annotations through sys.modules
    spec.loader.exec_module(module)
    tool: ToolBase = module.RetrievalServerTool(url)
    return tool


def question_rows(directory: Path, split: str) -> Iterator[dict[str, Any]]:
    """NQ/HotpotQA rows ``{"question", "golden_answers", ...}`` as recipe rows ``{"prompt", "references", ...}``."""
    path = directory / f"{split}.jsonl"
    if not path.is_file():
        raise RecipeError(f"search_r1: no {split!r} split: {path} does not exist")
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            question = row.pop("question", None) or row.pop("prompt", None)
            answers = row.pop("golden_answers", None) or row.pop("answer", None)
            if not isinstance(question, str) or answers is None:
                raise RecipeError(f"{path}:{number}: a row needs 'question' and 'golden_answers'")
            yield {"prompt": question.strip(), "references": answers if isinstance(answers, list) else [answers], **row}


def make_recipe(
    corpus: str | Path | None = None, data: str | Path | None = None, retriever_url: str | None = None
) -> Recipe:
    """The search agent over `corpus` (or the retrieval server at `retriever_url`) with questions from `data`.
    Defaults: $SEARCH_R1_CORPUS, $SEARCH_R1_DATA, $SEARCH_R1_RETRIEVER_URL, then the files shipped in `data/`."""
    corpus_path = Path(corpus or os.environ.get("SEARCH_R1_CORPUS") or HERE / "data" / "corpus.jsonl")
    data_dir = Path(data or os.environ.get("SEARCH_R1_DATA") or HERE / "data")
    url = retriever_url or os.environ.get("SEARCH_R1_RETRIEVER_URL") or None
    remote = retrieval_server_tool(url) if url else None

    def environment() -> FunctionCallEnvironment:
        search = remote or LocalSearchTool(search_index(corpus_path))
        return FunctionCallEnvironment(tools=[search], max_steps=MAX_TURNS)

    return Recipe(
        name="search-r1",
        protocol="qwen3",
        environment=environment,
        rewards=RewardPipeline(result=[MatchingReward(mode="normalized", extract="answer_tag", name="exact_match")]),
        system_prompt=SYSTEM_PROMPT,
        max_new_tokens=512,
        max_context_tokens=8192,
        dataset=lambda split: question_rows(data_dir, split),
        metadata={"search": url or str(corpus_path), "data": str(data_dir)},
    )


recipe = make_recipe()
