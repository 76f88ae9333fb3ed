"""One take rule for both transcript stores, the same scenario run on each: the in-memory LRU and Redis (a real
`redis-server`, started as tests/serve/test_redis_store.py starts it). A take leaves the entry for a while, so two
follow-ups to one turn (a retry, a branch) both continue the ids the model sampled; once the entry expires, a
follow-up is rendered from scratch.

The model sampled a non-canonical tokenization of its tool call, so only the stored ids give it back: a follow-up
that was re-rendered sends the engine other ids, and the test sees it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent_protocol import HFTokenizer, get_protocol
from agent_runtime import ScriptedEngine
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, answer_text, tool_call_text

QUESTION = "What is 17 * 23?"
TTL_S = 1.5  # the entries' TTL, and so their retake time (at most the TTL)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "memory"
        return
    # skipped (or, in CI, failed) without redis-server, as that module is
    from tests.serve.test_redis_store import RedisServer, free_port

    server = RedisServer(free_port()).start()
    yield server.url
    server.stop()


def ask(server: LiveServer, messages: list[Any]) -> Any:
    reply = server.client().chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    return reply.choices[0].message


def test_two_follow_ups_to_one_turn_both_continue_it_until_the_entry_expires(
    start_server: ServerFactory, tokenizer: HFTokenizer, store: str
) -> None:
    text = tool_call_text("17 * 23")
    cut = text.index("lator")
    sampled = tokenizer.encode(text[:cut]) + tokenizer.encode(text[cut:])
    assert sampled != tokenizer.encode(text)
    answer = answer_text("The answer is 391.")
    engine = ScriptedEngine(tokenizer, [sampled, answer, answer, answer])
    server = start_server(engine=engine, store=store, store_ttl_s=TTL_S)

    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    turn = ask(server, messages)
    (call,) = turn.tool_calls or []
    messages += [turn.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "391"}]

    # a retry (or a branch) of the follow-up: both continue the stored ids
    assert ask(server, messages).content == ask(server, messages).content == "The answer is 391."
    feedback = get_protocol("qwen3").render_feedback([{"role": "tool", "content": "391"}])
    continued = engine.calls[0] + sampled + tokenizer.encode(feedback)
    assert engine.calls[1] == engine.calls[2] == continued
    metrics = server.metrics()
    assert metrics["transcript_prefix_hits"] == 2 and metrics["transcript_rerenders"] == 0

    # past the expiry (the last take set it to TTL_S from then) the entry is gone: rendered from scratch
    time.sleep(TTL_S + 0.3)
    assert ask(server, messages).content == "The answer is 391."
    assert engine.calls[3] != continued and len(engine.calls[3]) > len(engine.calls[0])
    metrics = server.metrics()
    assert metrics["transcript_prefix_hits"] == 2 and metrics["transcript_rerenders"] == 1
    assert metrics["transcript_rerenders_store_unavailable"] == 0
