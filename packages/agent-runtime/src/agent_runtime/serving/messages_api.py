"""Anthropic's Messages API (``POST /v1/messages``, what Claude-style coding harnesses and the `anthropic` SDK
speak) on the tools-mode turn core: a request is converted to the chat messages and tools a chat completion would
carry, served by the same `tools_mode` turn (the same transcript store, limits and trajectory records), and its
turn is written back as content blocks.

Conversion, in order:

- ``system`` (a string or text blocks) is a system message before the rest;
- a user message's blocks, in order: ``text`` and ``image`` blocks gather into one user message (an image's
  ``base64`` source becomes a data URL, checked as every image is; a ``url`` source is refused there, as remote
  images are), and each ``tool_result`` block is a tool message (its content a string, or text and image blocks),
  refused when no earlier ``tool_use`` block has its ``tool_use_id``;
- an assistant message's blocks are one assistant message: ``thinking`` its reasoning, ``text`` its content,
  ``tool_use`` its tool calls (``input`` an object, kept as the call's arguments), ``redacted_thinking`` dropped;
  exactly the message the chat route would have echoed, so a follow-up continues the stored ids;
- tools (``name``, ``description``, ``input_schema``) are function tools; a server tool (a ``type`` other than
  ``custom``: web search, bash, the text editor) is refused, since this server runs no tools;
- ``max_tokens`` (required, as Anthropic requires it) caps the turn; ``temperature``, ``top_p``, ``top_k`` lay
  over the recipe's sampling; ``stop_sequences`` are refused as the chat route refuses ``stop``; ``thinking``,
  ``metadata``, ``service_tier`` and unknown fields are accepted and ignored (the chat template decides whether the
  model reasons).

The answer is a ``message``: a ``thinking`` block when the model reasoned (its ``signature`` empty: nothing here
signs), a ``text`` block when it wrote text, a ``tool_use`` block per well-formed call; ``stop_reason`` is
``tool_use``, ``max_tokens`` (the turn hit its limit) or ``end_turn``. A stream is SSE with ``event:`` lines:
``message_start``, per block ``content_block_start``, one delta (``text_delta``, ``thinking_delta``,
``input_json_delta``) and ``content_block_stop``, then ``message_delta`` (the stop reason and output tokens) and
``message_stop``; a failure mid-stream is an ``error`` event (which the `anthropic` client raises). Errors are in
Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, with this server's ``code`` and ``param``
beside them (`error_response`). The key may come as ``x-api-key`` (Anthropic's header) or as a bearer token.

This module knows the Messages wire format and the conversion; the turn is `tools_mode`'s, the route `app.py`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, Sequence
from typing import Annotated, Any, Final

import msgspec
import structlog
from starlette.responses import Response

from agent_protocol import Message, ToolSpec
from agent_runtime.serving.api_error import ApiError, from_decode_error
from agent_runtime.serving.backend import ServingBackend
from agent_runtime.serving.openai_wire import ChatCompletionRequest, encode
from agent_runtime.serving.tools_mode import ToolsTurn, open_turn

__all__ = [
    "MessagesRequest",
    "complete_message",
    "decode_messages_request",
    "error_response",
    "stream_message",
    "to_chat_request",
]

logger = structlog.get_logger(__name__)

_INT32: Final = 2**31 - 1
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


class MessagesRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/messages`. Unknown fields are ignored; messages and tools stay plain dicts, converted by
    `to_chat_request`, which names the offending ``messages[i].content[k]``."""

    model: str
    messages: list[Any]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=_INT32)]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool = False
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-_INT32, le=_INT32)] | None = None
    stop_sequences: list[str] | None = None  # refused when not empty, as the chat route refuses `stop`
    metadata: dict[str, Any] | None = None


_decoder: Final = msgspec.json.Decoder(MessagesRequest)


def decode_messages_request(body: bytes) -> MessagesRequest:
    """The request, or `ApiError` 400 naming the field."""
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as e:
        raise from_decode_error(e) from e


def to_chat_request(asked: MessagesRequest) -> ChatCompletionRequest:
    """The chat completion request the Messages request stands for; raises `ApiError` 400 naming the block or
    tool this server does not take."""
    if asked.stop_sequences:
        raise ApiError(400, "stop sequences are not supported; the model stops at its end-of-turn token",
                       param="stop_sequences", code="unsupported_value")  # fmt: skip
    messages: list[dict[str, Any]] = []
    if asked.system:
        messages.append({"role": "system", "content": _text(asked.system, "system")})
    messages += _messages(asked.messages)
    user = asked.metadata.get("user_id") if asked.metadata else None
    return ChatCompletionRequest(
        model=asked.model,
        messages=messages,
        tools=[_chat_tool(tool, i) for i, tool in enumerate(asked.tools or [])] or None,
        tool_choice=_chat_tool_choice(asked.tool_choice),
        stream=asked.stream,
        temperature=asked.temperature,
        top_p=asked.top_p,
        top_k=asked.top_k,
        max_tokens=asked.max_tokens,
        user=user if isinstance(user, str) else None,
    )


