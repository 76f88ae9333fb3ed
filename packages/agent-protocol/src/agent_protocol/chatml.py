"""The ChatML pieces the Qwen templates share (Qwen2.5, Qwen3, Qwen3-Coder), written once.

Every turn is `<|im_start|>{role}\\n...<|im_end|>\\n`; a model ends its turn with `<|im_end|>` (or, rarely,
`<|endoftext|>`), and the newline after it is the template's, so the feedback after a generated turn writes it.
Qwen2.5 and Qwen3 also print the same Hermes tool prompt, tool-call blocks and `<tool_response>` turns; they live
here too. Qwen3-Coder lists tools and writes calls in its own XML form (its module). This module knows the tag
strings; the order of blocks, system prompts and reasoning are each family's.
"""

from __future__ import annotations

from typing import Final

from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Message, ToolCall, ToolSpec

__all__ = [
    "ENDOFTEXT",
    "GENERATION_PROMPT",
    "IM_END",
    "IM_START",
    "STOP_TEXTS",
    "feedback_opening",
    "hermes_call",
    "hermes_tool_response",
    "hermes_tools",
    "strip_end_marker",
]

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
ENDOFTEXT: Final = "<|endoftext|>"
#: what engines stop on; `<|im_end|>` is the turn's own end, `<|endoftext|>` a model that ends the document
STOP_TEXTS: Final = (IM_END, ENDOFTEXT)
GENERATION_PROMPT: Final = f"{IM_START}assistant\n"

_HERMES_TOOLS_HEADER: Final = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_FOOTER: Final = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)


def strip_end_marker(text: str) -> str:
    """A generated turn without the end token it stopped on, if any (one: `<|im_end|>` or `<|endoftext|>`)."""
    for marker in STOP_TEXTS:
        if text.endswith(marker):
            return text[: -len(marker)]
    return text


def feedback_opening(*, turn_closed: bool) -> str:
    """What the feedback writes first after a generated turn: the `<|im_end|>` a cut-off turn lacks, then the
    newline the template puts after every turn (the model stops on `<|im_end|>` and never writes it)."""
    return ("" if turn_closed else IM_END) + "\n"


def hermes_tools(specs: list[ToolSpec]) -> str:
    """The Hermes tool prompt that ends the system turn (its `<|im_end|>\\n` included): the header, one JSON line
    per tool, and the call format. Every episode's prompt lists the same tools: their JSON is kept (`tojson_kept`)."""
    listing = "".join("\n" + tojson_kept(spec.to_openai()) for spec in specs)
    return f"{_HERMES_TOOLS_HEADER}{listing}{_HERMES_TOOLS_FOOTER}"


def hermes_call(call: ToolCall) -> str:
    """One call as the templates write it: a `<tool_call>` block holding `{"name": ..., "arguments": ...}`."""
    return f'<tool_call>\n{{"name": "{call.name}", "arguments": {tojson(call.arguments)}}}\n</tool_call>'


def hermes_tool_response(msgs: list[Message], index: int) -> str:
    """The tool result at `msgs[index]` as a `<tool_response>` inside a user turn: a run of tool messages shares
    one turn, opened by the first of the run and closed by the last."""
    out: list[str] = []
    if index == 0 or msgs[index - 1].role != "tool":
        out.append(f"{IM_START}user")
    out.append(f"\n<tool_response>\n{msgs[index].content or ''}\n</tool_response>")
    if index == len(msgs) - 1 or msgs[index + 1].role != "tool":
        out.append(f"{IM_END}\n")
    return "".join(out)
