"""Memory stays flat over 2,000 requests against one server: agent mode (plain and streamed), tools mode (a first
turn and its follow-up) and refused requests (a 4 MB message too long for the context, a 100,000-deep body).

The resident set size of this process (the server runs in it, in a thread) is read three times: after a warm-up
that fills every bounded cache (the tools-mode transcript store is bounded to 64 conversations here) and sends no
4 MB message; halfway; and at the end. Two bounds:

- `FIRST_HALF_MARGIN` for the first half, where the first 4 MB messages arrive. The allocator keeps the peak of a
  request's temporaries (a few copies of its body) for reuse, bounded by the body cap; tokenizing such a message
  used to keep some 90 MB, which this bound catches.
- `SECOND_HALF_MARGIN` for the second half, the same mix again: flat, or something leaks per request.

The scripted engine's own list of the prompts it got (a test fake's record, not the server's) is emptied as the
test goes. Linux only (reads /proc). CI runs 500 requests; the full count: ``SERVE_MEMORY_REQUESTS=2000 uv run
pytest tests/serve/test_memory.py -s`` (prints the numbers)."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from tests.serve.conftest import MODEL, ServerFactory, calculator_question
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy

REQUESTS = int(os.environ.get("SERVE_MEMORY_REQUESTS", "500"))
WARM_UP = 300
FIRST_HALF_MARGIN = 40 * 2**20
SECOND_HALF_MARGIN = 8 * 2**20
HUGE = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 4_000_000}]}).encode()
DEEP = b'{"model": "' + MODEL.encode() + b'", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def resident_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def one_request(client: httpx.Client, i: int) -> int:
    """Request `i` of a fixed rotation; returns how many HTTP calls it made."""
    question, answer = calculator_question(i % 500)
    messages: list[Any] = [{"role": "user", "content": question}]
    kind = i % 5
    if kind == 0:
        body = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}).json()
        assert body["choices"][0]["message"]["content"] == answer
    elif kind == 1:
        text = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "stream": True}).text
        assert text.endswith("data: [DONE]\n\n") and answer.split()[-1] in text
    elif kind == 2:
        first = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                         "tools": [CALCULATOR_TOOL]}).json()  # fmt: skip
        message = first["choices"][0]["message"]
        (call,) = message["tool_calls"]
        a, _, b = json.loads(call["function"]["arguments"])["expression"].split()
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": str(int(a) * int(b))}]
        second = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                          "tools": [CALCULATOR_TOOL]}).json()  # fmt: skip
        assert second["choices"][0]["message"]["content"] == answer
        return 2
    elif kind == 3:
        huge = i % 50 == 3 and i >= WARM_UP  # none in the warm-up: the first one must count in the growth
        response = client.post("/v1/chat/completions", content=HUGE if huge else DEEP)
        assert response.status_code == 400
    else:
        assert client.get("/health").status_code == 200
    return 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_is_flat_over_many_requests(start_server: ServerFactory, tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
    server = start_server(engine=engine, max_concurrency=8, transcript_store_conversations=64)

    def run(start: int, count: int) -> int:
        calls = 0
        for i in range(start, start + count):
            calls += one_request(client, i)
            engine.calls.clear()
        return calls

    with httpx.Client(base_url=server.url, timeout=30) as client:
        run(0, WARM_UP)
        gc.collect()
        before = resident_bytes()
        calls = run(WARM_UP, REQUESTS // 2)
        gc.collect()
        middle = resident_bytes()
        calls += run(WARM_UP + REQUESTS // 2, REQUESTS - REQUESTS // 2)
        gc.collect()
        after = resident_bytes()
    metrics = server.metrics()
    mib = 2**20
    print(f"rss after warm-up {before / mib:.1f} MiB; after {REQUESTS // 2} requests {middle / mib:.1f} MiB "
          f"({(middle - before) / mib:+.2f}); after {REQUESTS} requests ({calls} HTTP calls) {after / mib:.1f} MiB "
          f"({(after - middle) / mib:+.2f} over the second half)")  # fmt: skip
    assert metrics["server_errors"] == 0 and metrics["in_flight"] == 0
    assert metrics["transcript_store"]["conversations"] <= 64
    assert middle - before < FIRST_HALF_MARGIN, f"the first half kept {(middle - before) / mib:.1f} MiB"
    assert after - middle < SECOND_HALF_MARGIN, f"the second half grew {(after - middle) / mib:.1f} MiB"
