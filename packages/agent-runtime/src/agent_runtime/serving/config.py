"""`ServeConfig`: the settings of one server, everything `create_app` needs beside the engine and the recipe.

This module holds settings, their defaults and their bounds, in one place: `ServeConfig.add_arguments` gives a
command line a flag for each limit (default and help from here), and `ServeConfig.from_args` builds the settings
from what was parsed, checked once, by the struct itself.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Final

import msgspec

__all__ = ["ServeConfig", "ServeConfigError"]


class ServeConfigError(ValueError):
    """A setting out of its bounds; `fields` names the settings the message is about."""

    def __init__(self, message: str, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.fields = fields


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of a server.

    - `model_name`: the id `/v1/models` lists and requests must name (`aliases` are accepted too).
    - `api_key`: when set, `/v1/*` and `/metrics` need ``Authorization: Bearer <api_key>`` (else 401).
    - `max_concurrency`: chat completions in flight at once; one more is answered 429 at once.
    - `trajectory_log`: a JSONL file that gets one `Trajectory` per chat completion.
    - `trajectories`: the trajectory files (a JSONL file or a directory of them) the viewer at ``/viewer`` browses;
      None: the `trajectory_log`, if any.
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
    - `store`: where the transcript store lives: ``memory`` (this process; the default) or a Redis URL
      (``redis://HOST:PORT/DB``) that replicas share, so any replica continues any conversation. With Redis the
      three bounds above are per entry (an entry over `transcript_store_tokens` tokens or `transcript_store_bytes`
      packed bytes is not stored) and Redis's ``maxmemory`` bounds the whole. `store_ttl_s` is how long an entry
      is kept, in either store (a take keeps it 300 s more). A Redis that is down costs speed, never
      correctness: follow-ups are rendered from scratch.
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
    store: str = "memory"
    store_ttl_s: float = 3600.0
    max_request_bytes: int = 8 * 1024 * 1024
    request_read_timeout_s: float = 30.0
    max_buffered_request_bytes: int = 256 * 1024 * 1024
    max_chars_per_token: float = 32.0
    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_request_pixels: int = 80_000_000
    max_images: int = 16
    trajectories: str | None = None

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ServeConfigError("model_name must not be empty", ("model_name",))
        for name, setting in _FLAGS.items():
            low, value = setting.low, getattr(self, name)
            if low is not None and not (value > low if setting.exclusive else value >= low):  # NaN fails both
                rule = f"greater than {low:g}" if setting.exclusive else f"at least {low:g}"
                raise ServeConfigError(f"{name} must be {rule}, got {value}", (name,))
        if self.store != "memory":
            from agent_runtime.serving.redis_store import check_store_url

            try:
                check_store_url(self.store)
            except ValueError as e:
                raise ServeConfigError(str(e), ("store",)) from None
        if self.max_buffered_request_bytes < self.max_request_bytes:
            raise ServeConfigError(
                f"max_buffered_request_bytes ({self.max_buffered_request_bytes}) must be at least max_request_bytes "
                f"({self.max_request_bytes})",
                ("max_buffered_request_bytes", "max_request_bytes"),
            )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Give `parser` a flag for every setting below the model's name and key, with this struct's defaults."""
        default_of = {field.name: field.default for field in msgspec.structs.fields(cls)}
        for name, flag in _FLAGS.items():
            default = default_of[name]
            kind = str if default is None else type(default)
            shown = "" if default is None else " (default: %(default)s)"
            parser.add_argument(
                flag.flag, dest=name, type=kind, default=default, metavar=flag.metavar, help=flag.help + shown
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **settings: Any) -> ServeConfig:
        """The settings parsed by `add_arguments`' flags, plus `settings` (model_name, aliases, api_key).

        Raises `ServeConfigError` naming the flags (``--max-images must be at least 1, got 0``), for
        ``parser.error``.
        """
        values = {name: getattr(args, name) for name in _FLAGS if hasattr(args, name)}
        try:
            return cls(**values, **settings)
        except ServeConfigError as e:
            message = str(e)
            for name in sorted(e.fields, key=len, reverse=True):
                if name in _FLAGS:
                    message = message.replace(name, _FLAGS[name].flag)
            raise ServeConfigError(message, e.fields) from None


@dataclass(frozen=True)
class _Flag:
    """A setting's flag, and its lower bound (`exclusive`: for seconds, which may be fractions but never 0)."""

    flag: str
    metavar: str | None
    help: str
    low: float | None = None
    exclusive: bool = False


