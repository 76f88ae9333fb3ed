"""OpenAI's Responses API (``POST /v1/responses``, the OpenAI Agents SDK's default model) on the tools-mode turn
core: a request is converted to the chat messages and tools a chat completion would carry, served by the same
`tools_mode` turn (the same transcript store, limits, error answers and trajectory records), and its turn is
written back as Responses output items.

Input items, in order, become chat messages: a ``message`` (role user, system, developer, assistant; its content
a string or ``input_text``/``output_text`` parts, ``input_image`` as an image part) one message (developer is
a system message); consecutive ``reasoning``, assistant ``message`` and ``function_call`` items one assistant
message (its reasoning, its text, its tool calls by ``call_id``), exactly the message the chat route would have
echoed, so a follow-up's items continue the stored ids as the same conversation's chat messages would; a
``function_call_output`` a tool message, refused when no earlier ``function_call`` has its ``call_id``.
``instructions`` is a system message before them. Function tools become chat tools (``strict`` kept, so the
template prints the same listing). There is no server-side state: ``previous_response_id`` and ``conversation``
are refused (400 ``previous_response_unsupported``): the client sends its whole transcript as items, as the SDK
does by default; ``store`` is accepted and ignored (nothing is stored for later retrieval). A request without
tools is one model turn too (not agent mode: the Responses API is a model endpoint). Other unknown fields are
ignored, as the chat route ignores them.

The answer is a ``response`` object: a ``reasoning`` item when the model reasoned, a ``message`` with one
``output_text`` part when it wrote text, a ``function_call`` item per well-formed call; ``status`` is
``incomplete`` with ``incomplete_details.reason = "max_output_tokens"`` when the turn hit its token limit. A
stream is SSE with ``event:`` lines: ``response.created``, ``response.in_progress``, then per item
``response.output_item.added``, its content events (``content_part.added``, ``output_text.delta``/``.done``,
``content_part.done``; ``function_call_arguments.delta``/``.done``), ``response.output_item.done``, and
``response.completed`` (or ``response.incomplete``). A failure mid-stream is an ``error`` event (which the openai
client raises). This module knows the Responses wire format and the conversion; the turn is `tools_mode`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Annotated, Any, Final

import msgspec
import structlog

from agent_protocol import Message, ToolSpec
from agent_runtime.serving.api_error import ApiError, from_decode_error
from agent_runtime.serving.backend import ServingBackend
from agent_runtime.serving.openai_wire import ChatCompletionRequest, encode
from agent_runtime.serving.tools_mode import ToolsTurn, open_turn

__all__ = ["ResponsesRequest", "complete_response", "decode_responses_request", "stream_response", "to_chat_request"]

logger = structlog.get_logger(__name__)

_INT32: Final = 2**31 - 1
_TEXT_PARTS: Final = ("input_text", "output_text", "text")
_STATEFUL: Final = ("previous_response_id", "conversation")


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/responses`. Unknown fields are ignored (as the chat route does); items and tools stay plain
    dicts, converted by `to_chat_request`, which names the offending ``input[i]``."""

    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=_INT32)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    store: bool | None = None  # accepted and ignored: nothing is kept for retrieval
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None  # refused: no server-side state
    conversation: str | dict[str, Any] | None = None  # refused: no server-side state
    metadata: dict[str, Any] | None = None
    user: str | None = None


_decoder: Final = msgspec.json.Decoder(ResponsesRequest)


def decode_responses_request(body: bytes) -> ResponsesRequest:
    """The request, or `ApiError` 400 naming the field."""
    try:
        asked = _decoder.decode(body)
    except msgspec.DecodeError as e:
        raise from_decode_error(e) from e
    for name in _STATEFUL:
        if getattr(asked, name) is not None:
            raise ApiError(
                400,
                f"`{name}` is not supported: this server keeps no responses; send the whole conversation as "
                "`input` items (the Agents SDK does unless told to chain responses)",
                param=name,
                code="previous_response_unsupported",
            )
    return asked


