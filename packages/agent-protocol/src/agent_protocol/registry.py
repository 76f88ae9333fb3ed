"""Protocols by name: `get_protocol("qwen3", enable_thinking=False)`, `list_protocols()`, and
`register_protocol` for a new model family. Knows names, the module each built-in family lives in, and the
options each factory takes; not formats.

A built-in family's module is imported the first time one of its names is asked for, so a user of one family
never pays for the others. Each family module exposes `PROTOCOLS`, a mapping of registered name to factory; a
factory takes its options as keyword arguments and returns a `ChatProtocol`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from agent_protocol.chat_protocol import ChatProtocol
from agent_protocol.errors import UnknownProtocolError

__all__ = ["get_protocol", "list_protocols", "protocol_options", "register_protocol"]

ProtocolFactory = Callable[..., ChatProtocol]

#: built-in name -> the module (under agent_protocol.protocols) whose `PROTOCOLS` holds its factory
_BUILTIN: dict[str, str] = {
    "qwen3": "qwen3",
    "qwen3-instruct-2507": "qwen3",
    "qwen3-thinking-2507": "qwen3",
    "qwen3-2504": "qwen3",
    "qwen2.5": "qwen2_5",
    "qwen3-coder": "qwen3_coder",
    "qwen3-vl": "qwen_vl",
    "qwen2.5-vl": "qwen2_5_vl",
    "llama3.1": "llama3",
    "llama3.2": "llama3",
    "deepseek-v3.1": "deepseek_v31",
    "glm-4.5": "glm45",
    "gpt-oss": "gpt_oss",
    "mistral-v0.3": "mistral",
    "mistral-small-3.2": "mistral",
}

_REGISTRY: dict[str, ProtocolFactory] = {}


def list_protocols() -> list[str]:
    return sorted({*_BUILTIN, *_REGISTRY})


def register_protocol(name: str, factory: ProtocolFactory, *, replace: bool = False) -> None:
    """Add a protocol under `name`. `factory(**options)` returns a ChatProtocol; its keyword parameters are
    the options the protocol takes."""
    if name in list_protocols() and not replace:
        raise ValueError(f"chat protocol {name!r} is already registered; pass replace=True to override it")
    _REGISTRY[name] = factory


def _factory(name: str) -> ProtocolFactory:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name not in _BUILTIN:
        raise UnknownProtocolError(name, list_protocols())
    module = importlib.import_module(f"agent_protocol.protocols.{_BUILTIN[name]}")
    factory: ProtocolFactory = module.PROTOCOLS[name]
    return factory


def protocol_options(name: str) -> list[str]:
    """The options `get_protocol(name, ...)` takes (the factory's keyword parameters)."""
    parameters = inspect.signature(_factory(name)).parameters.values()
    return [p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def get_protocol(name: str, **options: Any) -> ChatProtocol:
    """The protocol registered as `name`, built with `options` (e.g. `enable_thinking=False` for qwen3).
    Raises ValueError (UnknownProtocolError) listing the known names, or TypeError naming an option the
    protocol does not take and the ones it does."""
    factory = _factory(name)
    takes = protocol_options(name)
    unknown = sorted(set(options) - set(takes))
    if unknown:
        offered = ", ".join(takes) if takes else "none"
        raise TypeError(f"chat protocol {name!r} does not take the option(s) {', '.join(unknown)}; it takes: {offered}")
    return factory(**options)