_FLAGS: Final[dict[str, _Flag]] = {
    "max_concurrency": _Flag(
        "--max-concurrency",
        "N",
        "chat completions in flight at once; more are answered 429 at once, never queued",
        low=1,
    ),
    "engine_timeout_s": _Flag(
        "--engine-timeout",
        "SECONDS",
        "the longest one engine call may take, in all (every retry and the whole answer included, not per read); "
        "past it the request fails with a 500 `engine_timeout` and the episode is recorded",
        low=0,
        exclusive=True,
    ),
    "max_request_bytes": _Flag(
        "--max-request-bytes", "BYTES", "the largest request body accepted; a larger one is answered 413", low=1
    ),
    "request_read_timeout_s": _Flag(
        "--request-read-timeout",
        "SECONDS",
        "the longest a request body may take to arrive, in all; a client that stalls or trickles is answered 408. "
        "Bodies are read before a request counts against --max-concurrency",
        low=0,
        exclusive=True,
    ),
    "max_buffered_request_bytes": _Flag(
        "--max-buffered-request-bytes",
        "BYTES",
        "the bytes of request bodies held at once, across all requests being read; a body that would go past it is "
        "answered 429 with Retry-After; at least --max-request-bytes",
        low=1,
    ),
    "max_chars_per_token": _Flag(
        "--max-chars-per-token",
        "CHARS",
        "a conversation longer than the context at this many characters per token is answered 400 before it is "
        "tokenized; generous (text averages about 4), raise it only for text of long runs of spaces or rule lines",
        low=1,
    ),
    "max_image_bytes": _Flag(
        "--max-image-bytes",
        "BYTES",
        "the largest image a message may carry, decoded, on a vision-language model (400 beyond). Images arrive "
        "only as data:image/...;base64 URLs (remote URLs and server paths are refused); the body holding them must "
        "also fit --max-request-bytes (base64 is 4/3 of the bytes)",
        low=1,
    ),
    "max_image_pixels": _Flag(
        "--max-image-pixels",
        "PIXELS",
        "the most pixels (width x height, read from every frame header and confirmed by decoding the image) one "
        "image may have; the server decodes each image it takes, one at a time, at most 4 bytes a pixel",
        low=1,
    ),
    "max_request_pixels": _Flag(
        "--max-request-pixels", "PIXELS", "the most pixels all the images of one request may have together", low=1
    ),
    "max_images": _Flag(
        "--max-images", "N", "the most images one request may carry; a recipe's own max_images lowers it", low=1
    ),
    "transcript_store_conversations": _Flag(
        "--transcript-store-conversations",
        "N",
        "tools mode: the most conversations whose rendered tokens are kept, so a follow-up request renders only "
        "its new messages; 0 renders every follow-up from scratch",
        low=0,
    ),
    "transcript_store_tokens": _Flag(
        "--transcript-store-tokens", "TOKENS", "tools mode: the most tokens the transcript store holds, in all", low=0
    ),
    "transcript_store_bytes": _Flag(
        "--transcript-store-bytes",
        "BYTES",
        "tools mode: the most bytes the transcript store holds, in all (about 11 a token of text)",
        low=0,
    ),
    "store": _Flag(
        "--store",
        "memory|redis://HOST:PORT/DB",
        "tools mode: where the transcript store lives: memory (this process) or a Redis database that replicas "
        "share (any replica continues any conversation; needs agent-runtime[redis]). With Redis the --transcript-"
        "store-tokens/-bytes bounds are per entry (a larger one is not kept) and Redis's maxmemory bounds the whole; "
        "if Redis is down the server still answers, rendering follow-ups from scratch (counted in /metrics)",
    ),
    "store_ttl_s": _Flag(
        "--store-ttl",
        "SECONDS",
        "tools mode: how long a stored conversation is kept for its follow-up (a follow-up's take keeps it 300 s more)",
        low=0,
        exclusive=True,
    ),
    "trajectory_log": _Flag(
        "--trajectory-log", "PATH", "append one trajectory record (JSONL) per chat completion to this file"
    ),
    "trajectories": _Flag(
        "--trajectories",
        "PATH",
        "browse the trajectory records (JSONL) in this file or directory in the web page's viewer (/viewer): tokens "
        "coloured by loss mask, logprobs, segments, tool calls, rewards, errors. Without --model, only the viewer "
        "is served and no model is loaded (default: the --trajectory-log, if any)",
    ),
}
