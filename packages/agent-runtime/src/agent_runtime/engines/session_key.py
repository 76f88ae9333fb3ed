"""The key of the episode (or served conversation) an engine call belongs to, carried beside the call.

`call_engine(..., session=key)` sets it around `engine.generate`; an engine that routes by it (`OpenAIEngine`
with several upstreams, `upstream_pool.py`) reads `current_session()`. A context variable, so `LLMEngine.generate`
keeps its signature and engines that do not care never see it. This module knows nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["current_session", "session_key"]

_SESSION: ContextVar[str | None] = ContextVar("agent_engine_session", default=None)


def current_session() -> str | None:
    """The key of the episode whose engine call is running in this task, if its caller gave one."""
    return _SESSION.get()


@contextlib.contextmanager
def session_key(key: str | None) -> Iterator[None]:
    """Engine calls made inside belong to the episode `key` (None: to none)."""
    token = _SESSION.set(key)
    try:
        yield
    finally:
        _SESSION.reset(token)
