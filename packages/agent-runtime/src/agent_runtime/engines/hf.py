"""`HFEngine`: a transformers causal LM, on CPU or GPU, behind the `LLMEngine` interface.

Generation is a hand-written incremental decoding loop over the model's KV cache, so every rule is visible here:

- sampling: temperature (below 1e-5 is greedy, as in vLLM), then top-k, then top-p, then a draw from a
  `torch.Generator` owned by the request (seeded with `SamplingParams.seed`, or randomly), so a seeded request
  gives the same ids however it was batched, up to float rounding between batch shapes;
- logprobs: the raw log-softmax of the model's logits at the sampled id, before temperature, top-k and top-p.
  This is vLLM's default (`logprobs_mode="raw_logprobs"`), so rollouts from this engine and from vLLM carry
  comparable numbers. They are computed only for the rows of a step whose request asks (`SamplingParams.logprobs`);
- stop: the model's eos ids (`generation_config.eos_token_id`, else `config.eos_token_id`) plus the request's
  `stop_token_ids`; the stop token is kept in the ids, as vLLM returns it;
- length: a prompt must leave room in `context_length` (else `ContextBudgetExceeded`); `max_new_tokens` is
  clamped to the room left, and `finish_reason` is "length" when the limit ended the generation;
- prompt ids: copied once into an `array('q')` (a C loop) and range-checked with one vectorised min/max, not a
  Python scan per id; the model's input is built from that buffer without another per-id conversion.

Fixed batches: `generate_batch(prompts, samplings)` runs exactly those requests, in that order, in batches of
`max_batch_size` rows formed from them alone (no waiting window, no joining either way), so the rows that share a
batch never depend on the timing of threads; one answer per prompt, an exception for a bad one. The local trainer's
lockstep engine (`agent_train.local.lockstep`) sends its waves this way, for bit-for-bit repeatable runs; serving
keeps `generate`'s arrival-time batching and joining, which answer a lone turn sooner.

The engine is four parts, one module each: construction, `generate` and `close` here; scheduling and batching on
one worker thread (`hf_batching`: batches, joining a running batch, the token bound, failures); the decode loop
(`hf_decode`: prefill, decode steps, the prefix cache's layout) with its sampling (`hf_sampling`); the kept
prefixes themselves (`hf_prefix`).

Closing: `close()` refuses new requests at once; what was sent before runs on for up to `timeout_s` (30 s by
default; None waits for all of it). Then the running batch stops at its next step and every request not answered
yet fails with `EngineUnavailable`, so a shutdown never waits on a long generation. A model stuck inside one forward
pass cannot be interrupted from Python: close() then fails the requests itself `ABORT_GRACE_S` later and returns,
and the worker (a daemon thread) ends when that pass does.

Output layer: on the CPU, a float32 Llama, Mistral, Qwen2 or Qwen3 model's decode steps of at most
`hf_head.MAX_ROWS` rows run the backbone and take their logits from `hf_head.TransposedHead`, a copy of the output
layer's weight stored ``[hidden, vocab]``: the same sums, several times faster than `nn.Linear`'s layout for a few
rows (one row of the tiny Qwen3's 151,669 x 64 head: 4.5 -> 1.1 ms). `head` is None where it does not apply.

Attention: a text model on transformers' ``sdpa`` with grouped key/value heads (Qwen3, Llama 3, ...) is switched to
`hf_attention.GQA_SDPA`, the same SDPA call with `enable_gqa`, which reads the grouped heads in place instead of
copying the KV cache per layer and step (`gqa_sdpa` says whether it was). A trainer that shares the model uses it
too: the same forward values, gradients within float rounding.

Policy versions: the engine starts at `policy_version` 0 (the weights it was given) and a trainer that changes them
says so with `set_policy_version(v)` once the new weights are in place (the local trainer after each optimizer
step; versions only grow). Every generated id carries the version current when the forward pass that produced its
logits began (`Generation.versions`), read once per decode step, so a generation that an update lands in the middle
of is tagged per token, the change at the first step computed after it. The engine cannot tell whether the weights
really changed between two steps (a trainer writing them while a forward pass runs gets no consistent numbers
either): the trainer changes the weights between steps, then sets the version.

Images: a Qwen2-VL-style vision-language model (Qwen2.5-VL in transformers) loaded with its directory's image
processor has `accepts_images`; `generate(prompt_ids, sampling, images=...)` then takes the prompt with each
image's pads expanded and the images' references in pad order (`LLMEngine`'s contract). `hf_vision.VisionInputs`
reads the images, computes the processor's pixel inputs, checks the pad runs against the image grid and computes
the model's 3-D RoPE positions; the request then runs through the same decoding loop (sampling, logprobs, stop and
length rules above), alone rather than batched, and bypasses the prefix cache (a kept prefix is keyed by ids, and
two different images have the same pad ids). A text-only prompt to such a model is batched and cached as usual.

This module knows nothing about chat formats; it imports torch and transformers, so import it only when the
`hf` extra is installed (`agent_runtime.engines.make_engine("hf", ...)` does that lazily).
"""

