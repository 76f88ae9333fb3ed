"""The served model over two upstreams: `create_app` on an `OpenAIEngine` with two real completions servers
behind it (`CompletionsServer`, uvicorn on loopback), driven through the official openai client. Each agent-mode
episode and each tools-mode conversation (its turns sent as separate requests) must reach one upstream only, told
from the upstreams' own logs; both upstreams work; `/metrics` shows the engine's per-upstream counters."""

from __future__ import annotations

import asyncio
import json
import runpy
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_runtime.engines.openai_http import OpenAIEngine
from tests.serve.conftest import MODEL, LiveServer, ServerFactory, calculator_question
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy
from tests.support.completions_server import CompletionsServer

CONVERSATIONS = 12


@pytest.fixture
def upstreams(tokenizer: HFTokenizer) -> Iterator[list[CompletionsServer]]:
    running = [
        CompletionsServer(ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)).start()
        for _ in range(2)
    ]
    for upstream in running:
        upstream.faults.delay_s = 0.02  # requests overlap, so the least loaded upstream is a real choice
    yield running
    for upstream in running:
        upstream.stop()


def served(start_server: ServerFactory, tokenizer: HFTokenizer, upstreams: list[CompletionsServer]) -> LiveServer:
    engine = OpenAIEngine(
        [u.base_url for u in upstreams], model=upstreams[0].model, tokenizer=tokenizer, context_length=4096
    )
    return start_server(engine=engine, max_concurrency=2 * CONVERSATIONS)


def questions_seen(upstream: CompletionsServer, tokenizer: HFTokenizer, questions: list[str]) -> list[int]:
    """Which conversation each request this upstream received belongs to, read from its prompt's text."""
    seen = []
    for body in upstream.requests:
        text = tokenizer.decode(body["prompt"])
        (n,) = [i for i, q in enumerate(questions) if q in text]
        seen.append(n)
    return seen


def assert_affinity(upstreams: list[CompletionsServer], tokenizer: HFTokenizer, questions: list[str]) -> None:
    seen = [questions_seen(u, tokenizer, questions) for u in upstreams]
    for n in range(len(questions)):
        counts = [log.count(n) for log in seen]
        assert sum(counts) == 2 and max(counts) == 2, (n, counts)  # a call turn and an answer, on one upstream
    assert all(log for log in seen), [len(log) for log in seen]  # both upstreams worked


def test_agent_mode_episodes_keep_to_one_upstream(
    start_server: ServerFactory, tokenizer: HFTokenizer, upstreams: list[CompletionsServer]
) -> None:
    server = served(start_server, tokenizer, upstreams)
    client = server.client()
    questions = [calculator_question(i) for i in range(CONVERSATIONS)]

    def episode(question: str) -> str:
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}])
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        answers = list(pool.map(episode, [q for q, _ in questions]))
    assert [a.strip() for a in answers] == [expected for _, expected in questions]
    assert_affinity(upstreams, tokenizer, [q for q, _ in questions])
    engine = server.metrics()["engine"]
    assert [u["requests"] for u in engine["upstreams"]] == [len(u.requests) for u in upstreams]
    assert engine["affinity"]["ratio"] == 1.0 and engine["affinity"]["turns"] == CONVERSATIONS
    episode_ids = {h.get("x-session-id") for u in upstreams for h in u.request_headers}
    assert len(episode_ids) == CONVERSATIONS and None not in episode_ids


def test_tools_mode_conversations_keep_to_one_upstream(
    start_server: ServerFactory, tokenizer: HFTokenizer, upstreams: list[CompletionsServer]
) -> None:
    server = served(start_server, tokenizer, upstreams)
    client = server.client()
    questions = [calculator_question(i) for i in range(CONVERSATIONS)]

    def conversation(question: str) -> str:
        messages: list[dict[str, object]] = [{"role": "user", "content": question}]
        first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])  # type: ignore[arg-type]
        (call,) = first.choices[0].message.tool_calls or []
        a, op, b = json.loads(call.function.arguments)["expression"].split()  # type: ignore[union-attr]
        result = {"*": int(a) * int(b), "+": int(a) + int(b), "-": int(a) - int(b)}[op]
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
        second = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])  # type: ignore[arg-type]
        return second.choices[0].message.content or ""

    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        answers = list(pool.map(conversation, [q for q, _ in questions]))
    assert [a.strip() for a in answers] == [expected for _, expected in questions]
    assert_affinity(upstreams, tokenizer, [q for q, _ in questions])
    engine = server.metrics()["engine"]
    assert engine["affinity"]["ratio"] == 1.0 and engine["affinity"]["sessions"] == CONVERSATIONS


def test_the_command_line_takes_several_upstreams(tiny_qwen3_dir: Path) -> None:
    app = runpy.run_path(str(Path(__file__).parents[2] / "apps" / "serve" / "__main__.py"), run_name="serve_app")
    flags = ["--engine", "openai", "--model", str(tiny_qwen3_dir)]
    urls = ["http://a:8001/v1", "http://b:8001/v1", "http://c:8001/v1"]
    for given, header in (
        (["--base-url", urls[0], "--base-url", f"{urls[1]}, {urls[2]}"], ["--session-header", "X-Affinity"]),
        (["--engine-url", urls[0]], ["--session-header", ""]),
    ):
        args = app["parse_args"]([*flags, *given, *header])
        engine = app["build_engine"](args, str(tiny_qwen3_dir))
        try:
            assert list(engine.base_urls) == urls[: len(engine.base_urls)] and len(engine.base_urls) in (1, 3)
            assert engine.session_header == (header[1] or None)
        finally:
            asyncio.run(engine.close())
    with pytest.raises(SystemExit):  # no upstream at all
        app["parse_args"](flags)
