"""The Kimi K2 chat formats, in Python: `get_protocol("kimi-k2")` (Kimi-K2-Instruct, the template it was
released with) and `get_protocol("kimi-k2-thinking")` (Kimi-K2-Thinking).

Both mirror their official template (tests/data/golden/templates/kimi_k2_instruct.jinja and
kimi_k2_thinking.jinja; sources in SOURCES.md) statement by statement. A turn is a role token, a role name, and
its text:

    <|im_system|>tool_declare<|im_middle|>[{tools as JSON}]<|im_end|>
    <|im_system|>system<|im_middle|>{system}<|im_end|><|im_user|>user<|im_middle|>{query}<|im_end|>
    <|im_assistant|>assistant<|im_middle|>{content}<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
    <|tool_call_argument_begin|>{json}<|tool_call_end|><|tool_calls_section_end|><|im_end|>
    <|im_system|>tool<|im_middle|>{result}<|im_end|>

(one line in the template; broken here). The generation prompt is `<|im_assistant|>assistant<|im_middle|>` in both.

`kimi-k2` (the Kimi-K2-Instruct template of July 2025):
- a default system turn `You are a helpful assistant` before the first message when that is not a system one;
- the tools list as `tools | tojson` (Hugging Face's: `, ` and `: ` separators, no ASCII escapes);
- every message's text and `<|im_end|>`, nothing else: an assistant's tool calls and reasoning, a tool result's
  call id and every `name` are not rendered. The model writes calls (vLLM's `kimi_k2` parser reads them), but
  the conversation it is shown later has none of them. That is the template, kept as it is; the later revision
  of the template that renders calls could not be found with its provenance (see SOURCES.md). The first render
  of a conversation with calls warns (`CallsNotRenderedWarning`, once per protocol object).
- null content fails in the template (it iterates it), so it is refused with the reason.

`kimi-k2-thinking`:
- the tools list as above, then the default system turn `You are Kimi, an AI assistant created by Moonshot AI.`
  unless the conversation starts with a system message (also for an empty conversation);
- the role name is the message's `name` when it has one (`<|im_system|>get_weather<|im_middle|>` for a named tool
  result), else its role;
- an assistant turn is `<think>{reasoning}</think>{content}{calls}`; every assistant turn up to and including the
  last one without tool calls (a final answer) is rendered with an empty `<think></think>`, the later ones with
  their `reasoning_content`;
- a tool result is `## Return of {tool_call_id}\n{content}`; each call is written with its `id`, which Kimi writes
  as `functions.NAME:INDEX`.
- Calls' arguments given as an object are dumped with `tojson`; a JSON string is concatenated by the template as
  it is, and here it is parsed once and dumped (the same object; a string spelled otherwise, e.g. with compact
  separators, renders in that canonical spelling).

Parsing follows vLLM's `kimi_k2` tool parser (`KimiK2ToolParser`) and, for `kimi-k2-thinking`, its `kimi_k2`
reasoning parser (`KimiK2ReasoningParser`): a leading `<think>` is consumed, the reasoning ends at the first
`</think>`, or where the tool-call section starts when there is none; content is the text before
`<|tool_calls_section_begin|>`, and each `<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>`
is a call whose id is kept as written and whose name is the id's part before `:` after its last `.`
(`functions.get_weather:0` -> `get_weather`); text after the section is dropped. Where vLLM drops a malformed
call (an id not of the form `name:INDEX`, a call cut off) or passes arguments that are not a JSON object, this
parser returns a coded issue. A thinking turn that never closes its reasoning and has no call is all reasoning, as
vLLM reads it, with the issue `missing_think_end`.

Seams (where an episode's token stream is not the official render of its conversation): `kimi-k2` renders no
tool calls in history, so every generated call section is in the transcript and not in the render;
`kimi-k2-thinking` renders the reasoning of every turn up to the last final answer as `<think></think>`, while
the transcript keeps what was sampled. A turn cut off by the length limit is closed with `<|im_end|>`.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from agent_protocol.broken_call import broken_call
from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import JsonLimitError, MessageError, TemplateGapWarning
from agent_protocol.hermes_parser import MISSING_THINK_END
from agent_protocol.json_call import json_kind
from agent_protocol.json_limits import loads_bounded
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Action, IssueCode, Message, MessageLike, ToolCall, ToolSpec

__all__ = ["PROTOCOLS", "CallsNotRenderedWarning", "KimiK2Protocol", "KimiK2ThinkingProtocol"]

IM_USER: Final = "<|im_user|>"
IM_ASSISTANT: Final = "<|im_assistant|>"
IM_SYSTEM: Final = "<|im_system|>"
IM_MIDDLE: Final = "<|im_middle|>"
IM_END: Final = "<|im_end|>"
THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
SECTION_BEGIN: Final = "<|tool_calls_section_begin|>"
SECTION_END: Final = "<|tool_calls_section_end|>"
CALL_BEGIN: Final = "<|tool_call_begin|>"
ARGUMENT_BEGIN: Final = "<|tool_call_argument_begin|>"
CALL_END: Final = "<|tool_call_end|>"

_PACKAGE_DIR: Final = str(Path(__file__).parent.parent)

GENERATION_PROMPT: Final = IM_ASSISTANT + "assistant" + IM_MIDDLE
INSTRUCT_SYSTEM: Final = "You are a helpful assistant"
THINKING_SYSTEM: Final = "You are Kimi, an AI assistant created by Moonshot AI."

#: the call id vLLM's regex accepts: anything without `<`, then `:` and an index
_CALL_ID: Final = re.compile(r"[^<]+:\d+", re.DOTALL)
_CALL_FORMAT: Final = (
    f"Write each call as {CALL_BEGIN}functions.NAME:INDEX{ARGUMENT_BEGIN}{{JSON arguments}}{CALL_END}, all of "
    f"them between {SECTION_BEGIN} and {SECTION_END}."
)


class CallsNotRenderedWarning(TemplateGapWarning):
    """An assistant turn with tool calls went to a template that renders no calls in history."""


class _KimiBase(ChatProtocol):
    end_of_turn = IM_END
    stop_texts = (IM_END,)
    generation_prompt = GENERATION_PROMPT
    #: the official template's name, in refusals
    template: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        self._check(msgs)
        head = _tools_block(specs or []) + self._default_system(msgs)
        body = self._render_body(msgs, reasoning_from=self._reasoning_from(msgs))
        return head + body + (GENERATION_PROMPT if add_generation_prompt else "")

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        msgs = feedback_messages(messages)
        self._check(msgs)
        return ("" if turn_closed else IM_END) + self._render_body(msgs, reasoning_from=0) + GENERATION_PROMPT

    # -- the family's hooks ----------------------------------------------------------------------------------

    def _check(self, msgs: list[Message]) -> None:
        """Raise `MessageError` for what the template cannot render (by default everything renders)."""

    def _default_system(self, msgs: list[Message]) -> str:
        raise NotImplementedError

    def _reasoning_from(self, msgs: list[Message]) -> int:
        """The index from which assistant turns show their reasoning."""
        return len(msgs)

    def _render_body(self, msgs: list[Message], *, reasoning_from: int) -> str:
        raise NotImplementedError

    # -- parsing ---------------------------------------------------------------------------------------------

    def _content_and_calls(self, body: str, call_id_prefix: str) -> Action:
        begin = body.find(SECTION_BEGIN)
        if begin < 0:
            return Action(content=body)
        calls = _parse_section(body[begin + len(SECTION_BEGIN) :], call_id_prefix=call_id_prefix)
        return Action(content=body[:begin], tool_calls=tuple(calls))


class KimiK2Protocol(_KimiBase):
    """Kimi-K2-Instruct's first template: texts only, no tool calls in history (see the module docstring)."""

    name = "kimi-k2"
    template = "Kimi-K2-Instruct"

    def __init__(self) -> None:
        self._warned_calls = False

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        if not self._warned_calls and any(m.tool_calls for m in msgs):
            self._warned_calls = True
            warnings.warn(
                "kimi-k2: the official Kimi-K2-Instruct chat template (its first revision) renders no tool calls and "
                "no call ids in history, so a re-rendered conversation does not show the model its earlier calls; "
                "an episode's transcript keeps them as sampled",
                CallsNotRenderedWarning,
                skip_file_prefixes=(_PACKAGE_DIR,),  # point at the caller, past render_prompt and render_messages
            )
        return super().render_coerced(msgs, specs, add_generation_prompt=add_generation_prompt)

    def _check(self, msgs: list[Message]) -> None:
        for index, message in enumerate(msgs):
            if message.content is None:
                raise MessageError(
                    f"messages[{index}].content",
                    "is null; the official Kimi-K2-Instruct template iterates a message's content when it is not a "
                    "string and fails on null (write an empty string)",
                )

    def _default_system(self, msgs: list[Message]) -> str:
        if msgs and msgs[0].role != "system":
            return IM_SYSTEM + "system" + IM_MIDDLE + INSTRUCT_SYSTEM + IM_END
        return ""

    def _render_body(self, msgs: list[Message], *, reasoning_from: int) -> str:
        return "".join(_INSTRUCT_HEADERS[m.role] + (m.content or "") + IM_END for m in msgs)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        return (msg.content or "") + _render_calls(msg.tool_calls) + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        return self._content_and_calls(text.removesuffix(IM_END), call_id_prefix)


