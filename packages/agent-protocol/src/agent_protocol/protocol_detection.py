"""Which registered chat protocol fits a model directory: `detect_protocol(model_dir)` reads the chat template
(``chat_template.jinja``, ``tokenizer_config.json``'s ``chat_template`` or ``chat_template.json``) and
``config.json``'s ``model_type``, and names the protocol whose rendering equals that template's.

    detect_protocol("path/to/Qwen3-4B")                  # "qwen3"
    detect_protocol("path/to/Qwen3-4B-Instruct-2507")    # "qwen3-instruct-2507"
    protocol_for_template(template_text, "qwen3")        # the same from the texts; None when unknown

The template decides, because the protocol is the template's format. Each family is told by the marks of its format
(each member's `marks` and `absent` in the family table, `agent_protocol.families`, tried in table order: harmony's
``<|channel|>`` and ``<|call|>``, Llama's ``ipython`` role, DeepSeek's ``<｜tool▁sep｜>``, GLM's ``[gMASK]`` and
``<arg_key>``, Mistral's ``[AVAILABLE_TOOLS]``, Qwen3-Coder's ``<function=``, Qwen3-VL's image placeholder with Hermes
calls and no reasoning, Qwen2.5-VL's with its default system prompt and no calls, Qwen2.5's default system prompt),
and members of a family by what sets them apart (Llama 3.2 reads today's date, 3.1 prints a fixed one;
Mistral-Small-3.2 writes ``[ARGS]``). The Qwen3 family is told by its marks (``<|im_start|>`` turns, ``<tool_call>``
calls, ``reasoning_content``) and its members by the generation header (one that opens ``<think>`` is a thinking-only
model, one that reads ``enable_thinking`` the hybrid Qwen3, in its current revision if it guards ``reasoning_content
is string``, else the first 2504 one; else an instruct model). A directory without a template falls back on an
unambiguous ``model_type`` (a member's `model_types`: Qwen3 -> the hybrid ``qwen3``, ``gpt_oss``, ``glm4_moe``).
Anything else raises `ProtocolDetectionError` naming what was found and the registered protocols.
This module reads JSON and text files; it renders nothing and knows no tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_protocol.errors import ProtocolDetectionError
from agent_protocol.families import family_table
from agent_protocol.registry import list_protocols

__all__ = ["detect_protocol", "protocol_for_template", "read_chat_template"]


def protocol_for_template(chat_template: str | None, model_type: str | None = None) -> str | None:
    """The registered protocol whose format `chat_template` is (`model_type` decides when there is no template),
    or None when neither is one this module knows."""
    members = [member for family in family_table() for member in family.members]
    if not chat_template:
        return next((m.name for m in members if model_type and model_type in m.model_types), None)
    return next((m.name for m in members if m.matches(chat_template)), None)


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolDetectionError(str(path.parent), f"{path.name} cannot be read: {e}") from e
    return data if isinstance(data, dict) else {}


def _template_of(value: Any) -> str | None:
    """A ``chat_template`` value: a string, or a list of named templates (the one named "default", else the first)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = [t for t in value if isinstance(t, dict) and isinstance(t.get("template"), str)]
        default = [t for t in named if t.get("name") == "default"]
        chosen = default or named
        return str(chosen[0]["template"]) if chosen else None
    return None


def read_chat_template(model_dir: str | Path) -> str | None:
    """The chat template a Hugging Face model directory carries (the files `transformers` reads, in its order),
    or None when it has none."""
    root = Path(model_dir)
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    found = _template_of(_json_object(root / "tokenizer_config.json").get("chat_template"))
    if found is None:
        found = _template_of(_json_object(root / "chat_template.json").get("chat_template"))
    return found


def detect_protocol(model_dir: str | Path) -> str:
    """The name of the registered protocol for the model in `model_dir` (see the module docstring). Raises
    `ProtocolDetectionError` when the directory is missing or its format is none of the known families."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ProtocolDetectionError(str(root), "no such directory")
    template = read_chat_template(root)
    model_type = _json_object(root / "config.json").get("model_type")
    model_type = model_type if isinstance(model_type, str) else None
    name = protocol_for_template(template, model_type)
    if name is None or name not in list_protocols():
        seen = f"model_type {model_type!r}" if model_type else "no model_type"
        seen += ", a chat template of an unknown family" if template else ", no chat template"
        raise ProtocolDetectionError(
            str(root), f"{seen}; the registered protocols are {', '.join(list_protocols())}", known=list_protocols()
        )
    return name
