"""Amplifying upstreams: answers of a few kilobytes (or a few megabytes) that would cost `OpenAIEngine` far more to
read than they weigh (a gzip bomb, 64 KB of gzip that inflate to millions of brackets, millions of ids, many
choices, long strings of escapes). Each must be refused with `engine_bad_output`, with this process growing by
less than twice `max_response_bytes` and its event loop never held more than 50 ms.

The upstream is a real HTTP server, kept as plain as can be so that its own memory does not blur the figure: a
thread that answers every request with one prebuilt body through `socket.sendall` (no copy). The growth is the
peak of the resident set sampled every millisecond by another thread, minus the resident set before the call;
the stall is the longest a ticker on the engine's loop waited past its 5 ms sleep (a call whose stall passes 50
ms is measured again, up to three times, and the least kept: on a busy machine the OS alone can hold a thread
that long, and a stall the engine causes comes back every time). Run with ``-s`` to see them:

    uv run pytest tests/agent_runtime/test_engine_upstream_amplification.py -s -q
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import gzip
import json
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.openai_http import OpenAIEngine
from agent_runtime.errors import EngineBadOutput

CAP = 8 * 1024 * 1024  # max_response_bytes of the engine under test
PROMPT = [151644, 872, 198, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198]  # <|im_start|>user\n2+2?...
ANSWER = "The answer is 4.<|im_end|>"
MAX_STALL_S = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE")


class RawUpstream:
    """Answers every POST with `self.head` and `self.body` (set by the test), then closes the connection."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        self.base_url = f"http://127.0.0.1:{self.socket.getsockname()[1]}/v1"
        self.head = b""
        self.body = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def answer(self, body: bytes, encoding: str | None = None) -> None:
        coding = f"Content-Encoding: {encoding}\r\n" if encoding else ""
        self.body = body
        self.head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{coding}"
            "Connection: close\r\n\r\n"
        ).encode()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return  # closed
            with connection:
                try:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += connection.recv(65536)
                    head, _, rest = request.partition(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                    while len(rest) < length:
                        rest += connection.recv(65536)
                    connection.sendall(self.head)
                    connection.sendall(memoryview(self.body))
                except OSError:
                    pass  # the engine hung up: what this test wants it to do with a hostile answer

    def close(self) -> None:
        self.socket.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[RawUpstream]:
    server = RawUpstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def _trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _honest(tokenizer: HFTokenizer, **extra: Any) -> dict[str, Any]:
    ids = tokenizer.encode(ANSWER)
    choice = {"index": 0, "text": ANSWER, "token_ids": ids, "prompt_token_ids": PROMPT, "finish_reason": "stop"}
    choice["logprobs"] = {"token_logprobs": [-0.25] * len(ids), "tokens": [tokenizer.decode([i]) for i in ids]}
    return {"id": "cmpl-1", "object": "text_completion", "choices": [choice | extra]}


def _fill(prefix: bytes, unit: bytes, suffix: bytes, size: int = CAP - 4096) -> bytes:
    """`prefix`, `unit` repeated, `suffix`: `size` bytes in all (under the cap: the cap alone does not refuse it)."""
    return prefix + unit * ((size - len(prefix) - len(suffix)) // len(unit)) + suffix


Amplifier = Callable[[], tuple[bytes, str | None]]  # the body on the wire, and its content coding


def _gz(body: bytes) -> tuple[bytes, str]:
    return gzip.compress(body, 6), "gzip"


AMPLIFIERS: dict[str, Amplifier] = {
    # 64 KB of gzip that inflate to 64 MiB: refused at the cap, having inflated no further
    "gzip_bomb": lambda: _gz(b" " * (64 << 20)),
    # a few hundred bytes, gzip inside gzip, 64 MiB inflated
    "gzip_in_gzip_bomb": lambda: (gzip.compress(gzip.compress(b" " * (64 << 20), 6), 6), "gzip, gzip"),
    "deflate_bomb": lambda: (zlib.compress(b"[" * (64 << 20), 6), "deflate"),
    # 8 KB of gzip, 8 MiB of brackets nested 8 million deep
    "nested_arrays": lambda: _gz(_fill(b'{"choices": [{"x": ', b"[", b"}]}")),
    # 8 MiB of `[],` in a field nobody reads: 2.8 M lists had they been decoded (~160 MB)
    "wide_empty_arrays": lambda: _gz(_fill(b'{"choices": [], "a": [', b"[],", b"[]]}")),
    "objects_of_objects": lambda: _gz(_fill(b'{"usage": {"a": [', b'{"b":{}},', b'{}]}, "choices": []}')),
    # 4 M ids, plain on the wire: counted against max_tokens as they are scanned, never built
    "four_million_ids": lambda: (
        _fill(b'{"choices": [{"finish_reason": "stop", "token_ids": [', b"0,", b"0]}]}"),
        None,
    ),
    "many_choices": lambda: _gz(_fill(b'{"choices": [', b"{},", b"{}]}")),
    "many_logprobs": lambda: _gz(_fill(b'{"choices": [{"logprobs": {"token_logprobs": [', b"-0.5,", b"0]}}]}")),
    # one string of 8 MiB of surrogate-pair escapes: 700 k emoji, 4 bytes a character once decoded
    "long_string_of_escapes": lambda: _gz(_fill(b'{"choices": [{"finish_reason": "', b"\\ud83d\\ude00", b'"}]}')),
    "many_strings_of_escapes": lambda: _gz(_fill(b'{"choices": [{"token_ids": [', b'"\\ud83d\\ude00",', b"1]}]}")),
}


def _measured(engine: OpenAIEngine, sampling: SamplingParams) -> tuple[Generation | BaseException, float, int, float]:
    """One call: its outcome, the longest loop stall (s), the peak resident growth (bytes), the seconds taken."""
    gc.collect()
    _trim()  # hand freed heap back first, so that reusing it does not hide growth
    before = _resident()
    peak = [before]
    sampling_done = threading.Event()

    def sample() -> None:
        while not sampling_done.is_set():
            peak[0] = max(peak[0], _resident())
            time.sleep(0.001)

    async def main() -> tuple[Generation | BaseException, float]:
        stall = 0.0
        running = True

        async def ticker() -> None:
            nonlocal stall
            while running:
                started = time.perf_counter()
                await asyncio.sleep(0.005)
                stall = max(stall, time.perf_counter() - started - 0.005)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        try:
            outcome: Generation | BaseException = await asyncio.wait_for(engine.generate(PROMPT, sampling), 60)
        except Exception as e:
            outcome = e
        finally:
            running = False
            await tick
            await engine.close()
        return outcome, stall

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        outcome, stall = asyncio.run(main())
    finally:
        sampling_done.set()
        sampler.join()
    return outcome, stall, peak[0] - before, time.perf_counter() - started


def _engine(upstream: RawUpstream, tokenizer: HFTokenizer) -> OpenAIEngine:
    return OpenAIEngine(
        upstream.base_url,
        model="m",
        tokenizer=tokenizer,
        context_length=8192,
        max_response_bytes=CAP,
        max_retries=0,
        deadline_s=30,
    )


@pytest.mark.parametrize("max_new_tokens", [32, 4096])
@pytest.mark.parametrize("name", list(AMPLIFIERS))
def test_an_amplifying_answer_is_refused_cheaply(
    name: str, max_new_tokens: int, upstream: RawUpstream, tokenizer: HFTokenizer
) -> None:
    body, encoding = AMPLIFIERS[name]()
    upstream.answer(body, encoding)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    outcome, stall, growth, seconds = _measured(_engine(upstream, tokenizer), sampling)
    stalls = [stall]
    while stall >= MAX_STALL_S and len(stalls) < 3:  # once more: a stall that does not come back was the machine's
        stalls.append(_measured(_engine(upstream, tokenizer), sampling)[1])
        stall = min(stalls)
    print(
        f"\n{name} (max_tokens={max_new_tokens}, {len(body):,} bytes on the wire): "
        f"{type(outcome).__name__} in {seconds:.2f} s, longest loop stall {stall * 1000:.1f} ms"
        f"{'' if len(stalls) == 1 else f' (best of {[round(x * 1000, 1) for x in stalls]})'}, "
        f"resident +{growth / 2**20:.1f} MiB (cap {CAP / 2**20:.0f} MiB): {str(outcome)[:150]}"
    )
    assert isinstance(outcome, EngineBadOutput), outcome
    assert outcome.code == "engine_bad_output"
    assert growth < 2 * CAP
    assert stall < MAX_STALL_S


@pytest.mark.parametrize("encoding", [None, "gzip", "deflate", "raw-deflate", "gzip, gzip"])
def test_an_honest_answer_is_read_in_every_offered_coding(
    encoding: str | None, upstream: RawUpstream, tokenizer: HFTokenizer
) -> None:
    body = json.dumps(_honest(tokenizer)).encode()
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "gzip, gzip":
        body = gzip.compress(gzip.compress(body))
    elif encoding == "deflate":
        body = zlib.compress(body)
    elif encoding == "raw-deflate":
        squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        body, encoding = squeeze.compress(body) + squeeze.flush(), "deflate"
    upstream.answer(body, encoding)
    outcome, stall, growth, _ = _measured(_engine(upstream, tokenizer), SamplingParams(max_new_tokens=32))
    print(f"\nhonest, {encoding}: longest loop stall {stall * 1000:.1f} ms, resident +{growth / 2**20:.1f} MiB")
    assert isinstance(outcome, Generation), outcome
    assert (outcome.text, outcome.logprobs) == (ANSWER, [-0.25] * len(outcome.ids))


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip, gzip"])
def test_a_coding_that_was_not_offered_is_refused(encoding: str, upstream: RawUpstream, tokenizer: HFTokenizer) -> None:
    upstream.answer(json.dumps(_honest(tokenizer)).encode(), encoding)
    outcome, _, _, _ = _measured(_engine(upstream, tokenizer), SamplingParams(max_new_tokens=32))
    assert isinstance(outcome, EngineBadOutput), outcome
    assert "content coding" in str(outcome)


def test_a_full_size_honest_answer_fits_its_budget(upstream: RawUpstream, tokenizer: HFTokenizer) -> None:
    """4,000 generated ids after a 4,000-id prompt, with everything vLLM sends (text, tokens, top_logprobs,
    text_offset, prompt_token_ids): well inside the budget that refuses the amplifiers above."""
    text = " ".join(f"word{i % 97} 3.{i}" for i in range(1400))
    ids = tokenizer.encode(text)[:4000]
    tokens = [tokenizer.decode([i]) for i in ids]
    prompt = (PROMPT * 400)[:4000]
    choice = {
        "index": 0,
        "text": tokenizer.decode(ids),
        "logprobs": {
            "text_offset": list(range(len(ids))),
            "token_logprobs": [-0.125] * len(ids),
            "tokens": tokens,
            "top_logprobs": [{t: -0.125, "x": -3.5} for t in tokens],
        },
        "finish_reason": "length",
        "stop_reason": None,
        "prompt_token_ids": prompt,
        "token_ids": ids,
    }
    upstream.answer(json.dumps({"id": "cmpl-1", "choices": [choice], "usage": {"total_tokens": 8000}}).encode())
    engine = _engine(upstream, tokenizer)

    async def one() -> Generation:
        try:
            return await engine.generate(prompt, SamplingParams(max_new_tokens=len(ids)))
        finally:
            await engine.close()

    generation = asyncio.run(one())
    assert generation.ids == ids and generation.finish_reason == "length"
