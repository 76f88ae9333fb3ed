"""The gpt-oss family's chat format (OpenAI harmony), in Python.

Every message is `<|start|>{author}{header}<|message|>{text}{end}`. An assistant turn is one or more messages:

    <|start|>assistant<|channel|>analysis<|message|>reasoning<|end|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{"x": 1}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>

and a tool result is `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"…"<|end|>`.
Generation stops on `<|call|>` (a tool call) or `<|return|>` (the answer): openai-harmony's
`stop_tokens_for_assistant_actions`, which vLLM passes as stop tokens.

Rendering mirrors the official Hugging Face template (`tests/data/golden/templates/gpt_oss.jinja`) statement by
statement, quirks included: the system block prints the date (`today`, fixed per instance; None: the real today,
as `strftime_now` gives); a first system message becomes the developer message's instructions and later system
messages are not rendered; tools are printed as a TypeScript namespace; only the first tool call of a message is
rendered; a tool result is printed as a JSON string under the name of the last call; the analysis of a call turn
is kept until a later final answer exists, and that of a final answer only in a render that ends with it and
has no generation prompt (a training render, ending in `<|return|>`; earlier answers end in `<|end|>`).
Two readings of the caller's input, both what the template means: `reasoning_content` is the template's
`thinking`, and null content is empty text (the template would fail on None, which OpenAI clients send for a
call-only turn). A spec given flat (without `function`) is read as its function. What the template refuses
(no description on a tool, a schema it cannot print, a tool result with no call before it, harmony tags in
content, content and reasoning both on a call turn, an empty conversation) raises `MessageError`.

Parsing follows vLLM's `openai` tool parser (vllm/entrypoints/openai/tool_parsers/openai_tool_parser.py), which
reads the turn with openai-harmony's `StreamableParser` for the assistant role: a message addressed
`to=functions.NAME` (in the role or the channel part of the header, with `json` or `<|constrain|>json`) is a
call whose JSON text is its arguments; the last `final` message is the content. The header grammar is
harmony's (`parse_header_from_string`). As vLLM's chat output does, every other assistant message (analysis,
commentary preambles) is reasoning, joined with newlines. Where harmony or vLLM would raise or silently drop
(a header without `<|message|>`, an unknown channel or role, text outside a message, arguments that are not a
JSON object, a message cut off by the length limit), this parser records a coded `ParseIssue`: `unclosed_tag` for
a header without `<|message|>` or a call cut off mid-JSON, `missing_think_end` for reasoning cut off,
`invalid_json` / `invalid_arguments` / `missing_name` for a broken call, and
`malformed_turn` for an unknown channel or author, a recipient other than `functions.NAME`, or stray text.

Seams: the token transcript of an episode keeps what was sampled, where a re-render of the conversation writes
something else (see the package README, "What the transcript holds"):
- a final answer ends with the sampled `<|return|>`; in history the template writes `<|end|>` there;
- the analysis of a call turn is dropped from history once a later final answer exists, and the analysis of
  every final answer but a training render's last; the transcript keeps them;
- a model may place the recipient in the channel part (`<|channel|>commentary to=functions.NAME
  <|constrain|>json`), and a turn may hold several reasoning messages; history re-renders the template's form.
A turn cut off by the length limit is closed with `<|end|>` by the feedback: for a cut-off answer that is what
history holds too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any, Final, Literal, NamedTuple

from agent_protocol.broken_call import raw_preview
from agent_protocol.chat_protocol import ChatProtocol, generated_message
from agent_protocol.errors import JsonLimitError, MessageError
from agent_protocol.json_limits import loads_bounded
from agent_protocol.template_json import tojson
from agent_protocol.types import (
    Action,
    IssueCode,
    Message,
    MessageLike,
    ParseIssue,
    ToolCall,
    ToolSpec,
    coerce_messages,
)

__all__ = ["PROTOCOLS", "GptOssProtocol", "ReasoningEffort"]

ReasoningEffort = Literal["low", "medium", "high"]

START: Final = "<|start|>"
MESSAGE: Final = "<|message|>"
CHANNEL: Final = "<|channel|>"
CONSTRAIN: Final = "<|constrain|>"
END: Final = "<|end|>"
CALL: Final = "<|call|>"
RETURN: Final = "<|return|>"
GENERATION_PROMPT: Final = f"{START}assistant"
_CHANNEL_TAGS: Final = (f"{CHANNEL}analysis{MESSAGE}", f"{CHANNEL}final{MESSAGE}")
_HARMONY_ROLES: Final = ("system", "developer", "user", "assistant", "tool")
_EFFORTS: Final = ("low", "medium", "high")


# -- rendering -----------------------------------------------------------------------------------------------


class _Undefined:
    """What Jinja gives for a missing key: falsy, equal to nothing."""

    def __bool__(self) -> bool:
        return False


UNDEFINED: Final = _Undefined()


def _get(value: Any, key: str) -> Any:
    """`value.key` in the template, on JSON data: a mapping's item, else undefined."""
    if isinstance(value, Mapping) and key in value:
        return value[key]
    return UNDEFINED


