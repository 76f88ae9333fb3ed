"""Agent mode: a chat completion without `tools` runs a whole episode server-side, the recipe's tools included, and
answers with the final assistant message.

    complete_agent(backend, request, messages)   -> ChatCompletion (with usage and an `agent` summary)
    stream_agent(backend, request, messages)     -> SSE frames: a role chunk; one chunk per runtime event, its
                                                    `agent_event` field holding `event_to_dict(event)` and no
                                                    choices; then the answer as a content delta, the finish
                                                    chunk, a usage chunk (`stream_options.include_usage`), [DONE]

Only the final answer is assistant content; the turns before it (tool calls, their results, compactions) are
reported as agent events, so a plain OpenAI client sees one answer and a client that knows the extension can
show the episode live. A tool result whose observation holds images (a crop, a rendered chart) carries them in
the event's `images`, as OpenAI ``image_url`` parts holding data URLs (`images.client_image_parts`).

An engine failure, an engine timeout, a broken environment or any component that raises (a parser, a tokenizer,
a plug-in calling `sys.exit`) ends that request only, with a 500 whose code says which (or an error frame
mid-stream); the episode is recorded in the trajectory log either way, its error included, and a client that
goes away (mid-stream, or before a plain answer is ready) leaves a record marked ``client_disconnected``. This
module knows the runtime and the wire format; routing, auth and the overload gate are the app's.

What runs is the served episode (`ServedEpisode`), opened by the backend's `EpisodeSource`: by default the
recipe's own session on the runtime (`SessionEpisodes`); a recipe whose agent is a program (`Recipe.agent`) is
served by `agent_runtime.proxy.ProgramEpisodes` instead (given to `create_app(episodes=...)`: the proxy sits above
this package), whose episode runs the program once and reports its turns as the same events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import structlog

from agent_protocol import Message, MessageError
from agent_runtime.boundary import boundary
from agent_runtime.events import (
    CompactionEvent,
    ErrorEvent,
    Event,
    FinalEvent,
    ToolCallEvent,
    ToolResultEvent,
    event_to_dict,
)
from agent_runtime.runtime import AgentRuntime
from agent_runtime.serving.api_error import ApiError, from_message_error
from agent_runtime.serving.backend import ServingBackend, new_completion_id
from agent_runtime.serving.images import client_image_parts
from agent_runtime.serving.openai_wire import (
    AgentSummary,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    CompletionUsage,
    Delta,
    ErrorBody,
    FinishReason,
    ResponseMessage,
)
from agent_runtime.serving.sse import SSE_DONE, sse_data
from agent_runtime.session import AgentSession
from agent_runtime.trajectory import Usage

__all__ = ["EpisodeSource", "ServedEpisode", "SessionEpisodes", "complete_agent", "stream_agent"]

logger = structlog.get_logger(__name__)

_FAILED_STOPS = {
    "engine_error", "engine_timeout", "engine_bad_output",  # the engine failed, ran out of time, answered garbage
    "environment_error", "decode_error", "parse_error", "render_error", "reward_error",  # a component raised in a step
    "internal_error",  # anything else that escaped the episode
}  # fmt: skip


class ServedEpisode(Protocol):
    """One agent-mode request's episode, as the request drives it: its events (never raising: a failure is kept
    for `failure()`), then its failure or its answer and summary; `finish` records it, whatever happened.
    `events(steps=False)`: a plain answer reads none of the step events, and an episode may leave them unbuilt
    (yielding only what ends it); the answer, the summary and the counters are the same either way."""

    @property
    def episode_id(self) -> str: ...

    def events(self, *, steps: bool = True) -> AsyncGenerator[Event]: ...

    async def event_dict(self, event: Event) -> dict[str, Any]: ...

    def failure(self) -> ApiError | None: ...

    def answer(self) -> tuple[ResponseMessage, FinishReason, CompletionUsage]: ...

    def summary(self) -> AgentSummary: ...

    def finish(self, *, disconnected: bool = False) -> None: ...


class EpisodeSource(Protocol):
    """What opens the served episodes of one app: `kind` names the agent for ``/health`` (``"session"``,
    ``"program"``); `aclose` runs when the app shuts down."""

    kind: str

    def open(
        self, backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message]
    ) -> ServedEpisode: ...

    async def aclose(self) -> None: ...


class SessionEpisodes:
    """The default source: each request runs the recipe's own session on the runtime."""

    kind = "session"

    def open(
        self, backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message]
    ) -> ServedEpisode:
        return _Episode(backend, request, messages)

    async def aclose(self) -> None:
        return None


_SESSIONS: Final = SessionEpisodes()


def _open(backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message]) -> ServedEpisode:
    return (backend.episodes or _SESSIONS).open(backend, request, messages)


