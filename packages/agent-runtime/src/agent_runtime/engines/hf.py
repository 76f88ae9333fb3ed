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

Prefix cache: an agent's next prompt is its previous prompt + the generated ids + the feedback ids (token-in,
token-out), so re-prefilling the whole history every turn is wasted work. When a generation ends, the keys and
values of its sequence (the prompt and every generated id but the last, which was never fed to the model) are
kept, per layer, keyed by those ids. A new request continues from the longest kept sequence that is a prefix of
its prompt and prefills only the rest (at least its last id, whose logits start the generation). The kept
sequence it extended is dropped, since the new one covers it. Kept sequences are evicted least recently used
first, beyond `prefix_cache_sequences` sequences or `prefix_cache_tokens` tokens (memory per token: layers x 2 x
kv_heads x head_dim x the dtype's bytes; 2 KiB on the calculator demo's model, 144 KiB on Qwen3-8B in bfloat16);
0 for either turns the cache off. Every kept sequence is dropped when the weights change (a parameter's version
counter or storage moved: an optimizer step, `load_state_dict`, `param.data = ...`), so a trainer that shares
the engine's model never continues from stale keys; `clear_prefix_cache()` does it by hand. The cache is used
only when the model's `DynamicCache` is made of plain `DynamicLayer`s (full attention, transformers >= 4.56):
sliding-window and linear-attention layers do not keep a prefix that can be cut and resumed, so such models
(and older transformers) always prefill in full. A prefix is not exact arithmetic: it was computed in another
batch shape, so logits can differ from a full prefill by float rounding (as batched rows already do); the tests
check that greedy ids are the same with and without the cache.

Concurrency: one worker thread owns the model and the prefix cache. Requests that arrive together run as one batch
(at most `max_batch_size`): a batch forms from the first request taken, for up to `batch_wait_s` (5 ms), and stops
waiting as soon as no event loop is still sending, i.e. every loop that sent a request has finished the step of
its work in which it sent it. So requests sent in one go (`asyncio.gather`, many episodes resuming from the same
engine answers) share a batch whatever the timing of the threads, and a lone request starts at once instead of
waiting out the window (on the tiny Qwen3 a 3000-token turn of 8 ids is about 27 ms, 5 of them the window); what
comes later joins the running batch (below). `batch_wait_full=True` waits the whole `batch_wait_s` every time, for
requests that come a few milliseconds apart from different steps. Each row is laid out as its kept
prefix (left-padded to the longest prefix in the batch, straight from the kept tensors into the batch's cache)
followed by the rest of its prompt (left-padded to the longest rest), with an attention mask over both and
per-row position ids, so a batched row computes what it would alone; the test suite checks greedy batched ==
unbatched, cached == uncached. A request is answered, and its sequence kept (prefix cache), as soon as its row is
done, not when its batch ends. Finished rows leave the batch: once they are at least an eighth of the running rows
(or when requests join), the cache, mask and positions are cut down to the rows still generating (`row_steps`
counts the rows computed); until then a finished row's later positions are masked out. On the calculator demo's RL
rollouts about 30 % of the row-steps were finished rows.

Joining (`join_running`, on by default): text requests that arrive while a text batch runs can join it between two
steps, up to `max_batch_size` rows generating, instead of waiting for the batch to end (an agent's turns come back
from their tools at different times). The newcomers are prefilled on their own (from their kept prefixes), their
first tokens sampled, and their rows appended to the running ones: the shorter of the two caches and masks is
left-padded to the longer, so every row keeps its own positions and sees only its own keys, and a joined row gives
the ids it gives alone (`tests/agent_runtime/test_engine_hf_join.py`; `joined_requests` counts them, `joins` the
prefills that brought them in). It needs the same `DynamicLayer` cache as the prefix cache; image requests never
join or are joined.

A join is not free: the running rows wait for the newcomers' prefill (on the tiny Qwen3 on a CPU, a 200-id prefill
and its first token cost about 1.3 decode steps), so joining every arrival at the next step makes each running row
pay one prefill per arrival, and with arrivals a few steps apart the batch spends most of its time prefilling one
row at a time (8 turns of 8 tokens arriving 10 ms apart: answered 0.76x as fast as with joining off). So arrivals
wait, taken from the queue, until they are at least `join_ratio` (1.0) times the rows still generating, or until
the first of them has waited `join_wait_steps` (20) decode steps; then they join together, in one prefill. The rule
is text-generation-inference's (its router's `waiting_served_ratio` and `max_waiting_tokens`): waiting requests
pause the running ones for a prefill only when they are many enough, or have waited long enough. What has not
joined when the batch ends runs first in the next one. `join_ratio=0, join_wait_steps=0` joins every arrival at
the next step. `bench/bench_hf_join.py` compares the three (figures in the agent-runtime README).