class KimiK2ThinkingProtocol(_KimiBase):
    """Kimi-K2-Thinking: reasoning in `<think>`, calls with their ids, reasoning kept after the last final answer."""

    name = "kimi-k2-thinking"
    template = "Kimi-K2-Thinking"

    def _default_system(self, msgs: list[Message]) -> str:
        if not msgs or msgs[0].role != "system":
            return IM_SYSTEM + "system" + IM_MIDDLE + THINKING_SYSTEM + IM_END
        return ""

    def _reasoning_from(self, msgs: list[Message]) -> int:
        last_final = max((i for i, m in enumerate(msgs) if m.role == "assistant" and not m.tool_calls), default=-1)
        return last_final + 1

    def _render_body(self, msgs: list[Message], *, reasoning_from: int) -> str:
        out: list[str] = []
        for index, m in enumerate(msgs):
            out.append(_THINKING_TOKENS[m.role] + (m.name or m.role) + IM_MIDDLE)
            if m.role == "assistant":
                reasoning = (m.reasoning_content or "") if index >= reasoning_from else ""
                out.append(THINK_OPEN + reasoning + THINK_CLOSE + (m.content or "") + _render_calls(m.tool_calls))
            elif m.role == "tool":
                out.append("## Return of " + (m.tool_call_id or "") + "\n" + (m.content or ""))
            else:
                out.append(m.content or "")
            out.append(IM_END)
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        reasoning = msg.reasoning_content or ""
        return THINK_OPEN + reasoning + THINK_CLOSE + (msg.content or "") + _render_calls(msg.tool_calls) + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        body = text.removesuffix(IM_END)
        start = len(THINK_OPEN) if body.startswith(THINK_OPEN) else 0
        close = body.find(THINK_CLOSE)
        if close >= 0:
            reasoning, rest = body[start:close], body[close + len(THINK_CLOSE) :]
        elif (section := body.find(SECTION_BEGIN)) >= 0:
            reasoning, rest = body[start:section], body[section:]  # the call section ends the reasoning
        else:
            return Action(content="", reasoning_content=body[start:], error=MISSING_THINK_END)
        action = self._content_and_calls(rest, call_id_prefix)
        return Action(content=action.content, reasoning_content=reasoning, tool_calls=action.tool_calls)


