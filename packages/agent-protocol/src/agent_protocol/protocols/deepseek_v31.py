"""The DeepSeek-V3.1 chat format, in Python: `get_protocol("deepseek-v3.1", thinking=False)`.

Mirrors the official template (tests/data/golden/templates/deepseek_v3.1.jinja, the original
deepseek-ai/DeepSeek-V3.1 revision) statement by statement:

    <｜begin▁of▁sentence｜>{every system message, joined by a blank line}<｜User｜>{query}<｜Assistant｜></think>
    {content}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...
    <｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜>{answer}
    <｜end▁of▁sentence｜>

- The generation prompt is `<｜Assistant｜></think>` (`thinking=False`) or `<｜Assistant｜><think>` (`thinking=True`),
  and only after a user message: after tool outputs the template opens nothing and the model continues
  directly, so `render_feedback` of tool results ends at `<｜tool▁output▁end｜>`.
- History never holds reasoning: every turn after a user message is `<｜Assistant｜></think>` + content (the text
  before a `</think>` inside the content is dropped; `reasoning_content` is never rendered).
- Tool-call arguments are concatenated as a string. Messages carry them as a dict (`coerce_messages` parses a
  string), and they are dumped with `json.dumps(ensure_ascii=False)`, as the golden renders were made: a string
  spelled another way (compact separators, ASCII escapes) is rendered in that canonical spelling.
- The template does **not** render the `tools` list: the model is never shown the tool specs. This is a known gap
  of the official template (vLLM and SGLang ship reworked copies that add a tools section); the tools are
  validated and, like the template, not rendered, and the first render with tools warns once per protocol object
  (`ToolsNotRenderedWarning`). The fix: `get_protocol("deepseek-v3.1-vllm-tools")`, below, or the specs in a
  system message written by the caller.
- Conversations the template cannot render raise `MessageError`: null content where it concatenates text.
  `tool_calls: []` reads as no calls (the template would print a lone `<｜tool▁calls▁end｜>`), and DeepSeek's
  `prefix` (prefix-completion) key is not supported.

Parsing follows vLLM's `deepseek_v31` tool parser and its `deepseek_v31` reasoning parser (DeepSeek-R1's when
`thinking` is on, none when off): content is the text before `<｜tool▁calls▁begin｜>`, each call is
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`, text after the calls is dropped. Where vLLM drops a
malformed call silently, this parser returns it with a coded issue, and it reads calls whose JSON spans lines
(vLLM's regex does not). vLLM's R1 reader takes a turn without `</think>` as all reasoning; with `thinking` on a
turn may also be the direct continuation after tool outputs, which no `<think>` opened, so a turn with neither
tag is content when it is closed by `<｜end▁of▁sentence｜>` or holds a tool call, and reasoning cut off
(`missing_think_end`) otherwise. `render_generation(..., after_tool_output=True)` writes that continuation.

Seams where the token stream of an episode is not the official render of its conversation: with `thinking` on,
each turn after a user message was generated after `<think>` as `{reasoning}</think>...`, and history renders it
as `</think>...`; a turn cut off by the length limit is closed with `<｜end▁of▁sentence｜>` alone (a cut call gets
no `<｜tool▁calls▁end｜>`). At the token level, DeepSeek-V3's tokenizer file has no `<think>`/`</think>` tokens, so a
generation that starts with a word right after the prompt's think tag keeps `>` and the word apart where one-piece
tokenization merges them (`>The`); V3.1's tokenizer adds both tags as tokens and has no such seam.

`deepseek-v3.1-vllm-tools` renders the reworked template vLLM ships (vllm-project/vllm
examples/tool_chat_template_deepseekv31.jinja, tests/data/golden/templates/deepseek_v3.1_vllm.jinja) as vLLM
renders it (transformers' trim_blocks/lstrip_blocks, tool-call arguments parsed to an object and dumped with
`tojson`): after the system messages a `## Tools` section lists each tool's name, description and parameters
(a tool without a description or without parameters makes the template fail, so it is refused), then the call
format. That template is indented, and the indentation before its `{{ ... }}` expressions reaches the prompt:
the render starts with two newlines, the generation prompt is `  <｜Assistant｜>    </think>` (or `<think>`), and
history writes an assistant turn after a user message as `      <｜Assistant｜>` plus `        </think>` and six
spaces before its content (no calls) or `</think>` and ten spaces (calls: eight before each further call, four
before `<｜tool▁calls▁end｜>`), an answer after tool outputs with six spaces before it. `tool_calls: []` reads as no
calls, as in `deepseek-v3.1` (the template would take the calls branch and drop the content). These are seams:
the model generated after the prompt's spaces, history re-renders the turn with others. Parsing is the same
`deepseek_v31` parser (vLLM serves this template with it); a generated turn's leading spaces are content.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from agent_protocol.broken_call import raw_preview
from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import JsonLimitError, MessageError, TemplateGapWarning
from agent_protocol.hermes_parser import MISSING_THINK_END
from agent_protocol.json_call import json_kind
from agent_protocol.json_limits import loads_bounded
from agent_protocol.template_json import tojson
from agent_protocol.types import Action, Message, MessageLike, ParseIssue, ToolCall, ToolSpec

__all__ = ["PROTOCOLS", "DeepSeekV31Protocol", "DeepSeekV31VllmProtocol", "ToolsNotRenderedWarning"]

BOS: Final = "<｜begin▁of▁sentence｜>"
EOS: Final = "<｜end▁of▁sentence｜>"
USER: Final = "<｜User｜>"
ASSISTANT: Final = "<｜Assistant｜>"
THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
CALLS_BEGIN: Final = "<｜tool▁calls▁begin｜>"
CALLS_END: Final = "<｜tool▁calls▁end｜>"
CALL_BEGIN: Final = "<｜tool▁call▁begin｜>"
CALL_END: Final = "<｜tool▁call▁end｜>"
TOOL_SEP: Final = "<｜tool▁sep｜>"
OUTPUT_BEGIN: Final = "<｜tool▁output▁begin｜>"
OUTPUT_END: Final = "<｜tool▁output▁end｜>"

_PACKAGE_DIR: Final = str(Path(__file__).parent.parent)

_CALL_FORMAT: Final = (
    f"Write each call as {CALL_BEGIN}NAME{TOOL_SEP}{{JSON arguments}}{CALL_END}, all of them between "
    f"{CALLS_BEGIN} and {CALLS_END}."
)


class ToolsNotRenderedWarning(TemplateGapWarning):
    """Tools were given to a protocol whose official template does not show them to the model."""


class DeepSeekV31Protocol(ChatProtocol):
    name = "deepseek-v3.1"
    end_of_turn = EOS
    stop_texts = (EOS,)

    def __init__(self, *, thinking: bool = False) -> None:
        self.thinking = thinking
        self._warned_tools = False

    def _warn_tools_not_rendered(self) -> None:
        if self._warned_tools:
            return
        self._warned_tools = True
        warnings.warn(
            "deepseek-v3.1: the official DeepSeek-V3.1 chat template does not render the tools list, so the model "
            "is asked to call tools it is never shown; use get_protocol('deepseek-v3.1-vllm-tools') (vLLM's "
            "reworked template, which lists them) or describe the tools in a system message yourself",
            ToolsNotRenderedWarning,
            skip_file_prefixes=(_PACKAGE_DIR,),  # point at the caller, past render_prompt and render_messages
        )

    def __repr__(self) -> str:
        return f"DeepSeekV31Protocol(thinking={self.thinking})"

    @property
    def generation_prompt(self) -> str:
        return ASSISTANT + (THINK_OPEN if self.thinking else THINK_CLOSE)

    # -- rendering ---------------------------------------------------------------------------------------

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        # `specs` were validated like every family's; the official template does not render them
        if specs:
            self._warn_tools_not_rendered()
        _check_renderable(msgs)
        system = "\n\n".join(m.content or "" for m in msgs if m.role == "system")
        body, last_is_user = _render_body(msgs)
        prompt = self.generation_prompt if add_generation_prompt and last_is_user else ""
        return BOS + system + body + prompt

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        msgs = feedback_messages(
            messages,
            system_refused="the official DeepSeek-V3.1 template renders every system message at the top of the "
            "prompt, so one cannot be appended to a running conversation",
        )
        _check_renderable(msgs)
        body, last_is_user = _render_body(msgs)
        return ("" if turn_closed else EOS) + body + (self.generation_prompt if last_is_user else "")

    def render_generation(self, message: MessageLike, *, after_tool_output: bool = False) -> str:
        """What the model writes for `message`: after the generation prompt, or, with `after_tool_output`,
        directly after tool outputs (no prompt opens that turn, so in thinking mode it has no `</think>`)."""
        msg = generated_message(message)
        content = msg.content or ""
        inline_reasoning = ""
        if not msg.tool_calls and not after_tool_output and THINK_CLOSE in content:
            inline_reasoning, content = content.split(THINK_CLOSE, 1)  # the template keeps only what follows
        head = ""
        if self.thinking and not after_tool_output:
            reasoning = msg.reasoning_content
            if reasoning is None:
                reasoning = inline_reasoning.split(THINK_OPEN, 1)[-1]
            head = reasoning + THINK_CLOSE
        return head + content + _render_calls(msg.tool_calls) + EOS

    # -- parsing -----------------------------------------------------------------------------------------

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        closed = text.endswith(EOS)
        body = text.removesuffix(EOS)
        reasoning: str | None = None
        if self.thinking:
            reasoning, body, issue = _split_reasoning(body, closed=closed)
            if issue is not None:
                return Action(content="", reasoning_content=reasoning, error=issue)
        content, calls = _split_tool_calls(body, call_id_prefix=call_id_prefix)
        return Action(content=content, reasoning_content=reasoning, tool_calls=tuple(calls))


_VLLM_TOOLS_HEAD: Final = "## Tools\nYou have access to the following tools:\n"
_VLLM_TOOLS_TAIL: Final = (
    "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
    f"{CALLS_BEGIN}{CALL_BEGIN}tool_call_name{TOOL_SEP}tool_call_arguments{CALL_END}{{{{additional_tool_calls}}}}"
    f"{CALLS_END}\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n"
    "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
    "- For multiple tool calls, chain them directly without separators or spaces\n"
)


class DeepSeekV31VllmProtocol(DeepSeekV31Protocol):
    """DeepSeek-V3.1 with the tools list, as vLLM's reworked template renders it (see the module docstring)."""

    name = "deepseek-v3.1-vllm-tools"

    def __repr__(self) -> str:
        return f"DeepSeekV31VllmProtocol(thinking={self.thinking})"

    @property
    def generation_prompt(self) -> str:
        return "  " + ASSISTANT + "    " + (THINK_OPEN if self.thinking else THINK_CLOSE)

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        _check_renderable(msgs, template="vLLM's DeepSeek-V3.1 tool template")
        system = "\n\n".join(m.content or "" for m in msgs if m.role == "system")
        if specs is not None:
            system += "\n\n" + _vllm_tools_section(specs)
        body, last_is_user = _render_body_vllm(msgs)
        prompt = self.generation_prompt if add_generation_prompt and last_is_user else ""
        return "\n\n" + BOS + system + body + prompt