_ARRAY_ITEM_TYPES: Final = (("string", "string[]"), ("number", "number[]"), ("integer", "number[]"),
                            ("boolean", "boolean[]"))  # fmt: skip


def _typescript_type(spec: Any) -> str:
    """The template's `render_typescript_type` macro. Its `has_object_variants` flag is set inside a loop, which
    Jinja scopes to the loop, so every `oneOf` is rendered variant by variant; that is what is mirrored here."""
    kind = _get(spec, "type")
    nullable = " | null" if _get(spec, "nullable") else ""
    if kind == "array":
        items = _get(spec, "items")
        if not items:
            return "any[]" + nullable
        item_kind = _get(items, "type")
        for name, rendered in _ARRAY_ITEM_TYPES:
            if item_kind == name:
                return rendered + nullable
        inner = _typescript_type(items)
        return ("any[]" if inner == "object | object" or len(inner) > 50 else inner + "[]") + nullable
    if isinstance(kind, (list, tuple)) and kind:
        return " | ".join(str(k) for k in kind) if len(kind) > 1 else str(kind[0])
    variants = _get(spec, "oneOf")
    if variants:
        out: list[str] = []
        variants = list(variants)
        for index, variant in enumerate(variants):
            out.append(_typescript_type(variant))
            description = _get(variant, "description")
            if description:
                out.append("// " + description)
            default = _get(variant, "default")
            if default is not UNDEFINED:
                out.append(" " * 20 + "// default: " + tojson(default))
            if index < len(variants) - 1:
                out.append(" | \n")
        return "".join(out)
    if kind == "string":
        enum = _get(spec, "enum")
        if enum:
            return '"' + '" | "'.join(str(e) for e in enum) + '"'
        return "string" + nullable
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "object":
        properties = _get(spec, "properties")
        if not properties:
            return "object"
        required = _get(spec, "required") or []
        fields = [
            f"{name}{'' if name in required else '?'}: \n{' ' * 16}{_typescript_type(prop)}"
            for name, prop in properties.items()
        ]
        return "{\n" + ", ".join(fields) + "}"
    return "any"


def _tool_declaration(function: Mapping[str, Any], where: str) -> str:
    if "description" not in function:
        raise MessageError(
            f"{where}.description",
            "missing: the official gpt-oss template refuses a tool without a description (it prints "
            "`// <description>` above each tool); give one, even an empty string",
        )
    out = ["// " + function["description"] + "\n", "type " + function["name"] + " = "]
    parameters = function.get("parameters")
    properties = _get(parameters, "properties")
    if not (parameters and properties):
        return "".join(out) + "() => any;\n\n"
    out.append("(_: {\n")
    required = _get(parameters, "required") or []
    for name, spec in properties.items():
        description = _get(spec, "description")
        if description:
            out.append("// " + description + "\n")
        out.append(name + ("" if name in required else "?") + ": " + _typescript_type(spec))
        default = _get(spec, "default")
        if default is not UNDEFINED:
            if _get(spec, "enum"):
                out.append(", // default: " + default)
            elif _get(spec, "oneOf"):
                out.append("// default: " + default)
            else:
                out.append(", // default: " + tojson(default))
        out.append(",\n")
    return "".join(out) + "}) => any;\n\n"


