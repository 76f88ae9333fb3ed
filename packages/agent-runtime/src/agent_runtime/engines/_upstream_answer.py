"""An upstream's answer, read without trusting it: its body inflated under a cap, its JSON bounded before decoding.

Three ways an answer of a few kilobytes could cost this process gigabytes, and what stops each:

- Compression. `read_body` takes the raw bytes and undoes ``Content-Encoding`` itself (``gzip``, ``deflate``,
  ``identity``, stacked at most `MAX_ENCODINGS` deep), inflating at most `_PIECE` bytes at a time, so the cap
  counts decoded bytes and a gzip bomb is refused at the cap, having inflated no further. httpx's own decoders
  inflate a whole network chunk at once (64 KiB of gzip is 64 MiB), so they are not used. Between pieces the
  event loop runs.
- Values. JSON decodes to objects much larger than its text (``[],`` is 3 bytes and a 56-byte list; 13 M ids
  are half a gigabyte of ints). `check_answer_shape` counts the answer's JSON tokens (strings, ``[ { , :``)
  against a budget set by the request (`AnswerLimits.for_request`: a multiple of `max_tokens` and of the
  prompt's length, which vLLM echoes), and the length of its longest string, before any decoder sees it. A
  body of few tokens is passed by a handful of C-speed ``bytes.count`` calls; another is walked string by string,
  stopping as soon as the budget is spent.
- Copies. The decoded body is held once, in an anonymous memory map (`AnswerBody`), and decoded from there.
- Decoding. `decode_answer` reads only what a completion needs (``choices[i].token_ids`` and its aliases,
  ``logprobs.token_logprobs`` or ``logprobs.content[i].logprob``, ``finish_reason``) with msgspec, which skips
  every other field without building it, straight from the bytes (no copy of the body as text).

`check_answer_shape` and `decode_answer` are synchronous; the engine runs them in a worker thread. Every refusal is
`EngineBadOutput`. This module knows JSON, HTTP content codings and the shape of a completions answer; it
knows nothing about tokenizers or retries.
"""

from __future__ import annotations

import asyncio
import mmap
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import httpx
import msgspec

from agent_runtime.errors import EngineBadOutput

__all__ = [
    "ACCEPT_ENCODING",
    "MAX_ENCODINGS",
    "AnswerBody",
    "AnswerLimits",
    "UpstreamAnswer",
    "UpstreamChoice",
    "check_answer_shape",
    "decode_answer",
    "read_body",
]

ACCEPT_ENCODING: Final = "gzip, deflate"
"""What the engine offers to decode; an answer in any other coding is refused."""

MAX_ENCODINGS: Final = 2
"""The most content codings an answer may stack (``gzip, gzip``); each one is inflated under the cap."""

_PIECE: Final = 64 * 1024  # the most bytes one inflate call may produce
_FIRST_MAP: Final = 1024 * 1024  # an answer's first map, doubled as it fills (most answers fit)
_BASE_TOKENS: Final = 4096  # JSON tokens of an answer's envelope (id, usage, model, ...), generously
_TOKENS_PER_NEW_TOKEN: Final = 48  # token_ids, logprobs, tokens, top_logprobs, content[i]{token,bytes,...}
_TOKENS_PER_PROMPT_TOKEN: Final = 2  # `prompt_token_ids`, which vLLM sends back
_BASE_STRING_BYTES: Final = 4096
_STRING_BYTES_PER_NEW_TOKEN: Final = 256  # `text`: the longest token's text, escaped, is far shorter
_STRUCTURAL: Final = (b",", b":", b"[", b"{")
_STRING_SPAN: Final = re.compile(rb'(?:[^"\\]++|\\.)*+', re.S)  # inside a string: possessive, so no backtracking
_WINDOW: Final = 256 * 1024  # the most bytes of one string matched in one call (one call holds the GIL)


@dataclass(frozen=True, slots=True)
class AnswerLimits:
    """What one answer may hold: `max_bytes` decoded bytes, `max_tokens` JSON tokens, strings of at most
    `max_string_bytes`."""

    max_bytes: int
    max_tokens: int
    max_string_bytes: int

    @classmethod
    def for_request(cls, *, prompt_tokens: int, max_new_tokens: int, max_bytes: int) -> AnswerLimits:
        """The limits of the answer to a request for `max_new_tokens` after a prompt of `prompt_tokens`: far
        above what vLLM or SGLang send for it (every field, logprobs included), far below what amplifies."""
        return cls(
            max_bytes=max_bytes,
            max_tokens=_BASE_TOKENS + _TOKENS_PER_NEW_TOKEN * max_new_tokens + _TOKENS_PER_PROMPT_TOKEN * prompt_tokens,
            max_string_bytes=_BASE_STRING_BYTES + _STRING_BYTES_PER_NEW_TOKEN * max_new_tokens,
        )


# -- the body ---------------------------------------------------------------------------------------------------