Batch size in tokens (`max_batch_tokens`, None by default: no bound). A batch's rows share one cache, left-padded to
its longest row, so one long prompt among short ones (or joining them) makes every row hold that many key/value
positions: a 32k-token prompt joining 8 turns of 500 tokens on Qwen3-8B makes the cache hold 9 x 32k positions
(40.5 GiB in bfloat16) where the rows need 5.1 GiB; as a batch forms, every short row is prefilled at the long
one's width too. With the bound, a text request joins a batch (as it forms or while it runs) only if rows x the
positions the cache reaches by the last token any row may still generate (the prefill's layout plus the largest
budget left) stays within it; otherwise it waits, first in line, for the next batch, and the requests behind it wait
behind it (arrival order is kept). A request larger than the bound on its own runs alone. So no forward pass
holds more than `max(max_batch_tokens, the largest lone request)` positions (`peak_batch_tokens` is the most one
held; `deferred_requests` counts the waits). Memory per position is the prefix cache's figure above.

Failures: if a batch fails, each request it had not answered is retried alone (without joining), so one bad request
cannot fail its neighbours. The event loop only awaits a future, so it is never blocked, and the engine can be
shared by several event loops. A request whose caller gave up (its task cancelled, as `call_engine` does on an engine
timeout) is never run if the worker had not taken it yet, and otherwise leaves its batch at the next step, without
being kept: a timed-out turn does not go on generating up to its budget (`abandoned_requests` counts them).

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
import contextlib
import inspect
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent_protocol import HFTokenizer, Tokenizer, TransformersTokenizer, load_tokenizer
from agent_runtime.engines.base import FinishReason, Generation, LLMEngine, SamplingParams
from agent_runtime.engines.hf_attention import use_gqa_sdpa
from agent_runtime.engines.hf_head import MAX_ROWS as MAX_HEAD_ROWS
from agent_runtime.engines.hf_head import TransposedHead
from agent_runtime.engines.hf_prefix import Prefix, PrefixCache
from agent_runtime.engines.hf_vision import ImageInputs, VisionInputs, is_vision_model
from agent_runtime.errors import EngineError, EngineUnavailable

try:
    import torch
    import transformers
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"agent_runtime.engines.hf needs torch and transformers ({e.name} is missing): install agent-runtime[hf]"
    ) from e

__all__ = ["HFEngine"]

logger = structlog.get_logger(__name__)

_GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature this small means greedy
_DROP_FINISHED_AT = 8  # finished rows leave a running batch once they are at least 1/8 of it
CLOSE_TIMEOUT_S = 30.0  # close(): how long the requests sent before it may run on
ABORT_GRACE_S = 5.0  # then: how long close() waits for the running batch to stop (a forward pass or two)
JOIN_RATIO = 1.0  # requests waiting to join a running batch join it once they are this many times its rows
JOIN_WAIT_STEPS = 20  # ... or once the first of them has waited this many decode steps
SENDING_POLL_S = 0.00025  # a forming batch checks this often whether any event loop is still sending


class _Closed(Exception):
    """Raised in the worker when close() stops a running batch."""


@dataclass(eq=False, slots=True)
class _Request:
    prompt: array.array[int]
    sampling: SamplingParams
    budget: int
    future: concurrent.futures.Future[Generation]
    vision: ImageInputs | None = None  # an image prompt's pixels and positions: it runs alone, uncached
    abandoned: bool = False  # its caller stopped waiting (set on the event loop, read by the worker)


@dataclass(eq=False, slots=True)
class _Row:
    """A request while its batch runs: its kept prefix, stop ids, generator, and what it generated so far."""

    request: _Request
    prefix: Prefix | None
    stops: frozenset[int]
    generator: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason = "length"
    done: bool = False


