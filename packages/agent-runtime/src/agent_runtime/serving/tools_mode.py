"""Tools mode: a chat completion that carries `tools` is one model turn. The server is the model endpoint; it
answers with `tool_calls` (finish_reason ``"tool_calls"``) for the client to run, or with text.

Token-in-token-out across the client's requests: each turn's transcript is stored (`TranscriptStore`) under the
conversation as the client will echo it back. A follow-up that extends a stored conversation continues its token
ids: only the new messages (tool results, a user message) are rendered as feedback and tokenized, alone, so the
model sees exactly the ids it sampled. A follow-up that rewrote only the last assistant turn of a stored
conversation (its messages before that turn are the turn's prompt: `TurnIndex`) rolls the stored ids back to the
turn's start, appends the rewritten turn as the template renders it, tokenized alone and not trained, and continues
from there (``rollback``). Otherwise the conversation is rendered from scratch. All are counted
(`transcript_prefix_hits`, `transcript_rollbacks`, `transcript_rerenders`, `transcript_new` in `/metrics`); a
prefix hit whose client sent a stored turn back without its reasoning (or with other reasoning) says so in its
record (``reasoning_stripped``), since the key leaves reasoning out.

The client owns the conversation, so the recipe's context policy (`Recipe.context`) is asked where a follow-up
grows the context: `Continue` appends the client's new messages, `NewSegment` renders the server's context anew
from the messages the policy returned (the client keeps sending its whole conversation; the record keeps both
segments), `End` is a 400 ``context_length_exceeded``. A `Summarize` is read as `Continue`: the server runs no
turn the client did not ask for, so a compaction policy only compacts in agent mode.

Only well-formed calls are returned as `tool_calls`; a call the model botched is recorded on the trajectory (one
record per request, holding the whole conversation's transcript so far). Whatever the engine, the tokenizer or
the protocol raises fails that request only: a 500 (or an error frame mid-stream) whose code says which
(``engine_error``, ``engine_timeout``, ``decode_error``, ``parse_error``, ``render_error``), recorded when the
request got as far as the engine. This module knows the protocol, the
engine and the wire format; routing, auth and the overload gate are the app's.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, NoReturn

import structlog

from agent_protocol import Action, Message, MessageError, ToolCall, ToolSpec
from agent_runtime.boundary import boundary
from agent_runtime.context_state import ContextState
from agent_runtime.conversation import Conversation
from agent_runtime.engine_call import EngineFailure, call_engine
from agent_runtime.engines.base import Generation
from agent_runtime.outcomes import EndingCode, StopReason, TurnFinish
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
    FunctionCall,
    ResponseMessage,
    ToolCallDelta,
    ToolCallOut,
)
from agent_runtime.serving.sse import SSE_DONE, sse_data
from agent_runtime.serving.transcript_store import StoredConversation, StoreUnavailable, conversation_key, turn_keys
from agent_runtime.trajectory import build_trajectory

__all__ = ["ToolsTurn", "complete_tools", "open_turn", "stream_tools"]

logger = structlog.get_logger(__name__)

Preparation = Literal["prefix_hit", "rollback", "rerender", "new"]
_PASSES: Final = (ApiError, MessageError)  # the caller's to fix (a 400), not a component that failed


@dataclass
class ToolsTurn:
    """One tools-mode request: a turn of the stored `Conversation` it continues, or of one rendered from the
    client's messages, driven through the same core as every agent-mode turn. `open_turn` makes one ready; a wire
    format (chat completions here, `responses_api.py`) `answer`s it, or drives `generate`, `went_away` and
    `record` itself when it streams."""

    backend: ServingBackend
    request: ChatCompletionRequest
    messages: list[Message]
    tools: list[ToolSpec]
    conversation_id: str = ""
    conversation: Conversation = field(init=False)
    stored: StoredConversation | None = None  # what the conversation was restored from (packed again on top of it)
    prepared: Preparation = "new"
    reasoning_stripped: bool = False  # a prefix hit whose messages carry other reasoning than the stored turns'
    prompt_tokens: int = 0
    generation: Generation | None = None
    action: Action | None = None
    calls: tuple[ToolCall, ...] = ()
    finish: TurnFinish = "stop"
    failed: EndingCode | None = None  # the code that failed this request (its record's stop reason)
    started: float = field(default_factory=time.perf_counter)
    generate_s: float = 0.0

    def __post_init__(self) -> None:
        backend = self.backend
        self.conversation = Conversation(  # its errors are this request's: its record holds them
            backend.protocol,
            backend.engine.tokenizer,
            max_new_tokens=backend.recipe.max_new_tokens,
            max_context_tokens=backend.context_limit,
            tools=self.tools,
            max_images=backend.recipe.max_images,
            special_tokens_in_text=backend.recipe.special_tokens_in_text,
        )

    async def prepare(self) -> None:
        """Continue a stored conversation or render this one; raises `ApiError` when it cannot fit."""
        backend, messages, metrics, conversation = self.backend, self.messages, self.backend.metrics, self.conversation
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
        stored, rewritten = None, False
        if last is not None and last + 1 < len(messages):
            try:
                stored = await backend.store.atake(conversation_key(self.tools, messages[: last + 1]))
                if stored is None and (key := backend.turn_index.get(conversation_key(self.tools, messages[:last]))):
                    stored, rewritten = await backend.store.atake(key), True
            except StoreUnavailable as e:  # rendered from scratch below: slower, never a wrong transcript
                logger.warning("transcript_store_unavailable", action="take", error=str(e))
                metrics.transcript_rerenders_store_unavailable += 1
            if rewritten and stored is not None and stored.message_count != last + 1:
                stored = None  # the entry is not the turn's (a context policy rebuilt its messages): rendered anew
        if stored is not None and last is not None:
            self.conversation_id, self.stored = stored.conversation_id, stored
            stored.restore(conversation)
            if rewritten:

                async def roll_back() -> None:
                    if await conversation.rewrite_last_turn(messages[last], messages[:last]) is None:
                        raise ApiError(500, "the stored conversation does not end with a generated turn",
                                   type="server_error", code="render_error")  # fmt: skip

                await self._contained("the rewritten turn", roll_back)
            else:
                self.reasoning_stripped = _reasoning_differs(messages[: last + 1], conversation.messages)
            reused = len(conversation)
            new = messages[last + 1 :]

            async def follow_up() -> None:
                state = ContextState(
                    backend.recipe.context, prompt=_prompt_of(messages), compactions=len(conversation.segments) - 1
                )
                grown = await state.add_feedback(conversation, new, summaries=False)
                if grown.ended is not None:
                    limit = backend.context_limit
                    raise ApiError(400, f"{grown.ended.message}; the model's context holds {limit}",
                                   param="messages", code="context_length_exceeded")  # fmt: skip

            await self._contained("the follow-up", follow_up)
            self.prepared = "rollback" if rewritten else "prefix_hit"
            if rewritten:
                metrics.transcript_rollbacks += 1
            else:
                metrics.transcript_prefix_hits += 1
            metrics.reused_prompt_tokens += reused
            metrics.rendered_prompt_tokens += len(conversation) - reused
        else:
            self.conversation_id = uuid.uuid4().hex[:12]
            await self._contained("the conversation", lambda: conversation.open_history(messages))
            self.prepared = "rerender" if last is not None else "new"
            if last is not None:
                metrics.transcript_rerenders += 1
            else:
                metrics.transcript_new += 1
            metrics.rendered_prompt_tokens += len(conversation)
        self.prompt_tokens = len(conversation)
        if not conversation.fits(0):
            limit = backend.context_limit
            raise ApiError(
                400,
                f"the conversation has {self.prompt_tokens} tokens; the model's context holds {limit}",
                param="messages",
                code="context_length_exceeded",
            )

    async def generate(self) -> None:
        """One engine call, read by the conversation; stores it for the follow-up. Raises `ApiError` when the
        engine fails or its output cannot be read."""
        backend, conversation = self.backend, self.conversation
        sampling = backend.sampling_for(self.request)
        turn = conversation.request(min(sampling.max_new_tokens, backend.recipe.max_new_tokens))
        assert turn is not None  # prepare() checked that a token fits
        t0 = time.perf_counter()
        outcome = await call_engine(
            backend.engine,
            turn.prompt_ids,
            turn.sampling(sampling),
            timeout_s=backend.config.engine_timeout_s,
            images=turn.images,
            session=_affinity_key(self.tools, self.messages),
        )
        self.generate_s = time.perf_counter() - t0
        if isinstance(outcome, EngineFailure):
            conversation.record_error(outcome.code, outcome.message, conversation.turns + 1)
            self.failed = outcome.code
            raise ApiError(500, outcome.message, type="server_error", code=outcome.code)
        self.generation = outcome
        with boundary(passes=_PASSES) as failed:
            reply = conversation.accept(outcome, call_id_prefix=f"call_{uuid.uuid4().hex[:8]}")
        if failed.exception is not None:
            self._fail(failed, "the model's turn")
        self.action = reply.action
        self.calls = reply.action.valid_tool_calls
        if self.calls:
            self.finish = "tool_calls"
        elif reply.truncated:
            self.finish = "length"
        backend.metrics.generated_tokens += len(outcome.ids)
        turn_key, key = turn_keys(self.tools, self.messages, self.echo())
        try:
            if await backend.store.aput(key, self.conversation_id, conversation, previous=self.stored):
                backend.turn_index.put(turn_key, key)
        except StoreUnavailable as e:  # the answer still goes out; its follow-up will be rendered from scratch
            logger.warning("transcript_store_unavailable", action="put", error=str(e))
            backend.metrics.transcript_store_put_failures += 1

    async def _contained(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        """Run `step` (foreign code: a tokenizer, a protocol plug-in) in the boundary: whatever it raises, any
        `BaseException` but the two that propagate (`agent_env.containment`), fails this request only (`_fail`)."""
        with boundary(passes=_PASSES) as failed:
            await step()
        if failed.exception is not None:
            self._fail(failed, what)

    def _fail(self, failed: boundary, what: str) -> NoReturn:
        """A 500 whose code names the stage that raised (``render_error``, ``decode_error``, ``parse_error``),
        recorded on this request's trajectory."""
        code = failed.code
        message = f"{self._what_failed(code, what)}: {failed.message}"
        logger.error("component_failed", mode="tools", code=code, error_type=type(failed.exception).__name__,
                     error=message, exc_info=failed.exception)  # fmt: skip
        self.conversation.record_error(code, message)
        self.failed = code
        raise ApiError(500, message, type="server_error", code=code) from failed.exception

    def _what_failed(self, code: str, what: str) -> str:
        protocol, engine = self.backend.protocol.name, self.backend.engine.name
        if code == "decode_error":
            return f"{engine}'s tokenizer could not decode the generated ids"
        if code == "parse_error":
            return f"the {protocol} protocol could not read the model's turn"
        if code == "render_error":
            return f"the {protocol} protocol could not render {what}"
        return f"{what} failed"

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
        """Log this request's trajectory: the whole conversation so far, its transcript, what this turn did.
        Nothing is built when there is no log: the record is the one part of a request that is O(history)."""
        if self.backend.writer is None:
            return
        conversation, action = self.conversation, self.action
        self.backend.record(
            build_trajectory(
                episode_id=self.conversation_id,
                protocol=self.backend.protocol.name,
                messages=conversation.messages,
                segments=conversation.records() if len(conversation) else [],
                generations=conversation.generations,
                final_answer=action.content if action is not None and not self.calls else None,
                stop_reason=self.stop_reason(),
                turns=conversation.turns,
                tool_calls=len(self.calls),
                compactions=len(conversation.segments) - 1 if conversation.segments else 0,
                errors=conversation.errors,
                timings={"generate_s": self.generate_s, "total_s": time.perf_counter() - self.started},
                task={"mode": "tools", "prepared": self.prepared}
                | ({"reasoning_stripped": True} if self.reasoning_stripped else {}),
                policy_version=self.backend.engine.policy_version,
            )
        )

    def stop_reason(self) -> StopReason | TurnFinish | None:
        """How the request ended: its finish reason, or the code that failed it (None: it never got an answer)."""
        return self.finish if self.action is not None else self.failed

    def went_away(self) -> None:
        """Record that the client hung up before this turn was answered."""
        self.conversation.record_error("client_disconnected", "the client went away")
        self.failed = "client_disconnected"

    async def answer(self) -> None:
        """`generate`, and `record` the turn however that ends: a client that hung up (`disconnect.py`) is
        recorded as such."""
        try:
            await self.generate()
        except asyncio.CancelledError:
            self.went_away()
            raise
        finally:
            self.record()


