"""OpenAIEngine against a real local HTTP server (uvicorn + Starlette in a thread) that serves HFEngine on the
tiny Qwen3 model: the same ids as calling HFEngine directly, the wire format it sends, and its behaviour when
the server fails, refuses, is slow, is down or answers without token ids."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import msgspec
import pytest

from agent_protocol import Tokenizer

pytest.importorskip("torch")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.engines.openai_http import OpenAIEngine
from agent_runtime.errors import ContextBudgetExceeded, EngineError, EngineUnavailable
from tests.support.completions_server import CompletionsServer

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
PROMPT = "<|im_start|>user\nHello over HTTP<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def server(tiny_hf_engine: HFEngine) -> Iterator[CompletionsServer]:
    with CompletionsServer(tiny_hf_engine) as running:
        yield running


@pytest.fixture
def fresh(server: CompletionsServer) -> Iterator[CompletionsServer]:
    """The shared server with no faults and an empty request log, restored after the test."""
    server.faults.reset()
    server.requests.clear()
    yield server
    server.faults.reset()


@pytest.fixture(scope="module")
def tokenizer(tiny_hf_engine: HFEngine) -> Tokenizer:
    return tiny_hf_engine.tokenizer  # loading the 11 MB tokenizer.json once per module, not once per client


def client(base_url: str, tokenizer: Tokenizer, **options: Any) -> OpenAIEngine:
    defaults: dict[str, Any] = {"model": "tiny-qwen3", "context_length": 4096, "backoff_s": 0.01, "max_retries": 3}
    return OpenAIEngine(base_url, tokenizer=tokenizer, **(defaults | options))


def call(engine: OpenAIEngine, prompt: list[int], sampling: SamplingParams) -> Generation:
    async def once() -> Generation:
        try:
            return await engine.generate(prompt, sampling)
        finally:
            await engine.close()

    return run(once())


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_greedy_over_http_equals_the_engine_called_directly(
    fresh: CompletionsServer, tiny_hf_engine: HFEngine, tokenizer: Tokenizer
) -> None:
    prompt = tiny_hf_engine.tokenize(PROMPT)
    direct = run(tiny_hf_engine.generate(prompt, GREEDY))
    remote = call(client(fresh.base_url, tokenizer), prompt, GREEDY)
    # ids, text, logprobs (floats survive JSON exactly) and finish reason; vLLM's HTTP API carries no policy version
    assert remote == msgspec.structs.replace(direct, versions=None) and direct.versions == [0] * len(direct.ids)
    (body,) = fresh.requests
    assert body["prompt"] == prompt
    assert body["return_token_ids"] is True and body["skip_special_tokens"] is False and body["logprobs"] == 1
    assert body["max_tokens"] == 6 and body["temperature"] == 0.0 and body["top_k"] == -1
    assert body["stop_token_ids"] == [151643, 151645]
    assert "seed" not in body


def test_seeded_sampling_and_stop_tokens_pass_through(
    fresh: CompletionsServer, tiny_hf_engine: HFEngine, tokenizer: Tokenizer
) -> None:
    prompt = tiny_hf_engine.tokenize(PROMPT)
    seeded = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=40, top_p=0.9, seed=11)
    direct = msgspec.structs.replace(run(tiny_hf_engine.generate(prompt, seeded)), versions=None)  # HTTP has none
    assert call(client(fresh.base_url, tokenizer), prompt, seeded) == direct
    greedy = run(tiny_hf_engine.generate(prompt, GREEDY)).ids
    stop = SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(greedy[1],))
    stopped = call(client(fresh.base_url, tokenizer), prompt, stop)
    assert stopped.ids == greedy[: greedy.index(greedy[1]) + 1]
    assert stopped.finish_reason == "stop"
    assert fresh.requests[-1]["stop_token_ids"] == sorted({151643, 151645, greedy[1]})


def test_max_tokens_is_clamped_to_the_context_and_an_overlong_prompt_is_never_sent(
    fresh: CompletionsServer, tokenizer: Tokenizer
) -> None:
    engine = client(fresh.base_url, tokenizer, context_length=40)
    clamped = call(engine, list(range(100, 137)), SamplingParams(max_new_tokens=10, temperature=0.0))
    assert fresh.requests[-1]["max_tokens"] == 3
    assert len(clamped.ids) == 3 and clamped.finish_reason == "length"
    sent = len(fresh.requests)
    with pytest.raises(ContextBudgetExceeded):
        call(client(fresh.base_url, tokenizer, context_length=40), list(range(100, 140)), GREEDY)
    assert len(fresh.requests) == sent


def test_retries_succeed_after_two_server_errors(fresh: CompletionsServer, tokenizer: Tokenizer) -> None:
    fresh.faults.fail_next(2, status=500)
    generation = call(client(fresh.base_url, tokenizer), [1, 2, 3], GREEDY)
    assert len(generation.ids) == 6
    assert len(fresh.requests) == 3


def test_server_errors_past_the_retries_are_an_engine_error(fresh: CompletionsServer, tokenizer: Tokenizer) -> None:
    fresh.faults.fail_next(5, status=502, message="upstream fell over")
    with pytest.raises(EngineError, match=r"after 3 attempt.*502: upstream fell over") as info:
        call(client(fresh.base_url, tokenizer, max_retries=2), [1, 2, 3], GREEDY)
    assert not isinstance(info.value, EngineUnavailable)
    assert len(fresh.requests) == 3


@pytest.mark.parametrize(
    ("options", "sampling", "status", "message"),
    [
        # SamplingParams rejects a negative temperature itself; a raw body field still reaches the server
        ({"extra_body": {"temperature": -1.0}}, GREEDY, 400, "temperature must be non-negative"),
        ({"model": "no-such-model"}, GREEDY, 404, "The model `no-such-model` does not exist"),
    ],
    ids=["bad_request", "unknown_model"],
)
def test_a_client_error_is_raised_at_once_with_the_server_message(
    fresh: CompletionsServer, tokenizer: Tokenizer, options: dict[str, Any], sampling: SamplingParams, status: int,
    message: str,
) -> None:  # fmt: skip
    with pytest.raises(EngineError, match=f"\\({status}\\): {message}"):
        call(client(fresh.base_url, tokenizer, **options), [1, 2, 3], sampling)
    assert len(fresh.requests) == 1  # not retried


def test_an_unreachable_server_is_engine_unavailable_after_retries(tokenizer: Tokenizer) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = client(f"http://127.0.0.1:{port}/v1", tokenizer, max_retries=2, backoff_s=0.01)
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match=r"after 3 attempt.*ConnectError"):
        call(engine, [1, 2, 3], GREEDY)
    assert time.monotonic() - started < 5


def test_a_slow_server_times_out_and_is_retried(fresh: CompletionsServer, tokenizer: Tokenizer) -> None:
    fresh.faults.delay_s = 2.0
    engine = client(fresh.base_url, tokenizer, timeout_s=0.2, max_retries=1)
    with pytest.raises(EngineError, match=r"after 2 attempt.*timed out \(ReadTimeout\)"):
        call(engine, [1, 2, 3], GREEDY)
    assert len(fresh.requests) == 2


def test_a_server_without_token_ids_is_refused(fresh: CompletionsServer, tokenizer: Tokenizer) -> None:
    fresh.faults.omit_token_ids = True
    with pytest.raises(EngineError, match="must support `return_token_ids`"):
        call(client(fresh.base_url, tokenizer), [1, 2, 3], GREEDY)


def test_the_api_key_is_sent_as_a_bearer_token(tiny_hf_engine: HFEngine, tokenizer: Tokenizer) -> None:
    with CompletionsServer(tiny_hf_engine, api_key="sekret") as guarded:
        with pytest.raises(EngineError, match="\\(401\\): Unauthorized"):
            call(client(guarded.base_url, tokenizer, api_key="wrong"), [1, 2, 3], GREEDY)
        ok = call(client(guarded.base_url, tokenizer, api_key="sekret"), [1, 2, 3], GREEDY)
        assert len(ok.ids) == 6


def test_close_releases_the_client(fresh: CompletionsServer, tokenizer: Tokenizer) -> None:
    engine = client(fresh.base_url, tokenizer)
    call(engine, [1, 2, 3], GREEDY)  # closes after the call
    with pytest.raises(EngineUnavailable, match="closed"):
        run(engine.generate([1, 2, 3], GREEDY))


def test_request_bodies_carry_plain_int_ids_from_a_view_or_any_integer_sequence() -> None:
    import numpy as np

    from agent_runtime.engines.base import PromptView, plain_ids

    ids = [151644, 872, 198, 9707, 151645, 7, 8]
    view = PromptView(ids, 5)
    ids.append(9)  # a transcript grows after the request is made: the view, and what is sent, do not
    assert plain_ids(view) == [151644, 872, 198, 9707, 151645]
    assert plain_ids(np.array(ids[:3], dtype=np.int32)) == [151644, 872, 198]
    assert all(type(i) is int for i in plain_ids(np.array(ids, dtype=np.int64)))
    with pytest.raises(TypeError):
        plain_ids([1.0, 2.0])
