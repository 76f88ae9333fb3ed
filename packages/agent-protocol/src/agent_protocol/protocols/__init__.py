"""Chat protocol family members, one module per model family."""

from agent_protocol.protocols.qwen3 import Qwen3Protocol, ThinkingMode

__all__ = ["Qwen3Protocol", "ThinkingMode"]
