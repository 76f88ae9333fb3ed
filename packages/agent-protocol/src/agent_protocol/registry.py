"""Protocols by name: `get_protocol("qwen3", enable_thinking=False)`, `list_protocols()`, and
`register_protocol` for a new model family. Knows names and factories, not formats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_protocol.chat_protocol import ChatProtocol
from agent_protocol.errors import UnknownProtocolError
from agent_protocol.protocols.qwen3 import Qwen3Protocol, ThinkingMode

__all__ = ["get_protocol", "list_protocols", "register_protocol"]

ProtocolFactory = Callable[..., ChatProtocol]


def _qwen3(*, enable_thinking: bool = True) -> ChatProtocol:
    return Qwen3Protocol("qwen3", ThinkingMode.HYBRID if enable_thinking else ThinkingMode.HYBRID_OFF)


def _qwen3_instruct_2507() -> ChatProtocol:
    return Qwen3Protocol("qwen3-instruct-2507", ThinkingMode.NONE)


def _qwen3_thinking_2507() -> ChatProtocol:
    return Qwen3Protocol("qwen3-thinking-2507", ThinkingMode.FORCED)


_REGISTRY: dict[str, ProtocolFactory] = {
    "qwen3": _qwen3,
    "qwen3-instruct-2507": _qwen3_instruct_2507,
    "qwen3-thinking-2507": _qwen3_thinking_2507,
}


def list_protocols() -> list[str]:
    return sorted(_REGISTRY)


def register_protocol(name: str, factory: ProtocolFactory, *, replace: bool = False) -> None:
    """Add a protocol under `name`. `factory(**options)` returns a ChatProtocol."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"chat protocol {name!r} is already registered; pass replace=True to override it")
    _REGISTRY[name] = factory


def get_protocol(name: str, **options: Any) -> ChatProtocol:
    """The protocol registered as `name`, built with `options` (e.g. `enable_thinking=False` for qwen3).
    Raises ValueError (UnknownProtocolError) listing the known names, or TypeError for an unknown option."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownProtocolError(name, list_protocols()) from None
    try:
        return factory(**options)
    except TypeError as e:
        raise TypeError(f"chat protocol {name!r} does not take these options {sorted(options)}: {e}") from e
