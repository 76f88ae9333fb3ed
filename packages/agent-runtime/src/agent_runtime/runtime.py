"""`AgentRuntime`: drives sessions with an engine and streams what happens as typed events.

    engine = make_engine("hf", model="path/to/model")
    session = AgentSession(protocol, env, context=CompactionPolicy())  # summarize when the context fills
    rt = AgentRuntime(engine, session, max_context_tokens=96000)
    async for event in rt.stream("What is 17 * 23?"):
        print(event)
    result = await rt.run("What is 17 * 23?")      # final answer, trajectory, usage

The session given is a definition: every `run`/`stream` works on a fresh `session.spawn()` (or calls the
factory given instead), so many episodes run concurrently against one engine. A failing or hanging engine ends
only its own episode (an `ErrorEvent`, then the `FinalEvent`), with everything recorded so far kept. This module
knows sessions, engines and events; it knows nothing about HTTP or OpenRLHF.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import msgspec
import structlog

from agent_protocol import MessageLike
from agent_runtime.boundary import boundary
from agent_runtime.engine_call import EngineFailure, call_engine
from agent_runtime.engines.base import Generation, LLMEngine, SamplingParams
from agent_runtime.events import (
    AssistantEvent,
    CompactionEvent,
    ErrorEvent,
    Event,
    FinalEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from agent_runtime.session import AgentSession, StepOutcome
from agent_runtime.trajectory import Trajectory, Usage

__all__ = ["AgentRuntime", "RunResult"]

logger = structlog.get_logger(__name__)

SessionFactory = Callable[[], AgentSession]


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    final_answer: str | None
    stop_reason: str | None
    reward: float
    usage: Usage
    trajectory: Trajectory
    events: list[Event] = msgspec.field(default_factory=list)

    @classmethod
    def of(
        cls, session: AgentSession, events: list[Event] | None = None, *, policy_version: int | None = None
    ) -> RunResult:
        """The result of `session`'s finished episode (what its `FinalEvent` says, and its trajectory, built with
        the engine's `policy_version`)."""
        trajectory = session.record(policy_version=policy_version)
        return cls(
            final_answer=session.final_answer,
            stop_reason=session.stop_reason,
            reward=session.reward,
            usage=trajectory.usage,  # counted once, for both
            trajectory=trajectory,
            events=events or [],
        )