def _vllm_tools_section(specs: list[ToolSpec]) -> str:
    out = [_VLLM_TOOLS_HEAD]
    for index, spec in enumerate(specs):
        if spec.source is not None and "function" not in spec.source:
            raise MessageError(
                f"tools[{index}]",
                "has no `function` object; vLLM's DeepSeek-V3.1 tool template reads `tool.function` and fails "
                "on the flat form",
            )
        function = spec.function
        for key in ("description", "parameters"):
            if key not in function or (key == "description" and function[key] is None):
                raise MessageError(
                    f"tools[{index}].function.{key}",
                    "is missing; vLLM's DeepSeek-V3.1 tool template prints every tool's description and "
                    "parameters and fails without them",
                )
        out.append(
            f"\n### {function['name']}\nDescription: {function['description']}\n\n"
            f"Parameters: {tojson(function['parameters'])}\n"
        )
    return "".join(out) + _VLLM_TOOLS_TAIL


def _render_body_vllm(msgs: list[Message]) -> tuple[str, bool]:
    """`_render_body` for vLLM's template, with the indentation its layout leaves in the output."""
    out: list[str] = []
    last_is_user = False
    after_tool = False
    for msg in msgs:
        content = msg.content or ""
        if msg.role == "user":
            out.append(USER + content)
            last_is_user, after_tool = True, False
        elif msg.role == "tool":
            out.append(OUTPUT_BEGIN + content + OUTPUT_END)
            last_is_user, after_tool = False, True
        elif msg.role == "assistant" and msg.tool_calls:
            opener = "      " + ASSISTANT + THINK_CLOSE if last_is_user else ""
            calls = [f"{CALL_BEGIN}{call.name}{TOOL_SEP}{tojson(call.arguments)}{CALL_END}" for call in msg.tool_calls]
            first = "          " + content + CALLS_BEGIN + calls[0]
            rest = "".join("        " + call for call in calls[1:])
            out.append(opener + first + rest + "    " + CALLS_END + EOS)
            last_is_user, after_tool = False, False
        elif msg.role == "assistant":
            opener = "      " + ASSISTANT + "        " + THINK_CLOSE if last_is_user else ""
            if not after_tool and THINK_CLOSE in content:
                content = content.split(THINK_CLOSE, 1)[1]
            out.append(opener + "      " + content + EOS)
            last_is_user, after_tool = False, False
    return "".join(out), last_is_user


