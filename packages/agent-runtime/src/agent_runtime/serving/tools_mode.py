"""Tools mode: a chat completion that carries `tools` is one model turn. The server is the model endpoint; it
answers with `tool_calls` (finish_reason ``"tool_calls"``) for the client to run, or with text.

Token-in-token-out across the client's requests: each turn's transcript is stored (`TranscriptStore`) under the
conversation as the client will echo it back. A follow-up that extends a stored conversation continues its token
ids: only the new messages (tool results, a user message) are rendered as feedback and tokenized, alone, so the
model sees exactly the ids it sampled. Otherwise the conversation is rendered from scratch. Both are counted
(`transcript_prefix_hits`, `transcript_rerenders`, `transcript_new` in `/metrics`).

Only well-formed calls are returned as `tool_calls`; a call the model botched is recorded on the trajectory (one
record per request, holding the whole conversation's transcript so far). Whatever the engine, the tokenizer or
the protocol raises fails that request only: a 500 (or an error frame mid-stream) whose code says which
(``engine_error``, ``engine_timeout``, ``decode_error``, ``parse_error``, ``render_error``), recorded when the
request got as far as the engine. This module knows the protocol, the
engine and the wire format; routing, auth and the overload gate are the app's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import structlog

from agent_protocol import Action, Message, MessageError, TokenTranscript, ToolCall, ToolSpec
from agent_runtime.encoding import encode_off_loop
from agent_runtime.engines.base import Generation
from agent_runtime.errors import EngineError
from agent_runtime.serving.api_error import ApiError
from agent_runtime.serving.backend import ServingBackend, new_completion_id
from agent_runtime.serving.openai_wire import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    CompletionUsage,
    Delta,
    ErrorBody,
    FinishReason,
    FunctionCall,
    ResponseMessage,
    ToolCallDelta,
    ToolCallOut,
)
from agent_runtime.serving.sse import SSE_DONE, sse_data
from agent_runtime.serving.transcript_store import StoredConversation, conversation_key
from agent_runtime.trajectory import EpisodeError, Trajectory, Usage

__all__ = ["complete_tools", "stream_tools"]

logger = structlog.get_logger(__name__)

Preparation = Literal["prefix_hit", "rerender", "new"]


@dataclass
class _Turn:
    """One tools-mode request: the prompt transcript it continues or rendered, then what the engine made of it."""

    backend: ServingBackend
    request: ChatCompletionRequest
    messages: list[Message]
    tools: list[ToolSpec]
    conversation_id: str = ""
    transcript: TokenTranscript = field(default_factory=TokenTranscript)
    turns: int = 0
    prepared: Preparation = "new"
    prompt_tokens: int = 0
    generation: Generation | None = None
    action: Action | None = None
    calls: tuple[ToolCall, ...] = ()
    finish: FinishReason = "stop"
    errors: list[EpisodeError] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    generate_s: float = 0.0

    async def prepare(self) -> None:
        """Continue a stored transcript or render the conversation; raises `ApiError` when it cannot fit."""
        backend, messages, metrics = self.backend, self.messages, self.backend.metrics
        tokenizer, protocol = backend.engine.tokenizer, backend.protocol
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
        stored = None
        if last is not None and last + 1 < len(messages):
            stored = backend.store.get(conversation_key(self.tools, messages[: last + 1]))
        if stored is not None and last is not None:
            self.conversation_id, self.transcript, self.turns = stored.conversation_id, stored.transcript, stored.turns
            reused = len(self.transcript)
            with self._contained("render_error", f"the {protocol.name} protocol could not render the follow-up"):
                feedback = protocol.render_feedback(messages[last + 1 :], turn_closed=stored.turn_closed)
                self.transcript.append_observation(await encode_off_loop(tokenizer, feedback))
            self.prepared = "prefix_hit"
            metrics.transcript_prefix_hits += 1
            metrics.reused_prompt_tokens += reused
            metrics.rendered_prompt_tokens += len(self.transcript) - reused
        else:
            self.conversation_id = uuid.uuid4().hex[:12]
            with self._contained("render_error", f"the {protocol.name} protocol could not render the conversation"):
                prompt = protocol.render_prompt(messages, tools=self.tools)
                self.transcript.append_prompt(await encode_off_loop(tokenizer, prompt))
            self.turns = sum(1 for m in messages if m.role == "assistant")
            self.prepared = "rerender" if last is not None else "new"
            if last is not None:
                metrics.transcript_rerenders += 1
            else:
                metrics.transcript_new += 1
            metrics.rendered_prompt_tokens += len(self.transcript)
        self.prompt_tokens = len(self.transcript)
        limit = backend.context_limit
        if self.prompt_tokens + 1 > limit:
            raise ApiError(
                400,
                f"the conversation has {self.prompt_tokens} tokens; the model's context holds {limit}",
                param="messages",
                code="context_length_exceeded",
            )

    async def generate(self) -> None:
        """One engine call, parsed; stores the continued transcript. Raises `ApiError` when the engine fails."""
        backend = self.backend
        engine, protocol, tokenizer = backend.engine, backend.protocol, backend.engine.tokenizer
        sampling = backend.sampling_for(self.request)
        room = backend.context_limit - self.prompt_tokens
        budget = min(sampling.max_new_tokens, backend.recipe.max_new_tokens, room)
        sampling = msgspec.structs.replace(sampling, max_new_tokens=budget)
        timeout = backend.config.engine_timeout_s
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                generation = await engine.generate(list(self.transcript.ids), sampling)
        except TimeoutError as e:
            message = f"{engine.name} did not answer within {timeout} s"
            self.errors.append(EpisodeError(code="engine_timeout", message=message, turn=self.turns + 1))
            raise ApiError(500, message, type="server_error", code="engine_timeout") from e
        except (Exception, SystemExit) as e:  # any engine failure fails this request only
            code = getattr(e, "code", None) if isinstance(e, EngineError) else None
            code = code if isinstance(code, str) else "engine_error"  # EngineError subclasses say which
            message = f"{engine.name} failed: {type(e).__name__}: {e}"
            self.errors.append(EpisodeError(code=code, message=message, turn=self.turns + 1))
            raise ApiError(500, message, type="server_error", code=code) from e
        finally:
            self.generate_s = time.perf_counter() - t0
        self.generation = generation
        self.turns += 1
        self.transcript.append_action(generation.ids, generation.logprobs)
        end = tokenizer.token_to_id(protocol.end_of_turn)
        closed = bool(generation.ids) and generation.ids[-1] == end
        prefix = f"call_{uuid.uuid4().hex[:8]}"
        with self._contained("decode_error", f"{engine.name}'s tokenizer could not decode the generated ids"):
            text = tokenizer.decode(generation.ids)
        with self._contained("parse_error", f"the {protocol.name} protocol could not read the model's turn"):
            action = protocol.parse_assistant_text(text, call_id_prefix=prefix)
        self.action = action
        self.errors.extend(EpisodeError(code=i.code, message=i.message, turn=self.turns) for i in action.issues)
        self.calls = action.valid_tool_calls
        if self.calls:
            self.finish = "tool_calls"
        elif generation.finish_reason == "length" and not closed:
            self.finish = "length"
        backend.metrics.generated_tokens += len(generation.ids)
        key = conversation_key(self.tools, [*self.messages, self.echo()])
        backend.store.put(key, StoredConversation(self.conversation_id, self.transcript, closed, self.turns))

    @contextlib.contextmanager
    def _contained(self, code: str, what: str) -> Iterator[None]:
        """The boundary around foreign code (a tokenizer, a protocol plug-in): whatever it raises, `SystemExit`
        included, fails this request only, as a 500 with `code`, recorded on its trajectory."""
        try:
            yield
        except (ApiError, MessageError):
            raise
        except (Exception, SystemExit) as e:
            message = f"{what}: {type(e).__name__}: {str(e)[:500]}"
            logger.error("component_failed", mode="tools", code=code, error_type=type(e).__name__, error=message,
                         exc_info=True)  # fmt: skip
            self.errors.append(EpisodeError(code=code, message=message, turn=self.turns))
            raise ApiError(500, message, type="server_error", code=code) from e

    def echo(self) -> Message:
        """The assistant message as the client gets it, and so as it will send it back."""
        content = self.action.content if self.action is not None else ""
        return Message(role="assistant", content=content, tool_calls=self.calls)

    def response_message(self) -> ResponseMessage:
        action = self.action or Action()
        content: str | None = action.content
        if self.calls and not content:
            content = None
        calls = [
            ToolCallOut(
                id=c.id, function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False))
            )
            for c in self.calls
        ]
        return ResponseMessage(content=content, reasoning_content=action.reasoning_content, tool_calls=calls or None)

    def usage(self) -> CompletionUsage:
        completion = len(self.generation.ids) if self.generation is not None else 0
        return CompletionUsage(
            prompt_tokens=self.prompt_tokens, completion_tokens=completion, total_tokens=self.prompt_tokens + completion
        )

    def record(self) -> None:
        """Log this request's trajectory: the whole conversation so far, its transcript, what this turn did."""
        messages = list(self.messages)
        if self.action is not None:
            messages.append(self.action.to_message())
        t = self.transcript
        completion = sum(t.loss_mask)
        self.backend.record(
            Trajectory(
                episode_id=self.conversation_id,
                protocol=self.backend.protocol.name,
                messages=messages,
                segments=[t.record()] if len(t) else [],
                final_answer=self.action.content if self.action is not None and not self.calls else None,
                stop_reason=self.finish if self.action is not None else (self.errors[-1].code if self.errors else None),
                turns=self.turns,
                tool_calls=len(self.calls),
                errors=list(self.errors),
                usage=Usage(prompt_tokens=len(t) - completion, completion_tokens=completion, generations=self.turns),
                timings={"generate_s": self.generate_s, "total_s": time.perf_counter() - self.started},
                task={"mode": "tools", "prepared": self.prepared},
            )
        )