from __future__ import annotations

import array
import asyncio
import collections
import concurrent.futures
import inspect
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

import structlog

from agent_protocol import HFTokenizer, Tokenizer, TransformersTokenizer, load_tokenizer
from agent_runtime.engines.base import Generation, LLMEngine, SamplingParams, checked_policy_version
from agent_runtime.engines.hf_attention import use_gqa_sdpa
from agent_runtime.engines.hf_batching import JOIN_RATIO, JOIN_WAIT_STEPS, FixedBatch, HFBatching, fail_requests
from agent_runtime.engines.hf_decode import Request, new_cache
from agent_runtime.engines.hf_head import TransposedHead
from agent_runtime.engines.hf_prefix import PrefixCache
from agent_runtime.engines.hf_vision import ImageInputs, VisionInputs, is_vision_model
from agent_runtime.errors import ContextBudgetExceeded, EngineError, EngineUnavailable

try:
    import torch
    import transformers
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"agent_runtime.engines.hf needs torch and transformers ({e.name} is missing): install agent-runtime[hf]"
    ) from e

__all__ = ["HFEngine", "HFEngineOptions"]

logger = structlog.get_logger(__name__)

CLOSE_TIMEOUT_S = 30.0  # close(): how long the requests sent before it may run on
ABORT_GRACE_S = 5.0  # then: how long close() waits for the running batch to stop (a forward pass or two)


class HFEngineOptions(TypedDict, total=False):
    """`HFEngine`'s options that `HFEngine.from_pretrained` passes on (their defaults and meaning: `HFEngine`)."""

    context_length: int | None
    stop_token_ids: Sequence[int] | None
    max_batch_size: int
    batch_wait_s: float
    prefix_cache_sequences: int
    prefix_cache_tokens: int
    join_running: bool
    join_ratio: float
    join_wait_steps: int
    max_batch_tokens: int | None
    batch_wait_full: bool