@dataclass
class _Episode:
    """One agent-mode request's episode and what its events said."""

    backend: ServingBackend
    request: ChatCompletionRequest
    messages: Sequence[Message]
    runtime: AgentRuntime = field(init=False)
    session: AgentSession = field(init=False)
    final: FinalEvent | None = None
    error: ErrorEvent | None = None
    raised: ApiError | None = None  # what an exception out of the episode became (streaming only)
    tool_results: dict[int, int] = field(default_factory=dict)  # tool results streamed so far, per turn

    def __post_init__(self) -> None:
        self.runtime = AgentRuntime(
            self.backend.engine,
            self.backend.session,
            sampling=self.backend.sampling_for(self.request),
            engine_timeout_s=self.backend.config.engine_timeout_s,
            log_episodes=bool(self.request.stream),  # a plain answer's request_served line carries the episode
        )
        self.session = self.runtime.new_session()

    @property
    def episode_id(self) -> str:
        return self.session.episode_id

    async def events(self, *, steps: bool = True) -> AsyncGenerator[Event]:
        """The runtime's events. `steps=False` (a plain answer) builds none for the steps, and the tool calls and
        compactions are counted at the end (those of a step that failed included, which the streamed events leave
        out). Either way the answer is read from the session's record of its last turn (`answer`)."""
        metrics = self.backend.metrics
        stream = self.runtime.stream(list(self.messages), session=self.session, steps=steps)
        try:
            with boundary() as escaped:  # whatever escaped the runtime's own boundary ends this request only
                async for event in stream:
                    if isinstance(event, ToolCallEvent):
                        metrics.tool_calls += 1
                    elif isinstance(event, CompactionEvent):
                        metrics.compactions += 1
                    elif isinstance(event, ErrorEvent):
                        self.error = event
                    elif isinstance(event, FinalEvent):
                        self.final = event
                    yield event
            raised = escaped.exception
            if isinstance(raised, MessageError):  # a conversation the chat format cannot render: the caller's to fix
                self.raised = from_message_error(raised)
            elif raised is not None:
                why = f"{escaped.code.replace('_', ' ')}: {escaped.message}"
                logger.error("request_failed", mode="agent", code=escaped.code, error_type=type(raised).__name__,
                             error=why, exc_info=raised)  # fmt: skip
                self.session.record_error(escaped.code, why)
                self.raised = ApiError(500, why, type="server_error", code=escaped.code)
        finally:
            if isinstance(stream, AsyncGenerator):  # close it now, not whenever it is collected
                await stream.aclose()
            if not steps:  # also for an episode that failed or whose client left
                metrics.tool_calls += self.session.tool_calls
                metrics.compactions += self.session.context_state.compactions

    async def event_dict(self, event: Event) -> dict[str, Any]:
        """The event as the stream sends it; a tool result whose observation holds images gets them as
        ``image_url`` parts (`images`)."""
        data = event_to_dict(event)
        if isinstance(event, ToolResultEvent):
            images = self._observation_images(event)
            if images:
                data["images"] = await asyncio.to_thread(client_image_parts, images)
        return data

    def _observation_images(self, event: ToolResultEvent) -> tuple[str, ...]:
        """The images of the observation `event` reports: the events of a turn's tool results follow its step's
        observations in order."""
        position = self.tool_results.get(event.turn, 0)
        self.tool_results[event.turn] = position + 1
        step = next((s for s in reversed(self.session.steps) if s.index == event.turn - 1), None)
        if step is None or position >= len(step.observations):
            return ()
        return step.observations[position].images

    def failure(self) -> ApiError | None:
        """The error that ends this request, if the episode failed."""
        final = self.final
        if self.raised is not None:
            return self.raised
        if self.error is not None:
            return ApiError(500, self.error.message, type="server_error", code=self.error.code)
        if final is None:
            return ApiError(500, "the episode ended without a result", type="server_error", code="internal_error")
        if final.stop_reason in _FAILED_STOPS:
            errors = [e.message for e in self.session.errors if e.code == final.stop_reason]
            message = errors[-1] if errors else final.stop_reason
            return ApiError(500, f"{final.stop_reason}: {message}", type="server_error", code=final.stop_reason)
        if final.stop_reason == "context_exhausted" and final.usage.generations == 0:
            reason = next((e.message for e in self.session.errors if e.code == "context_exhausted"), "")
            return ApiError(400, f"the conversation does not fit the model's context: {reason}",
                            param="messages", code="context_length_exceeded")  # fmt: skip
        return None

    def answer(self) -> tuple[ResponseMessage, FinishReason, CompletionUsage]:
        """The final message, the finish reason and the usage (call after `failure()` said None)."""
        final = self.final
        if final is None:
            raise RuntimeError("internal error: answer() before the episode's final event")
        content, reasoning, finish_reason = self._last_turn()
        if final.answer is not None:
            content = final.answer
        cut = finish_reason == "length"  # the final turn ran out of tokens
        finish: FinishReason = "stop" if final.stop_reason in ("final_answer", None) and not cut else "length"
        return ResponseMessage(content=content, reasoning_content=reasoning), finish, _usage(final.usage)

    def _last_turn(self) -> tuple[str, str | None, str | None]:
        """The last turn's content, reasoning and finish reason, from the session's record of it: the turn the
        last streamed `AssistantEvent` described (summary turns are not steps, and a step whose event was not
        built ended the episode in a failure, which is answered without this)."""
        steps, conversation = self.session.steps, self.session.conversation
        if not steps or conversation is None:
            return "", None, None
        action = steps[-1].action
        return action.content, action.reasoning_content, conversation.turn_finish_reason

    def summary(self) -> AgentSummary:
        s = self.session
        return AgentSummary(
            episode_id=s.episode_id,
            stop_reason=s.stop_reason,
            turns=s.conversation.turns if s.conversation is not None else 0,
            tool_calls=s.tool_calls,
            compactions=s.context_state.compactions,
            reward=s.reward,
        )

    def finish(self, *, disconnected: bool = False) -> None:
        """Record the episode in the trajectory log (always, when there is one) and count it. Without a log no
        record is built (apps/serve's default; building it was about 4% of a request's server CPU)."""
        session, backend = self.session, self.backend
        if disconnected and not session.done:
            session.record_error("client_disconnected", "the client went away")
        backend.metrics.episodes += 1
        backend.metrics.generated_tokens += session.usage().completion_tokens
        if backend.writer is not None:
            backend.record(session.record(policy_version=backend.engine.policy_version))


