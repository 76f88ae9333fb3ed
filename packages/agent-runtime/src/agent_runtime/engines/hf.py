"""`HFEngine`: a transformers causal LM, on CPU or GPU, behind the `LLMEngine` interface.

Generation is a hand-written incremental decoding loop over the model's KV cache, so every rule is visible here:

- sampling: temperature (below 1e-5 is greedy, as in vLLM), then top-k, then top-p, then a draw from a
  `torch.Generator` owned by the request (seeded with `SamplingParams.seed`, or randomly), so a seeded request
  gives the same ids however it was batched, up to float rounding between batch shapes;
- logprobs: `log_softmax` of the model's raw logits, before temperature, top-k and top-p. This is vLLM's default
  (`logprobs_mode="raw_logprobs"`), so rollouts from this engine and from vLLM carry comparable numbers;
- stop: the model's eos ids (`generation_config.eos_token_id`, else `config.eos_token_id`) plus the request's
  `stop_token_ids`; the stop token is kept in the ids, as vLLM returns it;
- length: a prompt must leave room in `context_length` (else `ContextBudgetExceeded`); `max_new_tokens` is
  clamped to the room left, and `finish_reason` is "length" when the limit ended the generation.

Concurrency: one worker thread owns the model. Requests that arrive together (within `batch_wait_s` of each
other, at most `max_batch_size`) run as one left-padded batch with an attention mask and per-row position ids,
so a batched row computes what it would alone; the test suite checks greedy batched == unbatched. A batch runs
until its longest row is done: rows do not join a running batch (no continuous batching; use vLLM for that).
If a batch fails, each request is retried alone, so one bad request cannot fail its neighbours. The event loop
only awaits a future, so it is never blocked, and the engine can be shared by several event loops.

This module knows nothing about chat formats; it imports torch and transformers, so import it only when the
`hf` extra is installed (`agent_runtime.engines.make_engine("hf", ...)` does that lazily).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agent_protocol import HFTokenizer, Tokenizer, TransformersTokenizer, load_tokenizer
from agent_runtime.engines.base import FinishReason, Generation, LLMEngine, SamplingParams
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


@dataclass(eq=False, slots=True)
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    budget: int
    future: concurrent.futures.Future[Generation]


class HFEngine(LLMEngine):
    """A transformers causal LM. Build it with `HFEngine.from_pretrained(path_or_id, device=..., dtype=...)`, or
    from a loaded model and its tokenizer: `HFEngine(model, tokenizer)` (the model is put in eval mode and runs
    under `torch.inference_mode`). `context_length` defaults to `config.max_position_embeddings`, the stop ids
    to the model's eos ids."""

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
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, got {batch_wait_s}")
        self.model = model.eval()
        self.tokenizer = load_tokenizer(tokenizer)
        config = model.config
        self.context_length = int(context_length if context_length is not None else config.max_position_embeddings)
        if self.context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {self.context_length}")
        self.stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else _model_eos_ids(model)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.device: torch.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        #: how many batches of each size ran (a batch of 3 is three requests sharing forward passes)
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        # transformers renamed `past_key_values` to `cache` in the forward signature of its 5.x models
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._closed = False

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
    ) -> HFEngine:
        """Load a model directory (or a Hugging Face id already in the local cache). `dtype` is "auto" (the
        checkpoint's), a name such as "bfloat16", or a `torch.dtype`. The tokenizer is the directory's
        `tokenizer.json` when there is one, else transformers' `AutoTokenizer`."""
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
        try:
            model: Any = transformers.AutoModelForCausalLM.from_pretrained(source, **options)
            model = model.to(device)
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
        )
        log.info(
            "hf_engine_loaded",
            dtype=str(model.dtype),
            context_length=engine.context_length,
            stop_token_ids=list(engine.stop_token_ids),
            seconds=round(time.perf_counter() - started, 3),
        )
        return engine

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        prompt = [int(i) for i in prompt_ids]
        _check_sampling(sampling)
        if not prompt:
            raise ValueError("hf: prompt_ids is empty; the model needs at least one token to continue")
        bad = next((i for i in prompt if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"hf: prompt id {bad} is outside the model's vocabulary of {self.vocab_size}")
        budget = self.max_new_tokens_for(len(prompt), sampling.max_new_tokens)
        request = _Request(prompt, sampling, budget, concurrent.futures.Future())
        with self._lock:
            if self._closed:
                raise EngineUnavailable("hf: the engine is closed")
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
                self._worker.start()
            self._queue.put(request)
        return await asyncio.wrap_future(request.future)

    async def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            worker = self._worker
            self._queue.put(None)
        if worker is not None:
            await asyncio.to_thread(worker.join)

    # -- the worker thread ---------------------------------------------------------------------------------

    def _serve(self) -> None:
        running = True
        while running:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 1e-4))
                except queue.Empty:
                    break
                if item is None:
                    running = False
                    break
                batch.append(item)
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if live:
                self._run(live)
        while True:  # a request queued after close() must not wait forever
            try:
                late = self._queue.get_nowait()
            except queue.Empty:
                return
            if late is not None and late.future.set_running_or_notify_cancel():
                late.future.set_exception(EngineUnavailable("hf: the engine was closed before this request ran"))

    def _run(self, batch: list[_Request]) -> None:
        started = time.perf_counter()
        try:
            results = self._generate_batch(batch)
        except Exception as e:
            if len(batch) > 1:
                logger.warning("hf_batch_failed_retrying_alone", batch_size=len(batch), error=repr(e))
                for request in batch:
                    self._run([request])
                return
            logger.warning("hf_generation_failed", prompt_tokens=len(batch[0].prompt), error=repr(e))
            error = EngineError(f"hf: generation failed: {type(e).__name__}: {e}")
            error.__cause__ = e
            batch[0].future.set_exception(error)
            return
        self.batch_sizes[len(batch)] += 1
        logger.debug(
            "hf_batch_done",
            batch_size=len(batch),
            new_tokens=sum(len(g.ids) for g in results),
            seconds=round(time.perf_counter() - started, 4),
        )
        for request, generation in zip(batch, results, strict=True):
            request.future.set_result(generation)

    @torch.inference_mode()
    def _generate_batch(self, batch: list[_Request]) -> list[Generation]:
        rows, width = len(batch), max(len(r.prompt) for r in batch)
        input_ids = torch.zeros((rows, width), dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for row, request in enumerate(batch):  # left padding: every row's last prompt token is at the end
            input_ids[row, width - len(request.prompt) :] = torch.tensor(request.prompt, dtype=torch.long)
            mask[row, width - len(request.prompt) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each row counts its positions from its first real token
        cache = _new_cache(self.model)
        stops = [frozenset(self.stop_token_ids) | frozenset(r.sampling.stop_token_ids) for r in batch]
        generators = [_generator(r.sampling, self.device) for r in batch]
        ids: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        finish: list[FinishReason] = ["length"] * rows
        done = [False] * rows
        step_ids = input_ids
        while True:
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: cache},
            )
            if step_ids is input_ids and cache.get_seq_length() != width:
                raise EngineError(f"hf: the model ignored its KV cache (passed as `{self._cache_kwarg}`)")
            logits = out.logits[:, -1, :].float()
            raw_logprobs = torch.log_softmax(logits, dim=-1)
            next_ids: list[int] = []
            for row, request in enumerate(batch):
                if done[row]:
                    next_ids.append(0)  # a finished row keeps the batch rectangular; its outputs are ignored
                    continue
                token = _sample(logits[row], request.sampling, generators[row])
                ids[row].append(token)
                if request.sampling.logprobs:
                    logprobs[row].append(float(raw_logprobs[row, token]))
                if token in stops[row]:
                    done[row], finish[row] = True, "stop"
                elif len(ids[row]) >= request.budget:
                    done[row] = True
                next_ids.append(token)
            if all(done):
                break
            step_ids = torch.tensor(next_ids, dtype=torch.long, device=self.device).unsqueeze(1)
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
            positions = positions[:, -1:] + 1
        return [
            Generation(
                ids=ids[row],
                text=self.tokenizer.decode(ids[row]),
                logprobs=logprobs[row] if request.sampling.logprobs else None,
                finish_reason=finish[row],
            )
            for row, request in enumerate(batch)
        ]


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
    for source in (getattr(generation_config, "eos_token_id", None), model.config.eos_token_id):
        if source is None:
            continue
        for token in [source] if isinstance(source, int) else source:
            if int(token) not in found:
                found.append(int(token))
        if found:
            break
    return tuple(found)


def _new_cache(model: Any) -> Any:
    try:
        return transformers.DynamicCache(config=model.config)
    except TypeError:  # transformers before 4.56 takes no config
        return transformers.DynamicCache()


def _generator(sampling: SamplingParams, device: torch.device) -> torch.Generator | None:
    if sampling.temperature < _GREEDY_BELOW:
        return None
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def _sample(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from one row of raw logits: greedy, or temperature -> top-k -> top-p -> a seeded draw."""
    if generator is None:
        return int(torch.argmax(logits))
    scores = logits / sampling.temperature
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
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
