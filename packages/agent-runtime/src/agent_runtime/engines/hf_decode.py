"""`HFDecodeLoop`: the part of `HFEngine` that runs one batch on the model: the prefill of its rows (each from its
kept prefix), then decode steps until every row is done, answering each request as its row finishes; requests that
join a running batch are prefilled on their own and merged in (`_join`). Which requests form a batch, when they
join and what happens when it fails is `hf_batching`'s business; building the engine is `hf`'s.

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

This module knows torch, transformers' `DynamicCache` and the engine's requests; nothing about queues or threads.
"""

from __future__ import annotations

import array
import collections
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers

from agent_protocol import Tokenizer
from agent_runtime.engines.base import FinishReason, Generation, SamplingParams
from agent_runtime.engines.hf_head import MAX_ROWS as MAX_HEAD_ROWS
from agent_runtime.engines.hf_head import TransposedHead
from agent_runtime.engines.hf_prefix import Prefix, PrefixCache
from agent_runtime.engines.hf_sampling import request_generator, sample_rows
from agent_runtime.engines.hf_vision import ImageInputs
from agent_runtime.errors import EngineError

__all__ = [
    "Closed",
    "HFDecodeLoop",
    "Intake",
    "Request",
    "Row",
    "answer_request",
    "fail_request",
    "new_cache",
    "reused_count",
]

_DROP_FINISHED_AT = 8  # finished rows leave a running batch once they are at least 1/8 of it


class Closed(Exception):
    """Raised in the worker when close() stops a running batch."""


@dataclass(eq=False, slots=True)
class Request:
    """One `generate` call on its way to the worker: its prompt ids, sampling, token budget and the future it
    is answered on."""

    prompt: array.array[int]
    sampling: SamplingParams
    budget: int
    future: concurrent.futures.Future[Generation]
    vision: ImageInputs | None = None  # an image prompt's pixels and positions: it runs alone, uncached
    abandoned: bool = False  # its caller stopped waiting (set on the event loop, read by the worker)


@dataclass(eq=False, slots=True)
class Row:
    """A request while its batch runs: its kept prefix, stop ids, generator, and what it generated so far."""

    request: Request
    prefix: Prefix | None
    stops: frozenset[int]
    generator: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version of each id (`HFEngine.policy_version`)
    finish: FinishReason = "length"
    done: bool = False


Intake = Callable[[int, list[Row], int, int], list[Request]]
"""What joins a running batch now: (room, its rows, its cache's positions, its decode steps so far) -> requests."""


class HFDecodeLoop:
    """The decode loop of `HFEngine` (which sets every attribute declared here)."""

    model: Any
    tokenizer: Tokenizer
    stop_token_ids: tuple[int, ...]
    device: torch.device
    head: TransposedHead | None
    prefix_cache: PrefixCache
    max_batch_size: int
    row_steps: int
    joined_requests: int
    joins: int
    peak_batch_tokens: int
    abandoned_requests: int
    batch_sizes: collections.Counter[int]
    policy_version: int
    _forward_version: int
    _cache_kwarg: str
    _abort: threading.Event

    def _decode(
        self, batch: list[Request], *, intake: Intake | None, caching: bool, vision: ImageInputs | None
    ) -> None:
        """Prefill, then decode steps until every row is done; `intake` (None: nothing joins) says which requests
        join the running rows between two steps (appended to `batch`)."""
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
                raise Closed
            newcomers = intake(self.max_batch_size - len(stay), running, mask.shape[1], step) if intake else []
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

    def _drop_abandoned(self, rows: list[Row]) -> None:
        """Mark done, unkept, the rows whose callers stopped waiting; they leave the batch as finished rows do."""
        for row in rows:
            if row.request.abandoned and not row.done:
                row.done, row.finish = True, "abort"
                self.abandoned_requests += 1
                fail_request(row.request.future, EngineError("hf: the caller stopped waiting for this request"))

    def _row(self, request: Request, caching: bool) -> Row:
        """A request's row: its kept prefix (when caching), stop ids and generator."""
        prefix = self.prefix_cache.longest_prefix(request.prompt) if caching else None
        stops = frozenset(self.stop_token_ids) | frozenset(request.sampling.stop_token_ids)
        return Row(request, prefix, stops, request_generator(request.sampling, self.device))

    def _prefill(
        self, rows: list[Row], vision: ImageInputs | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """The first forward of `rows`: its logits, and the mask, positions and cache it leaves. Each row is laid
        out as [pad][kept prefix][pad][rest of the prompt]; the prefix part lives only in the cache."""
        # a row reuses its kept prefix, except for the prompt's last id: its logits start the generation
        reused = [reused_count(0 if r.prefix is None else len(r.prefix.ids), len(r.request.prompt)) for r in rows]
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
        self, rows: list[Row], logits: torch.Tensor, cache: Any, mask: torch.Tensor, caching: bool
    ) -> list[int]:
        """Sample the next token of every live row from its logits (row `at` of `logits` is `rows[at]`); a row that
        is done is kept (prefix cache) and answered now. Returns the token of each row (0 for a row that was
        already done: it keeps the batch rectangular, its output is ignored)."""
        live = [at for at, row in enumerate(rows) if not row.done]
        version = self._forward_version  # these logits' forward pass: `_logits` read it as the pass began
        greedy = logits.argmax(-1).tolist() if any(rows[at].generator is None for at in live) else []
        tokens = [0] * len(rows)
        drawn = [at for at in live if rows[at].generator is not None]
        for at in live:
            if rows[at].generator is None:
                tokens[at] = greedy[at]
        if drawn:
            picks = sample_rows(
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
            row.versions.append(version)
            if token in row.stops:
                row.done, row.finish = True, "stop"
            elif len(row.ids) >= row.request.budget:
                row.done = True
            if row.done:
                if caching:
                    self._keep(row, cache, mask, at, alone=len(rows) == 1)
                answer_request(
                    row.request.future,
                    Generation(
                        ids=row.ids,
                        text=self.tokenizer.decode(row.ids),
                        logprobs=row.logprobs if row.request.sampling.logprobs else None,
                        finish_reason=row.finish,
                        exact_text=True,
                        versions=row.versions,
                    ),
                )
        return tokens

    def _next_inputs(
        self, rows: list[Row], tokens: list[int], mask: torch.Tensor, positions: torch.Tensor
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
        running: list[Row],
        step_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        newcomers: list[Request],
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
        merged = new_cache(self.model)
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
        """One forward step: the last position's logits of each row, in float32 (rows x vocab). The policy version
        as it begins is what the ids sampled from these logits carry (`_advance`)."""
        self._forward_version = self.policy_version
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
        cache = new_cache(self.model)
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

    def _keep(self, row: Row, cache: Any, mask: torch.Tensor, at: int, *, alone: bool) -> None:
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


def reused_count(kept: int, prompt: int) -> int:
    """How many of a prompt's ids a row takes from its kept prefix of `kept` ids: all but the prompt's last, whose
    logits start the generation (see `_prefill`)."""
    return min(kept, prompt - 1)


def answer_request(future: concurrent.futures.Future[Generation], generation: Generation) -> None:
    """Answer a request unless close() failed it already (it does when the model took too long to return)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(generation)


def fail_request(future: concurrent.futures.Future[Generation], error: BaseException) -> None:
    """Fail a request unless it has its answer already (close() and the worker may both try)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_exception(error)


def new_cache(model: Any) -> Any:
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
