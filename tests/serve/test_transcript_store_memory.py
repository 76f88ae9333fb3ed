"""A transcript store filled to its bound holds what it counts: measured with tracemalloc.

Realistic tools-mode conversations go through the real app (wire decoding, the Qwen3 protocol and tokenizer,
`tools_mode`, the store), in process over httpx's ASGI transport: a system prompt, a user task, twelve tool specs
with schemas, and turns of a tool call, a tool result of some 600 words and an answer, about 9,000 tokens in all.
The engine is the scripted calculator policy with a logprob of its own for each generated token, as a real
engine returns. The store is bounded to 200,000 tokens and filled until it evicts. What it holds is measured as
the bytes tracemalloc sees freed when the store is dropped, and compared with what the store counts
(`TranscriptStore.bytes`). ``uv run pytest tests/serve/test_transcript_store_memory.py -s`` prints the figures.
"""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from typing import Any

import httpx
import msgspec

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.serving import ServeConfig, TranscriptStore, create_app
from tests.serve.conftest import MODEL
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy
from tests.support.calculator_recipe import calculator_recipe

MAX_TOKENS = 200_000
TURNS = 6
RATIO = 1.5
WORDS = ("the", "file", "reads", "lines", "of", "code", "and", "output", "while", "a", "test", "runs", "over",
         "module's", "functions", "error", "trace", "value", "path", "returns", "none")  # fmt: skip


class SampledLogprobs(ScriptedEngine):
    """The scripted policy, each generated token with a logprob of its own (a float object each, as a real
    engine's are)."""

    def __init__(self, tokenizer: HFTokenizer) -> None:
        super().__init__(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25, record=False)
        self.rng = random.Random(0)

    async def generate(self, prompt_ids: Any, sampling: SamplingParams | None = None, **kwargs: Any) -> Generation:
        generation = await super().generate(prompt_ids, sampling, **kwargs)
        if generation.logprobs is None:
            return generation
        logprobs = [-self.rng.random() for _ in generation.ids]
        return msgspec.structs.replace(generation, logprobs=logprobs)


def tool(i: int, rng: random.Random) -> dict[str, Any]:
    properties = {f"arg_{j}": {"type": "string", "description": text(rng, 12)} for j in range(5)}
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": text(rng, 60),
            "parameters": {"type": "object", "properties": properties, "required": ["arg_0"]},
        },
    }


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def conversation(client: httpx.AsyncClient, tools: list[dict[str, Any]], i: int, rng: random.Random) -> None:
    """One conversation of `TURNS` tool calls, each answered: 2 requests a turn, every follow-up a prefix hit."""
    messages: list[Any] = [{"role": "system", "content": text(rng, 400)}]
    for turn in range(TURNS):
        a, b = 100 + i, 7 + turn
        messages.append({"role": "user", "content": f"{text(rng, 40)} What is {a} * {b}?"})
        for _ in range(2):
            body = {"model": MODEL, "messages": messages, "tools": tools, "logprobs": True}
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            message = response.json()["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                break
            (call,) = message["tool_calls"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{text(rng, 600)}\n{a * b}"})


async def fill(app: Any, store: TranscriptStore) -> int:
    rng = random.Random(1)
    tools = [CALCULATOR_TOOL, *(tool(i, rng) for i in range(11))]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        i = 0
        while store.evictions < 3:
            await conversation(client, tools, i, rng)
            i += 1
    return i


def test_a_full_store_holds_what_it_counts(tokenizer: HFTokenizer) -> None:
    app = create_app(SampledLogprobs(tokenizer), calculator_recipe(max_context_tokens=32768),
                     ServeConfig(model_name=MODEL, transcript_store_tokens=MAX_TOKENS))  # fmt: skip
    backend = app.state.backend
    gc.collect()
    tracemalloc.start()
    try:
        conversations = asyncio.run(fill(app, backend.store))
        store: TranscriptStore = backend.store
        metrics = backend.metrics
        gc.collect()
        full = tracemalloc.get_traced_memory()[0]
        counted, tokens, kept = store.bytes, store.tokens, len(store)
        backend.store = TranscriptStore()
        del store
        gc.collect()
        held = full - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    mib = 2**20
    print(f"\n{conversations} conversations through the app, {metrics.transcript_prefix_hits} prefix hits; the store "
          f"kept {kept} ({tokens:,} tokens, bound {MAX_TOKENS:,}): it holds {held / mib:.2f} MiB "
          f"({held / tokens:.1f} bytes a token) and counts {counted / mib:.2f} MiB: {held / counted:.2f}x")  # fmt: skip
    assert metrics.transcript_rerenders == 0 and metrics.server_errors == 0
    assert tokens <= MAX_TOKENS < tokens + 10_000  # full: the next conversation did not fit
    assert held <= RATIO * counted, f"the store holds {held / counted:.1f}x what it counts"
    assert counted <= RATIO * held, f"the store counts {counted / held:.1f}x what it holds"