def _check_renderable(msgs: list[Message], *, template: str = "official DeepSeek-V3.1 template") -> None:
    """The template concatenates every content as text; null content (but an assistant's with tool calls)
    makes it fail, so it is refused here with the reason."""
    for index, message in enumerate(msgs):
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            raise MessageError(
                f"messages[{index}].content",
                f"is null; the {template} concatenates a {message.role} message's content as text and fails on null",
            )


def _render_calls(calls: tuple[ToolCall, ...]) -> str:
    if not calls:
        return ""
    body = "".join(f"{CALL_BEGIN}{call.name}{TOOL_SEP}{tojson(call.arguments)}{CALL_END}" for call in calls)
    return CALLS_BEGIN + body + CALLS_END


def _render_body(msgs: list[Message]) -> tuple[str, bool]:
    """Every non-system message as the template's loop renders it, starting after an assistant turn (or at the
    top); returns the text and whether the last rendered message was a user's (then a generation prompt may
    follow)."""
    out: list[str] = []
    last_is_user = False
    after_tool = False
    for msg in msgs:
        content = msg.content or ""
        if msg.role == "user":
            out.append(USER + content)
            last_is_user, after_tool = True, False
        elif msg.role == "tool":
            out.append(OUTPUT_BEGIN + content + OUTPUT_END)
            last_is_user, after_tool = False, True
        elif msg.role == "assistant":
            opener = ASSISTANT + THINK_CLOSE if last_is_user else ""
            if not msg.tool_calls and not after_tool and THINK_CLOSE in content:
                content = content.split(THINK_CLOSE, 1)[1]
            out.append(opener + content + _render_calls(msg.tool_calls) + EOS)
            last_is_user, after_tool = False, False
    return "".join(out), last_is_user