_INSTRUCT_HEADERS: Final = {
    "system": IM_SYSTEM + "system" + IM_MIDDLE,
    "user": IM_USER + "user" + IM_MIDDLE,
    "assistant": IM_ASSISTANT + "assistant" + IM_MIDDLE,
    "tool": IM_SYSTEM + "tool" + IM_MIDDLE,
}
_THINKING_TOKENS: Final = {"system": IM_SYSTEM, "user": IM_USER, "assistant": IM_ASSISTANT, "tool": IM_SYSTEM}


def _tools_block(specs: list[ToolSpec]) -> str:
    """`tools | tojson` between the tool_declare header and `<|im_end|>`: the list as json.dumps writes it, each
    spec's JSON kept (every episode's prompt starts with the same tools)."""
    if not specs:
        return ""
    listing = "[" + ", ".join(tojson_kept(spec.to_openai()) for spec in specs) + "]"
    return IM_SYSTEM + "tool_declare" + IM_MIDDLE + listing + IM_END


def _render_calls(calls: tuple[ToolCall, ...]) -> str:
    if not calls:
        return ""
    body = "".join(f"{CALL_BEGIN}{call.id}{ARGUMENT_BEGIN}{tojson(call.arguments)}{CALL_END}" for call in calls)
    return SECTION_BEGIN + body + SECTION_END