def _tools_namespace(specs: list[ToolSpec]) -> str:
    out = ["## functions\n\nnamespace functions {\n\n"]
    for index, spec in enumerate(specs):
        where = f"tools[{index}].function"
        try:
            out.append(_tool_declaration(spec.function, where))
        except MessageError:
            raise
        except (TypeError, AttributeError, ValueError) as e:
            raise MessageError(where, f"the official gpt-oss template cannot render this schema ({e})") from e
    return "".join(out) + "} // namespace functions"


def _check_no_channel_tags(text: str | None, where: str) -> None:
    if text is not None and any(tag in text for tag in _CHANNEL_TAGS):
        raise MessageError(
            where,
            "holds harmony channel tags, which the official gpt-oss template refuses: pass the analysis text "
            "in reasoning_content and the final answer in content",
        )


def _call_analysis(message: Message, where: str) -> str:
    """The analysis text the template writes before a call: the content or the reasoning, never both."""
    _check_no_channel_tags(message.content, f"{where}.content")
    _check_no_channel_tags(message.reasoning_content, f"{where}.reasoning_content")
    if message.content and message.reasoning_content:
        raise MessageError(
            where,
            "the official gpt-oss template refuses an assistant message with tool calls that has both content "
            "and reasoning_content: it renders either as the analysis before the call",
        )
    return message.content or message.reasoning_content or ""


def _analysis(text: str) -> str:
    return f"{CHANNEL}analysis{MESSAGE}{text}{END}"


def _call(call: ToolCall) -> str:
    """A call as the template writes it after `<|start|>assistant`."""
    return f" to=functions.{call.name}{CHANNEL}commentary json{MESSAGE}{tojson(call.arguments)}{CALL}"


def _final(content: str, end: str) -> str:
    return f"{CHANNEL}final{MESSAGE}{content}{end}"


def _tool_result(name: str, content: str | None) -> str:
    return f"{START}functions.{name} to=assistant{CHANNEL}commentary{MESSAGE}{tojson(content)}{END}"


def _user(content: str | None) -> str:
    return f"{START}user{MESSAGE}{content or ''}{END}"


def _render_loop(msgs: list[Message], *, offset: int, add_generation_prompt: bool) -> list[str]:
    """The template's message loop over everything after the system/developer blocks."""
    out: list[str] = []
    last_final = max((i for i, m in enumerate(msgs) if m.role == "assistant" and not m.tool_calls), default=-1)
    last_call: str | None = None
    for index, msg in enumerate(msgs):
        where = f"messages[{index + offset}]"
        if msg.role == "assistant":
            if msg.tool_calls:
                analysis = _call_analysis(msg, where)
                if analysis and index >= last_final:  # dropped once a later final answer exists
                    out.append(GENERATION_PROMPT + _analysis(analysis))
                out.append(GENERATION_PROMPT + _call(msg.tool_calls[0]))
                last_call = msg.tool_calls[0].name
                continue
            _check_no_channel_tags(msg.content, f"{where}.content")
            _check_no_channel_tags(msg.reasoning_content, f"{where}.reasoning_content")
            if index == len(msgs) - 1 and not add_generation_prompt:  # a training render: the answer as sampled
                if msg.reasoning_content is not None:
                    out.append(GENERATION_PROMPT + _analysis(msg.reasoning_content))
                out.append(GENERATION_PROMPT + _final(msg.content or "", RETURN))
            else:
                out.append(GENERATION_PROMPT + _final(msg.content or "", END))
                last_call = None
        elif msg.role == "tool":
            if last_call is None:
                raise MessageError(
                    f"{where}.role",
                    "the official gpt-oss template refuses a tool message with no assistant tool call before it "
                    "(it names the result after the last call)",
                )
            out.append(_tool_result(last_call, msg.content))
        elif msg.role == "user":
            out.append(_user(msg.content))
        # a system message after the first: the template renders nothing for it
    return out


