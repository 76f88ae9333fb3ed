"""`EpisodeEndpoint`: one episode's OpenAI endpoint, in process: the real tools-mode server (`create_app`) of the
recipe on the episode's engine, reached by a real `openai.AsyncOpenAI` through an ASGI transport.

Each episode gets an app of its own (its own transcript store, request log and metrics) and a key of its own
(the app refuses any other), so concurrent episodes share nothing but the engine, which batches their requests.
No port is opened: the client's requests go straight to the app, in the caller's event loop, through the ASGI
transport of the HTTP library the installed `openai` is built on (`openai.DefaultAsyncHttpxClient`'s: httpx, or
the fork recent releases ship). A framework that only takes a base URL (and makes its own HTTP client) needs a
listening server instead; see examples/any_agent/README.md.

The client has retries off (`max_retries=0`): a failed turn must reach the program as it happened, once, so
that the episode's record is the program's actual conversation. This module knows the serving app and the
OpenAI client; what an episode's records mean is `request_log.py`'s.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any, Final

from agent_runtime.proxy.episode_engine import EpisodeEngine
from agent_runtime.proxy.request_log import RequestLog
from agent_runtime.recipe import Recipe
from agent_runtime.serving import ServeConfig, create_app

__all__ = ["EpisodeEndpoint"]

_NO_DEADLINE_S: Final = 24 * 3600.0  # the engine call's bound when the rollout sets none (the episode has its own)


class EpisodeEndpoint:
    """The endpoint of one episode; `client()` is an `openai.AsyncOpenAI` bound to it. Close it with `aclose`."""

    def __init__(
        self, recipe: Recipe, engine: EpisodeEngine, *, model_name: str, engine_timeout_s: float | None = None
    ) -> None:
        self.key = f"episode-{uuid.uuid4().hex[:16]}"
        self.engine = engine
        config = ServeConfig(
            model_name=model_name, api_key=self.key, engine_timeout_s=engine_timeout_s or _NO_DEADLINE_S
        )
        self.app = create_app(engine, recipe, config)
        self.log = RequestLog()
        self.app.state.backend.writer = self.log  # every request's record comes here (the serving trajectory log)
        self.requests = 0
        self._openai = _openai()
        http = sys.modules[self._openai.DefaultAsyncHttpxClient.__mro__[1].__module__.partition(".")[0]]
        self._http = self._openai.DefaultAsyncHttpxClient(
            transport=http.ASGITransport(app=self.app),
            base_url=f"http://{self.key}.proxy",
            timeout=None,
            event_hooks={"request": [self._count]},
        )

    async def _count(self, request: Any) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.requests += 1

    def client(self) -> Any:
        """An `openai.AsyncOpenAI` for this episode (no retries: see the module docstring)."""
        return self._openai.AsyncOpenAI(
            base_url=f"http://{self.key}.proxy/v1", api_key=self.key, http_client=self._http, max_retries=0
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def _openai() -> Any:
    try:
        import openai
    except ImportError as e:  # pragma: no cover - openai is installed wherever agent programs are trained
        raise RuntimeError("agent programs need the `openai` package: pip install openai") from e
    return openai