class AnswerBody:
    """A decoded body, in a private anonymous memory map that doubles as it fills (`mremap`: the pages move,
    nothing is copied; a shared one would fault past its first size) up to `limit`. A `bytearray` grown piece by
    piece is copied at each step, and in a heap whose large blocks are no longer mapped apart those copies stay
    resident: 8 MiB read that way cost 45 MiB. Close it (or use it as a context manager)."""

    def __init__(self, limit: int, expected: int = 0) -> None:
        self.limit = limit
        self._map = mmap.mmap(-1, max(1, min(limit, max(expected, _FIRST_MAP))), flags=mmap.MAP_PRIVATE)
        self.size = 0

    def __enter__(self) -> AnswerBody:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._map.close()

    def write(self, piece: bytes) -> None:
        needed = self.size + len(piece)
        if needed > len(self._map):
            self._map.resize(min(self.limit, max(needed, 2 * len(self._map))))
        self._map.write(piece)
        self.size = needed

    def __getitem__(self, index: int) -> int:
        return self._map[index]

    def find(self, sub: bytes, start: int, end: int) -> int:
        return self._map.find(sub, start, min(end, self.size))

    def count(self, sub: bytes, start: int, end: int) -> int:
        """Occurrences of the one byte `sub` in `[start, end)`, counted a window at a time (mmap has no count)."""
        total, end = 0, min(end, self.size)
        for at in range(start, end, _WINDOW):
            total += self._map[at : min(end, at + _WINDOW)].count(sub)
        return total

    def match(self, pattern: re.Pattern[bytes], start: int, end: int) -> int:
        """Where `pattern`, matched at `start` and not past `end`, stops."""
        found = pattern.match(self._map, start, min(end, self.size))
        return start if found is None else int(found.end())

    def tobytes(self) -> bytes:
        return self._map[: self.size]

    def decode(self, decoder: msgspec.json.Decoder[UpstreamAnswer]) -> UpstreamAnswer:
        with memoryview(self._map) as whole, whole[: self.size] as view:
            return decoder.decode(view)


class _Inflater:
    """One content coding undone, `_PIECE` bytes at a time, refusing to produce more than `limit` in all."""

    def __init__(self, coding: str, limit: int, url: str) -> None:
        self.coding = coding
        self.limit = limit
        self.url = url
        self.produced = 0
        self._wbits = zlib.MAX_WBITS | 16 if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
        self._inflate = zlib.decompressobj(self._wbits)

    @property
    def done(self) -> bool:
        return self._inflate.eof

    def feed(self, data: bytes) -> Iterator[bytes]:
        while True:
            try:
                out = self._inflate.decompress(data, _PIECE)
            except zlib.error as e:
                if self.coding == "deflate" and self.produced == 0 and self._wbits > 0:  # raw deflate, no header
                    self._wbits, self._inflate = -zlib.MAX_WBITS, zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise EngineBadOutput(f"openai: {self.url} sent a {self.coding} body that does not inflate: {e}") from e
            data = self._inflate.unconsumed_tail
            self.produced += len(out)
            if self.produced > self.limit:
                raise EngineBadOutput(
                    f"openai: {self.url} sent a {self.coding} body that inflates past max_response_bytes "
                    f"({self.limit:,} bytes); stopped inflating"
                )
            if out:
                yield out
            if self._inflate.eof or (not data and len(out) < _PIECE):
                return


def _inflaters(response: httpx.Response, limit: int, url: str) -> list[_Inflater]:
    """The codings of `response`, outermost first, as inflaters; EngineBadOutput for one the engine never
    offered or a stack deeper than `MAX_ENCODINGS`."""
    header = response.headers.get("content-encoding", "")
    codings = [c.strip().lower() for c in header.split(",") if c.strip() and c.strip().lower() != "identity"]
    if len(codings) > MAX_ENCODINGS:
        raise EngineBadOutput(f"openai: {url} stacked {len(codings)} content codings ({header!r}); at most 2 are read")
    unknown = [c for c in codings if c not in ("gzip", "x-gzip", "deflate")]
    if unknown:
        raise EngineBadOutput(f"openai: {url} answered in the content coding {unknown[0]!r}, which was not offered")
    return [_Inflater(coding, limit, url) for coding in reversed(codings)]


def _through(inflaters: list[_Inflater], data: bytes) -> Iterator[bytes]:
    if not inflaters:
        yield data
        return
    for piece in inflaters[0].feed(data):
        yield from _through(inflaters[1:], piece)


async def read_body(response: httpx.Response, url: str, *, limit: int, truncate: bool = False) -> AnswerBody:
    """The decoded body of `response`, at most `limit` bytes of it. Past the limit: EngineBadOutput, or with
    `truncate` (an error page, read for its message) the first `limit` bytes. A Content-Length above the limit
    is refused before reading."""
    declared = response.headers.get("content-length")
    if not truncate and declared is not None and declared.isdigit() and int(declared) > limit:
        raise EngineBadOutput(
            f"openai: {url} announced a {int(declared):,}-byte answer, over max_response_bytes ({limit:,})"
        )
    inflaters = _inflaters(response, limit, url)
    body = AnswerBody(limit, int(declared) if declared is not None and declared.isdigit() and not inflaters else 0)
    try:
        async for raw in response.aiter_raw():
            for piece in _through(inflaters, raw):
                if body.size + len(piece) > limit:
                    if truncate:
                        body.write(piece[: limit - body.size])
                        return body
                    raise EngineBadOutput(
                        f"openai: {url} sent more than max_response_bytes ({limit:,}) decoded; stopped reading"
                    )
                body.write(piece)
                if inflaters:
                    await asyncio.sleep(0)  # a piece inflated: let the loop run before the next one
        if not truncate and not all(inflater.done for inflater in inflaters):
            raise EngineBadOutput(f"openai: {url} sent a compressed body that ends before its compressed stream does")
    except BaseException:
        body.close()
        raise
    return body