class AgentRuntime:
    """Runs episodes of a session definition against one engine."""

    def __init__(
        self,
        engine: LLMEngine,
        session: AgentSession | SessionFactory,
        *,
        sampling: SamplingParams | None = None,
        max_context_tokens: int | None = None,
        engine_timeout_s: float | None = 600.0,
        max_concurrency: int | None = None,
        log_episodes: bool = True,
    ) -> None:
        """`log_episodes`: log an ``episode_finished`` line per episode (the server turns it off for a plain
        agent-mode request, whose one ``request_served`` line carries the same fields)."""
        self.engine = engine
        self._session_source = session
        self.sampling = sampling or SamplingParams()
        self.max_context_tokens = max_context_tokens
        self.engine_timeout_s = engine_timeout_s
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.log_episodes = log_episodes

    def new_session(self) -> AgentSession:
        """A fresh session bound to this runtime's engine and context limit."""
        source = self._session_source
        session = source.spawn() if isinstance(source, AgentSession) else source()
        if not isinstance(session, AgentSession):
            raise TypeError(f"the session factory returned {type(session).__name__}, not an AgentSession")
        session.bind_tokenizer(self.engine.tokenizer)
        limits = [x for x in (self.max_context_tokens, session.max_context_tokens, self.engine.context_length) if x]
        session.max_context_tokens = min(limits) if limits else None
        return session

    def stream(
        self,
        prompt: str | Sequence[MessageLike],
        *,
        task: Mapping[str, Any] | None = None,
        session: AgentSession | None = None,
        sampling: SamplingParams | None = None,
        steps: bool = True,
    ) -> AsyncGenerator[Event]:
        """Run one episode, yielding events as they happen; the last event is always a `FinalEvent`. `sampling`
        replaces the runtime's for this episode (a rollout's own seed). `steps=False` yields only an `ErrorEvent`
        that ends the episode and the `FinalEvent`, and builds no step events: for a caller that reads only the
        outcome (a plain agent-mode answer), the session having recorded every step either way. Without a
        concurrency cap the episode's own generator is returned, with no layer around it."""
        session = session or self.new_session()
        drive = self._drive(session, prompt, task, sampling or self.sampling, steps=steps)
        return drive if self._slots is None else self._in_slot(drive)

    async def _in_slot(self, drive: AsyncGenerator[Event]) -> AsyncGenerator[Event]:
        """`drive`, run while holding one of `max_concurrency` places."""
        async with self._slot(), contextlib.aclosing(drive):
            async for event in drive:
                yield event

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """One of `max_concurrency` places, held for an episode (none to wait for without a cap)."""
        if self._slots is None:
            yield
            return
        async with self._slots:
            yield

    async def _drive(
        self,
        session: AgentSession,
        prompt: str | Sequence[MessageLike],
        task: Mapping[str, Any] | None,
        base: SamplingParams,
        *,
        steps: bool,
    ) -> AsyncGenerator[Event]:
        """The episode loop. `steps`: yield each step's events; without, only an `ErrorEvent` that ends the
        episode and the `FinalEvent` (a run that keeps no events builds none: the session records everything)."""
        started = time.perf_counter()
        generate_s = 0.0
        await session.reset(prompt, task=task)  # raises only for a prompt that cannot be rendered (caller input)
        with boundary() as escaped:  # the last boundary: whatever escaped the session ends this episode only
            while (request := await session.next_request()) is not None:
                t0 = time.perf_counter()
                sampling = request.sampling(base)
                generation = await call_engine(
                    self.engine, request.prompt_ids, sampling, timeout_s=self.engine_timeout_s, images=request.images,
                    session=session.episode_id,
                )  # fmt: skip
                generate_s += time.perf_counter() - t0
                if isinstance(generation, EngineFailure):  # ends this episode only
                    await session.fail(generation.code, generation.message)
                    yield ErrorEvent(code=generation.code, message=generation.message)
                    break
                if generation.exact_text and session.tokenizer is not self.engine.tokenizer:
                    generation = msgspec.structs.replace(generation, exact_text=False)  # the session decodes its own
                outcome = await session.step(generation)
                if steps:
                    for event in _step_events(session, outcome, generation):
                        yield event
                elif outcome.error is not None:
                    yield ErrorEvent(code=outcome.error.code, message=outcome.error.message)
        if escaped.exception is not None:
            error = await session.contain(escaped.exception)
            yield ErrorEvent(code=error.code, message=error.message)
        session.timings["generate_s"] = generate_s
        session.timings["total_s"] = time.perf_counter() - started
        if self.log_episodes:
            turns = session.conversation.turns if session.conversation is not None else 0
            logger.info(
                "episode_finished", episode_id=session.episode_id, engine=self.engine.name,
                stop_reason=session.stop_reason, turns=turns, reward=session.reward,
            )  # fmt: skip
        yield FinalEvent(
            answer=session.final_answer, stop_reason=session.stop_reason, reward=session.reward, usage=session.usage()
        )

    async def run(
        self,
        prompt: str | Sequence[MessageLike],
        *,
        task: Mapping[str, Any] | None = None,
        keep_events: bool = False,
        sampling: SamplingParams | None = None,
    ) -> RunResult:
        """Run one episode to the end and return its final answer, trajectory and usage."""
        session = self.new_session()
        async with self._slot():
            drive = self._drive(session, prompt, task, sampling or self.sampling, steps=keep_events)
            events = [event async for event in drive]
        final = events[-1] if events else None
        if not isinstance(final, FinalEvent):
            raise RuntimeError("internal error: an episode stream ended without a FinalEvent")
        return RunResult.of(session, events if keep_events else [], policy_version=self.engine.policy_version)

    async def run_many(
        self, prompts: Sequence[str | Sequence[MessageLike]], *, tasks: Sequence[Mapping[str, Any]] | None = None
    ) -> list[RunResult]:
        """Run many episodes concurrently; results come back in input order, one per prompt, always: an episode
        that fails (its engine, tools, rewards, even a prompt that cannot be rendered) is a result with its
        error recorded, never an exception that cancels its siblings."""
        if tasks is not None and len(tasks) != len(prompts):
            raise ValueError(f"got {len(tasks)} tasks for {len(prompts)} prompts")
        async with asyncio.TaskGroup() as group:
            jobs = [
                group.create_task(self._run_kept(prompt, task=tasks[i] if tasks is not None else None))
                for i, prompt in enumerate(prompts)
            ]
        return [job.result() for job in jobs]

    async def _run_kept(self, prompt: str | Sequence[MessageLike], *, task: Mapping[str, Any] | None) -> RunResult:
        """`run`, with the one error `run` lets through (a prompt the session cannot start) recorded too."""
        with boundary() as failed:
            return await self.run(prompt, task=task)
        session = self.new_session()
        session.task = dict(task or {})
        await session.fail("invalid_prompt", failed.message)
        logger.warning("episode_not_started", error_type=type(failed.exception).__name__, error=failed.message)
        return RunResult.of(session, policy_version=self.engine.policy_version)


def _step_events(session: AgentSession, outcome: StepOutcome, generation: Generation) -> list[Event]:
    """What one step did, as the events `stream` yields."""
    if outcome.error is not None:  # the step failed and ended the episode (recorded by the session)
        return [ErrorEvent(code=outcome.error.code, message=outcome.error.message)]
    if outcome.compaction is not None:
        return [_new_segment(session, outcome, summary=outcome.compaction)]
    action = outcome.action
    events: list[Event] = [
        AssistantEvent(
            turn=outcome.turn,
            content=action.content,
            reasoning_content=action.reasoning_content,
            tokens=len(generation.ids),
            finish_reason=generation.finish_reason,
        )
    ]
    events.extend(ToolCallEvent(turn=outcome.turn, call=call) for call in action.tool_calls)
    events.extend(
        ToolResultEvent(
            turn=outcome.turn,
            tool_call_id=observation.tool_call_id,
            name=observation.name,
            content=observation.content,
            ok=observation.ok,
            code=observation.code,
        )
        for observation in outcome.observations
    )
    if outcome.new_segment:  # the context policy rewrote the context at this feedback: a segment with no summary
        events.append(_new_segment(session, outcome, summary=""))
    return events


def _new_segment(session: AgentSession, outcome: StepOutcome, *, summary: str) -> CompactionEvent:
    """The event of the segment `outcome` opened (its prompt is the step's feedback ids)."""
    segment = len(session.conversation.segments) - 1 if session.conversation else 0
    return CompactionEvent(segment=segment, summary=summary, prompt_tokens=len(outcome.feedback_ids))