class HFEngine(LLMEngine):
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
        #: wait the whole `batch_wait_s` for more requests, even when no event loop is sending (module docstring)
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
        #: the kept sequences whose keys and values a new request continues from (see the module docstring)
        self.prefix_cache = PrefixCache(max_sequences=prefix_cache_sequences, max_tokens=prefix_cache_tokens)
        #: whether requests use `prefix_cache` (off when a bound is 0 or the model's cache cannot be resumed)
        self._resumable = _prefix_resumable(model)
        self.prefix_caching = prefix_cache_sequences > 0 and prefix_cache_tokens > 0 and self._resumable
        #: whether text requests that arrive while a batch runs join it (see the module docstring)
        self.join_running = join_running
        #: waiting text requests join a running batch once they are at least this many times its rows still
        #: generating, or once the first of them has waited `join_wait_steps` decode steps (module docstring)
        self.join_ratio = join_ratio
        self.join_wait_steps = join_wait_steps
        self.joined_requests = 0  # requests that joined a running batch
        self.joins = 0  # the prefills that brought them in (waiting requests join together)
        #: the most key/value positions a batch's cache may come to hold, padding included (None: no bound; see the
        #: module docstring)
        self.max_batch_tokens = max_batch_tokens
        self.deferred_requests = 0  # requests that waited for a later batch because this one had no room in tokens
        #: the most key/value positions a forward pass held: its rows x its positions (padding included)
        self.peak_batch_tokens = 0
        self.abandoned_requests = 0  # requests that left their batch because their caller stopped waiting
        self._parameters = list(model.parameters())
        self._weights_seen: tuple[tuple[int, int], ...] | None = self._weights_version()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._pending: collections.deque[_Request | None] = collections.deque()  # taken, not joined: next batch first
        #: text requests taken while a batch runs, waiting to join it, with the step each was taken at (arrived
        #: before everything in `_pending`; they go first in the next batch if they do not join)
        self._waiting: collections.deque[tuple[_Request, int]] = collections.deque()
        self._lock = threading.Lock()
        #: requests put on the queue whose event loop has not finished the step that sent them (under `_lock`)
        self._sending = 0
        self._worker: threading.Thread | None = None
        self._closed = False
        self._abort = threading.Event()  # close() ran out of time: stop the running batch, run nothing more
        self._taken: list[_Request] = []  # what the worker took and runs now (close() fails them if it must)
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
        context_length: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        max_batch_size: int = 8,
        batch_wait_s: float = 0.005,
        prefix_cache_sequences: int = 256,
        prefix_cache_tokens: int = 131_072,
        join_running: bool = True,
        join_ratio: float = JOIN_RATIO,
        join_wait_steps: int = JOIN_WAIT_STEPS,
        max_batch_tokens: int | None = None,
        batch_wait_full: bool = False,
    ) -> HFEngine:
        """Load a model directory (or a Hugging Face id already in the local cache). `dtype` is "auto" (the
        checkpoint's), a name such as "bfloat16", or a `torch.dtype`. The tokenizer is the directory's
        `tokenizer.json` when there is one, else transformers' `AutoTokenizer`. A vision-language model (its
        config has a `vision_config`) is loaded with `AutoModelForImageTextToText` and the directory's image
        processor (`AutoImageProcessor`, from ``preprocessor_config.json``), so the engine takes images."""
        source = str(path)
        log = logger.bind(model=source, device=device)
        started = time.perf_counter()
        resolved_dtype = dtype if isinstance(dtype, torch.dtype) or dtype == "auto" else getattr(torch, dtype, None)
        if not isinstance(resolved_dtype, torch.dtype) and resolved_dtype != "auto":
            raise ValueError(f"hf: unknown dtype {dtype!r}; use 'auto', a torch dtype name or a torch.dtype")
        dtype_kwarg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
        options: dict[str, Any] = {dtype_kwarg: resolved_dtype}
        if attn_implementation is not None:
            options["attn_implementation"] = attn_implementation
        image_processor: Any = None
        try:
            vision = getattr(transformers.AutoConfig.from_pretrained(source), "vision_config", None) is not None
            auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
            model: Any = auto.from_pretrained(source, **options)
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
        engine = cls(
            model,
            tokenizer,
            context_length=context_length,
            stop_token_ids=stop_token_ids,
            max_batch_size=max_batch_size,
            batch_wait_s=batch_wait_s,
            prefix_cache_sequences=prefix_cache_sequences,
            prefix_cache_tokens=prefix_cache_tokens,
            image_processor=image_processor,
            join_running=join_running,
            join_ratio=join_ratio,
            join_wait_steps=join_wait_steps,
            max_batch_tokens=max_batch_tokens,
            batch_wait_full=batch_wait_full,
        )
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
        try:  # one C loop over the ids; a PromptView is listed first (array's own iteration is slower)
            prompt = array.array("q", prompt_ids if isinstance(prompt_ids, list) else list(prompt_ids))
        except (TypeError, OverflowError) as e:
            raise ValueError(f"hf: prompt ids must be ints in the model's vocabulary of {self.vocab_size}: {e}") from e
        _check_sampling(sampling)
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
        request = _Request(prompt, sampling, budget, concurrent.futures.Future(), vision)
        with self._lock:
            if self._closed:
                raise EngineUnavailable("hf: the engine is closed")
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
                self._worker.start()
            self._sending += 1  # before the put: the worker never sees the request while the count says quiet
            self._queue.put(request)
        # Runs once this loop has run everything ready now, the rest of a gather's sends included.
        asyncio.get_running_loop().call_soon(self._sent)
        try:
            return await asyncio.wrap_future(request.future)
        except asyncio.CancelledError:
            request.abandoned = True  # a queued request is never run; a running one leaves its batch (module docs)
            raise

    def _sent(self) -> None:
        with self._lock:
            self._sending -= 1

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
            _fail_all(list(self._taken), stuck)
            self._fail_queued()

    # -- the worker thread ---------------------------------------------------------------------------------

    def _serve(self) -> None:
        running = True
        while running and not self._abort.is_set():
            first = self._next(None)
            if first is None:
                break
            batch = [first]
            footprint = self._footprint().plus(self, first) if first.vision is None else self._footprint()
            deadline = time.monotonic() + self.batch_wait_s
            quiet = False  # no loop was sending when the last poll came back empty: one more look, then start
            while len(batch) < self.max_batch_size:
                left = deadline - time.monotonic()
                wait = 0 if quiet else max(left if self.batch_wait_full else min(left, SENDING_POLL_S), 1e-4)
                try:
                    item = self._next(wait)
                except queue.Empty:  # it waited to the deadline, or one poll while a loop may still be sending
                    if self.batch_wait_full or left <= SENDING_POLL_S or quiet:
                        break
                    # A request put after the poll gave up has its count taken back only after its put: once the
                    # count is 0, what was sent is in the queue, so look once more before the batch starts.
                    quiet = self._sending == 0
                    continue
                quiet = False
                if item is None:
                    running = False
                    break
                if item.future.cancelled():
                    continue
                if item.vision is None:
                    grown = footprint.plus(self, item)
                    if not self._within(grown):
                        self._defer(item)
                        break
                    footprint = grown
                batch.append(item)
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            self._taken = live
            if live:
                self._run(live)
            self._taken = []
        self._fail_queued()

    def _fail_queued(self) -> None:
        """Fail every request still waiting (taken or queued): after close(), none will run."""
        self._requeue_waiting()
        while True:
            try:
                late = self._next(0)
            except (queue.Empty, IndexError):  # IndexError: close() and the worker both emptied `_pending`
                return
            if late is not None and late.future.set_running_or_notify_cancel():
                _fail(late.future, EngineUnavailable("hf: the engine was closed before this request ran"))

    def _next(self, timeout: float | None) -> _Request | None:
        """The next request (or the close marker): one a running batch took but could not join first."""
        if self._pending:
            return self._pending.popleft()
        if timeout == 0:
            return self._queue.get_nowait()
        return self._queue.get(timeout=timeout)

    def _newcomers(self, room: int, running: list[_Row], width: int, step: int) -> list[_Request]:
        """Text requests to join the running batch now, at most `room` (see the module docstring); `running`: its
        rows (those not done are still generating), `width`: its cache's positions, `step`: its decode steps so far.
        What arrived waits in `_waiting` until the waiting requests are `join_ratio` times the rows still
        generating, or the first of them has waited `join_wait_steps` steps; then they join, oldest first. An image
        request, the close marker or a request the batch has no room for in tokens (`max_batch_tokens`) stops the
        intake and waits in `_pending` for the next batch, first; what waited behind it follows it there."""
        while not self._pending:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None or item.vision is not None:
                self._pending.append(item)
            elif not item.future.cancelled():
                self._waiting.append((item, step))
        live = sum(1 for row in running if not row.done)
        if not self._waiting or room < 1:
            return []
        if len(self._waiting) < self.join_ratio * live and step - self._waiting[0][1] < self.join_wait_steps:
            return []
        joining: list[_Request] = []
        footprint = self._footprint(running, width)
        while self._waiting and len(joining) < room:
            item, _ = self._waiting.popleft()
            if not self._within(grown := footprint.plus(self, item)):
                self._requeue_waiting()
                self._defer(item)
            elif item.future.set_running_or_notify_cancel():
                footprint = grown
                joining.append(item)
                self._taken.append(item)
        return joining

    def _requeue_waiting(self) -> None:
        """Put the requests waiting to join at the front of `_pending`, in arrival order: they run first in the next
        batch (they arrived before everything `_pending` holds)."""
        waiting = []
        while self._waiting:
            try:
                waiting.append(self._waiting.popleft()[0])
            except IndexError:  # close() and the worker both emptied it
                break
        self._pending.extendleft(reversed(waiting))

    def _run(self, batch: list[_Request]) -> None:
        """Run the text requests as one batch and each image request alone."""
        plain = [r for r in batch if r.vision is None]
        for group in [plain] * bool(plain) + [[r] for r in batch if r.vision is not None]:
            self._run_group(group, join=self.join_running)

    def _run_group(self, batch: list[_Request], *, join: bool) -> None:
        """Run `batch` (requests that join it are appended to it); if it fails, retry alone, without joining,
        each request it had not answered yet."""
        if self._abort.is_set():
            self._fail_closed(batch)
            return
        started = time.perf_counter()
        self.batch_sizes[len(batch)] += 1
        try:
            self._generate_batch(batch, join=join)
        except _Closed:
            self._fail_closed(batch)
            return
        except Exception as e:
            unanswered = [r for r in batch if not r.future.done()]
            if len(batch) > 1:
                logger.warning("hf_batch_failed_retrying_alone", batch_size=len(batch), error=repr(e))
                for request in unanswered:
                    self._run_group([request], join=False)
                return
            logger.warning("hf_generation_failed", prompt_tokens=len(batch[0].prompt), error=repr(e))
            error = EngineError(f"hf: generation failed: {type(e).__name__}: {e}")
            error.__cause__ = e
            _fail_all(unanswered, error)
            return
        logger.debug("hf_batch_done", batch_size=len(batch), seconds=round(time.perf_counter() - started, 4))

    def _fail_closed(self, batch: list[_Request]) -> None:
        _fail_all(batch, EngineUnavailable("hf: the engine was closed while this request ran"))

    def _weights_version(self) -> tuple[tuple[int, int], ...]:
        # a parameter's version counter moves on every in-place write, its data pointer on `param.data = ...`
        return tuple((p._version, p.data_ptr()) for p in self._parameters)

    @torch.inference_mode()
    def _generate_batch(self, batch: list[_Request], *, join: bool) -> None:
        """Run `batch` until every row is done, answering each request as its row finishes. With `join`, text
        requests that arrive meanwhile join the running rows (appended to `batch`)."""
        vision = batch[0].vision  # an image request runs alone (see `_run`)
        caching = self.prefix_caching and vision is None
        if caching:
            weights = self._weights_version()
            if weights != self._weights_seen:
                self.prefix_cache.clear()
                self._weights_seen = weights
        try:
            self._decode(batch, join=join and vision is None and self._resumable, caching=caching, vision=vision)
        finally:
            self._requeue_waiting()  # what did not join runs first in the next batch

    def _decode(self, batch: list[_Request], *, join: bool, caching: bool, vision: ImageInputs | None) -> None:
        """`_generate_batch`'s loop: prefill, then decode steps until every row is done."""
        running = [self._row(request, caching) for request in batch]  # the row of each row of the running tensors
        logits, mask, positions, cache = self._prefill(running, vision)
        step = 0
        while True:
            step += 1
            self.row_steps += len(running)
            tokens = self._advance(running, logits, cache, mask, caching)
            self._drop_abandoned(running)
            stay = [at for at, row in enumerate(running) if not row.done]
            if not stay:
                break
            if self._abort.is_set():
                raise _Closed
            newcomers = self._newcomers(self.max_batch_size - len(stay), running, mask.shape[1], step) if join else []
            finished = len(running) - len(stay)
            if finished and (newcomers or finished * _DROP_FINISHED_AT >= len(running)) and positions.dim() == 2:
                # Enough rows are done to be worth a copy of the cache without them (they were kept and answered as
                # they finished): every later step computes only the rows still generating.
                chosen = torch.tensor(stay, device=self.device)
                cache.batch_select_indices(chosen)
                mask, positions = mask[chosen], positions[chosen]
                tokens = [tokens[at] for at in stay]
                running = [running[at] for at in stay]
            step_ids, mask, positions = self._next_inputs(running, tokens, mask, positions)
            if newcomers:
                batch.extend(newcomers)
                step_ids, mask, positions, cache = self._join(
                    running, step_ids, mask, positions, cache, newcomers, caching
                )
            logits = self._logits(step_ids, mask, positions, cache, {})

    def _drop_abandoned(self, rows: list[_Row]) -> None:
        """Mark done, unkept, the rows whose callers stopped waiting; they leave the batch as finished rows do."""
        for row in rows:
            if row.request.abandoned and not row.done:
                row.done, row.finish = True, "abort"
                self.abandoned_requests += 1
                _fail(row.request.future, EngineError("hf: the caller stopped waiting for this request"))

    def _footprint(self, running: Sequence[_Row] = (), width: int = 0) -> _Footprint:
        """A batch about to form (empty), or the rows of `running` still generating in a cache of `width` positions
        (done rows leave the batch when requests join it). Empty without `max_batch_tokens`: nothing is counted."""
        live = [row for row in running if not row.done] if self.max_batch_tokens is not None else []
        left = max((row.request.budget - len(row.ids) for row in live), default=0)
        return _Footprint(rows=len(live), width=width, left=left)

    def _within(self, footprint: _Footprint) -> bool:
        """Whether a batch of that footprint stays within `max_batch_tokens` (always, without the bound)."""
        return self.max_batch_tokens is None or footprint.positions <= self.max_batch_tokens

    def _defer(self, request: _Request) -> None:
        """`request` waits, first in line, for the next batch: this one has no room for it in tokens."""
        self._pending.appendleft(request)
        self.deferred_requests += 1

    def _row(self, request: _Request, caching: bool) -> _Row:
        """A request's row: its kept prefix (when caching), stop ids and generator."""
        prefix = self.prefix_cache.longest_prefix(request.prompt) if caching else None
        stops = frozenset(self.stop_token_ids) | frozenset(request.sampling.stop_token_ids)
        return _Row(request, prefix, stops, _generator(request.sampling, self.device))

    def _prefill(
        self, rows: list[_Row], vision: ImageInputs | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """The first forward of `rows`: its logits, and the mask, positions and cache it leaves. Each row is laid
        out as [pad][kept prefix][pad][rest of the prompt]; the prefix part lives only in the cache."""
        # a row reuses its kept prefix, except for the prompt's last id: its logits start the generation
        reused = [_reused(0 if r.prefix is None else len(r.prefix.ids), len(r.request.prompt)) for r in rows]
        self.prefix_cache.reused_tokens += sum(reused)
        past = max(reused)
        width = max(len(r.request.prompt) - n for r, n in zip(rows, reused, strict=True))
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), past + width), dtype=torch.long)
        for at, (row, n) in enumerate(zip(rows, reused, strict=True)):
            rest = torch.frombuffer(row.request.prompt, dtype=torch.long)[n:]
            input_ids[at, width - len(rest) :] = rest
            mask[at, past - n : past] = 1
            mask[at, past + width - len(rest) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]  # each row counts from its first real token
        cache = self._batch_cache([r.prefix for r in rows], reused, past)
        extra: dict[str, torch.Tensor] = {}
        if vision is not None:  # the pixels go in with the prompt; its positions are 3-D (3, 1, len)
            extra = {"pixel_values": vision.pixel_values, "image_grid_thw": vision.image_grid_thw}
            positions = vision.positions
        logits = self._logits(input_ids, mask, positions, cache, extra)
        if cache.get_seq_length() != mask.shape[1]:
            raise EngineError(f"hf: the model ignored its KV cache (passed as `{self._cache_kwarg}`)")
        return logits, mask, positions, cache

    def _advance(
        self, rows: list[_Row], logits: torch.Tensor, cache: Any, mask: torch.Tensor, caching: bool
    ) -> list[int]:
        """Sample the next token of every live row from its logits (row `at` of `logits` is `rows[at]`); a row that
        is done is kept (prefix cache) and answered now. Returns the token of each row (0 for a row that was
        already done: it keeps the batch rectangular, its output is ignored)."""
        live = [at for at, row in enumerate(rows) if not row.done]
        greedy = logits.argmax(-1).tolist() if any(rows[at].generator is None for at in live) else []
        tokens = [0] * len(rows)
        drawn = [at for at in live if rows[at].generator is not None]
        for at in live:
            if rows[at].generator is None:
                tokens[at] = greedy[at]
        if drawn:
            picks = _sample_rows(
                logits[drawn],
                [rows[at].request.sampling for at in drawn],
                [rows[at].generator for at in drawn],
            )
            for at, token in zip(drawn, picks, strict=True):
                tokens[at] = token
        asking = [at for at in live if rows[at].request.sampling.logprobs]
        if asking:  # the asking rows only (torch.logsumexp is far slower than log_softmax on a CPU row)
            chosen = torch.tensor([[tokens[at]] for at in asking], device=self.device)
            values = torch.log_softmax(logits[asking], dim=-1).gather(1, chosen).squeeze(1).tolist()
            for at, value in zip(asking, values, strict=True):
                rows[at].logprobs.append(value)
        for at in live:
            row, token = rows[at], tokens[at]
            row.ids.append(token)
            if token in row.stops:
                row.done, row.finish = True, "stop"
            elif len(row.ids) >= row.request.budget:
                row.done = True
            if row.done:
                if caching:
                    self._keep(row, cache, mask, at, alone=len(rows) == 1)
                _answer(
                    row.request.future,
                    Generation(
                        ids=row.ids,
                        text=self.tokenizer.decode(row.ids),
                        logprobs=row.logprobs if row.request.sampling.logprobs else None,
                        finish_reason=row.finish,
                        exact_text=True,
                    ),
                )
        return tokens

    def _next_inputs(
        self, rows: list[_Row], tokens: list[int], mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next decode step's input ids, mask and positions after a step that sampled `tokens`."""
        step_ids = torch.tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(1)
        # a row that is done feeds a token that is not its own: masked, so its keys stay exactly its sequence
        mask = torch.cat([mask, torch.tensor([[0 if row.done else 1] for row in rows], device=self.device)], dim=1)
        if positions.dim() == 3:  # after an image prompt: one past the highest of the last token's 3 positions
            positions = positions[..., -1:].amax(0, keepdim=True).expand(3, -1, -1) + 1
        else:
            positions = positions[:, -1:] + 1
        return step_ids, mask, positions

    def _join(
        self,
        running: list[_Row],
        step_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        newcomers: list[_Request],
        caching: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Prefill `newcomers` on their own, sample their first tokens, and append their rows to the running ones:
        the shorter of the two caches (and masks) is left-padded to the longer, so each row keeps its own
        positions and sees only its own keys. `running` is extended in place."""
        self.joined_requests += len(newcomers)
        self.joins += 1
        rows = [self._row(request, caching) for request in newcomers]
        logits, first_mask, first_positions, joined = self._prefill(rows, None)
        self.row_steps += len(rows)
        tokens = self._advance(rows, logits, joined, first_mask, caching)
        new_ids, new_mask, new_positions = self._next_inputs(rows, tokens, first_mask, first_positions)
        length = max(cache.get_seq_length(), joined.get_seq_length())
        merged = _new_cache(self.model)
        for layer, (old, new) in enumerate(zip(cache.layers, joined.layers, strict=True)):
            keys = torch.cat([_pad_left(old.keys, length), _pad_left(new.keys, length)], dim=0)
            values = torch.cat([_pad_left(old.values, length), _pad_left(new.values, length)], dim=0)
            merged.update(keys, values, layer)
        width = length + 1  # the cache and the token fed next
        mask = torch.cat([_pad_left(mask, width, dim=1), _pad_left(new_mask, width, dim=1)], dim=0)
        running.extend(rows)
        return (
            torch.cat([step_ids, new_ids], dim=0),
            mask,
            torch.cat([positions, new_positions], dim=0),
            merged,
        )

    def _logits(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        extra: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """One forward step: the last position's logits of each row, in float32 (rows x vocab)."""
        self.peak_batch_tokens = max(self.peak_batch_tokens, mask.shape[0] * mask.shape[1])
        inputs = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions, "use_cache": True}
        inputs[self._cache_kwarg] = cache  # the stock models `hf_head` allows pass it on to their backbone by name
        if self.head is not None and not extra and input_ids.shape[0] <= MAX_HEAD_ROWS:
            hidden = self.head.backbone(**inputs).last_hidden_state
            return self.head.logits(hidden[:, -1, :])
        out = self.model(**inputs, logits_to_keep=1, **extra)
        logits: torch.Tensor = out.logits[:, -1, :].float()
        return logits

    def _batch_cache(self, prefixes: list[Prefix | None], reused: list[int], past: int) -> Any:
        """A new cache holding each row's kept prefix, left-padded to `past` positions (the mask hides the pad)."""
        cache = _new_cache(self.model)
        if past == 0:
            return cache
        template = next(p for p in prefixes if p is not None)
        for layer, (first_keys, first_values) in enumerate(zip(template.keys, template.values, strict=True)):
            keys = first_keys.new_zeros((len(prefixes), first_keys.shape[1], past, first_keys.shape[3]))
            values = first_values.new_zeros((len(prefixes), first_values.shape[1], past, first_values.shape[3]))
            for row, (prefix, n) in enumerate(zip(prefixes, reused, strict=True)):
                if prefix is not None:
                    keys[row, :, past - n :] = prefix.keys[layer][0, :, :n]
                    values[row, :, past - n :] = prefix.values[layer][0, :, :n]
            cache.update(keys, values, layer)
        return cache

    def _keep(self, row: _Row, cache: Any, mask: torch.Tensor, at: int, *, alone: bool) -> None:
        """Keep a finished row's sequence (its prompt and generated ids but the last) from row `at` of the running
        cache, whose positions `mask` marks (`alone`: the running tensors hold this row only)."""
        positions = mask[at].nonzero().squeeze(1)
        sequence = row.request.prompt + array.array("q", row.ids[:-1])
        if len(positions) != len(sequence):  # the layout above went wrong: keep nothing rather than garbage
            raise EngineError(f"hf: {len(positions)} cached positions for a sequence of {len(sequence)} ids")
        whole = alone and len(positions) == mask.shape[1]  # the cache is this row alone: no copy
        layers = cache.layers
        keys = [lay.keys if whole else lay.keys[at : at + 1].index_select(2, positions) for lay in layers]
        values = [lay.values if whole else lay.values[at : at + 1].index_select(2, positions) for lay in layers]
        self.prefix_cache.add(Prefix(sequence, keys, values), extends=row.prefix)


def _reused(kept: int, prompt: int) -> int:
    """How many of a prompt's ids a row takes from its kept prefix of `kept` ids: all but the prompt's last, whose
    logits start the generation (see `_prefill`)."""
    return min(kept, prompt - 1)


@dataclass(frozen=True, slots=True)
class _Footprint:
    """What a batch's cache comes to hold (`max_batch_tokens`): its rows x the positions it reaches by the last token
    any row may still generate: the prefill's layout (the longest reused prefix + the longest rest of a prompt, see
    `_prefill`) or a running batch's `width`, whichever is longer, plus the largest budget left."""

    rows: int = 0
    past: int = 0
    rest: int = 0
    width: int = 0
    left: int = 0

    def plus(self, engine: HFEngine, request: _Request) -> _Footprint:
        """This footprint with `request`'s row added (its kept prefix as `_row` will find it); without the bound,
        itself: nothing is counted."""
        if engine.max_batch_tokens is None:
            return self
        kept = engine.prefix_cache.reusable(request.prompt) if engine.prefix_caching else 0
        reused = _reused(kept, len(request.prompt))
        return _Footprint(
            rows=self.rows + 1,
            past=max(self.past, reused),
            rest=max(self.rest, len(request.prompt) - reused),
            width=self.width,
            left=max(self.left, request.budget),
        )

    @property
    def positions(self) -> int:
        return self.rows * (max(self.width, self.past + self.rest) + self.left)


def _answer(future: concurrent.futures.Future[Generation], generation: Generation) -> None:
    """Answer a request unless close() failed it already (it does when the model took too long to return)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(generation)


def _fail(future: concurrent.futures.Future[Generation], error: BaseException) -> None:
    """Fail a request unless it has its answer already (close() and the worker may both try)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_exception(error)


def _fail_all(requests: list[_Request], error: BaseException) -> None:
    """Fail each of `requests` that has no answer yet with the one `error`."""
    for request in requests:
        _fail(request.future, error)


def _image_processor(source: str, log: Any) -> Any:
    """The model directory's image processor, or None (the engine then takes no images) when it has none."""
    auto: Any = transformers.AutoImageProcessor  # untyped in transformers
    try:
        return auto.from_pretrained(source)
    except Exception as e:  # no preprocessor_config.json, or one transformers cannot read
        log.warning("hf_image_processor_missing", error=f"{type(e).__name__}: {e}")
        return None


def _check_sampling(sampling: SamplingParams) -> None:
    if sampling.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {sampling.max_new_tokens}")
    if sampling.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}")


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
    layers = getattr(_new_cache(model), "layers", None)
    if layer_class is None or not layers:
        return False
    return all(type(layer) is layer_class for layer in layers)