def _split_reasoning(body: str, *, closed: bool) -> tuple[str | None, str, ParseIssue | None]:
    """(reasoning, content, issue) of a thinking-mode turn; see the module docstring for a turn with no tags."""
    close_at = body.find(THINK_CLOSE)
    if close_at >= 0:
        return body[:close_at].split(THINK_OPEN, 1)[-1], body[close_at + len(THINK_CLOSE) :], None
    if THINK_OPEN not in body and (closed or CALLS_BEGIN in body):
        return None, body, None
    return body.split(THINK_OPEN, 1)[-1], "", MISSING_THINK_END


def _split_tool_calls(body: str, *, call_id_prefix: str) -> tuple[str, list[ToolCall]]:
    begin = body.find(CALLS_BEGIN)
    if begin < 0:
        return body, []
    section = body[begin + len(CALLS_BEGIN) :]
    section = section.split(CALLS_END, 1)[0]  # what follows the calls is dropped, as vLLM drops it
    blocks = section.split(CALL_BEGIN)[1:]
    if not blocks:
        cut_off = CALLS_END not in body[begin:]
        issue = ParseIssue(
            code="unclosed_tag" if cut_off and not section.strip() else "invalid_json",
            message=f"{CALLS_BEGIN} holds no call. {_CALL_FORMAT}",
        )
        return body[:begin], [ToolCall(id=f"{call_id_prefix}_0", name="", error=issue, raw=raw_preview(section))]
    calls = [_parse_call(block, call_id=f"{call_id_prefix}_{k}") for k, block in enumerate(blocks)]
    return body[:begin], calls