def to_chat_request(asked: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request the Responses request stands for; raises `ApiError` 400 naming ``input[i]``
    or ``tools[i]`` for an item or a tool this server does not take."""
    messages: list[dict[str, Any]] = []
    if asked.instructions:
        messages.append({"role": "system", "content": asked.instructions})
    messages += _messages(asked.input)
    return ChatCompletionRequest(
        model=asked.model,
        messages=messages,
        tools=[_chat_tool(tool, i) for i, tool in enumerate(asked.tools or [])] or None,
        tool_choice=_chat_tool_choice(asked.tool_choice),
        stream=asked.stream,
        temperature=asked.temperature,
        top_p=asked.top_p,
        max_tokens=asked.max_output_tokens,
        parallel_tool_calls=asked.parallel_tool_calls,
        user=asked.user,
    )


def _bad(where: str, problem: str) -> ApiError:
    return ApiError(400, f"invalid value for `{where}`: {problem}", param=where, code="invalid_value")


def _messages(items: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message being gathered from consecutive items
    calls: set[str] = set()
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise _bad(where, f"must be an object, got {type(item).__name__}")
        kind = item.get("type", "message" if "role" in item else None)
        role = item.get("role")
        if kind in ("reasoning", "function_call") or (kind == "message" and role == "assistant"):
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            if kind == "reasoning":
                turn["reasoning_content"] = (turn.get("reasoning_content") or "") + _reasoning(item, where)
            elif kind == "function_call":
                call_id, name, arguments = (_text_field(item, key, where) for key in ("call_id", "name", "arguments"))
                turn.setdefault("tool_calls", []).append(
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                )
                calls.add(call_id)
            else:
                turn["content"] += _text(item.get("content"), f"{where}.content")
            continue
        turn = None
        if kind == "function_call_output":
            call_id = _text_field(item, "call_id", where)
            if call_id not in calls:
                raise ApiError(
                    400,
                    f"`{where}` is the output of call {call_id!r}, but no earlier `function_call` item has that "
                    "call_id",
                    param=f"{where}.call_id",
                    code="invalid_value",
                )
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "message":
            if role not in ("user", "system", "developer"):
                raise _bad(f"{where}.role", f"must be user, system, developer or assistant, got {role!r}")
            out.append({"role": "system" if role == "developer" else role, "content": _content(item, where)})
        else:
            raise _bad(
                f"{where}.type",
                f"this server takes message, function_call, function_call_output and reasoning items, got {kind!r}",
            )
    return out


def _text_field(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key}", f"must be a string, got {type(value).__name__}")
    return value


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise _bad(where, f"must be a string or a list of content parts, got {type(content).__name__}")
    for k, part in enumerate(content):
        if not isinstance(part, dict):
            raise _bad(f"{where}[{k}]", f"must be an object, got {type(part).__name__}")
    return content


def _text(content: Any, where: str) -> str:
    """The text of a string or of a list of text parts (an image or other part is refused)."""
    if isinstance(content, str):
        return content
    texts = []
    for k, part in enumerate(_parts(content, where)):
        if part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise _bad(f"{where}[{k}]", f"must be a text part ({', '.join(_TEXT_PARTS)}), got {part.get('type')!r}")
        texts.append(part["text"])
    return "".join(texts)


def _content(item: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    """A user or system message's content as chat content: text, or text and image parts."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = _parts(content, f"{where}.content")
    if not any(part.get("type") == "input_image" for part in parts):
        return _text(parts, f"{where}.content")
    out: list[dict[str, Any]] = []
    for k, part in enumerate(parts):
        if part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _bad(f"{where}.content[{k}].image_url", "must be a data URL (file ids are not supported)")
            out.append({"type": "image_url", "image_url": {"url": url}})
        else:
            out.append({"type": "text", "text": _text([part], f"{where}.content[{k}]")})
    return out


def _reasoning(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else its summary."""
    content = item.get("content")
    if content:
        return "".join(part.get("text", "") for part in _parts(content, f"{where}.content"))
    return "".join(part.get("text", "") for part in _parts(item.get("summary") or [], f"{where}.summary"))


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise ApiError(400, f"`tools[{index}]` is a {tool.get('type')!r} tool; this server runs function tools only",
                       param=f"tools[{index}].type", code="unsupported_value")  # fmt: skip
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


# -- the answer -------------------------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


class _Answer:
    """One turn's response object and its output items, ids fixed once so a stream and its final object agree."""

    def __init__(self, asked: ResponsesRequest, chat: ChatCompletionRequest) -> None:
        self.asked, self.chat = asked, chat
        self.id = _new_id("resp")
        self.created_at = int(time.time())

    def response(self, turn: ToolsTurn | None, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        asked = self.asked
        usage = None
        if turn is not None and status != "in_progress":
            counted = turn.usage()
            usage = {
                "input_tokens": counted.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": counted.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counted.total_tokens,
            }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "model": asked.model,
            "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None,
            "instructions": asked.instructions,
            "output": output,
            "tools": asked.tools or [],
            "tool_choice": asked.tool_choice or "auto",
            "parallel_tool_calls": asked.parallel_tool_calls is not False,
            "temperature": asked.temperature,
            "top_p": asked.top_p,
            "max_output_tokens": asked.max_output_tokens,
            "store": False,
            "metadata": asked.metadata or {},
            "usage": usage,
        }

    def items(self, turn: ToolsTurn) -> list[dict[str, Any]]:
        """The turn's output items: reasoning, message, function calls (what was generated, in that order)."""
        message = turn.response_message()
        out: list[dict[str, Any]] = []
        if message.reasoning_content:
            text = message.reasoning_content
            out.append({"type": "reasoning", "id": _new_id("rs"), "summary": [],
                        "content": [{"type": "reasoning_text", "text": text}], "status": "completed"})  # fmt: skip
        if message.content:
            out.append({
                "type": "message", "id": _new_id("msg"), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": message.content, "annotations": [], "logprobs": []}],
            })  # fmt: skip
        for call in message.tool_calls or []:
            function = call.function
            out.append({"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": function.name,
                        "arguments": function.arguments, "status": "completed"})  # fmt: skip
        return out


def _status(turn: ToolsTurn) -> str:
    return "incomplete" if turn.finish == "length" else "completed"


async def complete_response(
    backend: ServingBackend,
    asked: ResponsesRequest,
    chat: ChatCompletionRequest,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
) -> dict[str, Any]:
    """One model turn as a ``response`` object."""
    turn = await open_turn(backend, chat, messages, tools)
    await turn.answer()
    answer = _Answer(asked, chat)
    return answer.response(turn, _status(turn), answer.items(turn))


async def stream_response(
    backend: ServingBackend,
    asked: ResponsesRequest,
    chat: ChatCompletionRequest,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
) -> AsyncGenerator[bytes]:
    """The turn as Responses SSE events. The prompt is prepared here, before the stream starts, so a conversation
    that does not fit is a 400, not an error event."""
    return _stream(backend, _Answer(asked, chat), await open_turn(backend, chat, messages, tools))


async def _stream(backend: ServingBackend, answer: _Answer, turn: ToolsTurn) -> AsyncGenerator[bytes]:
    sequence = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + encode(payload) + b"\n\n"

    try:
        yield event("response.created", response=answer.response(None, "in_progress", []))
        yield event("response.in_progress", response=answer.response(None, "in_progress", []))
        try:
            await turn.generate()
        except ApiError as e:
            backend.metrics.server_errors += 1
            logger.warning("request_failed", mode="responses", code=e.code, error=e.message)
            detail = msgspec.to_builtins(e.detail())
            yield event("error", code=e.code, message=e.message, param=e.param, error=detail)
            return
        items = answer.items(turn)
        for index, item in enumerate(items):
            for frame in _item_events(event, index, item):
                yield frame
        status = _status(turn)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield event(kind, response=answer.response(turn, status, items))
        backend.metrics.completed += 1
    finally:
        turn.record()


def _item_events(event: Any, index: int, item: dict[str, Any]) -> list[bytes]:
    """``output_item.added``, the item's content events, ``output_item.done``."""
    kind, item_id = item["type"], item["id"]
    at = {"item_id": item_id, "output_index": index}
    frames = []
    if kind == "message":
        opened = {**item, "content": [], "status": "in_progress"}
        frames.append(event("response.output_item.added", output_index=index, item=opened))
        part = item["content"][0]
        text = part["text"]
        frames.append(event("response.content_part.added", **at, content_index=0, part={**part, "text": ""}))
        frames.append(event("response.output_text.delta", **at, content_index=0, delta=text, logprobs=[]))
        frames.append(event("response.output_text.done", **at, content_index=0, text=text, logprobs=[]))
        frames.append(event("response.content_part.done", **at, content_index=0, part=part))
    elif kind == "function_call":
        opened = {**item, "arguments": "", "status": "in_progress"}
        frames.append(event("response.output_item.added", output_index=index, item=opened))
        arguments = item["arguments"]
        frames.append(event("response.function_call_arguments.delta", **at, delta=arguments))
        frames.append(event("response.function_call_arguments.done", **at, arguments=arguments))
    else:  # reasoning: whole, in the added and done events
        frames.append(event("response.output_item.added", output_index=index, item=item))
    frames.append(event("response.output_item.done", output_index=index, item=item))
    return frames
