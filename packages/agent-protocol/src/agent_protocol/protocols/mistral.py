"""The Mistral family's chat formats: Mistral-7B-Instruct-v0.3 ("v3" tokenizer) and Mistral-Small-3.2-2506.

Both mirror a community Jinja port of Mistral's reference tokenization (mistral-common has no HF template; see
tests/data/golden/templates/SOURCES.md), statement by statement:

    v0.3:      <s>[AVAILABLE_TOOLS] [{...}][/AVAILABLE_TOOLS][INST] question[/INST][TOOL_CALLS] [{"name": "f",
               "arguments": {...}, "id": "Xq3tB7mZ1"}]</s>[TOOL_RESULTS] {"content": 18, "call_id": "Xq3tB7mZ1"}
               [/TOOL_RESULTS] It is 18 °C.</s>
    Small 3.2: <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][AVAILABLE_TOOLS][{...}][/AVAILABLE_TOOLS][INST]question[/INST]
               [TOOL_CALLS]f[CALL_ID]Xq3tB7mZ1[ARGS]{...}</s>[TOOL_RESULTS]Xq3tB7mZ1[TOOL_CONTENT]18[/TOOL_RESULTS]
               It is 18 °C.</s>

There is no generation prompt (the model writes right after `[/INST]` or `[/TOOL_RESULTS]`), every assistant turn
ends with `</s>`, and neither format has reasoning. What the templates refuse raises `MessageError`: roles that do
not alternate user/assistant after the optional system message (tool results and tool-call turns are skipped,
so a user message right after the tool results of a turn that followed a user message is refused), a tool call
id or tool result id that is not 9 characters long, a system message after the first (v0.3).

Parsing follows vLLM's `mistral` tool parser (vllm/tool_parsers/mistral_tool_parser.py): content is the text
before the first `[TOOL_CALLS]`; v0.3 (tokenizers before v11) writes one JSON list after it, read whole or, failing
that, from the first `[{` to the last `}]`; Small 3.2 (v11+) writes `[TOOL_CALLS]name[ARGS]{json}` per call (vLLM
sees `name{json}` once the control tokens are decoded away, and that form is read too), optionally with
`[CALL_ID]id` before `[ARGS]`. Where it differs, deliberately: a broken call is kept as a `ToolCall` with a coded
`ParseIssue` (vLLM drops it, or returns a call whose arguments are not JSON) so the environment can answer it;
several `[TOOL_CALLS]` in a v0.3 turn are all read (vLLM raises); a call id the model wrote itself is kept when it
is valid (9 ASCII letters or digits, unique in the turn), so that re-rendering the turn gives back what was
sampled; otherwise the id is derived from `call_id_prefix` and the call's position (vLLM draws a random one).

Seams, where the templates are not append-only and the token transcript keeps what the model saw:
- `[AVAILABLE_TOOLS]` is rendered right before the *last* user message: a user message given as feedback does
  not move the block; the transcript keeps it before the user message that was last when the prompt was made.
- v0.3 writes the system message into the last message only when that is a user message: the prompt carries it
  in its final `[INST]`, and a render of the finished conversation (ending with the model's answer) has none.
- a call the model wrote differently from the template's rendering (no call id, keys in another order, spacing)
  re-renders as the template writes it, with the id the parser gave the call.
Two renders differ from the official template on purpose: an empty tool list renders no `[AVAILABLE_TOOLS]`
block (the template prints an empty one for `tools=[]`; mistral-common prints none), and `tool_calls: []` is no
tool call (v0.3's template opens a `[TOOL_CALLS] [` it never closes). This module knows text, not tokens.
"""

from __future__ import annotations

import hashlib
import json
import string
from abc import abstractmethod
from collections.abc import Sequence
from datetime import date
from typing import Any, Final

from agent_protocol.broken_call import broken_call
from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import JsonLimitError, MessageError
from agent_protocol.json_call import arguments_object, json_kind
from agent_protocol.json_limits import loads_bounded
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Action, IssueCode, Message, MessageLike, ToolCall, ToolSpec

__all__ = ["PROTOCOLS", "MistralProtocol", "MistralSmall32Protocol", "MistralV3Protocol", "mistral_call_id"]

