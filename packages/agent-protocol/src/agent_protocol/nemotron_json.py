"""NVIDIA's `<TOOLCALL>[...]</TOOLCALL>` JSON tool calls, shared by the Nemotron families that write them.

Nemotron Nano v2 (`protocols/nemotron.py`) and Llama-3.3-Nemotron-Super-49B-v1.5 (`protocols/nemotron_super.py`)
render calls alike (a JSON list of `{"name", "arguments"}` in one `<TOOLCALL>` block, arguments as the template's
`tojson`), list their tools alike (each tool's `function` object after the same head) and are served by two
plugins NVIDIA ships with the models, `nemotron_json` and `llama_nemotron_json`, that read the first block the same
way but for two points, which `parse_calls(strict=...)` keeps apart:

- `nemotron_json` (strict=False) adds a missing `[` and a missing `]`, and takes a call without `"arguments"` as
  called with `{}`;
- `llama_nemotron_json` (strict=True) adds only a missing `[` (a missing `]` makes it fail: `invalid_json` here),
  and fails on a call without `"arguments"` (`invalid_arguments` here).

Where a plugin drops a malformed call, a coded issue is kept instead (never an exception).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

from agent_protocol.broken_call import broken_call
from agent_protocol.errors import JsonLimitError
from agent_protocol.json_call import arguments_object, json_kind
from agent_protocol.json_limits import loads_bounded
from agent_protocol.template_json import tojson
from agent_protocol.types import ToolCall, ToolSpec

__all__ = ["CALL_CLOSE", "CALL_OPEN", "FORMAT", "TOOLS_HEAD", "parse_calls", "render_calls", "tool_function"]

CALL_OPEN, CALL_CLOSE = "<TOOLCALL>", "</TOOLCALL>"
_CALL_BLOCK: Final = re.compile(r"<TOOLCALL>(.*?)</TOOLCALL>", re.DOTALL)

#: what both templates write before the tool list (the instructions after it differ)
TOOLS_HEAD: Final = "You can use the following tools to assist the user if required:\n<AVAILABLE_TOOLS>["
#: the format hint a coded issue ends with
FORMAT: Final = 'Write calls as <TOOLCALL>[{"name": "...", "arguments": {...}}]</TOOLCALL>.'


def render_calls(calls: Sequence[ToolCall]) -> str:
    """A turn's calls as both templates write them: one `<TOOLCALL>` block holding a JSON list."""
    body = ", ".join(f'{{"name": "{c.name}", "arguments": {tojson(c.arguments)}}}' for c in calls)
    return f"{CALL_OPEN}[{body}]{CALL_CLOSE}"


def tool_function(spec: ToolSpec) -> Any:
    """What the templates dump for a tool: its `function` object, or the spec itself when it has none."""
    source = spec.to_openai()
    return source.get("function", source)


def parse_calls(body: str, prefix: str, *, strict: bool) -> tuple[ToolCall, ...]:
    """The calls of the first `<TOOLCALL>...</TOOLCALL>` block in `body` (which holds `CALL_OPEN`), as NVIDIA's
    `nemotron_json` (strict=False) or `llama_nemotron_json` (strict=True) plugin reads them (module docstring)."""
    match = _CALL_BLOCK.search(body)
    if match is None:
        raw = body[body.find(CALL_OPEN) :]
        return (broken_call(f"{prefix}_0", raw, "unclosed_tag", f"Your <TOOLCALL> block was never closed. {FORMAT}"),)
    listed = match.group(1).strip()
    listed = listed if listed.startswith("[") else "[" + listed
    if not strict:
        listed = listed if listed.endswith("]") else listed + "]"
    try:
        if strict and not listed.endswith("]"):
            raise json.JSONDecodeError("the list is not closed with ]", listed, len(listed))
        items = loads_bounded(listed)
    except (json.JSONDecodeError, JsonLimitError) as e:
        what = "a JSON list" if strict else "JSON"
        return (
            broken_call(
                f"{prefix}_0", match.group(0), "invalid_json", f"Your tool calls are not {what} ({e}). {FORMAT}"
            ),
        )
    if not isinstance(items, list):
        items = [items]
    calls = []
    for k, item in enumerate(items):
        call_id = f"{prefix}_{k}"
        raw = json.dumps(item, ensure_ascii=False) if not isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            calls.append(
                broken_call(call_id, raw, "missing_name", f"A call has no name, it is {json_kind(item)}. {FORMAT}")
            )
            continue
        if strict and "arguments" not in item:
            calls.append(
                broken_call(
                    call_id, raw, "invalid_arguments", f'The call has no "arguments". {FORMAT}', name=item["name"]
                )
            )
            continue
        arguments, problem = arguments_object(item.get("arguments", {}))
        if problem is not None:
            calls.append(broken_call(call_id, raw, "invalid_arguments", f"{problem} {FORMAT}", name=item["name"]))
            continue
        calls.append(ToolCall(id=call_id, name=item["name"], arguments=arguments, raw=None))
    return tuple(calls) or (
        broken_call(f"{prefix}_0", match.group(0), "missing_name", f"Your <TOOLCALL> list is empty. {FORMAT}"),
    )
