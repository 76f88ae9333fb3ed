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
    - `engine_timeout_s`: the longest one engine call may take, in all (not per read), before the request fails.
    - `max_request_bytes`: the largest request body accepted (413 beyond, checked on ``Content-Length`` and while
      the body streams in).
    - `request_read_timeout_s`: the longest the whole body may take to arrive (408 beyond). The body is read
      before a request takes a slot of `max_concurrency`, so clients that stall mid-body lock nobody out.
    - `max_buffered_request_bytes`: the bytes of request bodies held at once, across every request being read or
      parsed (429 beyond): since bodies are read before a slot is taken, this is what bounds their memory.
    - `max_chars_per_token`: a conversation whose text needs more tokens than the context holds, at this many
      characters per token, is refused (400) before it is tokenized. Generous: text averages about 4; raise it
      only for conversations made mostly of long runs of spaces or rule lines.
    - `transcript_store_conversations` / `transcript_store_tokens` / `transcript_store_bytes`: bounds of the
      tools-mode transcript store (0 conversations disables it: every follow-up is rendered from scratch). It
      holds conversations packed and counts the bytes they really hold (a full store measured at 1.01x its
      count). A text conversation costs about 11 bytes a token (4 an id, 8 more a generated id, its messages'
      text), so 8M tokens are some 85 MB; the 256 MiB byte bound binds first for conversations heavy in images.
    - `max_image_bytes`: the largest image a message may carry, decoded (400 beyond). Images arrive inline as
      base64 data URLs, a third larger than the image, so `max_request_bytes` bounds them too: raise both to
      take large images.
    - `max_image_pixels`: the most pixels (width x height, read from every frame header and confirmed by the
      decoder) one image may have (400 beyond): a few kilobytes of PNG can claim a gigapixel that an engine would
      decode in full. The server decodes each image it takes, one at a time, so this also bounds the memory one
      image costs it: at most 4 bytes a pixel.
    - `max_request_pixels`: the most pixels all the images of one request may have together (400 beyond): an
      engine decodes a request's images together.
    - `max_images`: the most images one request may carry (400 beyond), whatever the recipe allows; a recipe's
      own `max_images` lowers it.
    """

    model_name: str
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_concurrency: int = 64
    trajectory_log: str | None = None
    engine_timeout_s: float = 600.0
    transcript_store_conversations: int = 1024
    transcript_store_tokens: int = 8_000_000
    transcript_store_bytes: int = 256 * 2**20
    max_request_bytes: int = 8 * 1024 * 1024
    request_read_timeout_s: float = 30.0
    max_buffered_request_bytes: int = 256 * 1024 * 1024
    max_chars_per_token: float = 32.0
    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_request_pixels: int = 80_000_000
    max_images: int = 16

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.engine_timeout_s <= 0:
            raise ValueError(f"engine_timeout_s must be positive, got {self.engine_timeout_s}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be at least 1, got {self.max_request_bytes}")
        if self.max_buffered_request_bytes < self.max_request_bytes:
            raise ValueError(
                f"max_buffered_request_bytes ({self.max_buffered_request_bytes}) must be at least max_request_bytes "
                f"({self.max_request_bytes})"
            )
        if self.request_read_timeout_s <= 0:
            raise ValueError(f"request_read_timeout_s must be positive, got {self.request_read_timeout_s}")
        if self.max_chars_per_token < 1:
            raise ValueError(f"max_chars_per_token must be at least 1, got {self.max_chars_per_token}")
        if self.max_image_bytes < 1 or self.max_image_pixels < 1:
            raise ValueError(
                f"max_image_bytes and max_image_pixels must be at least 1, got {self.max_image_bytes} and "
                f"{self.max_image_pixels}"
            )
        if self.max_request_pixels < 1 or self.max_images < 1:
            raise ValueError(
                f"max_request_pixels and max_images must be at least 1, got {self.max_request_pixels} and "
                f"{self.max_images}"
            )