class HFEngine(HFBatching, LLMEngine):
    """A transformers causal LM. Build it with `HFEngine.from_pretrained(path_or_id, device=..., dtype=...)`, or
    from a loaded model and its tokenizer: `HFEngine(model, tokenizer)` (the model is put in eval mode and runs
    under `torch.inference_mode`). `context_length` defaults to `config.max_position_embeddings`, the stop ids
    to the model's eos ids. `image_processor` (a Qwen2-VL-style transformers image processor) with a
    vision-language model makes the engine take images (`accepts_images`)."""

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer | Any,
        *,
        context_length: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        max_batch_size: int = 8,
        batch_wait_s: float = 0.005,
        prefix_cache_sequences: int = 256,
        prefix_cache_tokens: int = 131_072,
        image_processor: Any | None = None,
        join_running: bool = True,
        join_ratio: float = JOIN_RATIO,
        join_wait_steps: int = JOIN_WAIT_STEPS,
        max_batch_tokens: int | None = None,
        batch_wait_full: bool = False,
    ) -> None:
        if join_ratio < 0 or join_wait_steps < 0:
            raise ValueError(f"join_ratio and join_wait_steps must be >= 0, got {join_ratio} and {join_wait_steps}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1 (or None: no bound), got {max_batch_tokens}")
        if prefix_cache_sequences < 0 or prefix_cache_tokens < 0:
            raise ValueError(
                f"prefix_cache_sequences and prefix_cache_tokens must be >= 0 (0 turns the cache off), got "
                f"{prefix_cache_sequences} and {prefix_cache_tokens}"
            )
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, got {batch_wait_s}")
        self.model = model.eval()
        self.tokenizer = load_tokenizer(tokenizer)
        config = model.config.get_text_config()  # a vision-language model's language half; the config itself else
        self.context_length = int(context_length if context_length is not None else config.max_position_embeddings)
        if self.context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {self.context_length}")
        self.stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else _model_eos_ids(model)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.device: torch.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        #: wait the whole `batch_wait_s` for more requests, even when no event loop is sending (`hf_batching`)
        self.batch_wait_full = batch_wait_full
        #: how many batches of each starting size ran (a request that joined one is in `joined_requests`; a batch
        #: that failed counts, and so does each retry alone)
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self.row_steps = 0  # rows computed, summed over every forward pass (a finished row leaves its batch)
        #: grouped-query attention read in place instead of copied per step (`hf_attention.use_gqa_sdpa`)
        self.gqa_sdpa = use_gqa_sdpa(model)
        # transformers renamed `past_key_values` to `cache` in the forward signature of its 5.x models
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        #: a decode step's logits from the output layer's weight kept transposed (CPU float32, `hf_head`), or None
        self.head = TransposedHead.of(model)
        #: the kept sequences whose keys and values a new request continues from (`hf_decode`)
        self.prefix_cache = PrefixCache(max_sequences=prefix_cache_sequences, max_tokens=prefix_cache_tokens)
        #: whether requests use `prefix_cache` (off when a bound is 0 or the model's cache cannot be resumed)
        self._resumable = _prefix_resumable(model)
        self.prefix_caching = prefix_cache_sequences > 0 and prefix_cache_tokens > 0 and self._resumable
        #: whether text requests that arrive while a batch runs join it (`hf_batching`)
        self.join_running = join_running
        #: waiting text requests join a running batch once they are at least this many times its rows still
        #: generating, or once the first of them has waited `join_wait_steps` decode steps (`hf_batching`)
        self.join_ratio = join_ratio
        self.join_wait_steps = join_wait_steps
        self.joined_requests = 0  # requests that joined a running batch
        self.joins = 0  # the prefills that brought them in (waiting requests join together)
        #: the most key/value positions a batch's cache may come to hold, padding included (None: no bound; see
        #: `hf_batching`)
        self.max_batch_tokens = max_batch_tokens
        self.deferred_requests = 0  # requests that waited for a later batch because this one had no room in tokens
        #: the most key/value positions a forward pass held: its rows x its positions (padding included)
        self.peak_batch_tokens = 0
        self.abandoned_requests = 0  # requests that left their batch because their caller stopped waiting
        #: the weights' version, on every id generated from now on (`set_policy_version`; the module docstring)
        self.policy_version: int = 0
        self._forward_version = 0  # the version read as the latest forward pass began (the decode loop's)
        self._parameters = list(model.parameters())
        self._weights_seen: tuple[tuple[int, int], ...] | None = self._weights_version()
        self._queue: queue.SimpleQueue[Request | FixedBatch | None] = queue.SimpleQueue()
        self._pending: collections.deque[Request | FixedBatch | None] = (
            collections.deque()
        )  # taken, not joined: next batch first
        #: text requests taken while a batch runs, waiting to join it, with the step each was taken at (arrived
        #: before everything in `_pending`; they go first in the next batch if they do not join)
        self._waiting: collections.deque[tuple[Request, int]] = collections.deque()
        self._lock = threading.Lock()
        #: requests put on the queue whose event loop has not finished the step that sent them (under `_lock`)
        self._sending = 0
        self._worker: threading.Thread | None = None
        self._closed = False
        self._abort = threading.Event()  # close() ran out of time: stop the running batch, run nothing more
        self._taken: list[Request] = []  # what the worker took and runs now (close() fails them if it must)
        #: the image side (None: the engine takes no images, as the model or its image processor is missing)
        self.vision = (
            VisionInputs(model, image_processor) if image_processor is not None and is_vision_model(model) else None
        )
        self.accepts_images = self.vision is not None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: str | torch.dtype = "auto",
        attn_implementation: str | None = None,
        tokenizer: Tokenizer | Any | None = None,
        **options: Unpack[HFEngineOptions],
    ) -> HFEngine:
        """Load a model directory (or a Hugging Face id already in the local cache). `dtype` is "auto" (the
        checkpoint's), a name such as "bfloat16", or a `torch.dtype`. The tokenizer is the directory's
        `tokenizer.json` when there is one, else transformers' `AutoTokenizer`. A vision-language model (its
        config has a `vision_config`) is loaded with `AutoModelForImageTextToText` and the directory's image
        processor (`AutoImageProcessor`, from ``preprocessor_config.json``), so the engine takes images. The other
        keywords are `HFEngine`'s own (`HFEngineOptions`), passed on as they are."""
        source = str(path)
        log = logger.bind(model=source, device=device)
        started = time.perf_counter()
        resolved_dtype = dtype if isinstance(dtype, torch.dtype) or dtype == "auto" else getattr(torch, dtype, None)
        if not isinstance(resolved_dtype, torch.dtype) and resolved_dtype != "auto":
            raise ValueError(f"hf: unknown dtype {dtype!r}; use 'auto', a torch dtype name or a torch.dtype")
        dtype_kwarg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
        loading: dict[str, Any] = {dtype_kwarg: resolved_dtype}
        if attn_implementation is not None:
            loading["attn_implementation"] = attn_implementation
        image_processor: Any = None
        try:
            vision = getattr(transformers.AutoConfig.from_pretrained(source), "vision_config", None) is not None
            auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
            model: Any = auto.from_pretrained(source, **loading)
            model = model.to(device)
            if vision and is_vision_model(model):
                image_processor = _image_processor(source, log)
            if tokenizer is None:
                local = Path(source) / "tokenizer.json"
                if local.is_file():
                    tokenizer = HFTokenizer.from_file(local)
                else:
                    tokenizer = TransformersTokenizer(transformers.AutoTokenizer.from_pretrained(source))
        except Exception as e:
            raise EngineUnavailable(f"hf: cannot load model {source!r}: {e}") from e
        engine = cls(model, tokenizer, image_processor=image_processor, **options)
        log.info(
            "hf_engine_loaded",
            dtype=str(model.dtype),
            context_length=engine.context_length,
            stop_token_ids=list(engine.stop_token_ids),
            prefix_cache=engine.prefix_caching,
            accepts_images=engine.accepts_images,
            seconds=round(time.perf_counter() - started, 3),
        )
        return engine

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        request = await self._request(prompt_ids, sampling, images)
        self._put(request)
        # Runs once this loop has run everything ready now, the rest of a gather's sends included.
        asyncio.get_running_loop().call_soon(self._sent)
        try:
            return await asyncio.wrap_future(request.future)
        except asyncio.CancelledError:
            request.abandoned = True  # a queued request is never run; a running one leaves its batch (module docs)
            raise

    async def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: Sequence[SamplingParams],
        *,
        images: Sequence[Sequence[str]] | None = None,
    ) -> list[Generation | Exception]:
        """Generate for every prompt, in batches formed from these requests alone, in this order: the text requests
        in runs of at most `max_batch_size` rows (and within `max_batch_tokens`), each image request alone, one
        batch after another; nothing sent by `generate` joins them and they join nothing, whatever the timing of
        the threads. So the same requests in the same order compute the same floats on the same machine, run after
        run (`agent_train.local`'s lockstep engine: deterministic rollouts). One answer per prompt, in order: its
        `Generation`, or the exception `generate` would have raised for it (bad input, a failed generation), so one
        bad request fails only itself."""
        if len(samplings) != len(prompts) or (images is not None and len(images) != len(prompts)):
            raise ValueError(
                f"hf: generate_batch needs one sampling (and one image list, if any) per prompt; got {len(prompts)} "
                f"prompts, {len(samplings)} samplings, {'no' if images is None else len(images)} image lists"
            )
        answers: list[Generation | Exception | None] = [None] * len(prompts)
        requests: list[tuple[int, Request]] = []
        for index, (prompt, sampling) in enumerate(zip(prompts, samplings, strict=True)):
            try:
                requests.append((index, await self._request(prompt, sampling, images[index] if images else ())))
            except (ValueError, ContextBudgetExceeded) as e:
                answers[index] = e
        if requests:
            self._put(FixedBatch([request for _, request in requests]))
            asyncio.get_running_loop().call_soon(self._sent)
            futures = [asyncio.wrap_future(request.future) for _, request in requests]
            try:
                done = await asyncio.gather(*futures, return_exceptions=True)
            except asyncio.CancelledError:
                for _, request in requests:
                    request.abandoned = True
                raise
            for (index, _), answer in zip(requests, done, strict=True):
                if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                    raise answer
                answers[index] = answer
        return [answer if answer is not None else EngineError("hf: no answer") for answer in answers]

    async def _request(self, prompt_ids: Sequence[int], sampling: SamplingParams, images: Sequence[str]) -> Request:
        """A checked request for the worker (`generate`'s rules on ids, length and images), not sent yet."""
        try:  # one C loop over the ids; a PromptView is listed first (array's own iteration is slower)
            prompt = array.array("q", prompt_ids if isinstance(prompt_ids, list) else list(prompt_ids))
        except (TypeError, OverflowError) as e:
            raise ValueError(f"hf: prompt ids must be ints in the model's vocabulary of {self.vocab_size}: {e}") from e
        if not prompt:
            raise ValueError("hf: prompt_ids is empty; the model needs at least one token to continue")
        ids = torch.frombuffer(prompt, dtype=torch.long)  # a view of the array: no copy
        low, high = torch.aminmax(ids)
        if int(low) < 0 or int(high) >= self.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            raise ValueError(f"hf: prompt id {bad} is outside the model's vocabulary of {self.vocab_size}")
        budget = self.max_new_tokens_for(len(prompt), sampling.max_new_tokens)
        vision: ImageInputs | None = None
        if images:
            if self.vision is None:
                raise ValueError("hf: this engine's model is text-only (or was loaded without its image processor)")
            vision = await asyncio.to_thread(self.vision.prepare, prompt, list(images))
        elif self.vision is not None and self.vision.pad_id in prompt:
            raise ValueError("hf: the prompt holds image pad tokens but no images were given")
        return Request(prompt, sampling, budget, concurrent.futures.Future(), vision)

    def _put(self, item: Request | FixedBatch) -> None:
        """Queue `item` for the worker (started on the first request); the caller schedules `_sent` after it."""
        with self._lock:
            if self._closed:
                raise EngineUnavailable("hf: the engine is closed")
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
                self._worker.start()
            self._sending += 1  # before the put: the worker never sees the request while the count says quiet
            self._queue.put(item)

    def _sent(self) -> None:
        with self._lock:
            self._sending -= 1

    def set_policy_version(self, version: int) -> None:
        """The weights are now policy `version` (an int >= 0, never below the current one): every token from a
        forward pass that begins after this call carries it. Call it once the new weights are in place."""
        self.policy_version = checked_policy_version(self.name, version, self.policy_version)

    def clear_prefix_cache(self) -> None:
        """Forget every kept sequence, from the worker thread before its next batch (for a change of weights the
        engine cannot see, such as a new `model` object)."""
        self._weights_seen = None

    async def close(self, *, timeout_s: float | None = CLOSE_TIMEOUT_S) -> None:
        """Refuse new requests, let the ones sent before run on for up to `timeout_s` seconds (None: until they
        are done), then stop: every request not answered by then fails with `EngineUnavailable` (module docstring).
        """
        if timeout_s is not None and timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0 (or None), got {timeout_s}")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            worker = self._worker
            self._queue.put(None)
        if worker is None:
            return
        await asyncio.to_thread(worker.join, timeout_s)
        if not worker.is_alive():
            return
        logger.warning("hf_close_stopping_running_batch", timeout_s=timeout_s, running=len(self._taken))
        self._abort.set()
        await asyncio.to_thread(worker.join, ABORT_GRACE_S)
        if worker.is_alive():  # stuck in a forward pass: answer for it; it ends when the pass returns
            logger.warning("hf_close_model_not_returning", grace_s=ABORT_GRACE_S)
            stuck = EngineUnavailable("hf: the engine was closed while this request ran (the model did not return)")
            fail_requests(list(self._taken), stuck)
            self._fail_queued()