BOS: Final = "<s>"
EOS: Final = "</s>"
TOOL_CALLS: Final = "[TOOL_CALLS]"
CALL_ID: Final = "[CALL_ID]"
ARGS: Final = "[ARGS]"
CALL_ID_LENGTH: Final = 9
_ID_ALPHABET: Final = string.ascii_letters + string.digits
_SMALL_3_2_SYSTEM: Final = (
    "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup headquartered "
    "in Paris.\nYour knowledge base was last updated on 2023-10-01. The current date is {today}.\n\nWhen you're not "
    "sure about some information or when the user's request requires up-to-date or specific data, you must use "
    "the available tools to fetch the information. Do not hesitate to use tools whenever they can provide a more "
    "accurate or complete response. If no relevant tools are available, then clearly state that you don't have "
    "the information and avoid making up anything.\n\nIf the user's question is not clear, ambiguous, or does not "
    "provide enough context for you to accurately answer the question, you do not try to answer it right away and "
    'you rather ask the user to clarify their request (e.g. "What are some good restaurants around me?" => "Where '
    'are you?" or "When is the next flight to Tokyo" => "Where do you travel from?").\nYou are always very '
    "attentive to dates, and when asked about information at specific dates, you discard information that is at "
    "another date.\nYou follow these instructions in all languages, and always respond to the user in the language "
    "they use or request.\nNext sections describe the capabilities that you have.\n\n# WEB BROWSING INSTRUCTIONS\n\n"
    "You cannot perform any web search or access internet to open URLs, links etc. If it seems like the user is "
    "expecting you to do so, you clarify the situation and ask the user to copy paste the text directly in the "
    "chat.\n\n# MULTI-MODAL INSTRUCTIONS\n\nYou have the ability to read images, but you cannot generate images. "
    "You also cannot transcribe audio files or videos.\nYou cannot read nor transcribe audio files or videos.\n\n"
    "# TOOL CALLING INSTRUCTIONS\n\nYou may have access to tools that you can use to fetch information or perform "
    "actions. You must use these tools in the following situations:\n\n1. When the request requires up-to-date "
    "information.\n2. When the request requires specific data that you do not have in your knowledge base.\n3. When "
    "the request involves actions that you cannot perform without tools.\n\nAlways prioritize using tools to provide "
    "the most accurate and helpful response. If tools are not available, inform the user that you cannot perform "
    "the requested action at the moment."
)


def mistral_call_id(prefix: str, position: int) -> str:
    """A valid Mistral call id (9 ASCII letters and digits) for the call at `position` of a turn, derived from the
    turn's `call_id_prefix`: the same inputs give the same id, different turns different ids."""
    digest = hashlib.sha256(f"{prefix}\x00{position}".encode("utf-8", "surrogatepass")).digest()
    number = int.from_bytes(digest[:8], "big")  # 2**64 > 62**9
    chars = []
    for _ in range(CALL_ID_LENGTH):
        number, rest = divmod(number, len(_ID_ALPHABET))
        chars.append(_ID_ALPHABET[rest])
    return "".join(chars)


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and len(value) == CALL_ID_LENGTH and value.isascii() and value.isalnum()


class MistralProtocol(ChatProtocol):
    """What both Mistral formats share: `</s>` closing every assistant turn, no generation prompt, the
    alternation rule, and feedback and generated turns that are the body of the template (see the module
    docstring)."""

    end_of_turn = EOS
    stop_texts = (EOS,)

    @property
    def generation_prompt(self) -> str:
        return ""

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        has_system = bool(msgs) and msgs[0].role == "system"
        loop = msgs[1:] if has_system else msgs
        offset = 1 if has_system else 0
        _check_alternation(loop, offset)
        return BOS + self._render(loop, offset, system=msgs[0] if has_system else None, specs=specs or [], opening=True)

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        msgs = feedback_messages(messages)
        return ("" if turn_closed else EOS) + self._render(msgs, 0, system=None, specs=[], opening=False)

    def render_generation(self, message: MessageLike) -> str:
        """The turn as the template writes it in history: no generation prompt comes before it."""
        return self._render([generated_message(message)], 0, system=None, specs=[], opening=False)

    @abstractmethod
    def _render(
        self, msgs: list[Message], offset: int, *, system: Message | None, specs: list[ToolSpec], opening: bool
    ) -> str:
        """`msgs` as the template writes them after `<s>` (their indexes in the caller's list start at `offset`).
        `opening`: they start the conversation (the system block goes first); otherwise they continue it."""


