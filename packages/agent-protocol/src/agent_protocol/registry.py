"""Protocols by name: `get_protocol("qwen3", enable_thinking=False)`, `list_protocols()`, and
`register_protocol` for a factory of one's own. Knows names and the options each factory takes; not formats. Which
module a family lives in is the family table's (`agent_protocol.families`).

A family's module is imported the first time one of its names is asked for, so a user of one family never pays
for the others. Each family module exposes `PROTOCOLS`, a mapping of registered name to factory; a factory takes
its options as keyword arguments and returns a `ChatProtocol`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from agent_protocol.chat_protocol import ChatProtocol
from agent_protocol.errors import UnknownProtocolError
from agent_protocol.families import family_of, family_table

__all__ = ["get_protocol", "list_protocols", "protocol_options", "register_protocol"]

ProtocolFactory = Callable[..., ChatProtocol]

_REGISTRY: dict[str, ProtocolFactory] = {}


def list_protocols() -> list[str]:
    return sorted({*(name for family in family_table() for name in family.names), *_REGISTRY})


def register_protocol(name: str, factory: ProtocolFactory, *, replace: bool = False) -> None:
    """Add a protocol under `name`. `factory(**options)` returns a ChatProtocol; its keyword parameters are
    the options the protocol takes."""
    if name in list_protocols() and not replace:
        raise ValueError(f"chat protocol {name!r} is already registered; pass replace=True to override it")
    _REGISTRY[name] = factory


def _factory(name: str) -> ProtocolFactory:
    if name in _REGISTRY:
        return _REGISTRY[name]
    family = family_of(name)
    if family is None:
        raise UnknownProtocolError(name, list_protocols())
    module = importlib.import_module(family.module_path)
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