async def _new_turn(
    backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> _Turn:
    turn = _Turn(backend, request, list(messages), list(tools))
    await turn.prepare()
    return turn


async def complete_tools(
    backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> ChatCompletion:
    """One model turn: text, or tool calls for the client to run."""
    turn = await _new_turn(backend, request, messages, tools)
    try:
        await turn.generate()
    finally:
        turn.record()
    return ChatCompletion(
        id=new_completion_id(),
        created=int(time.time()),
        model=request.model,
        choices=[Choice(index=0, message=turn.response_message(), finish_reason=turn.finish)],
        usage=turn.usage(),
    )


async def stream_tools(
    backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> AsyncGenerator[bytes]:
    """The turn as SSE frames. The prompt is prepared here, before the stream starts, so a conversation that does
    not fit is a 400, not an error frame."""
    return _stream(backend, request, await _new_turn(backend, request, messages, tools))


async def _stream(backend: ServingBackend, request: ChatCompletionRequest, turn: _Turn) -> AsyncGenerator[bytes]:
    chunk_id, created, model = new_completion_id(), int(time.time()), request.model

    def chunk(choices: list[ChunkChoice], *, usage: CompletionUsage | None = None) -> bytes:
        return sse_data(ChatCompletionChunk(id=chunk_id, created=created, model=model, choices=choices, usage=usage))

    try:
        yield chunk([ChunkChoice(index=0, delta=Delta(role="assistant", content=""))])
        try:
            await turn.generate()
        except ApiError as e:
            backend.metrics.server_errors += 1
            logger.warning("request_failed", mode="tools", code=e.code, error=e.message)
            yield sse_data(ErrorBody(error=e.detail()))
            yield SSE_DONE
            return
        message = turn.response_message()
        if message.content or message.reasoning_content:
            yield chunk(
                [
                    ChunkChoice(
                        index=0, delta=Delta(content=message.content, reasoning_content=message.reasoning_content)
                    )
                ]
            )
        if message.tool_calls:
            deltas = [ToolCallDelta(index=i, id=c.id, function=c.function) for i, c in enumerate(message.tool_calls)]
            yield chunk([ChunkChoice(index=0, delta=Delta(tool_calls=deltas))])
        yield chunk([ChunkChoice(index=0, delta=Delta(), finish_reason=turn.finish)])
        if request.stream_options is not None and request.stream_options.include_usage:
            yield chunk([], usage=turn.usage())
        yield SSE_DONE
        backend.metrics.completed += 1
    finally:
        turn.record()
