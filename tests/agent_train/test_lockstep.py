"""LockstepEngine: requests of registered episodes go to the engine in waves, each wave holding the next request of
every episode still running, in episode order, whatever the timing of the episodes (random sleeps on the loop and
in threads); a request from outside any episode goes straight through; an episode that ends or stops waiting
leaves the waves. The engine under it is a recording fake with `HFEngine`'s `generate_batch` contract."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any, cast

import pytest

from agent_runtime import Generation, SamplingParams
from agent_train.local.lockstep import LockstepEngine, as_episode

SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)


class RecordingEngine:
    """Answers each prompt with its own ids; records the waves `generate_batch` got and the lone `generate` calls."""

    tokenizer: Any = None
    context_length = 1024
    stop_token_ids = (0,)
    accepts_images = False

    def __init__(self) -> None:
        self.waves: list[list[tuple[int, ...]]] = []
        self.lone: list[tuple[int, ...]] = []

    async def generate_batch(
        self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingParams], *, images: Any = None
    ) -> list[Generation | Exception]:
        self.waves.append([tuple(p) for p in prompts])
        await asyncio.sleep(random.random() * 0.002)
        return [Generation(ids=list(p), text="", logprobs=None, finish_reason="stop") for p in prompts]

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, **_: Any) -> Generation:
        self.lone.append(tuple(prompt_ids))
        return Generation(ids=list(prompt_ids), text="", logprobs=None, finish_reason="stop")

    async def close(self) -> None:
        pass


async def episode(engine: LockstepEngine, number: int, calls: int, jitter: random.Random) -> int:
    for call in range(calls):
        if jitter.random() < 0.5:
            await asyncio.sleep(jitter.random() * 0.003)
        else:
            await asyncio.to_thread(time.sleep, jitter.random() * 0.003)  # a tool in a thread
        await engine.generate([number, call], SAMPLING)
    return number


def waves_of(timing_seed: int, calls: Sequence[int]) -> list[list[tuple[int, ...]]]:
    fake = RecordingEngine()
    engine = LockstepEngine(cast(Any, fake))
    jitter = random.Random(timing_seed)
    done = asyncio.run(engine.gather([episode(engine, i, n, jitter) for i, n in enumerate(calls)]))
    assert done == list(range(len(calls)))
    assert engine.waves == len(fake.waves) and not fake.lone
    return fake.waves


def test_waves_hold_every_running_episodes_next_request_in_episode_order_whatever_the_timing() -> None:
    calls = [3, 1, 4, 0, 2, 5]
    expected = [[(i, k) for i, n in enumerate(calls) if n > k] for k in range(max(calls))]
    for timing_seed in range(5):
        assert waves_of(timing_seed, calls) == expected


def test_a_request_outside_any_episode_goes_straight_to_the_engine() -> None:
    fake = RecordingEngine()
    engine = LockstepEngine(cast(Any, fake))

    async def main() -> None:
        await engine.generate([7], SAMPLING)  # no episode
        plain = await as_episode(cast(Any, fake), episode(engine, 9, 1, random.Random(0)))  # not a LockstepEngine
        assert plain == 9

    asyncio.run(main())
    assert fake.lone == [(7,), (9, 0)] and not fake.waves


def test_an_episode_that_stops_waiting_leaves_the_wave() -> None:
    fake = RecordingEngine()
    engine = LockstepEngine(cast(Any, fake))

    async def impatient() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await engine.generate([0, 0], SAMPLING)  # held: episode 1 is still busy

    async def slow() -> None:
        await asyncio.sleep(0.05)
        await engine.generate([1, 0], SAMPLING)

    asyncio.run(engine.gather([impatient(), slow()]))
    assert fake.waves == [[(1, 0)]]


def test_a_wave_waits_stall_s_for_an_episode_that_never_asks_then_goes_without_it() -> None:
    """An episode that waits on something other than the engine (here an event nobody sets until the end; in a
    trainer, a semaphore narrower than the round) would hold every wave forever: after `stall_s` the wave goes."""
    fake = RecordingEngine()
    engine = LockstepEngine(cast(Any, fake), stall_s=0.05)
    release = asyncio.Event()

    async def blocked() -> None:
        await release.wait()
        await engine.generate([0, 0], SAMPLING)

    async def asking() -> None:
        started = time.perf_counter()
        await engine.generate([1, 0], SAMPLING)
        assert time.perf_counter() - started >= 0.05
        release.set()

    async def main() -> None:
        async with asyncio.timeout(5):
            await engine.gather([blocked(), asking()])

    asyncio.run(main())
    assert engine.stalls == 1
    assert fake.waves == [[(1, 0)], [(0, 0)]]
    with pytest.raises(ValueError, match="stall_s"):
        LockstepEngine(cast(Any, fake), stall_s=0)
