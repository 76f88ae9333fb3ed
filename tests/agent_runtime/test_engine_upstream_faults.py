"""Upstream faults: `OpenAIEngine` against a real local HTTP server (uvicorn + Starlette in a thread) that goes
down, fails, answers garbage, cuts its answer off or trickles it. Every fault must end the call with a coded
`EngineError` (`engine_error`, `engine_bad_output` or `engine_timeout`) and nothing else: no other exception,
no garbage `Generation` that would reach a training transcript, no call that outlives its deadline.

The server replays real ids of the real Qwen3 tokenizer (`ScriptedEngine` behind `CompletionsServer`); each
fault starts from that honest answer and breaks one thing. The count of `test_each_upstream_fault_ends_cleanly`
cases is the "upstream faults: clean end N / tried N" row of docs/RELIABILITY.md."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from agent_env import CalculatorTool, FunctionCallEnvironment
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, AgentSession
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.openai_http import OpenAIEngine
from agent_runtime.engines.scripted import ScriptedEngine
from agent_runtime.errors import EngineBadOutput, EngineError, EngineTimeout, EngineUnavailable
from tests.support.completions_server import CompletionsServer

ANSWER = "The answer is 4.<|im_end|>"
SAMPLING = SamplingParams(max_new_tokens=32, temperature=0.0)
PROMPT = [151644, 872, 198, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198]  # <|im_start|>user\n2+2?...
VOCAB = 151_669  # the Qwen3 tokenizer, added tokens included


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


@pytest.fixture(scope="module")
def server(tokenizer: HFTokenizer) -> Iterator[CompletionsServer]:
    engine = ScriptedEngine(tokenizer, policy=lambda _prompt: ANSWER, logprob=-0.25)
    with CompletionsServer(engine) as running:
        yield running


@pytest.fixture
def upstream(server: CompletionsServer) -> Iterator[CompletionsServer]:
    server.faults.reset()
    server.requests.clear()
    yield server
    server.faults.reset()


def engine_for(base_url: str, tokenizer: HFTokenizer, **options: Any) -> OpenAIEngine:
    defaults: dict[str, Any] = {
        "model": "tiny-qwen3",
        "context_length": 4096,
        "max_retries": 1,
        "backoff_s": 0.01,
        "deadline_s": 5.0,
    }
    return OpenAIEngine(base_url, tokenizer=tokenizer, **(defaults | options))


def generate(engine: OpenAIEngine, sampling: SamplingParams = SAMPLING, *, guard_s: float = 20.0) -> Generation:
    """One call, closed afterwards; `guard_s` keeps a hanging call from hanging the test suite."""

    async def once() -> Generation:
        try:
            return await asyncio.wait_for(engine.generate(PROMPT, sampling), guard_s)
        finally:
            await engine.close()

    return asyncio.run(once())


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- the faults ------------------------------------------------------------------------------------------------


def _set(key: str, value: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def rewrite(choice: dict[str, Any]) -> None:
        choice[key] = value(choice)

    return rewrite


def _logprobs(value: Callable[[list[float]], Any]) -> Callable[[dict[str, Any]], None]:
    def rewrite(choice: dict[str, Any]) -> None:
        choice["logprobs"]["token_logprobs"] = value(choice["logprobs"]["token_logprobs"])

    return rewrite


@dataclass(frozen=True)
class Fault:
    """What the upstream does wrong, and the error code (and words) the engine must answer it with."""

    arrange: Callable[[CompletionsServer], str]  # sets the fault up, returns the base URL to call
    code: str
    match: str


def _rewrite(rewrite: Callable[[dict[str, Any]], None]) -> Callable[[CompletionsServer], str]:
    def arrange(server: CompletionsServer) -> str:
        server.faults.rewrite = rewrite
        return server.base_url

    return arrange


def _raw(body: bytes) -> Callable[[CompletionsServer], str]:
    def arrange(server: CompletionsServer) -> str:
        server.faults.raw_body = body
        return server.base_url

    return arrange


def _down(server: CompletionsServer) -> str:
    return f"http://127.0.0.1:{closed_port()}/v1"


def _failing(server: CompletionsServer) -> str:
    server.faults.fail_next(10, status=500, message="the upstream fell over")
    return server.base_url


def _truncated(server: CompletionsServer) -> str:
    server.faults.truncate_to = 40
    return server.base_url


def _trickling(server: CompletionsServer) -> str:
    server.faults.trickle_s = 0.05  # a byte every 50 ms: no read ever waits long, the answer takes ~30 s
    return server.base_url


def _no_token_ids(server: CompletionsServer) -> str:
    server.faults.omit_token_ids = True
    return server.base_url


BAD_OUTPUT = "engine_bad_output"
FAULTS: dict[str, Fault] = {
    "connection_refused": Fault(_down, "engine_error", r"after 2 attempt.*ConnectError"),
    "http_500": Fault(_failing, "engine_error", r"after 2 attempt.*HTTP 500: the upstream fell over"),
    "malformed_json": Fault(_raw(b'{"choices": [{"token_ids": [1, 2'), BAD_OUTPUT, "not JSON"),
    "html_error_page": Fault(_raw(b"<html><body>502 Bad Gateway</body></html>"), BAD_OUTPUT, "not JSON"),
    "deeply_nested_json": Fault(_raw(b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), BAD_OUTPUT, "JSON"),
    "huge_integer_id": Fault(_raw(b'{"choices": [{"token_ids": [' + b"9" * 5000 + b"]}]}"), BAD_OUTPUT, "JSON"),
    "truncated_body": Fault(_truncated, "engine_error", r"after 2 attempt.*(RemoteProtocolError|ReadError)"),
    "trickled_body": Fault(_trickling, "engine_timeout", r"within the 1\.0 s deadline"),
    "no_choices": Fault(_raw(b'{"choices": []}'), BAD_OUTPUT, "no choices"),
    "choice_not_an_object": Fault(_raw(b'{"choices": [7]}'), BAD_OUTPUT, r"not a completion.*\$\.choices\[0\]"),
    "answer_is_a_list": Fault(_raw(b"[1, 2, 3]"), BAD_OUTPUT, "not a completion"),
    "no_token_ids": Fault(_no_token_ids, BAD_OUTPUT, "must support `return_token_ids`"),
    "ids_not_a_list": Fault(_rewrite(_set("token_ids", lambda c: "1 2 3")), BAD_OUTPUT, r"choices\[0\]\.token_ids`"),
    "ids_as_floats": Fault(
        _rewrite(_set("token_ids", lambda c: [float(i) for i in c["token_ids"]])), BAD_OUTPUT, r"id 0 is .*float"
    ),
    "ids_as_bools": Fault(_rewrite(_set("token_ids", lambda c: [True] * 3)), BAD_OUTPUT, r"id 0 is .*bool"),
    "ids_as_strings": Fault(
        _rewrite(_set("token_ids", lambda c: [str(i) for i in c["token_ids"]])),
        BAD_OUTPUT,
        r"got `str` - at .*token_ids\[0\]",
    ),
    "id_out_of_vocabulary": Fault(
        _rewrite(_set("token_ids", lambda c: [*c["token_ids"][:-1], VOCAB])),
        BAD_OUTPUT,
        r"id 151669 .*vocabulary of 151669",
    ),
    "id_2**32-1": Fault(
        _rewrite(_set("token_ids", lambda c: [2**32 - 1, *c["token_ids"][1:]])),
        BAD_OUTPUT,
        r"id 4294967295 .*vocabulary",
    ),
    "negative_id": Fault(
        _rewrite(_set("token_ids", lambda c: [-1, *c["token_ids"][1:]])), BAD_OUTPUT, r"id -1 .*vocabulary"
    ),
    "too_many_ids": Fault(
        _rewrite(_set("token_ids", lambda c: c["token_ids"] * 400)), BAD_OUTPUT, r"\d+ ids for max_tokens=32"
    ),
    # Python's json writes NaN and -Infinity, which are not JSON
    "nan_logprob": Fault(_rewrite(_logprobs(lambda lp: [math.nan] * len(lp))), BAD_OUTPUT, "not JSON"),
    "infinite_logprob": Fault(_rewrite(_logprobs(lambda lp: [-math.inf, *lp[1:]])), BAD_OUTPUT, "not JSON"),
    "positive_logprob": Fault(_rewrite(_logprobs(lambda lp: [3.0, *lp[1:]])), BAD_OUTPUT, "above 0"),
    "logprob_as_string": Fault(
        _rewrite(_logprobs(lambda lp: ["-0.5", *lp[1:]])), BAD_OUTPUT, r"got `str` - at .*token_logprobs\[0\]"
    ),
    "logprobs_too_short": Fault(_rewrite(_logprobs(lambda lp: lp[:-1])), BAD_OUTPUT, r"logprobs for \d+ ids"),
    "logprobs_too_long": Fault(_rewrite(_logprobs(lambda lp: [*lp, -1.0])), BAD_OUTPUT, r"logprobs for \d+ ids"),
    "logprobs_not_an_object": Fault(_rewrite(_set("logprobs", lambda c: [-0.5])), BAD_OUTPUT, "logprobs"),
    "unknown_finish_reason": Fault(
        _rewrite(_set("finish_reason", lambda c: "banana")), BAD_OUTPUT, "finish reason 'banana'"
    ),
    "missing_finish_reason": Fault(_rewrite(_set("finish_reason", lambda c: None)), BAD_OUTPUT, "finish reason None"),
    "finish_reason_error": Fault(
        _rewrite(_set("finish_reason", lambda c: "error")), "engine_error", "reported an internal error"
    ),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_upstream_fault_ends_cleanly(name: str, upstream: CompletionsServer, tokenizer: HFTokenizer) -> None:
    fault = FAULTS[name]
    base_url = fault.arrange(upstream)
    engine = engine_for(base_url, tokenizer, deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(EngineError, match=fault.match) as info:
        generate(engine)
    assert info.value.code == fault.code, f"{type(info.value).__name__}: {info.value}"
    assert time.monotonic() - started < 1.0 + 2.0  # nothing outlives the deadline by more than a little slack


def test_the_honest_answer_passes_every_check(upstream: CompletionsServer, tokenizer: HFTokenizer) -> None:
    generation = generate(engine_for(upstream.base_url, tokenizer))
    assert generation.ids == tokenizer.encode(ANSWER)
    assert generation.text == ANSWER
    assert generation.logprobs == [-0.25] * len(generation.ids)
    assert generation.finish_reason == "stop"


def test_the_last_id_of_the_vocabulary_and_a_zero_logprob_are_accepted(
    upstream: CompletionsServer, tokenizer: HFTokenizer
) -> None:
    def edge(choice: dict[str, Any]) -> None:
        choice["token_ids"] = [0, VOCAB - 1]
        choice["logprobs"]["token_logprobs"] = [0.0, -1e4]
        choice["finish_reason"] = "length"

    upstream.faults.rewrite = edge
    generation = generate(engine_for(upstream.base_url, tokenizer))
    assert (generation.ids, generation.logprobs, generation.finish_reason) == ([0, VOCAB - 1], [0.0, -1e4], "length")


def test_a_trickling_server_is_cut_off_at_the_deadline(upstream: CompletionsServer, tokenizer: HFTokenizer) -> None:
    """One byte every 100 ms: every read succeeds, so only an overall deadline ends the call. Without one it
    ran for the whole answer (~60 s here, unbounded in general)."""
    upstream.faults.trickle_s = 0.1
    hung_up = upstream.disconnects
    engine = engine_for(upstream.base_url, tokenizer, deadline_s=1.0, timeout_s=30.0)
    started = time.monotonic()
    with pytest.raises(EngineTimeout, match=r"no complete answer within the 1\.0 s deadline"):
        generate(engine, guard_s=10.0)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 1.0 + 1.0
    deadline = time.monotonic() + 2
    while upstream.disconnects == hung_up and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.disconnects == hung_up + 1  # the engine hung up; the server saw it and stopped sending


def _padded_answer(upstream: CompletionsServer, tokenizer: HFTokenizer, size: int) -> bytes:
    """The honest answer's JSON, padded with whitespace to `size` bytes: valid, just large."""
    honest = json.dumps(
        {"choices": [{"index": 0, "text": ANSWER, "token_ids": tokenizer.encode(ANSWER), "finish_reason": "stop"}]}
    ).encode()
    return honest[:-1] + b" " * (size - len(honest)) + b"}"


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_an_answer_over_max_response_bytes_is_refused(
    upstream: CompletionsServer, tokenizer: HFTokenizer, chunked: bool
) -> None:
    """A server sending 3 MB to an engine capped at 1 MiB: refused from the Content-Length it announces, or as
    soon as the streamed body passes the cap; before the cap the whole body was held in memory, any size."""
    upstream.faults.raw_body = _padded_answer(upstream, tokenizer, 3 * 1024 * 1024)
    upstream.faults.chunked = chunked
    engine = engine_for(upstream.base_url, tokenizer, max_response_bytes=1024 * 1024)
    with pytest.raises(EngineBadOutput, match="max_response_bytes"):
        generate(engine)


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_an_answer_under_max_response_bytes_is_read(
    upstream: CompletionsServer, tokenizer: HFTokenizer, chunked: bool
) -> None:
    upstream.faults.raw_body = _padded_answer(upstream, tokenizer, 512 * 1024)
    upstream.faults.chunked = chunked
    engine = engine_for(upstream.base_url, tokenizer, max_response_bytes=1024 * 1024)
    assert generate(engine).ids == tokenizer.encode(ANSWER)