def _new_cache(model: Any) -> Any:
    try:
        return transformers.DynamicCache(config=model.config)
    except TypeError:  # transformers before 4.56 takes no config
        return transformers.DynamicCache()


def _pad_left(tensor: torch.Tensor, length: int, *, dim: int = 2) -> torch.Tensor:
    """`tensor` with zeros before its entries along `dim`, to `length` (a KV tensor's sequence axis is 2)."""
    short = length - tensor.shape[dim]
    if short == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = short
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _generator(sampling: SamplingParams, device: torch.device) -> torch.Generator | None:
    if sampling.temperature < _GREEDY_BELOW:
        return None
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def _sample_rows(
    logits: torch.Tensor, samplings: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token per row of raw logits, each row with its own settings and seeded generator: temperature ->
    top-k -> top-p, then a draw. The draw is `torch.multinomial`'s own for one sample (each row's probabilities
    over exponential noise from its generator, arg max), done for all rows at once: the same tokens as a
    `multinomial` call per row (`tests/agent_runtime/test_engine_hf_sampling.py`), with one call per row fewer."""
    temperatures = torch.tensor([s.temperature for s in samplings], dtype=logits.dtype, device=logits.device)
    scores = logits / temperatures.unsqueeze(1)
    for row, sampling in enumerate(samplings):
        if 0 < sampling.top_k < scores.shape[1] or sampling.top_p < 1.0:
            scores[row] = _filter(scores[row], sampling)
    probs = torch.softmax(scores, dim=-1)
    noise = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        noise[row].exponential_(1, generator=generator)
    return [int(t) for t in (probs / noise).argmax(-1).tolist()]


def _filter(scores: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """One row's tempered scores with top-k and top-p applied (the tokens left out at -inf)."""
    if 0 < sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it already does
        drop = (probs.cumsum(-1) - probs) >= sampling.top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(0, order, sorted_scores)
    return scores