class MistralV3Protocol(MistralProtocol):
    """Mistral-7B-Instruct-v0.3: `[INST] ...[/INST]`, calls as one JSON list after `[TOOL_CALLS] `."""

    name = "mistral-v0.3"

    def __repr__(self) -> str:
        return "MistralV3Protocol()"

    def _render(
        self, msgs: list[Message], offset: int, *, system: Message | None, specs: list[ToolSpec], opening: bool
    ) -> str:
        if opening and not msgs and system is None:
            raise MessageError("messages", "the official template cannot render an empty conversation")
        last_user = next((m for m in reversed(msgs) if m.role == "user"), None)
        out: list[str] = []
        for index, msg in enumerate(msgs):
            where = f"messages[{index + offset}]"
            if msg.role == "user":
                if specs and msg == last_user:  # equality, as the template's `message == user_messages[-1]`
                    out.append(_v3_tools(specs))
                content = _required(msg, where)
                if index == len(msgs) - 1 and system is not None:
                    out.append(f"[INST] {_required(system, 'messages[0]')}\n\n{content}[/INST]")
                else:
                    out.append(f"[INST] {content}[/INST]")
            elif msg.tool_calls:
                calls = ", ".join(_v3_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(msg.tool_calls))
                out.append(f"{TOOL_CALLS} [{calls}]{EOS}")
            elif msg.role == "assistant":
                out.append(f" {str(msg.content).strip()}{EOS}")  # the template's `content|trim`: null prints None
            elif msg.role == "tool":
                call_id = _checked_id(msg.tool_call_id, f"{where}.tool_call_id")
                out.append(f'[TOOL_RESULTS] {{"content": {msg.content}, "call_id": "{call_id}"}}[/TOOL_RESULTS]')
            else:
                raise MessageError(
                    f"{where}.role",
                    "the official Mistral v0.3 template refuses a system message after the first message "
                    "(only user and assistant roles, with an optional initial system message)",
                )
        return "".join(out)

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        body, closed = _strip_eos(text)
        first = body.find(TOOL_CALLS)
        if first < 0:
            return Action(content=body.strip())
        ids = _Ids(call_id_prefix)
        calls: list[ToolCall] = []
        for segment in body[first + len(TOOL_CALLS) :].split(TOOL_CALLS):
            calls.extend(_v3_segment(segment, closed=closed, ids=ids))
        return Action(content=body[:first].strip(), tool_calls=tuple(calls))


class MistralSmall32Protocol(MistralProtocol):
    """Mistral-Small-3.2-24B-Instruct-2506: a default system prompt with the date, `[TOOL_CALLS]name[CALL_ID]id
    [ARGS]{json}` per call, `[TOOL_RESULTS]id[TOOL_CONTENT]...`."""

    name = "mistral-small-3.2"

    def __init__(self, today: date) -> None:
        self.today = today

    def __repr__(self) -> str:
        return f"MistralSmall32Protocol(today={self.today.isoformat()})"

    def _render(
        self, msgs: list[Message], offset: int, *, system: Message | None, specs: list[ToolSpec], opening: bool
    ) -> str:
        out: list[str] = []
        if opening:
            prompt = (
                _required(system, "messages[0]") if system is not None else _SMALL_3_2_SYSTEM.format(today=self.today)
            )
            out.append(f"[SYSTEM_PROMPT]{prompt}[/SYSTEM_PROMPT]")
        last_user = next((m for m in reversed(msgs) if m.role == "user"), None)
        for index, msg in enumerate(msgs):
            where = f"messages[{index + offset}]"
            if msg.role == "system":
                out.append(f"[SYSTEM_PROMPT]{_required(msg, where)}[/SYSTEM_PROMPT]")
            elif msg.role == "user":
                if specs and msg == last_user:
                    listing = tojson_kept([spec.to_openai() for spec in specs])
                    out.append(f"[AVAILABLE_TOOLS]{listing}[/AVAILABLE_TOOLS]")
                out.append(f"[INST]{_required(msg, where)}[/INST]")
            elif msg.role == "assistant" and msg.tool_calls:
                for j, call in enumerate(msg.tool_calls):
                    call_id = _checked_id(call.id, f"{where}.tool_calls[{j}].id")
                    out.append(f"{TOOL_CALLS}{call.name}{CALL_ID}{call_id}{ARGS}{tojson(call.arguments)}")
                out.append(EOS)
            elif msg.role == "assistant":
                out.append(_required(msg, where) + EOS)
            else:
                call_id = _checked_id(msg.tool_call_id, f"{where}.tool_call_id")
                out.append(f"[TOOL_RESULTS]{call_id}[TOOL_CONTENT]{msg.content}[/TOOL_RESULTS]")
        return "".join(out)

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        body, closed = _strip_eos(text)
        pieces = body.split(TOOL_CALLS)
        ids = _Ids(call_id_prefix)
        last = len(pieces) - 2
        calls = [_v11_call(piece, closed=closed or k < last, ids=ids) for k, piece in enumerate(pieces[1:])]
        return Action(content=pieces[0], tool_calls=tuple(calls))