def test_the_deadline_covers_retries_too(upstream: CompletionsServer, tokenizer: HFTokenizer) -> None:
    upstream.faults.fail_next(50, status=503)
    engine = engine_for(upstream.base_url, tokenizer, deadline_s=0.5, max_retries=50, backoff_s=0.1)
    started = time.monotonic()
    with pytest.raises(EngineTimeout):
        generate(engine)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("deadline_s", [0.0, -1.0, math.nan])
def test_a_deadline_that_is_not_positive_is_refused(deadline_s: float, tokenizer: HFTokenizer) -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        engine_for("http://127.0.0.1:1/v1", tokenizer, deadline_s=deadline_s)


def test_bad_output_ends_only_its_own_episode_in_run_many(upstream: CompletionsServer, tokenizer: HFTokenizer) -> None:
    """Four episodes share one upstream that corrupts only the answers to the second prompt: that episode ends
    with the engine's error recorded on its trajectory; the other three finish with the real ids."""
    poisoned = tokenizer.encode("poisoned")

    def corrupt_one(choice: dict[str, Any]) -> None:
        prompt = choice["prompt_token_ids"]
        if any(prompt[i : i + len(poisoned)] == poisoned for i in range(len(prompt))):
            choice["token_ids"] = [VOCAB + 7]

    upstream.faults.rewrite = corrupt_one
    engine = engine_for(upstream.base_url, tokenizer)
    session = AgentSession(
        protocol="qwen3", environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=2)
    )
    runtime = AgentRuntime(engine, session, sampling=SAMPLING)

    async def all_four() -> list[Any]:
        try:
            return await runtime.run_many(["What is 2+2?", "poisoned", "What is 3+3?", "What is 4+4?"])
        finally:
            await engine.close()

    results = asyncio.run(all_four())
    bad = results[1]
    assert bad.stop_reason == BAD_OUTPUT
    (error,) = bad.trajectory.errors
    assert error.code == BAD_OUTPUT and "id 151676" in error.message
    for good in (results[0], results[2], results[3]):
        assert good.trajectory.errors == []
        assert good.final_answer == "The answer is 4."


def test_the_runtime_records_the_engine_error_code(upstream: CompletionsServer, tokenizer: HFTokenizer) -> None:
    upstream.faults.rewrite = _set("token_ids", lambda c: [VOCAB])
    engine = engine_for(upstream.base_url, tokenizer)
    session = AgentSession(protocol="qwen3", environment=lambda: FunctionCallEnvironment(tools=[], max_steps=1))

    async def one() -> Any:
        try:
            return await AgentRuntime(engine, session, sampling=SAMPLING).run("hi")
        finally:
            await engine.close()

    result = asyncio.run(one())
    assert [e.code for e in result.trajectory.errors] == [EngineBadOutput.code]
    assert all(VOCAB not in segment.ids for segment in result.trajectory.segments)  # nothing bad was kept


def test_codes_are_distinct_per_kind() -> None:
    assert (EngineError.code, EngineBadOutput.code, EngineTimeout.code) == (
        "engine_error",
        "engine_bad_output",
        "engine_timeout",
    )
    assert EngineUnavailable.code == "engine_error"  # unreachable is still an engine failure to the episode