# -- parsing -------------------------------------------------------------------------------------------------


class _Header(NamedTuple):
    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None


class _Piece(NamedTuple):
    """One parsed harmony message of a generated turn; `closed` is false when the text ends inside it."""

    header: _Header
    text: str
    closed: bool


_HEADER_END: Final = re.compile("|".join(re.escape(t) for t in (MESSAGE, END, CALL, RETURN, START)))
_CONTENT_END: Final = re.compile("|".join(re.escape(t) for t in (END, CALL, RETURN)))
_CHANNEL_END: Final = re.compile(r"[\s<]")
_ASCII_SPACE: Final = re.compile(r"[\t\n\x0c\r ]+")


def _parse_header(header: str, *, role: str | None) -> _Header | str:
    """openai-harmony's header grammar: the channel after `<|channel|>`, then whitespace-separated parts: the
    role (unless known), then `[to=]recipient` and a content type, in that order. Returns a problem as text."""
    channel = None
    at = header.find(CHANNEL)
    if at >= 0:
        after = header[at + len(CHANNEL) :]
        channel = _CHANNEL_END.split(after, maxsplit=1)[0]
        if not channel:
            return "it has <|channel|> with no channel name after it"
        header = header[:at] + after[len(channel) :]
    header = header.strip()
    if CONSTRAIN in header:
        header = header.replace(CONSTRAIN, " " + CONSTRAIN).strip()
    parts = [p for p in _ASCII_SPACE.split(header) if p]
    if role is None:
        if not parts:
            return "it names no author after <|start|>"
        if parts[0] in _HARMONY_ROLES:
            role = parts[0]
        elif len(parts) > 1 or parts[0].startswith("to="):
            role = "tool"
            parts.pop(0)
        else:
            return f"its author {parts[0][:40]!r} is not a harmony role"
    if parts and parts[0] == role:
        parts.pop(0)
    recipient = content_type = None
    if parts:
        count = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif count == 1 and not last.startswith(CONSTRAIN):
            recipient = last
        else:
            content_type = last
            if parts:
                before = parts.pop()
                recipient = before.removeprefix("to=")
    if parts:
        return f"its header holds unexpected text {' '.join(parts)[:60]!r}"
    return _Header(role, channel, recipient, content_type)


def _issue(code: IssueCode, message: str) -> ParseIssue:
    return ParseIssue(code=code, message=message)


def _split_messages(text: str) -> tuple[list[_Piece], list[ParseIssue]]:
    """The harmony messages of one generated turn (which starts inside the first header, after
    `<|start|>assistant`), and what was wrong with the ones that could not be read."""
    pieces: list[_Piece] = []
    issues: list[ParseIssue] = []
    pos, first = 0, True
    while pos < len(text):
        if not first:
            if not text.startswith(START, pos):
                found = text.find(START, pos)
                issues.append(_issue("malformed_turn", "Text after the end of a message was ignored: every message "
                                     "starts with <|start|>assistant."))  # fmt: skip
                if found < 0:
                    break
                pos = found
            pos += len(START)
        header_end = _HEADER_END.search(text, pos)
        if header_end is None:
            issues.append(_issue("unclosed_tag", "Your turn was cut off inside a message header; nothing in that "
                                 "message was read."))  # fmt: skip
            break
        header, marker = text[pos : header_end.start()], header_end.group()
        role = "assistant" if first else None
        first = False
        if marker != MESSAGE:
            issues.append(_issue("unclosed_tag", f"A message header was ended by {marker} instead of <|message|>, "
                                 "so that message was not read. Write <|channel|>NAME then <|message|>."))  # fmt: skip
            pos = header_end.start() if marker == START else header_end.end()
            continue
        parsed = _parse_header(header, role=role)
        body_start = header_end.end()
        body_end = _CONTENT_END.search(text, body_start)
        if body_end is None:
            body, closed, pos = text[body_start:], False, len(text)
        else:
            body, closed, pos = text[body_start : body_end.start()], True, body_end.end()
        if isinstance(parsed, str):
            issues.append(_issue("malformed_turn", f"A message could not be read: {parsed}."))
            continue
        pieces.append(_Piece(parsed, body, closed))
    return pieces, issues


