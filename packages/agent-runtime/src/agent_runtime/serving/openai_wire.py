"""The OpenAI chat-completions wire format, as msgspec Structs: the request, the `chat.completion` answer, the
`chat.completion.chunk` of a stream, the model list and the error body.

Extensions (fields OpenAI does not define; clients that do not know them ignore them):

- `Delta.reasoning_content` / `ResponseMessage.reasoning_content`: the model's reasoning (vLLM's name).
- `ChatCompletionChunk.agent_event`: in agent mode, one runtime event as it happens, `event_to_dict(event)`:
  ``{"type": "assistant" | "tool_call" | "tool_result" | "compaction" | "error" | "final", ...}`` (see
  `agent_runtime.events`). Such chunks carry no choices. A ``tool_result`` whose tool returned images also has
  ``"images": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}, ...]``.
- `ChatCompletion.agent`: in agent mode, a summary of the episode (`AgentSummary`).

Encoders and decoders are built once, here. This module knows the wire format only; it runs nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from agent_runtime.outcomes import TurnFinish

__all__ = [
    "AGENT_EVENT_FIELD",
    "AgentSummary",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "Choice",
    "ChunkChoice",
    "CompletionUsage",
    "Delta",
    "ErrorBody",
    "ErrorDetail",
    "FinishReason",
    "FunctionCall",
    "ModelCard",
    "ModelList",
    "ResponseMessage",
    "StreamOptions",
    "ToolCallDelta",
    "ToolCallOut",
    "decode_request",
    "encode",
]

AGENT_EVENT_FIELD: Final = "agent_event"
"""The name of the chunk field that carries agent events in a stream."""

FinishReason = TurnFinish  # one definition, shared with the trajectory record

_INT32: Final = 2**31 - 1


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class ChatCompletionRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/chat/completions`. Unknown fields are ignored, as OpenAI-compatible servers do.

    `messages` and `tools` stay plain dicts here: `agent_protocol.coerce_messages` converts them and names the
    offending field (``messages[2].content``) when one is malformed."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-_INT32, le=_INT32)] | None = None  # vLLM's extension; <= 0 disables it
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=_INT32)] | None = None
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1, le=_INT32)] | None = None
    n: int = 1
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None  # what engines' seeds hold
    stop: str | list[str] | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None


class CompletionUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # a JSON object, as a string (OpenAI's convention)


class ToolCallOut(msgspec.Struct, kw_only=True):
    id: str
    function: FunctionCall
    type: str = "function"


class ResponseMessage(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="role", tag="assistant"):
    """The assistant message of a completion (`role` is its tag, so it is always written)."""

    content: str | None  # always written, null included
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class Choice(msgspec.Struct, kw_only=True):
    index: int
    message: ResponseMessage
    finish_reason: FinishReason
    logprobs: None = None


class AgentSummary(msgspec.Struct, kw_only=True):
    """What the server-side episode did, beside the final message (agent mode only)."""

    episode_id: str
    stop_reason: str | None
    turns: int
    tool_calls: int
    compactions: int
    reward: float


class ChatCompletion(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="object", tag="chat.completion"):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    agent: AgentSummary | None = None


class ToolCallDelta(msgspec.Struct, kw_only=True):
    index: int
    id: str
    function: FunctionCall
    type: str = "function"


class Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(
    msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="object", tag="chat.completion.chunk"
):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    agent_event: dict[str, Any] | None = None


class ModelCard(msgspec.Struct, kw_only=True, tag_field="object", tag="model"):
    id: str
    created: int
    owned_by: str = "openrlhf-agent"


class ModelList(msgspec.Struct, kw_only=True, tag_field="object", tag="list"):
    data: list[ModelCard]


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    error: ErrorDetail


_encoder: Final = msgspec.json.Encoder()
_request_decoder: Final = msgspec.json.Decoder(ChatCompletionRequest)


def encode(value: Any) -> bytes:
    """JSON bytes of a wire Struct (or of builtins)."""
    return _encoder.encode(value)


def decode_request(body: bytes) -> ChatCompletionRequest:
    """Decode a request body; raises `msgspec.DecodeError` (malformed JSON) or `msgspec.ValidationError`."""
    return _request_decoder.decode(body)