# -- rendering helpers ------------------------------------------------------------------------------------


def _check_alternation(loop: list[Message], offset: int) -> None:
    """The templates' check: after the optional system message, the messages that are neither tool results nor
    tool-call turns alternate user / not user, starting with a user message."""
    counted = 0
    for index, msg in enumerate(loop):
        if msg.role == "tool" or msg.tool_calls:
            continue
        if (msg.role == "user") != (counted % 2 == 0):
            raise MessageError(
                f"messages[{index + offset}].role",
                "the official Mistral template refuses this conversation: after the optional system message, "
                "roles must alternate user/assistant/user/assistant/... (tool results and tool-call turns are "
                f"skipped), and this {msg.role} message breaks the alternation",
            )
        counted += 1


def _required(msg: Message, where: str) -> str:
    if msg.content is None:
        raise MessageError(f"{where}.content", f"the official template cannot render a {msg.role} message without text")
    return msg.content


def _checked_id(value: str | None, where: str) -> str:
    if value is None or len(value) != CALL_ID_LENGTH:
        raise MessageError(
            where,
            f"the official Mistral template refuses it: tool call ids must be {CALL_ID_LENGTH} characters long "
            f"(alphanumeric), got {value!r}",
        )
    return value


def _v3_tools(specs: list[ToolSpec]) -> str:
    """The v0.3 tools block: each `function` object written key by key, strings pasted unescaped as the
    template does, other values with `tojson`; a `return` key is left out."""
    rendered = []
    for spec in specs:
        fields = []
        for key, value in spec.function.items():
            if key == "return":
                continue
            fields.append(f'"{key}": "{value}"' if isinstance(value, str) else f'"{key}": {tojson(value)}')
        rendered.append('{"type": "function", "function": {' + ", ".join(fields) + "}}")
    return "[AVAILABLE_TOOLS] [" + ", ".join(rendered) + "][/AVAILABLE_TOOLS]"


def _v3_call(call: ToolCall, where: str) -> str:
    function = tojson({"name": call.name, "arguments": call.arguments})
    return f'{function[:-1]}, "id": "{_checked_id(call.id, f"{where}.id")}"}}'


# -- parsing helpers --------------------------------------------------------------------------------------