def _usage(usage: Usage) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
    )


async def complete_agent(
    backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message]
) -> ChatCompletion:
    """Run the episode to its end and answer with the final assistant message."""
    episode = _open(backend, request, messages)
    cancelled = False
    try:
        async with contextlib.aclosing(episode.events(steps=False)) as events:  # the answer needs no step events
            async for _ in events:
                pass
    except asyncio.CancelledError:  # the client hung up (`disconnect.py`): recorded as such
        cancelled = True
        raise
    finally:
        episode.finish(disconnected=cancelled)
    failure = episode.failure()
    if failure is not None:  # logged here: the runtime does not log a plain request's episode (`_Episode`)
        logger.warning("request_failed", mode="agent", stream=False, episode_id=episode.episode_id,
                       code=failure.code, error=failure.message)  # fmt: skip
        raise failure
    message, finish, usage = episode.answer()
    return ChatCompletion(
        id=new_completion_id(),
        created=int(time.time()),
        model=request.model,
        choices=[Choice(index=0, message=message, finish_reason=finish)],
        usage=usage,
        agent=episode.summary(),
    )


def stream_agent(
    backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message]
) -> AsyncGenerator[bytes]:
    """The episode as SSE frames, each runtime event as it happens (see the module docstring). The episode's
    session is made here, before the stream starts, so a failure to make it is an HTTP error, not a frame."""
    return _stream(backend, request, _open(backend, request, messages))


async def _stream(
    backend: ServingBackend, request: ChatCompletionRequest, episode: ServedEpisode
) -> AsyncGenerator[bytes]:
    log = logger.bind(mode="agent", stream=True)
    chunk_id, created, model = new_completion_id(), int(time.time()), request.model

    def chunk(
        choices: list[ChunkChoice], *, usage: CompletionUsage | None = None, agent_event: dict[str, Any] | None = None
    ) -> bytes:
        return sse_data(
            ChatCompletionChunk(
                id=chunk_id, created=created, model=model, choices=choices, usage=usage, agent_event=agent_event
            )
        )

    finished = False
    try:
        yield chunk([ChunkChoice(index=0, delta=Delta(role="assistant", content=""))])
        async with contextlib.aclosing(episode.events()) as events:  # closed here, also when the client left
            async for event in events:  # never raises: a failure is kept for `episode.failure()`
                yield chunk([], agent_event=await episode.event_dict(event))
        finished = True
        failure = episode.failure()
        if failure is not None:
            if failure.status >= 500:
                backend.metrics.server_errors += 1
            else:
                backend.metrics.client_errors += 1
            log.warning("request_failed", episode_id=episode.episode_id, code=failure.code, error=failure.message)
            yield sse_data(ErrorBody(error=failure.detail()))
            yield SSE_DONE
            return
        message, finish, usage = episode.answer()
        delta = Delta(content=message.content, reasoning_content=message.reasoning_content)
        yield chunk([ChunkChoice(index=0, delta=delta)])
        yield chunk([ChunkChoice(index=0, delta=Delta(), finish_reason=finish)])
        if request.stream_options is not None and request.stream_options.include_usage:
            yield chunk([], usage=usage)
        yield SSE_DONE
        backend.metrics.completed += 1
    finally:
        episode.finish(disconnected=not finished)