def _parse_section(section: str, *, call_id_prefix: str) -> list[ToolCall]:
    """The calls of a tool-call section (the text after its begin token); what follows its end is dropped."""
    section = section.split(SECTION_END, 1)[0]
    blocks = section.split(CALL_BEGIN)[1:]
    if not blocks:
        message = f"{SECTION_BEGIN} holds no call. {_CALL_FORMAT}"
        code: IssueCode = "unclosed_tag" if not section.strip() else "invalid_json"
        return [broken_call(f"{call_id_prefix}_0", section, code, message)]
    return [_parse_call(block, fallback_id=f"{call_id_prefix}_{k}") for k, block in enumerate(blocks)]


def _parse_call(block: str, *, fallback_id: str) -> ToolCall:
    end = block.find(CALL_END)
    head, sep, arguments = block[: end if end >= 0 else len(block)].partition(ARGUMENT_BEGIN)
    call_id = head.strip()
    well_formed_id = _CALL_ID.fullmatch(call_id) is not None
    name = call_id.split(":")[0].split(".")[-1].strip() if well_formed_id else ""
    kept_id = call_id if well_formed_id else fallback_id
    if end < 0:
        return broken_call(kept_id, block, "unclosed_tag", f"The tool call was cut off before {CALL_END}.", name=name)
    if not sep:
        message = f"The tool call has no {ARGUMENT_BEGIN}. {_CALL_FORMAT}"
        return broken_call(kept_id, block, "invalid_json", message, name=name)
    subject = f"The arguments of {name}" if name else "The arguments of the tool call"
    try:  # the arguments first: a call whose arguments cannot be read says so whatever its id
        value = loads_bounded(arguments) if arguments.strip() else {}
    except JsonLimitError as e:
        return broken_call(kept_id, block, "invalid_json", f"{subject} cannot be read: {e}.", name=name)
    except json.JSONDecodeError as e:
        message = f"{subject} are not valid JSON ({e.msg} at character {e.pos}). {_CALL_FORMAT}"
        return broken_call(kept_id, block, "invalid_json", message, name=name)
    if not isinstance(value, dict):
        message = f"{subject} must be a JSON object, not {json_kind(value)}."
        return broken_call(kept_id, block, "invalid_arguments", message, name=name)
    if not name:  # vLLM's regex skips such a call
        message = f"The tool call id {call_id[:60]!r} is not of the form functions.NAME:INDEX. {_CALL_FORMAT}"
        return broken_call(kept_id, block, "missing_name", message)
    return ToolCall(id=kept_id, name=name, arguments=value)


def _kimi_k2() -> ChatProtocol:
    return KimiK2Protocol()


def _kimi_k2_thinking() -> ChatProtocol:
    return KimiK2ThinkingProtocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"kimi-k2": _kimi_k2, "kimi-k2-thinking": _kimi_k2_thinking}