# -- the JSON ---------------------------------------------------------------------------------------------------


def check_answer_shape(body: AnswerBody, limits: AnswerLimits, url: str) -> None:
    """EngineBadOutput when `body` holds more than `limits.max_tokens` JSON tokens or a string longer than
    `limits.max_string_bytes` (see the module docstring); cost bounded by the budget, not the body."""
    size = body.size
    quotes = body.count(b'"', 0, size)
    upper = quotes // 2 + 1 + sum(body.count(c, 0, size) for c in _STRUCTURAL)  # strings' insides too: an upper bound
    if upper <= limits.max_tokens and size <= limits.max_string_bytes:
        return
    tokens, position = 0, 0
    while True:
        quote = body.find(b'"', position, size)
        end = size if quote < 0 else quote
        tokens += sum(body.count(c, position, end) for c in _STRUCTURAL)
        if tokens > limits.max_tokens:
            raise EngineBadOutput(
                f"openai: {url} answered JSON of more than {limits.max_tokens:,} values for this request "
                f"(its limit, set by max_tokens and the prompt); stopped reading it"
            )
        if quote < 0:
            return
        position = _string_end(body, quote + 1, limits.max_string_bytes, url)
        tokens += 1


def _string_end(body: AnswerBody, start: int, limit: int, url: str) -> int:
    """Where the string opened just before `start` ends (past its closing quote). EngineBadOutput once it has
    run past `limit` bytes, or when it never ends. Matched a window at a time, so no one call holds the GIL
    for long, and no more than `limit` bytes are looked at."""
    quote = body.find(b'"', start, start + limit + 1)
    if quote >= 0 and body.find(b"\\", start, quote) < 0:  # no escapes: the first quote closes it
        return quote + 1
    position, size = start, body.size
    while position - start <= limit:
        was = position
        position = body.match(_STRING_SPAN, position, position + _WINDOW)
        if position < size and body[position] == 0x22 and position - start <= limit:
            return position + 1
        if position >= size or position == was:  # the body ends inside the string (or on a lone backslash)
            raise EngineBadOutput(f"openai: {url} answered a body that is not JSON it can read (a string never ends)")
    raise EngineBadOutput(
        f"openai: {url} answered a JSON string of more than {limit:,} bytes (its limit, set by max_tokens); "
        "stopped reading it"
    )


_Number = int | float | bool | None  # what validate_generation names when it is not the int or float it wants


class _Step(msgspec.Struct):
    logprob: _Number = None


class _Logprobs(msgspec.Struct):
    token_logprobs: list[_Number] | msgspec.UnsetType | None = msgspec.UNSET
    content: list[_Step] | None = None


class UpstreamChoice(msgspec.Struct):
    """The fields of one choice a completion needs; every other field is skipped unread."""

    token_ids: list[_Number] | None = None
    output_token_ids: list[_Number] | None = None
    output_ids: list[_Number] | None = None  # SGLang's native /generate
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None

    @property
    def ids(self) -> list[_Number] | None:
        """The generated ids, under whichever key the server used."""
        return next((v for v in (self.token_ids, self.output_token_ids, self.output_ids) if v is not None), None)

    @property
    def logprob_values(self) -> list[_Number] | None:
        """`token_logprobs` (/v1/completions) when present, else `content[i].logprob` (/inference/v1/generate)."""
        block = self.logprobs
        if block is None:
            return None
        if not isinstance(block.token_logprobs, msgspec.UnsetType):
            return block.token_logprobs
        return None if block.content is None else [step.logprob for step in block.content]


class UpstreamAnswer(msgspec.Struct):
    choices: list[UpstreamChoice] | None = None


_DECODER: Final = msgspec.json.Decoder(UpstreamAnswer)


def decode_answer(body: AnswerBody, limits: AnswerLimits, url: str) -> UpstreamAnswer:
    """The answer's completion fields, after `check_answer_shape`; EngineBadOutput for a body that is not JSON
    or not shaped like a completion, naming where (``$.choices[0].token_ids[3]``)."""
    check_answer_shape(body, limits, url)
    try:
        return body.decode(_DECODER)
    except msgspec.ValidationError as e:
        raise EngineBadOutput(f"openai: {url} answered JSON that is not a completion: {e}") from e
    except (msgspec.DecodeError, RecursionError) as e:  # RecursionError: nesting deeper than the decoder goes
        raise EngineBadOutput(
            f"openai: {url} answered a body that is not JSON it can read ({type(e).__name__}: {str(e)[:120]})"
        ) from e