class _Ids:
    """The ids of one turn's calls: the model's own when valid and new in the turn, else derived ones."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.used: set[str] = set()

    def next(self, written: object = None) -> str:
        if isinstance(written, str) and _valid_id(written) and written not in self.used:
            self.used.add(written)
            return written
        position = len(self.used)
        while (call_id := mistral_call_id(self.prefix, position)) in self.used:  # one the model wrote: skip it
            position += 1
        self.used.add(call_id)
        return call_id


def _strip_eos(text: str) -> tuple[str, bool]:
    """The turn without its closing `</s>`, and whether it had one (else it was cut off)."""
    return (text[: -len(EOS)], True) if text.endswith(EOS) else (text, False)


def _broken(ids: _Ids, raw: str, code: IssueCode, message: str, name: str = "") -> ToolCall:
    return broken_call(ids.next(), raw, code, message, name=name)


def _v3_segment(segment: str, *, closed: bool, ids: _Ids) -> list[ToolCall]:
    """The calls of one `[TOOL_CALLS]` segment: a JSON list, read whole or from the first `[{` to the last `}]`."""
    body = segment.strip()
    usage = 'Write [TOOL_CALLS] [{"name": <function-name>, "arguments": <args-json-object>}].'
    try:
        try:
            payload = loads_bounded(body)
        except json.JSONDecodeError as e:
            start, end = body.find("[{"), body.rfind("}]")
            if start < 0 or end < start:
                raise e from None
            payload = loads_bounded(body[start : end + 2])
    except JsonLimitError as e:
        return [_broken(ids, body, "invalid_json", f"The tool calls cannot be read: {e}. {usage}")]
    except json.JSONDecodeError as e:
        if not closed:
            message = "The tool calls were cut off before the end of their JSON list."
            return [_broken(ids, body, "unclosed_tag", message)]
        message = f"The tool calls are not valid JSON ({e.msg} at character {e.pos}). {usage}"
        return [_broken(ids, body, "invalid_json", message)]
    if not isinstance(payload, list):
        return [_broken(ids, body, "invalid_json", f"The tool calls must be a JSON list, not {json_kind(payload)}.")]
    return [_v3_item(item, ids) for item in payload]


def _v3_item(item: Any, ids: _Ids) -> ToolCall:
    raw = json.dumps(item, ensure_ascii=False)
    if not isinstance(item, dict):
        return _broken(ids, raw, "invalid_json", f"Each tool call must be a JSON object, not {json_kind(item)}.")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        return _broken(ids, raw, "missing_name", 'The tool call has no "name" string.')
    arguments, problem = arguments_object(item.get("arguments", {}), subject="The arguments")
    if problem is not None:
        return _broken(ids, raw, "invalid_arguments", problem, name)
    return ToolCall(id=ids.next(item.get("id")), name=name, arguments=arguments)


def _v11_call(piece: str, *, closed: bool, ids: _Ids) -> ToolCall:
    """One `name[CALL_ID]id[ARGS]{json}` (or `name{json}`) piece; `closed`: the text after it was not cut off."""
    if ARGS in piece:
        head, args = piece.split(ARGS, 1)
    elif "{" in piece:
        at = piece.find("{")
        head, args = piece[:at], piece[at:]
    else:
        if not closed:
            return _broken(ids, piece, "unclosed_tag", "The tool call was cut off before its arguments.")
        message = "The tool call has no arguments. Write [TOOL_CALLS]<function-name>[ARGS]<args-json-object>."
        return _broken(ids, piece, "invalid_arguments", message)
    name, _, written_id = head.partition(CALL_ID)
    name = name.strip()
    if not name:
        return _broken(ids, piece, "missing_name", "The tool call has no function name before its arguments.")
    try:
        arguments: Any = loads_bounded(args.strip())
    except JsonLimitError as e:
        return _broken(ids, piece, "invalid_json", f"The tool call's arguments cannot be read: {e}.", name)
    except json.JSONDecodeError as e:
        if not closed:
            return _broken(ids, piece, "unclosed_tag", "The tool call was cut off inside its arguments.", name)
        message = f"The tool call's arguments are not valid JSON ({e.msg} at character {e.pos})."
        return _broken(ids, piece, "invalid_json", message, name)
    arguments, problem = arguments_object(arguments, subject="The arguments")
    if problem is not None:
        return _broken(ids, piece, "invalid_arguments", problem, name)
    return ToolCall(id=ids.next(written_id.strip()), name=name, arguments=arguments)


def _mistral_v0_3() -> ChatProtocol:
    return MistralV3Protocol()


def _mistral_small_3_2(*, today: date | None = None) -> ChatProtocol:
    """`today`: the date the default system prompt prints (None: today's date, fixed for this instance)."""
    return MistralSmall32Protocol(today or date.today())


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {
    "mistral-v0.3": _mistral_v0_3,
    "mistral-small-3.2": _mistral_small_3_2,
}