def _bad(where: str, problem: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"invalid value for `{where}`: {problem}", param=where, code=code)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """`content` as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(where, f"must be a string or a list of content blocks, got {type(content).__name__}")
    for k, block in enumerate(content):
        if not isinstance(block, dict):
            raise _bad(f"{where}[{k}]", f"must be an object, got {type(block).__name__}")
    return content


def _text(content: Any, where: str) -> str:
    """The text of a string or of text blocks (any other block is refused)."""
    texts = []
    for k, block in enumerate(_blocks(content, where)):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise _bad(f"{where}[{k}]", f"must be a text block, got {block.get('type')!r}")
        texts.append(block["text"])
    return "".join(texts)


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``image`` block as an OpenAI image part; the image checks (`images.py`) judge its URL and bytes."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise _bad(f"{where}.source", "must be an object")
    if source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _bad(f"{where}.source", "a base64 source needs a `media_type` and `data` string")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}  # refused by the image checks
    raise _bad(f"{where}.source.type", f"must be base64 or url, got {source.get('type')!r}")


def _parts(blocks: list[dict[str, Any]], where: str) -> str | list[dict[str, Any]]:
    """Text and image blocks as chat content: plain text when there is no image."""
    if not any(block.get("type") == "image" for block in blocks):
        return "".join(block["text"] for block in blocks)
    return [
        _image(block, f"{where}[{k}]") if block.get("type") == "image" else {"type": "text", "text": block["text"]}
        for k, block in enumerate(blocks)
    ]


def _user(content: Any, where: str, calls: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # text and image blocks since the last tool result

    def flush() -> None:
        if pending:
            out.append({"role": "user", "content": _parts(pending, where)})
            pending.clear()

    for k, block in enumerate(_blocks(content, where)):
        at, kind = f"{where}[{k}]", block.get("type")
        if (kind == "text" and isinstance(block.get("text"), str)) or kind == "image":
            pending.append(block)
        elif kind == "tool_result":
            flush()
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise ApiError(
                    400,
                    f"`{at}` is the result of tool use {call_id!r}, but no earlier `tool_use` block has that id",
                    param=f"{at}.tool_use_id",
                    code="invalid_value",
                )
            result = block.get("content", "")
            text = _parts(_checked_blocks(result, f"{at}.content"), f"{at}.content")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise _bad(f"{at}.type", f"a user message takes text, image and tool_result blocks, got {kind!r}")
    flush()
    return out


def _checked_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    blocks = _blocks(content, where)
    for k, block in enumerate(blocks):
        kind = block.get("type")
        if not (kind == "image" or (kind == "text" and isinstance(block.get("text"), str))):
            raise _bad(f"{where}[{k}]", f"must be a text or image block, got {kind!r}")
    return blocks


def _assistant(content: Any, where: str, calls: set[str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for k, block in enumerate(_blocks(content, where)):
        at, kind = f"{where}[{k}]", block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            message["content"] += block["text"]
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            message["reasoning_content"] = message.get("reasoning_content", "") + block["thinking"]
        elif kind == "redacted_thinking":
            continue  # nothing readable to render
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise _bad(at, "a tool_use block needs an `id` and a `name` string")
            if not isinstance(arguments, dict):
                raise _bad(f"{at}.input", f"must be an object, got {type(arguments).__name__}")
            function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
            message.setdefault("tool_calls", []).append({"id": call_id, "type": "function", "function": function})
            calls.add(call_id)
        else:
            raise _bad(f"{at}.type", f"an assistant message takes text, thinking and tool_use blocks, got {kind!r}")
    return message


def _messages(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    for index, item in enumerate(items):
        where = f"messages[{index}]"
        if not isinstance(item, dict):
            raise _bad(where, f"must be an object, got {type(item).__name__}")
        role = item.get("role")
        if role == "user":
            out += _user(item.get("content"), f"{where}.content", calls)
        elif role == "assistant":
            out.append(_assistant(item.get("content"), f"{where}.content", calls))
        else:
            raise _bad(f"{where}.role", f"must be user or assistant (the system prompt is `system`), got {role!r}")
    return out


def _chat_tool(tool: Any, index: int) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise _bad(where, f"must be an object, got {type(tool).__name__}")
    if tool.get("type", "custom") != "custom":
        raise _bad(
            f"{where}.type",
            f"{tool.get('type')!r} is a server tool; this server runs no tools, send custom tools (name, "
            "description, input_schema) and run them yourself",
            code="unsupported_value",
        )
    if not isinstance(tool.get("name"), str):
        raise _bad(f"{where}.name", "must be a string")
    function: dict[str, Any] = {"name": tool["name"]}  # in the chat tool's key order: the template prints it
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    function["parameters"] = tool.get("input_schema", {"type": "object"})
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Accepted and mapped; the server ignores it, as the chat route does."""
    kind = choice.get("type") if choice else None
    if kind == "tool" and choice is not None and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind) if isinstance(kind, str) else None


