"""The Llama 4 instruct chat format (Scout / Maverick: header blocks, JSON tool calls after a python block), in
Python.

    <|begin_of_text|><|header_start|>system<|header_end|>\\n\\nEnvironment: ipython\\n{system}<|eot|>
    <|header_start|>user<|header_end|>\\n\\n{tool instructions and specs}{first user message}<|eot|>
    <|header_start|>assistant<|header_end|>\\n\\n<|python_start|>{content}<|python_end|>{"name": "f",
    "parameters": {...}}<|eot|><|header_start|>ipython<|header_end|>\\n\\n"{result}"<|eot|>

Mirrors the official template (the one Hugging Face transformers ships as `Llama4Processor`'s chat template,
tests/data/golden/templates/SOURCES.md) statement by statement: BOS in every render; a system block only when the
caller gave a system message (trimmed), with `Environment: ipython` when tools were given (an empty list too); the
tool specs (`tojson(indent=4)`) in the first message after the system one by default, whatever its role, its
content trimmed (`tools_in_user_message=False`: in the system block, and then nowhere when there is no system
message, which this protocol warns about once); every other message untrimmed in its own role's header; a
tool-call turn as `<|python_start|>{content}<|python_end|>` followed by each call's JSON object, concatenated with
nothing between them (the template takes any number of calls); tool results in the `ipython` role dumped as JSON
strings. The template writes no date (it sets `date_string` and never prints it), so there is no `today` option.
Two places follow vLLM's chat preprocessing rather than the bare Jinja: null content renders as empty text (Jinja
would print "None" or fail), and string arguments are parsed to the object they hold. Content given as a list of
text parts is joined, as the template joins it, except in three places where the template writes something else
and which are refused: a first system message of several parts (it keeps the first part), the message that
carries the tools (it writes the list's Python repr) and a tool message (it writes the list as JSON). An assistant
message given as a dict with `"tool_calls": []` is left out, as the template writes nothing for it (a `Message`
with no calls stands for one without the key). Not supported: image parts (`<|image|>`, which Llama 4's processor
expands in its own way, which no engine here does; a message with an image is refused, as for every text-only
family).

Parsing follows vLLM's `llama4_json` tool parser, which is its `llama3_json` one (`Llama3JsonToolParser`, registered
under both names): a leading `<|python_start|>...<|python_end|>` block is the turn's content, and what follows is
read as `llama3_json` reads a turn (`agent_protocol.protocols.llama3.parse_llama3_turn`: every `{` starts a JSON
candidate, an object with `name` and `parameters`/`arguments` is a call, several may follow one another). A turn
without the block is read the same way. Llama 4 has no reasoning channel; the pythonic format (`[f(x=1)]`, vLLM's
`llama4_pythonic` parser with vLLM's own template) is not this template's.

Turns end on `<|eot|>` (what the template writes after every turn) or `<|eom|>` (in the model's
`generation_config` stop list); engines also stop on `<|end_of_text|>`. Seams, where the transcript keeps what was
sampled and a re-render differs: a turn closed by `<|eom|>` (re-rendered with `<|eot|>`), a call written without
the python block (the history writes `<|python_start|><|python_end|>` before it), text after the calls (moved into
the block), and a turn ended by `<|end_of_text|>` or cut off (the feedback closes it with `<|eot|>`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Final

from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import MessageError, TemplateGapWarning
from agent_protocol.protocols.llama3 import _SYSTEM_TOOLS, _USER_TOOLS, _tool_listing, parse_llama3_turn
from agent_protocol.protocols.llama3 import EOT as LLAMA3_EOT
from agent_protocol.template_json import tojson
from agent_protocol.types import Action, Message, MessageLike, ToolSpec, has_image_parts

__all__ = ["PROTOCOLS", "Llama4Protocol", "ToolsNotShownWarning", "parse_llama4_turn"]

BOS: Final = "<|begin_of_text|>"
EOT: Final = "<|eot|>"
EOM: Final = "<|eom|>"
END_OF_TEXT: Final = "<|end_of_text|>"
PYTHON_START: Final = "<|python_start|>"
PYTHON_END: Final = "<|python_end|>"

_END_MARKERS: Final = (EOT, EOM, END_OF_TEXT)


class ToolsNotShownWarning(TemplateGapWarning):
    """Tools were given where the official Llama 4 template shows them nowhere (tools in the system block, and no
    system message)."""


def _header(role: str) -> str:
    return f"<|header_start|>{role}<|header_end|>\n\n"


class Llama4Protocol(ChatProtocol):
    name = "llama4"
    end_of_turn = EOT
    stop_texts = (EOT, EOM, END_OF_TEXT)

    def __init__(self, *, tools_in_user_message: bool = True) -> None:
        self.tools_in_user_message = tools_in_user_message
        self._warned_tools = False

    def __repr__(self) -> str:
        return f"Llama4Protocol(tools_in_user_message={self.tools_in_user_message})"

    @property
    def turn_end_texts(self) -> tuple[str, ...]:
        return (EOT, EOM)

    @property
    def generation_prompt(self) -> str:
        return _header("assistant")

    # -- rendering ---------------------------------------------------------------------------------------

    def prepare_raw(self, messages: Iterable[MessageLike], *, tools_given: bool) -> Iterable[MessageLike]:
        """Refuses content given as a list of parts where the template does not join the parts' text (see
        `_refuse_part_lists`) and leaves out what it renders nothing for (see `_without_empty_call_lists`)."""
        messages = list(messages)
        tools_message = tools_given and self.tools_in_user_message
        _refuse_part_lists(messages, tools_message=tools_message)
        return _without_empty_call_lists(messages, tools_message=tools_message)

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        # `specs` None: no tools given, which the template tells from an empty list
        if not msgs:
            raise MessageError("messages", "the official Llama 4 template cannot render an empty conversation")
        first = 1 if msgs[0].role == "system" else 0
        out = [BOS]
        if first:
            out.append(self._system_block((msgs[0].content or "").strip(), specs))
        elif specs and not self.tools_in_user_message:
            self._warn_tools_not_shown()
        if specs is not None and self.tools_in_user_message:
            if first >= len(msgs):
                raise MessageError(
                    "messages",
                    "the official Llama 4 template refuses tools without a first message after the system one to "
                    "put them in ('Cannot put tools in the first user message when there's no first user message!')",
                )
            tools_block = _USER_TOOLS + _tool_listing(specs) + (msgs[first].content or "").strip()
            out.append(_header("user") + tools_block + EOT)
            first += 1
        out.extend(_render_message(msg) for msg in msgs[first:])
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def _system_block(self, system: str, specs: list[ToolSpec] | None) -> str:
        out = [_header("system")]
        if specs is not None:
            out.append("Environment: ipython\n")
            if not self.tools_in_user_message:
                out.append(_SYSTEM_TOOLS + _tool_listing(specs))
        out.append(system + EOT)
        return "".join(out)

    def _warn_tools_not_shown(self) -> None:
        if self._warned_tools:
            return
        self._warned_tools = True
        warnings.warn(
            "llama4: with tools_in_user_message=False the official Llama 4 template lists the tools in the system "
            "block, which it writes only when the conversation starts with a system message; this one does not, "
            "so the model is never shown the tools",
            ToolsNotShownWarning,
            stacklevel=4,
        )

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        """`ended_by` does not matter here: `<|eot|>` and `<|eom|>` both close the turn and are already in the
        transcript, and the next block starts with its own header."""
        _refuse_part_lists(messages, tools_message=False, first=False)
        msgs = feedback_messages(messages)
        body = "".join(_render_message(msg) for msg in msgs)
        return ("" if turn_closed else EOT) + body + self.generation_prompt

    def render_generation(self, message: MessageLike) -> str:
        return _render_message(generated_message(message)).removeprefix(_header("assistant"))

    # -- parsing -----------------------------------------------------------------------------------------

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        return parse_llama4_turn(text, call_id_prefix=call_id_prefix)


def _refuse_part_lists(messages: Sequence[MessageLike], *, tools_message: bool, first: bool = True) -> None:
    """Content given as a list of parts renders as the parts' text joined everywhere but in three places, where
    the template does something else with the list, and which are refused: a first system message of several
    parts (the template takes the first part's text), the message that carries the tools (it writes the list's
    Python repr) and a tool message (it writes the list as JSON)."""
    carrier = None
    if first and messages:
        head = messages[0]
        carrier = 1 if isinstance(head, dict) and head.get("role") == "system" else 0
        if isinstance(head, Message):
            carrier = 1 if head.role == "system" else 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            continue
        if has_image_parts(message["content"]):
            continue  # refused by `coerce_messages` as text-only, which is what is wrong with it
        parts = message["content"]
        where = f"messages[{index}].content"
        if message.get("role") == "tool":
            raise MessageError(where, "the official Llama 4 template writes a tool message's list of parts as JSON")
        if first and index == 0 and message.get("role") == "system" and len(parts) != 1:
            raise MessageError(where, "the official Llama 4 template keeps only the first part of a system message")
        if tools_message and index == carrier:
            raise MessageError(
                where,
                "the official Llama 4 template writes the list of parts of the message that carries the tools "
                "as a Python list",
            )


def _without_empty_call_lists(messages: list[MessageLike], *, tools_message: bool) -> list[MessageLike]:
    """`messages` less each assistant message given with `"tool_calls": []`: the template's loop writes nothing at
    all for one (its plain branch skips a message that has the key, its call branch one whose list is empty), as
    vLLM passes it. The message that carries the tools is kept (the template writes its content there)."""
    carrier = 1 if messages and _role(messages[0]) == "system" else 0
    kept = [
        message
        for index, message in enumerate(messages)
        if not (
            isinstance(message, dict)
            and message.get("role") == "assistant"
            and message.get("tool_calls") == []
            and not (tools_message and index == carrier)
        )
    ]
    if kept and messages and kept[0] is not messages[0] and _role(kept[0]) == "system":
        raise MessageError(
            "messages[0]",
            "an assistant message with an empty tool_calls list before a system message: the official Llama 4 "
            "template renders nothing for it, and the protocol cannot render the system message after it as the "
            "template does; leave tool_calls out",
        )
    return kept


def _role(message: MessageLike) -> object:
    return message.role if isinstance(message, Message) else message.get("role")


def _render_message(msg: Message) -> str:
    """One message of the template's loop (after the system block and the tools' message)."""
    if msg.role == "tool":
        return _header("ipython") + tojson(msg.content or "") + EOT
    if not msg.tool_calls:
        return _header(msg.role) + (msg.content or "") + EOT
    calls = "".join(f'{{"name": "{call.name}", "parameters": {tojson(call.arguments)}}}' for call in msg.tool_calls)
    return _header("assistant") + PYTHON_START + (msg.content or "") + PYTHON_END + calls + EOT


def parse_llama4_turn(text: str, *, call_id_prefix: str = "call") -> Action:
    """One generated turn: the python block's text as content, then the calls after it, read as `llama3_json`
    reads them. A block with no call after it is no call turn: the whole turn stays content."""
    body, closed = text, False
    for marker in _END_MARKERS:
        if body.endswith(marker):
            body, closed = body[: -len(marker)], True
            break
    if not body.startswith(PYTHON_START) or PYTHON_END not in body:
        return _llama3_json(body, closed, call_id_prefix)
    inner, _, rest = body[len(PYTHON_START) :].partition(PYTHON_END)
    after = _llama3_json(rest, closed, call_id_prefix)
    if not after.tool_calls:
        return Action(content=body)
    content = "\n".join(piece for piece in (inner, after.content or "") if piece)
    return Action(content=content, tool_calls=after.tool_calls)


def _llama3_json(body: str, closed: bool, call_id_prefix: str) -> Action:
    """`llama3_json`'s reading of a turn's text without its end token; Llama 3's end token stands in for
    Llama 4's, so that the parser tells a closed turn (bad JSON) from a cut-off one as it does for Llama 3."""
    return parse_llama3_turn(body + (LLAMA3_EOT if closed else ""), call_id_prefix=call_id_prefix)


def _llama4(*, tools_in_user_message: bool = True) -> ChatProtocol:
    return Llama4Protocol(tools_in_user_message=tools_in_user_message)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"llama4": _llama4}