def _image_processor(source: str, log: Any) -> Any:
    """The model directory's image processor, or None (the engine then takes no images) when it has none."""
    auto: Any = transformers.AutoImageProcessor  # untyped in transformers
    try:
        return auto.from_pretrained(source)
    except Exception as e:  # no preprocessor_config.json, or one transformers cannot read
        log.warning("hf_image_processor_missing", error=f"{type(e).__name__}: {e}")
        return None


def _model_eos_ids(model: Any) -> tuple[int, ...]:
    found: list[int] = []
    generation_config = getattr(model, "generation_config", None)
    text_config = model.config.get_text_config()
    for source in (getattr(generation_config, "eos_token_id", None), getattr(text_config, "eos_token_id", None)):
        if source is None:
            continue
        for token in [source] if isinstance(source, int) else source:
            if int(token) not in found:
                found.append(int(token))
        if found:
            break
    return tuple(found)


def _prefix_resumable(model: Any) -> bool:
    """Whether the model's `DynamicCache` is all plain `DynamicLayer`s, whose keys and values can be cut to a
    prefix and resumed (not sliding-window, linear-attention or pre-4.56 caches)."""
    layer_class = getattr(transformers.cache_utils, "DynamicLayer", None)
    layers = getattr(new_cache(model), "layers", None)
    if layer_class is None or not layers:
        return False
    return all(type(layer) is layer_class for layer in layers)
