"""The data that crosses every layer: messages, tool calls, parsed actions and tool specs.

All are frozen msgspec Structs. OpenAI-style dicts are accepted at every public entry and converted once, here,
with errors that name the offending message index and field. This module knows nothing about any model's
chat format or tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from agent_protocol.errors import JsonLimitError, MessageError
from agent_protocol.images import check_image_url
from agent_protocol.json_limits import check_json_value, loads_bounded

__all__ = [
    "ROLES",
    "Action",
    "ImagePart",
    "IssueCode",
    "Message",
    "MessageLike",
    "ParseIssue",
    "Role",
    "ToolCall",
    "ToolSpec",
    "ToolSpecLike",
    "coerce_messages",
    "coerce_tools",
]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: Final[tuple[str, ...]] = ("system", "user", "assistant", "tool")

IssueCode = Literal[
    "invalid_json",  # a <tool_call> block whose body is not valid JSON
    "missing_name",  # valid JSON, but no non-empty string "name"
    "invalid_arguments",  # "arguments" is neither a JSON object nor a string holding one
    "unclosed_tag",  # <tool_call> never closed and its body is incomplete (usually cut off by the length limit)
    "missing_think_end",  # reasoning was opened and never closed with </think>
    "malformed_turn",  # not in the family's format (unknown channel or role, stray text): the rest was read
    "parse_error",  # the family's parser failed on this text (a bug it has; the turn is kept, unread)
]


class ParseIssue(msgspec.Struct, frozen=True, kw_only=True):
    """What was wrong with a piece of model output: a machine-readable code and a short message that an
    environment can show the model as-is."""

    code: IssueCode
    message: str


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One function call. `error` is set when the model wrote a call that could not be parsed; then `name`
    and `arguments` hold what could be recovered and `raw` the text of the block."""

    id: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    error: ParseIssue | None = None
    raw: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


class ImagePart(msgspec.Struct, frozen=True, kw_only=True):
    """One image of a message: `url` the reference the client gave (a data URL, a ``file://`` URL or a path, see
    `agent_protocol.images`), `offset` the character position in the message's text where it sits (images at
    the same offset keep their order)."""

    url: str
    offset: int


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One chat message. `content` is None where OpenAI allows null (an assistant turn with only tool
    calls); chat formats treat None as empty text.

    A message with images (OpenAI ``image_url`` content parts) keeps its text in `content`, the text parts
    joined, and its images in `images`, each with the position in that text where it sat; a text-only message
    has none, so every text-only family reads `content` as before. Only a vision-language protocol accepts a
    message with images (`coerce_messages(..., images=True)`)."""

    role: Role
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    images: tuple[ImagePart, ...] = ()

    def content_parts(self) -> list[dict[str, Any]]:
        """The content as OpenAI parts: text and ``image_url`` parts in their order (no empty text part)."""
        text = self.content or ""
        parts: list[dict[str, Any]] = []
        at = 0
        for image in self.images:
            if image.offset > at:
                parts.append({"type": "text", "text": text[at : image.offset]})
                at = image.offset
            parts.append({"type": "image_url", "image_url": {"url": image.url}})
        if at < len(text):
            parts.append({"type": "text", "text": text[at:]})
        return parts

    @classmethod
    def from_openai(cls, data: Mapping[str, Any], *, index: int = 0) -> Message:
        return _message_from_dict(data, f"messages[{index}]")

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content_parts() if self.images else self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class Action(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one generated assistant turn parsed into. Malformed output never raises: `error` describes a
    turn-level problem (unclosed reasoning), `ToolCall.error` a broken call."""

    content: str = ""
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    error: ParseIssue | None = None

    @property
    def valid_tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(call for call in self.tool_calls if call.error is None)

    @property
    def issues(self) -> tuple[ParseIssue, ...]:
        """Every problem found in the turn, turn-level first, then per call in order."""
        found = [self.error] if self.error is not None else []
        found.extend(call.error for call in self.tool_calls if call.error is not None)
        return tuple(found)

    def to_message(self) -> Message:
        """The assistant message this turn stands for (all calls, broken ones included, so that each can be
        answered by a tool message)."""
        return Message(
            role="assistant",
            content=self.content,
            reasoning_content=self.reasoning_content,
            tool_calls=self.tool_calls,
        )


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """An OpenAI function schema: what a chat format shows the model about one tool."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    #: the dict exactly as the client sent it, when the spec came from one: chat templates render the dict they
    #: are given (a missing description, `strict`, the key order), so rendering uses it
    source: dict[str, Any] | None = None

    @classmethod
    def from_openai(cls, data: Mapping[str, Any], *, index: int = 0) -> ToolSpec:
        return _tool_spec_from_dict(data, f"tools[{index}]")

    @property
    def function(self) -> dict[str, Any]:
        """The `function` object as given (or as built here): what field-by-field templates read."""
        if self.source is not None:
            function = self.source.get("function", self.source)
            return dict(function)
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_openai(self) -> dict[str, Any]:
        """The spec as the client sent it, or `{"type": "function", "function": {...}}` with keys in OpenAI's
        order for one built here (chat templates dump it with `tojson`, so key order is part of the prompt)."""
        if self.source is not None:
            return self.source
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


MessageLike = Message | Mapping[str, Any]
ToolSpecLike = ToolSpec | Mapping[str, Any]


def coerce_messages(messages: Iterable[MessageLike], *, images: bool = False) -> list[Message]:
    """Accept Messages and OpenAI-style dicts alike; convert the dicts, naming the index of a bad one.

    `images`: whether the caller shows images to the model (a vision-language protocol). Left False, a message
    with an image is refused with a MessageError naming the message and part and saying that the chat protocol
    is text-only, so that no text-only family silently drops an image."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise MessageError("messages", f"must be a list of messages, got {type(messages).__name__}")
    out: list[Message] = []
    for index, item in enumerate(messages):
        if isinstance(item, Message):
            message = item
        elif isinstance(item, Mapping):
            message = _message_from_dict(item, f"messages[{index}]")
        else:
            raise MessageError(f"messages[{index}]", f"must be a Message or a dict, got {type(item).__name__}")
        if message.images and not images:
            raise MessageError(f"messages[{index}].content[{_first_image_part(message)}]", _TEXT_ONLY)
        out.append(message)
    return out


