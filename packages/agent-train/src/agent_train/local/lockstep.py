"""`LockstepEngine`: the local trainer's engine, an `HFEngine` whose batches are formed by the episodes' order, not
by when their requests arrive, so that a seeded run gives the same figures, bit for bit, run after run.

    engine = LockstepEngine(HFEngine(model, tokenizer, max_batch_size=256))
    results = await engine.gather([runtime.run(prompt) for prompt in prompts])   # episodes 0, 1, ...

Why: a batched row's floats depend on the rows beside it (the padding, the matrix shapes the kernels see), and
`HFEngine` serving-style batches by arrival: a turn that comes back from its tool while a batch runs joins it at
the next step. So thread timing decided which rows shared a batch, hence the float rounding, the logprobs, now
and then a sampled token, and from there the whole run. Here requests wait in waves: an episode's request is held
until every episode still running has sent its next one (or ended); then the wave goes to the engine at once,
ordered by (episode, call within the episode), through `HFEngine.generate_batch`, which runs exactly those rows, in
that order, in batches of `max_batch_size`, joining nothing. Which rows share a batch then follows from the
episodes' own course, which the seeds fix (episode `i` of a rollout samples with its own seed:
`agent_train.local.rollout`).

An episode is what `gather` (or `episode`) registers: the coroutine and every task it starts (the episode is known
by a context variable; an agent program's requests through the proxy carry it too). A request from outside any
registered episode goes straight to the engine, batched by arrival as before (`passed_through` counts them).
Episodes must not wait on one another: one that waits for a place (a semaphore narrower than the episodes of a
round, such as `AgentRuntime(max_concurrency=...)` or an `AgentProgram.max_concurrent` below them) holds no request
and never ends. A wave that has waited `stall_s` (120 s by default) for such an episode goes without it, with a
`lockstep_stalled` warning (`stalls` counts them): the run goes on, no longer bit for bit. What it costs: a wave
waits for its longest row, where joining let a turn that came back early start its next one (measured in the
agent-train README). This module knows `HFEngine` and asyncio; nothing about training.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from agent_runtime import EngineUnavailable, Generation, LLMEngine, SamplingParams

if TYPE_CHECKING:
    from agent_runtime.engines import HFEngine

__all__ = ["STALL_S", "LockstepEngine", "as_episode"]

STALL_S = 120.0
"""How long a wave waits for the episodes that have sent no request before it goes without them."""

logger = structlog.get_logger(__name__)

#: the episode the current task belongs to: (its engine's id, its number), or None outside any
_EPISODE: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("lockstep_episode", default=None)


@dataclass(slots=True)
class _Held:
    """A request held until its wave goes: its key (episode, call number) and the caller's future."""

    key: tuple[int, int]
    prompt: Sequence[int]
    sampling: SamplingParams
    images: Sequence[str]
    future: asyncio.Future[Generation]


