"""A long prompt is tokenized off the event loop: other episodes on the loop keep running meanwhile, and the ids
are the ones the tokenizer gives in place."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from pathlib import Path

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_protocol import GIL_FREE_MIN_CHARS, HFTokenizer, Message
from agent_runtime import AgentSession, encoding
from agent_runtime.encoding import encode_off_loop

# a conversation of about 40,000 tokens: tens of milliseconds of encoding or more
LONG = [Message(role="system", content="You are a careful assistant.")]
for i in range(120):
    LONG.append(Message(role="user", content=f"Question {i}: " + "how do the tides follow the moon? " * 30))
    LONG.append(Message(role="assistant", content=f"Answer {i}: " + "gravity pulls the oceans, twice a day. " * 30))
LONG.append(Message(role="user", content="And in one sentence?"))


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def session(tokenizer: HFTokenizer) -> AgentSession:
    return AgentSession(
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()]),
        rewards=RewardPipeline(result=[MatchingReward()]),
        tokenizer=tokenizer,
    )


async def _reset_while_ticking(tokenizer: HFTokenizer) -> tuple[list[int], float, float]:
    """Reset a session on the long conversation while another task ticks on the loop. Returns the prompt ids,
    the reset's duration and the longest the ticking task waited for the loop meanwhile."""
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    if tokenizer.pieces is not None:
        tokenizer.pieces.clear()  # every run encodes all of it: the pieces of a run before are not reused
    # A full garbage collection holds the GIL too (up to a second in a process that has loaded torch, on a loaded
    # machine): collected now and kept off while measuring, so the gaps are the encode's, not the collector's.
    gc.collect()
    gc.disable()
    try:
        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        ids = await session(tokenizer).reset(LONG)
        took = time.perf_counter() - t0
        stop.set()
        await ticker
    finally:
        gc.enable()
    return ids, took, max(gaps)


def test_a_long_prompt_does_not_stall_the_loop(tokenizer: HFTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    offloaded, took, offloaded_gap = asyncio.run(_reset_while_ticking(tokenizer))
    assert len(offloaded) > 30_000
    # the same reset with the encoding forced onto the loop: the other task waits for all of it
    monkeypatch.setattr(encoding, "GIL_FREE_MIN_CHARS", 10**9)
    inline, inline_took, inline_gap = asyncio.run(_reset_while_ticking(tokenizer))
    assert inline == offloaded
    assert inline_gap > 0.5 * inline_took, (inline_gap, inline_took)
    assert offloaded_gap < inline_gap / 4, (offloaded_gap, inline_gap, took)
    print(f"longest wait for the loop: {offloaded_gap * 1e3:.1f} ms offloaded, {inline_gap * 1e3:.1f} ms inline")


class _ThreadRecordingTokenizer(HFTokenizer):
    """The real tokenizer, noting which thread each encode ran on."""

    threads: list[int]

    def encode(self, text: str) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().encode(text)


def test_only_long_texts_leave_the_loop_thread(qwen3_tokenizer_file: Path) -> None:
    tokenizer = _ThreadRecordingTokenizer(HFTokenizer.from_file(qwen3_tokenizer_file).backend)
    tokenizer.threads = []
    long = "x " * (GIL_FREE_MIN_CHARS // 2)
    short = long[:-1]
    assert len(short) == GIL_FREE_MIN_CHARS - 1 and len(long) == GIL_FREE_MIN_CHARS

    async def main() -> tuple[list[int], list[int]]:
        return await encode_off_loop(tokenizer, short), await encode_off_loop(tokenizer, long)

    short_ids, long_ids = asyncio.run(main())
    loop_thread = threading.get_ident()  # asyncio.run runs the loop on the calling thread
    assert tokenizer.threads[0] == loop_thread and tokenizer.threads[1] != loop_thread
    assert short_ids == tokenizer.encode(short) and long_ids == tokenizer.encode(long)