def has_image_parts(content: object) -> bool:
    """Whether OpenAI content (as a client sent it) is a list holding an ``image_url`` part. A text-only family's
    own checks of a list of parts leave such a message to `coerce_messages`, whose refusal says it is text-only."""
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and part.get("type") == "image_url" for part in content
    )


def refuse_part_lists(messages: Iterable[MessageLike], why: str) -> Iterable[MessageLike]:
    """The caller's messages (a list, when they are one to walk) with a `MessageError` saying `why` for the first
    dict whose content is a list of parts: a text-only template that takes strings runs this before
    `coerce_messages`. A list holding an image is left to `coerce_messages`, which refuses it as text-only; what is
    not a list of messages is left to it too (it says what it is)."""
    if not isinstance(messages, Iterable) or isinstance(messages, (str, bytes, Mapping)):
        return messages
    listed = list(messages)
    for index, message in enumerate(listed):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and not has_image_parts(content):
            raise MessageError(f"messages[{index}].content", why)
    return listed


_TEXT_ONLY: Final = "holds an image, and this chat protocol is text-only; use a vision-language protocol (qwen3-vl)"


def _first_image_part(message: Message) -> int:
    """The index, among the message's OpenAI content parts, of its first image part."""
    return next(k for k, part in enumerate(message.content_parts()) if part["type"] == "image_url")


def coerce_tools(tools: Iterable[ToolSpecLike] | None) -> list[ToolSpec]:
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise MessageError("tools", f"must be a list of tool specs, got {type(tools).__name__}")
    out: list[ToolSpec] = []
    for index, item in enumerate(tools):
        if isinstance(item, ToolSpec):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(_tool_spec_from_dict(item, f"tools[{index}]"))
        else:
            raise MessageError(f"tools[{index}]", f"must be a ToolSpec or a dict, got {type(item).__name__}")
    return out


def _message_from_dict(data: Mapping[str, Any], where: str) -> Message:
    if "role" not in data:
        raise MessageError(f"{where}.role", "missing; expected one of " + ", ".join(ROLES))
    role = data["role"]
    if role not in ROLES:
        raise MessageError(f"{where}.role", f"unknown role {role!r}; expected one of " + ", ".join(ROLES))
    content, images = _content(data.get("content"), f"{where}.content")
    if role in ("user", "system", "tool") and "content" not in data:
        raise MessageError(f"{where}.content", f"missing; a {role} message needs content")
    reasoning = _optional_str(data.get("reasoning_content"), f"{where}.reasoning_content")
    tool_calls: tuple[ToolCall, ...] = ()
    raw_calls = data.get("tool_calls")
    if raw_calls is not None:
        if role != "assistant":
            raise MessageError(f"{where}.tool_calls", f"only assistant messages carry tool calls, not {role}")
        if not isinstance(raw_calls, Sequence) or isinstance(raw_calls, (str, bytes)):
            raise MessageError(f"{where}.tool_calls", f"must be a list, got {type(raw_calls).__name__}")
        tool_calls = tuple(
            _tool_call_from_dict(call, f"{where}.tool_calls[{j}]", j) for j, call in enumerate(raw_calls)
        )
    return Message(
        role=role,
        content=content,
        reasoning_content=reasoning,
        tool_calls=tool_calls,
        tool_call_id=_optional_str(data.get("tool_call_id"), f"{where}.tool_call_id"),
        name=_optional_str(data.get("name"), f"{where}.name"),
        images=images,
    )


