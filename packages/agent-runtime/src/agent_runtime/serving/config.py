"""`ServeConfig`: the settings of one server, everything `create_app` needs beside the engine and the recipe.

This module holds settings only; `apps/serve` fills them from its command line.
"""

from __future__ import annotations

import msgspec

__all__ = ["ServeConfig"]


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of a server.

    - `model_name`: the id `/v1/models` lists and requests must name (`aliases` are accepted too).
    - `api_key`: when set, `/v1/*` and `/metrics` need ``Authorization: Bearer <api_key>`` (else 401).
    - `max_concurrency`: chat completions in flight at once; one more is answered 429 at once.
    - `trajectory_log`: a JSONL file that gets one `Trajectory` per chat completion.
    - `engine_timeout_s`: the longest one generation may take before the request fails.
    - `transcript_store_conversations` / `transcript_store_tokens`: bounds of the tools-mode transcript store
      (0 conversations disables it: every follow-up is rendered from scratch).
    """

    model_name: str
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_concurrency: int = 64
    trajectory_log: str | None = None
    engine_timeout_s: float = 600.0
    transcript_store_conversations: int = 1024
    transcript_store_tokens: int = 8_000_000

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.engine_timeout_s <= 0:
            raise ValueError(f"engine_timeout_s must be positive, got {self.engine_timeout_s}")