# -- the answer -------------------------------------------------------------------------------------------------


def _blocks_of(turn: ToolsTurn) -> list[dict[str, Any]]:
    """The turn's content blocks: thinking, text, tool uses (what was generated, in that order)."""
    message = turn.response_message()
    out: list[dict[str, Any]] = []
    if message.reasoning_content:
        out.append({"type": "thinking", "thinking": message.reasoning_content, "signature": ""})
    if message.content:
        out.append({"type": "text", "text": message.content})
    out += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in turn.calls]
    return out


def _stop_reason(turn: ToolsTurn) -> str:
    if turn.finish == "length":
        return "max_tokens"
    return "tool_use" if turn.calls else "end_turn"


def _message(turn: ToolsTurn | None, asked: MessagesRequest, message_id: str, content: list[Any]) -> dict[str, Any]:
    prompt = turn.prompt_tokens if turn is not None else 0
    done = turn is not None and turn.action is not None
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": asked.model,
        "content": content,
        "stop_reason": _stop_reason(turn) if done and turn is not None else None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt,
            "output_tokens": turn.usage().completion_tokens if done and turn is not None else 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _new_id() -> str:
    return f"msg_{os.urandom(12).hex()}"


async def complete_message(
    backend: ServingBackend,
    asked: MessagesRequest,
    chat: ChatCompletionRequest,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
) -> dict[str, Any]:
    """One model turn as a ``message`` object."""
    turn = await open_turn(backend, chat, messages, tools)
    await turn.answer()
    return _message(turn, asked, _new_id(), _blocks_of(turn))


async def stream_message(
    backend: ServingBackend,
    asked: MessagesRequest,
    chat: ChatCompletionRequest,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
) -> AsyncGenerator[bytes]:
    """The turn as Messages SSE events. The prompt is prepared here, before the stream starts, so a conversation
    that does not fit is a 400, not an error event."""
    return _stream(backend, asked, await open_turn(backend, chat, messages, tools))


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + encode({"type": kind, **fields}) + b"\n\n"


_DELTAS: Final = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking")}


async def _stream(backend: ServingBackend, asked: MessagesRequest, turn: ToolsTurn) -> AsyncGenerator[bytes]:
    message_id = _new_id()
    try:
        yield _event("message_start", message=_message(turn, asked, message_id, []))
        try:
            await turn.generate()
        except ApiError as e:
            backend.metrics.server_errors += 1
            logger.warning("request_failed", mode="messages", code=e.code, error=e.message)
            yield _event("error", error=_error_detail(e))
            return
        for index, block in enumerate(_blocks_of(turn)):
            kind = block["type"]
            if kind == "tool_use":
                opened = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
            else:
                delta_type, field = _DELTAS[kind]
                opened = {**block, field: ""}
                delta = {"type": delta_type, field: block[field]}
            yield _event("content_block_start", index=index, content_block=opened)
            yield _event("content_block_delta", index=index, delta=delta)
            yield _event("content_block_stop", index=index)
        usage = {"output_tokens": turn.usage().completion_tokens}
        yield _event("message_delta", delta={"stop_reason": _stop_reason(turn), "stop_sequence": None}, usage=usage)
        yield _event("message_stop")
        backend.metrics.completed += 1
    finally:
        turn.record()


# -- errors -----------------------------------------------------------------------------------------------------


def _error_detail(error: ApiError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": kind, "message": error.message, "code": error.code, "param": error.param}


def error_response(error: ApiError) -> Response:
    """`error` in Anthropic's shape (its ``type`` by status, as the `anthropic` client maps them), with this
    server's ``code`` and ``param`` kept beside the message."""
    body = encode({"type": "error", "error": _error_detail(error)})
    return Response(body, status_code=error.status, media_type="application/json", headers=error.headers)