def _function_call(piece: _Piece, call_id: str) -> ToolCall:
    name = (piece.header.recipient or "").removeprefix("functions.")
    raw = raw_preview(piece.text)

    def broken(code: IssueCode, message: str) -> ToolCall:
        return ToolCall(id=call_id, name=name, error=_issue(code, message), raw=raw)

    if not name:
        return broken("missing_name", "The call is addressed to functions. with no function name after it.")
    content_type = piece.header.content_type
    if content_type and "json" not in content_type:
        return broken("invalid_arguments", f"The call to {name} has content type {content_type[:40]!r}; "
                      "function calls take JSON arguments (<|constrain|>json).")  # fmt: skip
    try:
        arguments = loads_bounded(piece.text)
    except JsonLimitError as e:
        return broken("invalid_json", f"The arguments of the call to {name} cannot be read: {e}.")
    except json.JSONDecodeError as e:
        if not piece.closed:
            return broken("unclosed_tag", f"The call to {name} was cut off before <|call|> and its JSON is "
                          "incomplete.")  # fmt: skip
        return broken("invalid_json", f"The arguments of the call to {name} are not valid JSON ({e.msg} at "
                      f"character {e.pos}). Write one JSON object after <|message|>.")  # fmt: skip
    if not isinstance(arguments, dict):
        return broken("invalid_arguments", f"The arguments of the call to {name} must be a JSON object, not "
                      f"{type(arguments).__name__}.")  # fmt: skip
    return ToolCall(id=call_id, name=name, arguments=arguments)


def parse_harmony_turn(text: str, *, call_id_prefix: str = "call") -> Action:
    """One generated gpt-oss turn (the text after `<|start|>assistant`) as an `Action`; see the module docstring."""
    pieces, issues = _split_messages(text)
    reasoning: list[str] = []
    content: str | None = None
    calls: list[ToolCall] = []
    for piece in pieces:
        header = piece.header
        if header.role != "assistant":
            issues.append(_issue("malformed_turn", f"You wrote a message as {header.role}; it was ignored. Write "
                                 "only assistant messages."))  # fmt: skip
        elif header.recipient is not None and header.recipient.startswith("functions."):
            calls.append(_function_call(piece, f"{call_id_prefix}_{len(calls)}"))
        elif header.channel == "final":
            content = piece.text
        else:
            reasoning.append(piece.text)
            if header.channel not in ("analysis", "commentary"):
                issues.append(_issue("malformed_turn", f"A message in channel {str(header.channel)[:40]!r} was read "
                                     "as reasoning: the channels are analysis, commentary and final."))  # fmt: skip
            elif header.recipient is not None:
                issues.append(_issue("malformed_turn", f"A message addressed to {header.recipient[:40]!r} was read "
                                     "as reasoning: only functions.NAME can be called."))  # fmt: skip
            elif not piece.closed:
                issues.append(_issue("missing_think_end", "Your reasoning was cut off before <|end|>, so no "
                                     "answer or tool call followed it."))  # fmt: skip
    return Action(
        content=content or "",
        reasoning_content="\n".join(reasoning) if reasoning else None,
        tool_calls=tuple(calls),
        error=issues[0] if issues else None,
    )


# -- the protocol --------------------------------------------------------------------------------------------


