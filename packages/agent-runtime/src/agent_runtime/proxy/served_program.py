"""`ProgramEpisodes`: agent mode for a recipe whose agent is a program (`Recipe.agent`): a chat completion without
`tools` runs the program once, as a rollout runs it, and is answered with what the program returned.

    app = create_app(engine, recipe, config, episodes=ProgramEpisodes())    # apps/serve, for such a recipe

The request's messages are the program's task (``ProgramTask(prompt=<the messages as OpenAI dicts>, row={})``);
its model calls go to an endpoint of its own on the server's engine (`run_program`: the request's sampling, the
server's engine timeout, the program's budgets), a command program's through the app's one listening gateway
(`WorkerGateway`: started by the first command-program request, stopped when the app shuts down).

Events, live: each model call of the program is reported as soon as it is answered (the endpoint's record, through
`run_program(on_record=...)`): the tool messages the program sent back since its previous turn as ``tool_result``
events of that turn, then the new assistant message as ``assistant`` and one ``tool_call`` per call, turns counted
from 1 over the episode as agent mode counts them; then ``final`` (the answer, stop reason, reward and usage of
the episode's trajectory). A program that fails (`ProgramOutcome.code`: any code but ``no_model_calls`` with an
answer) ends the request with a 500 of that code (an ``error`` event, then the error frame, mid-stream). A client
that goes away cancels the program (a command program's process group is killed); a finished episode's
trajectory goes to the server's trajectory log (a cancelled one has none: `run_program` returns nothing then).

This module knows the proxy and agent mode's `ServedEpisode`; routing and the wire format are the app's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Final

import structlog

from agent_protocol import Message
from agent_runtime.agent_program import PROGRAM_CODES, ProgramCommand, ProgramTask
from agent_runtime.boundary import boundary
from agent_runtime.events import (
    AssistantEvent,
    ErrorEvent,
    Event,
    FinalEvent,
    ToolCallEvent,
    ToolResultEvent,
    event_to_dict,
)
from agent_runtime.proxy.episode import ProgramEpisode, run_program
from agent_runtime.proxy.request_log import generated
from agent_runtime.proxy.worker_gateway import WorkerGateway
from agent_runtime.recipe import RecipeError
from agent_runtime.serving.api_error import ApiError
from agent_runtime.serving.backend import ServingBackend
from agent_runtime.serving.openai_wire import (
    AgentSummary,
    ChatCompletionRequest,
    CompletionUsage,
    FinishReason,
    ResponseMessage,
)
from agent_runtime.trajectory import Trajectory

__all__ = ["ProgramEpisodes", "ServedProgram"]

logger = structlog.get_logger(__name__)

_FAILED: Final = frozenset(code for code in PROGRAM_CODES if code != "no_model_calls")


class ProgramEpisodes:
    """The agent-mode episodes of a program recipe (an `EpisodeSource` of `agent_runtime.serving.agent_mode`), and
    the app's gateway for command programs (`gateways`: the address from ``AGENT_GATEWAY_*``, as a worker's)."""

    kind = "program"

    def __init__(self, gateways: WorkerGateway | None = None) -> None:
        self.gateways = gateways or WorkerGateway()

    def open(
        self, backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message]
    ) -> ServedProgram:
        if backend.recipe.agent is None:
            raise RecipeError(f"recipe {backend.recipe.name!r} names no agent program (Recipe.agent) to serve")
        return ServedProgram(self, backend, request, messages)

    async def aclose(self) -> None:
        """Stop the gateway, if a command program started it."""
        await self.gateways.aclose()


class ServedProgram:
    """One request's run of the program (agent mode's `ServedEpisode`; see the module docstring)."""

    def __init__(
        self,
        source: ProgramEpisodes,
        backend: ServingBackend,
        request: ChatCompletionRequest,
        messages: Sequence[Message],
    ) -> None:
        self.source = source
        self.backend = backend
        self.request = request
        self.task = ProgramTask(prompt=[message.to_openai() for message in messages], row={})
        self.episode: ProgramEpisode | None = None
        self.raised: ApiError | None = None  # what an exception out of the run became
        self.turns = 0  # the program's generated turns reported so far
        self.last: Message | None = None  # the last generated assistant message
        self._called: dict[str, str] = {}  # the last turn's calls: id -> tool name (for results that omit it)
        self._run: asyncio.Future[ProgramEpisode] | None = None

    @property
    def episode_id(self) -> str:
        return self.episode.trajectory.episode_id if self.episode is not None else ""

    async def events(self, *, steps: bool = True) -> AsyncGenerator[Event]:
        """The program's turns as events, reported from its records as they come; `steps` is not read (the
        records are built either way, and the answer is read from their events)."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue()

        def on_record(record: Trajectory) -> None:
            for event in self._turn_events(record):
                queue.put_nowait(event)

        program = self.backend.recipe.agent
        assert program is not None  # checked by ProgramEpisodes.open
        try:
            with boundary() as escaped:  # whatever escapes run_program (it records a program's own failures)
                gateway = await self.source.gateways.get() if isinstance(program.agent, ProgramCommand) else None
                backend = self.backend
                running = run_program(
                    backend.recipe, backend.engine, self.task, sampling=backend.sampling_for(self.request),
                    engine_timeout_s=backend.config.engine_timeout_s, gateway=gateway, on_record=on_record,
                )  # fmt: skip
                self._run = run = asyncio.ensure_future(running)
                run.add_done_callback(lambda _: queue.put_nowait(None))  # after every record's events
                while (event := await queue.get()) is not None:
                    yield event
                self.episode = run.result()
                failed = self.failure()
                if failed is not None:
                    yield ErrorEvent(code=str(failed.code), message=failed.message)
                yield self._final_event()
            if escaped.exception is not None:
                why = f"{escaped.code.replace('_', ' ')}: {escaped.message}"
                error_type = type(escaped.exception).__name__
                logger.error("request_failed", mode="agent", agent="program", code=escaped.code,
                             error_type=error_type, error=why, exc_info=escaped.exception)  # fmt: skip
                self.raised = ApiError(500, why, type="server_error", code=escaped.code)
        finally:
            await self._cancel()

    async def _cancel(self) -> None:
        """Cancel a program still running (the client left) and wait for it to stop (its processes killed)."""
        run = self._run
        if run is not None and not run.done():
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait((run,))

    def _turn_events(self, record: Trajectory) -> list[Event]:
        """The events of one answered model call (see the module docstring); none for a call that failed."""
        if not generated(record):
            return []
        *prompt, message = record.messages
        events: list[Event] = []
        if self.turns:  # the results of the previous turn's calls, as the program sent them back
            last_assistant = max((i for i, m in enumerate(prompt) if m.role == "assistant"), default=len(prompt))
            for m in prompt[last_assistant + 1 :]:
                if m.role == "tool":
                    name = m.name or self._called.get(m.tool_call_id or "", "")
                    events.append(
                        ToolResultEvent(
                            turn=self.turns, tool_call_id=m.tool_call_id, name=name, content=m.content or ""
                        )
                    )
        self.turns += 1
        ranges = record.segments[-1].action_ranges if record.segments else []
        tokens = ranges[-1][1] - ranges[-1][0] if ranges else 0
        finish = "length" if record.stop_reason == "length" else "stop"
        assistant = AssistantEvent(
            turn=self.turns, content=message.content or "", reasoning_content=message.reasoning_content,
            tokens=tokens, finish_reason=finish,
        )  # fmt: skip
        events.append(assistant)
        events += [ToolCallEvent(turn=self.turns, call=call) for call in message.tool_calls]
        self.backend.metrics.tool_calls += len(message.tool_calls)
        self._called = {call.id: call.name for call in message.tool_calls}
        self.last = message
        return events

    def _final_event(self) -> FinalEvent:
        assert self.episode is not None
        trajectory = self.episode.trajectory
        return FinalEvent(
            answer=trajectory.final_answer, stop_reason=trajectory.stop_reason, reward=trajectory.reward,
            usage=trajectory.usage,
        )  # fmt: skip

    async def event_dict(self, event: Event) -> dict[str, Any]:
        return event_to_dict(event)

    def failure(self) -> ApiError | None:
        """The error that ends this request, if the run failed (see the module docstring)."""
        if self.raised is not None:
            return self.raised
        if self.episode is None:
            return ApiError(500, "the program's episode ended without a result", type="server_error",
                            code="internal_error")  # fmt: skip
        code, message = self.episode.outcome.code, self.episode.outcome.message
        if code in _FAILED or (code == "no_model_calls" and self.episode.trajectory.final_answer is None):
            return ApiError(500, f"{code}: {message}", type="server_error", code=code)
        return None

    def answer(self) -> tuple[ResponseMessage, FinishReason, CompletionUsage]:
        """The program's answer (else the model's last message), the finish reason and the usage (call after
        `failure()` said None)."""
        if self.episode is None:
            raise RuntimeError("internal error: answer() before the program's episode ended")
        trajectory, last = self.episode.trajectory, self.last
        content = trajectory.final_answer
        if content is None:
            content = (last.content or "") if last is not None else ""
        reasoning = last.reasoning_content if last is not None else None
        finish: FinishReason = "length" if self.episode.truncated else "stop"
        usage = trajectory.usage
        tokens = CompletionUsage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )
        return ResponseMessage(content=content, reasoning_content=reasoning), finish, tokens

    def summary(self) -> AgentSummary:
        if self.episode is None:
            raise RuntimeError("internal error: summary() before the program's episode ended")
        trajectory = self.episode.trajectory
        return AgentSummary(
            episode_id=trajectory.episode_id, stop_reason=trajectory.stop_reason, turns=trajectory.turns,
            tool_calls=trajectory.tool_calls, compactions=0, reward=trajectory.reward,
        )  # fmt: skip

    def finish(self, *, disconnected: bool = False) -> None:
        """Record the episode (when it finished) and count it; a program still running is cancelled."""
        run = self._run
        if run is not None and not run.done():
            run.cancel()  # its own cleanup (a command's process group killed) runs on the loop
        metrics = self.backend.metrics
        metrics.episodes += 1
        if self.episode is None:
            logger.info("agent_program_cancelled", disconnected=disconnected, turns=self.turns)
            return
        metrics.generated_tokens += self.episode.outcome.generated_tokens
        self.backend.record(self.episode.trajectory)
