"""The demo model's chat template: the official Qwen3-Instruct-2507 template (Jinja text), shipped as package data
(``templates/qwen3_instruct_2507.jinja``). The demo model directory carries it in ``tokenizer_config.json``, so
`transformers`, vLLM and `agent_protocol.detect_protocol` read the demo's format (`DEMO_PROTOCOL`) from it.

This module reads one package file; it knows nothing about models or rendering.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

__all__ = ["DEMO_CHAT_TEMPLATE", "chat_template"]

DEMO_CHAT_TEMPLATE: Final = "qwen3_instruct_2507.jinja"


def chat_template() -> str:
    """The official Qwen3-Instruct-2507 chat template (Jinja text)."""
    return resources.files("agent_demo").joinpath("templates", DEMO_CHAT_TEMPLATE).read_text(encoding="utf-8")