class LockstepEngine(LLMEngine):
    """`engine` with its registered episodes' requests sent in waves, in episode order (the module docstring).
    Attributes other than `generate`, `close` and the episode bookkeeping are the engine's."""

    name = "hf-lockstep"

    def __init__(self, engine: HFEngine, *, stall_s: float = STALL_S) -> None:
        if not stall_s > 0:
            raise ValueError(f"stall_s must be positive, got {stall_s}")
        self.engine = engine
        self.stall_s = stall_s
        self.tokenizer = engine.tokenizer
        self.context_length = engine.context_length
        self.stop_token_ids = engine.stop_token_ids
        self.accepts_images = engine.accepts_images
        self._numbers = itertools.count()
        self._live: set[int] = set()  # episodes registered and not ended
        self._calls: dict[int, int] = {}  # per live episode, the requests it has sent
        self._held: dict[int, list[_Held]] = {}  # per episode, its requests waiting for the wave
        self._wave: asyncio.Task[None] | None = None
        self._stall: asyncio.TimerHandle | None = None  # armed while a wave waits for episodes that sent nothing
        self.stalls = 0  # waves sent without every live episode (see STALL_S)
        self.waves = 0  # waves sent to the engine
        self.passed_through = 0  # requests from outside any registered episode, sent as they came

    def __getattr__(self, name: str) -> Any:  # the engine's counters and settings (batch_sizes, max_batch_size...)
        return getattr(self.engine, name)

    @property
    def policy_version(self) -> int:  # type: ignore[override]  # the engine's, not the base class's None
        return self.engine.policy_version

    def set_policy_version(self, version: int) -> None:
        """The engine's weights are now policy `version` (`HFEngine.set_policy_version`)."""
        self.engine.set_policy_version(version)

    def episode[T](self, coroutine: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """`coroutine` as an episode: registered now, in call order (its place in every wave), ended when it
        returns or raises. Register every episode of a round before awaiting any, as `gather` does: a wave goes
        once every registered episode still running waits on the engine."""
        number = next(self._numbers)
        self._live.add(number)
        self._calls[number] = 0
        return self._run_episode(number, coroutine)

    async def gather[T](self, coroutines: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
        """Run `coroutines` as episodes, in that order; their results in that order (an exception propagates,
        as `asyncio.gather`'s)."""
        episodes: list[Awaitable[T]] = [self.episode(coroutine) for coroutine in coroutines]
        return list(await asyncio.gather(*episodes))

    async def _run_episode[T](self, number: int, coroutine: Coroutine[Any, Any, T]) -> T:
        token = _EPISODE.set((id(self), number))  # run as a task: its requests, and its subtasks', carry it
        try:
            return await coroutine
        finally:
            _EPISODE.reset(token)
            self._live.discard(number)
            self._calls.pop(number, None)
            self._maybe_send()

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        episode = _EPISODE.get()
        if episode is None or episode[0] != id(self) or episode[1] not in self._live:
            self.passed_through += 1
            return await self.engine.generate(prompt_ids, sampling, images=images)
        number = episode[1]
        call = self._calls[number]
        self._calls[number] = call + 1
        held = _Held((number, call), prompt_ids, sampling, images, asyncio.get_running_loop().create_future())
        self._held.setdefault(number, []).append(held)
        self._maybe_send()
        try:
            return await held.future
        except asyncio.CancelledError:
            waiting = self._held.get(number, [])
            if held in waiting:  # not sent yet: it leaves the wave
                waiting.remove(held)
                if not waiting:
                    del self._held[number]
                self._maybe_send()
            raise

    def _maybe_send(self, *, stalled: bool = False) -> None:
        """Send the wave once every live episode holds a request (or, `stalled`, whatever is held) and no wave is
        running; while it waits for some, arm the stall timer."""
        if not self._held or (self._wave is not None and not self._wave.done()):
            return
        missing = [number for number in self._live if number not in self._held]
        if missing and not stalled:
            if self._stall is None:
                self._stall = asyncio.get_running_loop().call_later(self.stall_s, self._stalled)
            return
        if missing:
            self.stalls += 1
            logger.warning(
                "lockstep_stalled", waiting_s=self.stall_s, held=len(self._held), silent_episodes=len(missing),
                hint="an episode waits on something other than the engine (a semaphore narrower than the round?); "
                "this wave goes without it, and the run is no longer bit-for-bit reproducible",
            )  # fmt: skip
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        wave = sorted((held for requests in self._held.values() for held in requests), key=lambda h: h.key)
        self._held = {}
        self._wave = asyncio.get_running_loop().create_task(self._send(wave), name="lockstep-wave")

    def _stalled(self) -> None:
        self._stall = None
        self._maybe_send(stalled=True)

    async def _send(self, wave: list[_Held]) -> None:
        self.waves += 1
        answers: Sequence[Generation | Exception] = []
        try:
            answers = await self.engine.generate_batch(
                [held.prompt for held in wave],
                [held.sampling for held in wave],
                images=[held.images for held in wave] if any(held.images for held in wave) else None,
            )
        except Exception as e:  # the engine is closed, say: every request of the wave fails with it
            answers = [e] * len(wave)
        finally:  # cancelled too (the loop is ending): no caller is left waiting
            answers = list(answers) or [EngineUnavailable("hf-lockstep: the wave was cancelled")] * len(wave)
            for held, answer in zip(wave, answers, strict=True):
                if held.future.done():  # its caller stopped waiting
                    continue
                if isinstance(answer, Exception):
                    held.future.set_exception(answer)
                else:
                    held.future.set_result(answer)
            self._wave = None
        self._maybe_send()

    async def close(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        await self.engine.close()


def as_episode[T](engine: LLMEngine, coroutine: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """`coroutine` registered as an episode of `engine` when it is a `LockstepEngine`; else `coroutine` itself."""
    return engine.episode(coroutine) if isinstance(engine, LockstepEngine) else coroutine