_PARTS: Final = '{"type": "text", "text": ...} and {"type": "image_url", "image_url": {"url": ...}}'


def _content(value: Any, where: str) -> tuple[str | None, tuple[ImagePart, ...]]:
    """OpenAI content: a string, null, or a list of text and image_url parts. The text parts are joined; each
    image is kept with its position in that text."""
    if value is None:
        return value, ()
    if isinstance(value, str):
        return _text(value, where), ()
    if not isinstance(value, Sequence) or isinstance(value, (bytes, bytearray)):
        raise MessageError(where, f"must be a string, null or a list of content parts, got {type(value).__name__}")
    texts: list[str] = []
    images: list[ImagePart] = []
    offset = 0
    for k, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(_text(part["text"], f"{where}[{k}].text"))
            offset += len(texts[-1])
        elif kind == "image_url":
            images.append(ImagePart(url=_image_url(part, f"{where}[{k}]"), offset=offset))
        elif kind == "text":
            raise MessageError(f"{where}[{k}].text", "a text part needs a string text")
        else:
            got = f"a part of type {kind!r}" if isinstance(kind, str) else f"a {type(part).__name__}"
            raise MessageError(f"{where}[{k}]", f"{got}; the supported parts are {_PARTS}")
    return "".join(texts), tuple(images)


def _image_url(part: Mapping[str, Any], where: str) -> str:
    if "image_url" not in part:
        raise MessageError(where, 'an image_url part needs "image_url": {"url": "..."}')
    image_url = part["image_url"]
    if isinstance(image_url, str):  # a bare string, as some clients send it
        url: Any = image_url
    elif isinstance(image_url, Mapping):
        url = image_url.get("url")
    else:
        raise MessageError(f"{where}.image_url", f'must be an object {{"url": ...}}, got {type(image_url).__name__}')
    try:
        return check_image_url(url)
    except ValueError as e:
        raise MessageError(f"{where}.image_url.url", str(e)) from e


def _optional_str(value: Any, where: str) -> str | None:
    if value is None:
        return value
    if isinstance(value, str):
        return _text(value, where)
    raise MessageError(where, f"must be a string, got {type(value).__name__}")


def _text(value: str, where: str) -> str:
    """`value` if it is valid Unicode text; a lone surrogate (from a JSON escape) cannot be tokenized."""
    try:
        check_json_value(value)
    except JsonLimitError as e:
        raise MessageError(where, f"cannot be read: {e}") from e
    return value


def _named_function(data: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], str, str]:
    """The function object of a tool call or tool spec (OpenAI nests it under "function"; the flat form is
    accepted too), where it sits, and its name, checked."""
    function = data.get("function", data)
    fn_where = f"{where}.function" if "function" in data else where
    if not isinstance(function, Mapping):
        raise MessageError(fn_where, f"must be an object, got {type(function).__name__}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise MessageError(f"{fn_where}.name", "missing or not a non-empty string")
    return function, fn_where, name


def _tool_call_from_dict(data: Any, where: str, position: int) -> ToolCall:
    if isinstance(data, ToolCall):
        return data
    if not isinstance(data, Mapping):
        raise MessageError(where, f"must be an object, got {type(data).__name__}")
    function, fn_where, name = _named_function(data, where)
    arguments = function.get("arguments", {})
    try:
        if isinstance(arguments, str):
            arguments = loads_bounded(arguments) if arguments.strip() else {}
        else:
            check_json_value(arguments)
    except json.JSONDecodeError as e:
        raise MessageError(f"{fn_where}.arguments", f"is a string but not valid JSON ({e.msg})") from e
    except JsonLimitError as e:
        raise MessageError(f"{fn_where}.arguments", f"cannot be read: {e}") from e
    if not isinstance(arguments, dict):
        raise MessageError(f"{fn_where}.arguments", f"must be a JSON object, got {type(arguments).__name__}")
    call_id = data.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise MessageError(f"{where}.id", f"must be a string, got {type(call_id).__name__}")
    return ToolCall(id=call_id or f"call_{position}", name=name, arguments=arguments)


def _tool_spec_from_dict(data: Mapping[str, Any], where: str) -> ToolSpec:
    function, fn_where, name = _named_function(data, where)
    description = function.get("description", "")
    if not isinstance(description, str):
        raise MessageError(f"{fn_where}.description", f"must be a string, got {type(description).__name__}")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise MessageError(f"{fn_where}.parameters", f"must be a JSON schema object, got {type(parameters).__name__}")
    try:
        check_json_value(parameters)
    except JsonLimitError as e:
        raise MessageError(f"{fn_where}.parameters", f"cannot be read: {e}") from e
    try:
        check_json_value(data)
    except (JsonLimitError, TypeError, ValueError) as e:
        raise MessageError(where, f"cannot be read: {e}") from e
    return ToolSpec(name=name, description=description, parameters=parameters, source=dict(data))