class GptOssProtocol(ChatProtocol):
    name = "gpt-oss"
    end_of_turn = END
    stop_texts = (RETURN, CALL)

    def __init__(self, *, reasoning_effort: ReasoningEffort = "medium", today: date | None = None) -> None:
        if reasoning_effort not in _EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {', '.join(_EFFORTS)}; got {reasoning_effort!r}")
        if today is not None and not isinstance(today, date):
            raise TypeError(f"today must be a datetime.date or None, got {type(today).__name__}")
        self.reasoning_effort = reasoning_effort
        self.today = today if today is not None else date.today()

    def __repr__(self) -> str:
        return f"GptOssProtocol(reasoning_effort={self.reasoning_effort!r}, today={self.today.isoformat()!r})"

    @property
    def turn_end_texts(self) -> tuple[str, ...]:
        return (CALL, RETURN)

    @property
    def generation_prompt(self) -> str:
        return GENERATION_PROMPT

    def _system_block(self, has_tools: bool) -> str:
        calls = "\nCalls to these tools must go to the commentary channel: 'functions'." if has_tools else ""
        return (
            f"{START}system{MESSAGE}You are ChatGPT, a large language model trained by OpenAI.\n"
            f"Knowledge cutoff: 2024-06\nCurrent date: {self.today.strftime('%Y-%m-%d')}\n\n"
            f"Reasoning: {self.reasoning_effort}\n\n"
            f"# Valid channels: analysis, commentary, final. Channel must be included for every message.{calls}{END}"
        )

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        specs = specs or []
        if not msgs:
            raise MessageError("messages", "empty: the official gpt-oss template refuses a conversation with none")
        out = [self._system_block(bool(specs))]
        offset = 1 if msgs[0].role == "system" else 0
        developer = (msgs[0].content or "") if offset else ""
        if developer or specs:
            instructions = f"# Instructions\n\n{developer}\n\n" if developer else ""
            listing = "# Tools\n\n" + _tools_namespace(specs) if specs else ""
            out.append(f"{START}developer{MESSAGE}{instructions}{listing}{END}")
        out.extend(_render_loop(msgs[offset:], offset=offset, add_generation_prompt=add_generation_prompt))
        if add_generation_prompt:
            out.append(GENERATION_PROMPT)
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        if msg.tool_calls:  # harmony generates one call per turn; the template renders a message's first call
            analysis = _call_analysis(msg, "message")
            return (_analysis(analysis) + GENERATION_PROMPT if analysis else "") + _call(msg.tool_calls[0])
        _check_no_channel_tags(msg.content, "message.content")
        _check_no_channel_tags(msg.reasoning_content, "message.reasoning_content")
        reasoning = msg.reasoning_content
        return (_analysis(reasoning) + GENERATION_PROMPT if reasoning is not None else "") + _final(
            msg.content or "", RETURN
        )

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        """Tool results and user messages after a generated turn. `ended_by` changes nothing: the sampled
        `<|call|>` or `<|return|>` stays in the transcript (the template's history writes `<|end|>` after an
        answer: a seam). A tool result is named by its message's `name` (the call's; the template takes the
        last call's name, which is the same for harmony's one call per turn; a result without a name is written
        `functions.`, as the template names the result of a call whose name was empty)."""
        msgs = coerce_messages(messages)
        if not msgs:
            raise MessageError("messages", "feedback needs at least one tool result or user message")
        out = [] if turn_closed else [END]
        for index, msg in enumerate(msgs):
            if msg.role == "tool":
                out.append(_tool_result(msg.name or "", msg.content))
            elif msg.role == "user":
                out.append(_user(msg.content))
            else:
                raise MessageError(
                    f"messages[{index}].role",
                    f"feedback carries tool or user messages, not {msg.role} (the official gpt-oss template "
                    "renders no system message after the first)",
                )
        out.append(GENERATION_PROMPT)
        return "".join(out)

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        return parse_harmony_turn(text, call_id_prefix=call_id_prefix)


def _gpt_oss(*, reasoning_effort: ReasoningEffort = "medium", today: date | None = None) -> ChatProtocol:
    return GptOssProtocol(reasoning_effort=reasoning_effort, today=today)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"gpt-oss": _gpt_oss}