def _parse_call(block: str, *, call_id: str) -> ToolCall:
    end = block.find(CALL_END)
    raw = raw_preview(block)
    if end < 0:
        issue = ParseIssue(code="unclosed_tag", message=f"The tool call was cut off before {CALL_END}.")
        name = block.split(TOOL_SEP, 1)[0] if TOOL_SEP in block else ""
        return ToolCall(id=call_id, name=name, error=issue, raw=raw)
    name, sep, arguments = block[:end].partition(TOOL_SEP)
    if not sep:
        issue = ParseIssue(code="invalid_json", message=f"The tool call has no {TOOL_SEP}. {_CALL_FORMAT}")
        return ToolCall(id=call_id, name="", error=issue, raw=raw)
    if not name.strip():
        issue = ParseIssue(code="missing_name", message=f"The tool call has no function name before {TOOL_SEP}.")
        return ToolCall(id=call_id, name="", error=issue, raw=raw)
    try:
        value = loads_bounded(arguments) if arguments.strip() else {}
    except JsonLimitError as e:
        issue = ParseIssue(code="invalid_json", message=f"The arguments of {name} cannot be read: {e}.")
        return ToolCall(id=call_id, name=name, error=issue, raw=raw)
    except json.JSONDecodeError as e:
        issue = ParseIssue(
            code="invalid_json",
            message=f"The arguments of {name} are not valid JSON ({e.msg} at character {e.pos}). {_CALL_FORMAT}",
        )
        return ToolCall(id=call_id, name=name, error=issue, raw=raw)
    if not isinstance(value, dict):
        issue = ParseIssue(
            code="invalid_arguments", message=f"The arguments of {name} must be a JSON object, not {json_kind(value)}."
        )
        return ToolCall(id=call_id, name=name, error=issue, raw=raw)
    return ToolCall(id=call_id, name=name, arguments=value)


def _deepseek_v31(*, thinking: bool = False) -> ChatProtocol:
    return DeepSeekV31Protocol(thinking=thinking)


def _deepseek_v31_vllm_tools(*, thinking: bool = False) -> ChatProtocol:
    return DeepSeekV31VllmProtocol(thinking=thinking)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"deepseek-v3.1": _deepseek_v31, "deepseek-v3.1-vllm-tools": _deepseek_v31_vllm_tools}