def _affinity_key(tools: Sequence[ToolSpec], messages: Sequence[Message]) -> str:
    """The engine's session key of a conversation: a hash of its tools and its messages up to the first user
    message, the same at every turn, so an engine with several upstreams keeps all its turns on one."""
    first = next((i for i, m in enumerate(messages) if m.role == "user"), len(messages) - 1)
    return conversation_key(tools, messages[: first + 1])[:16]


def _reasoning_differs(sent: Sequence[Message], stored: Sequence[Message]) -> bool:
    """Whether a stored assistant turn that had reasoning came back in `sent` without it (or with other)."""
    return any(
        s.role == "assistant" and bool(s.reasoning_content) and m.reasoning_content != s.reasoning_content
        for m, s in zip(sent, stored, strict=False)
    )


def _prompt_of(messages: Sequence[Message]) -> list[Message]:
    """The conversation's prompt: its messages before the first assistant turn."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    return list(messages[:first])


async def open_turn(
    backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> ToolsTurn:
    """The turn of `messages`, its prompt found in the transcript store or rendered (a prompt that does not fit
    is an `ApiError` here, before any answer starts)."""
    turn = ToolsTurn(backend, request, list(messages), list(tools))
    await turn.prepare()
    return turn


async def complete_tools(
    backend: ServingBackend, request: ChatCompletionRequest, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> ChatCompletion:
    """One model turn: text, or tool calls for the client to run."""
    turn = await open_turn(backend, request, messages, tools)
    await turn.answer()
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
    return _stream(backend, request, await open_turn(backend, request, messages, tools))


async def _stream(backend: ServingBackend, request: ChatCompletionRequest, turn: ToolsTurn) -> AsyncGenerator[bytes]:
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
