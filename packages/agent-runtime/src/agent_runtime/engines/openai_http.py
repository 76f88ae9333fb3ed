"""`OpenAIEngine`: token ids in and out over HTTP, through an OpenAI-compatible `/v1/completions` endpoint.

The request sends the prompt as a list of token ids and asks for the generated ids back, which vLLM
(>= 0.10.2) and SGLang both support with the same fields:

    {"prompt": [ids...], "return_token_ids": true, "skip_special_tokens": false, "logprobs": 1,
     "max_tokens": n, "temperature": t, "top_p": p, "top_k": k, "stop_token_ids": [...], "seed": s}

and the answer's `choices[0]` carries `token_ids` (the generated ids, a stop token included),
`logprobs.token_logprobs` and `finish_reason`. `output_token_ids` and `output_ids` (the key of SGLang's native
`/generate`) are read when `token_ids` is absent. The text of a `Generation` is decoded here from those ids with
the engine's tokenizer, so it is the same text every engine gives for the same ids; the server's `text` is not
used. A server that answers without token ids is an error: token-in-token-out cannot be rebuilt from text.

Failures: 408, 429 and 5xx answers, timeouts and connection errors are retried with capped exponential backoff
and a little jitter (honouring a short `Retry-After`); other 4xx answers raise `EngineError` at once with the
server's message. When the retries are spent, a server that could not be reached (or kept answering 503) raises
`EngineUnavailable`; anything else raises `EngineError`. Pass server-specific fields (e.g. SGLang's
`no_stop_trim`) with `extra_body`.

The upstream is not trusted. `timeout_s` bounds each read, which a server that trickles its answer byte by byte
never trips, so `deadline_s` bounds the whole call (every attempt, every backoff and the body read) and raises
`EngineTimeout` when it passes. What comes back passes `validate_generation` (plain int ids inside the
tokenizer's vocabulary, at most `max_tokens` of them, finite logprobs one per id, a known finish reason); a body
that is not JSON, has no usable choice or fails those checks raises `EngineBadOutput` at once, without retrying.
Nor is its size: `max_response_bytes` caps the decoded body (a gzip bomb stops inflating there), and the JSON's
values are counted against a budget set by the request before anything is decoded, off the event loop
(`_upstream_answer.py`), so a few kilobytes on the wire can neither fill this process's memory nor stall its loop.

Images: `/v1/completions` takes no images with a token prompt (vLLM 0.29's `CompletionRequest` has `prompt`
and `prompt_embeds`, no multimodal field), and `/v1/chat/completions` takes messages, not token ids. vLLM 0.29's
token-in-token-out endpoint does both: `POST /inference/v1/generate` (`vllm/entrypoints/scale_out/
token_in_token_out`, mounted by `vllm serve` for every generative model) takes

    {"token_ids": [ids...], "content_parts": [{"type": "image_url", "url": "data:image/png;base64,..."}, ...],
     "sampling_params": {vLLM SamplingParams fields}, "stream": false}

renders the ids with the images through the model's multimodal processor (which expands each `<|image_pad|>`
into the image's count, as for `VLLMEngine`) and answers `choices[0].{token_ids, logprobs.content[i].logprob,
finish_reason}`. So an engine with `accepts_images` sends an image prompt there: the ids with each run of pads
collapsed (`collapse_image_pads`), the images as data URLs in pad order (a file is read and sent as bytes, since
the server may not see this machine's files). `accepts_images` defaults to whether the engine's tokenizer knows
an image grid (`tokenizer.vision`, read from the model directory's ``preprocessor_config.json``): a
vision-language model. Text prompts keep using `/v1/completions`. The same retries, deadline and output checks
apply to both.

Several upstreams: `base_url` may be a list of API roots (data-parallel replicas of one model). Each call goes to
one of them by `upstream_pool.UpstreamPool`: an episode's first turn to the one its key hashes to (rendezvous
hashing, so replicas of the server agree; another when that one is overloaded), its later turns to the same one
(its prefix cache), keyed by the session its caller names (`call_engine(..., session=...)`,
`session_key.py`). An upstream that refuses the connection is left at once for another one (with one upstream it
is retried as above); one that stays unavailable through its retries (503, connect timeouts) is left after them;
either is marked down for `down_s` and its episodes re-pinned elsewhere. When every upstream fails, the
`EngineUnavailable` names each one and why. Every request carries the session key in the `session_header`
(default `X-Session-ID`) so a router in front (vllm-router, SGLang's router) can keep the affinity itself.
`stats()` gives the per-upstream and affinity counters.

This module knows HTTP and the completions wire format; it knows nothing about chat formats or the model.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import structlog

from agent_protocol import Tokenizer, collapse_image_pads, image_grid, load_tokenizer, read_image
from agent_runtime.engines._upstream_answer import ACCEPT_ENCODING, AnswerBody, AnswerLimits, decode_answer, read_body
from agent_runtime.engines.base import (
    Generation,
    LLMEngine,
    SamplingParams,
    plain_ids,
    tokenizer_vocab_size,
    validate_generation,
)
from agent_runtime.engines.session_key import current_session
from agent_runtime.engines.upstream_pool import Upstream, UpstreamPool
from agent_runtime.errors import EngineBadOutput, EngineError, EngineTimeout, EngineUnavailable

__all__ = ["OpenAIEngine"]

logger = structlog.get_logger(__name__)

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_GENERATE_PATH: Final = "/inference/v1/generate"  # vLLM's token-in-token-out endpoint, at the server's root
_IMAGE_TYPES: Final = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
    (b"BM", "image/bmp"),
)


DEFAULT_MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
_ERROR_BODY_BYTES: Final = 64 * 1024  # an error answer is read this far, for its message


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str
    unreachable: bool  # the server could not be reached (or said 503): EngineUnavailable when retries run out
    retry_after: float | None = None
    error: BaseException | None = None


class OpenAIEngine(LLMEngine):
    """An OpenAI-compatible completions server that takes and returns token ids.

    `base_url` is the API root including `/v1` (as for the OpenAI SDK), e.g. `http://localhost:8000/v1`, or a
    list of them (replicas of one model, each episode pinned to one: the module docstring). `session_header`
    (None: none) carries the caller's session key on every request; `max_sessions` bounds the affinity table and
    `down_s` is how long an unreachable upstream is passed over.
    `context_length` is the server's `max_model_len`; prompts are checked and `max_tokens` clamped against it
    here, so the server never rejects a request for its length. `stop_token_ids` default to the tokenizer's
    `<|im_end|>` and `<|endoftext|>`; they are sent with every request. `deadline_s` (None: none) bounds one
    `generate` call end to end; its default matches `AgentRuntime`'s `engine_timeout_s`, because a completion
    that is not streamed sends nothing until it is done, so the deadline must outlast the longest honest
    generation. `timeout_s` bounds each read. `max_response_bytes` caps one answer's body once decoded (default
    64 MiB, far above a 32k-token completion with logprobs); a server that sends more, compressed or not, is
    `EngineBadOutput`, read no further.
    `accepts_images` (default: the tokenizer has an image grid) sends image prompts to `generate_url` (default:
    vLLM's `/inference/v1/generate` at the root of `base_url`), their pads collapsed on `image_pad_id` (default:
    the tokenizer's `<|image_pad|>`).
    """

    name = "openai"

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        model: str,
        tokenizer: Tokenizer | str | Path,
        context_length: int,
        stop_token_ids: Sequence[int] | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        deadline_s: float | None = 600.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        connect_timeout_s: float = 10.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        extra_body: Mapping[str, Any] | None = None,
        client: httpx.AsyncClient | None = None,
        accepts_images: bool | None = None,
        generate_url: str | None = None,
        image_pad_id: int | None = None,
        session_header: str | None = "X-Session-ID",
        max_sessions: int = 65536,
        down_s: float = 5.0,
    ) -> None:
        if context_length < 1:
            raise ValueError(f"context_length must be positive, got {context_length}")
        if max_retries < 0 or backoff_s < 0 or backoff_max_s < 0:
            raise ValueError("max_retries, backoff_s and backoff_max_s must be >= 0")
        if deadline_s is not None and not deadline_s > 0:  # `not >` also refuses NaN
            raise ValueError(f"deadline_s must be positive (or None for no deadline), got {deadline_s}")
        if max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be positive, got {max_response_bytes}")
        self.max_response_bytes = max_response_bytes
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.base_urls = tuple(url.rstrip("/") for url in urls)
        self.pool = UpstreamPool(self.base_urls, max_sessions=max_sessions, down_s=down_s)
        self.base_url = self.base_urls[0]
        self.session_header = session_header
        self.model = model
        self.tokenizer = load_tokenizer(tokenizer)
        self.vocab_size = tokenizer_vocab_size(self.tokenizer)
        self.context_length = context_length
        self.deadline_s = deadline_s
        if stop_token_ids is None:
            named = ("<|im_end|>", "<|endoftext|>")
            stop_token_ids = [i for t in named if (i := self.tokenizer.token_to_id(t)) is not None]
        self.stop_token_ids = tuple(stop_token_ids)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.extra_body = dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), headers=headers
        )
        if client is not None and headers:
            self._client.headers.update(headers)
        self._closed = False
        if generate_url is not None and len(self.base_urls) > 1:
            raise ValueError("generate_url names one server; with several base_urls each one's own is used")
        self._generate_urls = {url: f"{url.removesuffix('/v1')}{_GENERATE_PATH}" for url in self.base_urls}
        self.generate_url = generate_url or self._generate_urls[self.base_url]
        self._generate_urls[self.base_url] = self.generate_url
        self.image_pad_id = image_pad_id if image_pad_id is not None else self.tokenizer.token_to_id("<|image_pad|>")
        vision = image_grid(self.tokenizer) is not None
        self.accepts_images = (vision if accepts_images is None else accepts_images) and self.image_pad_id is not None

    def request_body(self, prompt_ids: Sequence[int], sampling: SamplingParams, max_tokens: int) -> dict[str, Any]:
        """The JSON body sent for one generation (public so callers can log or replay it)."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": plain_ids(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": sorted(set(self.stop_token_ids) | set(sampling.stop_token_ids)),
            "return_token_ids": True,
            "skip_special_tokens": False,
            "n": 1,
            "stream": False,
        }
        if sampling.logprobs:
            body["logprobs"] = 1
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        body.update(self.extra_body)
        return body

    def image_request_body(
        self, prompt_ids: Sequence[int], images: Sequence[str], sampling: SamplingParams, max_tokens: int
    ) -> dict[str, Any]:
        """The JSON body of an image prompt for vLLM's `/inference/v1/generate`: the ids with each run of image
        pads collapsed, the images as data URLs in pad order. ValueError for a text-only engine, an image that
        cannot be read or runs of pads that are not one per image."""
        if not self.accepts_images or self.image_pad_id is None:
            raise ValueError("openai: this engine's model is text-only (its tokenizer has no image grid)")
        collapsed = collapse_image_pads(plain_ids(prompt_ids), {self.image_pad_id})
        runs = collapsed.count(self.image_pad_id)
        if runs != len(images):
            raise ValueError(f"openai: the prompt holds {runs} runs of image pads for {len(images)} images")
        params: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else 0,
            "stop_token_ids": sorted(set(self.stop_token_ids) | set(sampling.stop_token_ids)),
            "skip_special_tokens": False,
            "detokenize": False,
            "n": 1,
        }
        if sampling.logprobs:
            params["logprobs"] = 1
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        parts = [{"type": "image_url", "url": _as_data_url(url, k)} for k, url in enumerate(images)]
        body: dict[str, Any] = {"model": self.model, "token_ids": collapsed, "content_parts": parts}
        body.update(sampling_params=params, stream=False)
        body.update(self.extra_body)
        return body

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        if self._closed:
            raise EngineUnavailable("openai: the engine is closed")
        budget = self.max_new_tokens_for(len(prompt_ids), sampling.max_new_tokens)
        if images:
            body = await asyncio.to_thread(self.image_request_body, prompt_ids, images, sampling, budget)
        else:
            body = self.request_body(prompt_ids, sampling, budget)
        url = self.generate_url if images else f"{self.base_url}/completions"  # the one named in a deadline error
        if len(self.base_urls) > 1:
            url = f"{len(self.base_urls)} upstreams ({', '.join(self.base_urls)})"
        limits = AnswerLimits.for_request(
            prompt_tokens=len(prompt_ids), max_new_tokens=budget, max_bytes=self.max_response_bytes
        )
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.deadline_s) as deadline:
                content, url = await self._send(body, limits, images=bool(images))
        except TimeoutError as e:
            if not deadline.expired():
                raise  # not ours: let it through as it came
            logger.warning("openai_request_deadline_passed", url=url, deadline_s=self.deadline_s)
            raise EngineTimeout(
                f"openai: {url} gave no complete answer within the {self.deadline_s} s deadline "
                f"({time.perf_counter() - started:.1f} s, retries included)"
            ) from e
        return await asyncio.to_thread(self._parse, content, limits, url, sampling, budget)  # megabytes, maybe

    async def close(self) -> None:
        self._closed = True
        if self._owns_client:
            await self._client.aclose()

    def stats(self) -> dict[str, Any]:
        return {"engine": self.name, **self.pool.stats()}

    # -- HTTP ----------------------------------------------------------------------------------------------

    async def _send(self, body: Mapping[str, Any], limits: AnswerLimits, *, images: bool) -> tuple[AnswerBody, str]:
        """The answer of the upstream that took the call, and its URL: the session's pinned upstream, another
        when that one is unavailable (the module docstring)."""
        key = current_session()
        headers = {self.session_header: key} if key is not None and self.session_header else {}
        pool, tried, reasons = self.pool, list[Upstream](), list[str]()
        several = len(pool.upstreams) > 1
        pinned = pool.pinned(key)
        while (upstream := pool.pick(key, tried)) is not None:
            url = self._generate_urls[upstream.url] if images else f"{upstream.url}/completions"
            upstream.requests += 1
            upstream.in_flight += 1
            try:
                content = await self._post(url, body, limits, headers, fail_over=several)
            except EngineUnavailable as e:
                pool.failed(upstream, unreachable=True)
                if not several:
                    raise
                tried.append(upstream)
                reasons.append(str(e))
                logger.warning("openai_upstream_failed_over", url=url, session=key, error=str(e)[:300])
                continue
            except EngineError:
                pool.failed(upstream, unreachable=False)
                raise
            finally:
                upstream.in_flight -= 1
            pool.answered(upstream, pinned)
            return content, url
        raise EngineUnavailable(f"openai: every upstream is unavailable ({len(tried)}): " + "; ".join(reasons))

    async def _post(
        self,
        url: str,
        body: Mapping[str, Any],
        limits: AnswerLimits,
        headers: Mapping[str, str] | None = None,
        *,
        fail_over: bool = False,
    ) -> AnswerBody:
        """`fail_over`: a refused connection raises `EngineUnavailable` at once (another upstream will take the
        call) instead of being retried here."""
        log = logger.bind(url=url)
        for attempt in itertools.count():
            started = time.perf_counter()
            failure = await self._attempt(url, body, limits, headers or {})
            if isinstance(failure, AnswerBody):
                return failure
            if fail_over and isinstance(failure.error, httpx.ConnectError):
                raise EngineUnavailable(f"openai: {url} refused the connection: {failure.reason}") from failure.error
            if attempt >= self.max_retries:
                log.warning("openai_request_failed", attempts=attempt + 1, reason=failure.reason)
                kind = EngineUnavailable if failure.unreachable else EngineError
                raise kind(f"openai: {url} failed after {attempt + 1} attempt(s): {failure.reason}") from failure.error
            delay = self._backoff(attempt, failure.retry_after)
            log.info(
                "openai_request_retrying",
                attempt=attempt + 1,
                reason=failure.reason,
                delay_s=round(delay, 3),
                seconds=round(time.perf_counter() - started, 3),
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - itertools.count() never ends

    async def _attempt(
        self, url: str, body: Mapping[str, Any], limits: AnswerLimits, extra_headers: Mapping[str, str]
    ) -> AnswerBody | _Failure:
        """One POST: the answer's decoded body, or a failure worth retrying. Raises for a failure that is not."""
        headers = {
            **extra_headers,
            "Accept-Encoding": ACCEPT_ENCODING,
        }  # only the codings `read_body` inflates under its cap
        try:
            async with self._client.stream("POST", url, json=body, headers=headers) as response:
                error = response.status_code >= 400
                limit = min(limits.max_bytes, _ERROR_BODY_BYTES) if error else limits.max_bytes
                content = await read_body(response, url, limit=limit, truncate=error)
        except httpx.TimeoutException as e:
            return _Failure(f"timed out ({type(e).__name__})", isinstance(e, httpx.ConnectTimeout), error=e)
        except httpx.TransportError as e:
            return _Failure(f"{type(e).__name__}: {e}", isinstance(e, httpx.ConnectError), error=e)
        if not error:
            return content
        with content:
            message = _error_message(response, content.tobytes())
        if response.status_code not in _RETRY_STATUS:
            logger.warning("openai_request_rejected", url=url, status=response.status_code, message=message)
            raise EngineError(f"openai: {url} rejected the request ({response.status_code}): {message}")
        reason = f"HTTP {response.status_code}: {message}"
        return _Failure(reason, response.status_code == 503, retry_after=_retry_after_s(response))

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.backoff_max_s, self.backoff_s * 2.0**attempt)
        delay = min(self.backoff_max_s, delay * (1 + random.uniform(0, 0.1)))  # jitter spreads synchronized retries
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max_s))
        return delay

    def _parse(
        self, content: AnswerBody, limits: AnswerLimits, url: str, sampling: SamplingParams, max_tokens: int
    ) -> Generation:
        """The answer's first choice as a checked `Generation` (in a worker thread: the body may be megabytes)."""
        with content:
            answer = decode_answer(content, limits, url)
            if not answer.choices:
                raise EngineBadOutput(f"openai: the response has no choices: {content.tobytes()[:200]!r}")
        choice = answer.choices[0]
        ids = choice.ids
        if ids is None:
            raise EngineBadOutput(
                "openai: the server returned no token ids; it must support `return_token_ids` "
                "(vLLM >= 0.10.2, or SGLang) so generated ids are never re-tokenized from text"
            )
        logprobs: object = None
        if sampling.logprobs:
            logprobs = choice.logprob_values
            if logprobs is None:  # a server that gives none is allowed; training then has no rollout logprobs
                logger.warning("openai_logprobs_missing", ids=len(ids))
        return validate_generation(
            "openai",
            self.tokenizer,
            ids=ids,
            logprobs=logprobs,
            finish_reason=choice.finish_reason,
            max_tokens=max_tokens,
            vocab_size=self.vocab_size,
        )


def _as_data_url(url: str, index: int) -> str:
    """`url` when it is already a data URL, else the image it names read into one (the server may not share this
    machine's files). ValueError naming the image when it cannot be read."""
    try:
        data = read_image(url)
    except ValueError as e:
        raise ValueError(f"openai: image {index}: {e}") from e
    if url.startswith("data:"):
        return url
    mime = next((kind for magic, kind in _IMAGE_TYPES if data.startswith(magic)), "image/png")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _error_message(response: httpx.Response, content: bytes) -> str:
    """The server's own words: vLLM/OpenAI `{"error": {"message"}}`, older vLLM `{"message"}`, or the body."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return content.decode("utf-8", "replace").strip()[:500] or response.reason_phrase
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return str(data)[:500]


def _retry_after_s(response: httpx.Response) -> float | None:
    value: str | None = response.headers.get("retry-after")
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None
