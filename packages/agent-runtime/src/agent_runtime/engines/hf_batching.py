"""`HFBatching`: the part of `HFEngine` that schedules requests on its one worker thread: which requests form a
batch, when waiting requests join a running one, how many positions a batch may hold, and what happens when a
batch fails. Each batch runs on the model through `hf_decode.HFDecodeLoop`.

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
held; `deferred_requests` counts the waits). Memory per position is the prefix cache's figure (`hf_decode`).

Failures: if a batch fails, each request it had not answered is retried alone (without joining), so one bad request
cannot fail its neighbours. The event loop only awaits a future, so it is never blocked, and the engine can be
shared by several event loops. A request whose caller gave up (its task cancelled, as `call_engine` does on an engine
timeout) is never run if the worker had not taken it yet, and otherwise leaves its batch at the next step, without
being kept: a timed-out turn does not go on generating up to its budget (`abandoned_requests` counts them).

This module knows the engine's queue, its worker thread and its requests; the model only through the decode loop.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from agent_runtime.engines.hf_decode import Closed, HFDecodeLoop, Request, Row, fail_request, reused_count
from agent_runtime.errors import EngineError, EngineUnavailable

__all__ = ["JOIN_RATIO", "JOIN_WAIT_STEPS", "SENDING_POLL_S", "FixedBatch", "HFBatching", "fail_requests"]

logger = structlog.get_logger(__name__)

JOIN_RATIO = 1.0  # requests waiting to join a running batch join it once they are this many times its rows
JOIN_WAIT_STEPS = 20  # ... or once the first of them has waited this many decode steps
SENDING_POLL_S = 0.00025  # a forming batch checks this often whether any event loop is still sending


@dataclass(frozen=True, slots=True)
class FixedBatch:
    """Requests sent together by `HFEngine.generate_batch`: they run in batches formed from them alone, in their
    order (the text ones in runs of at most `max_batch_size` rows and within `max_batch_tokens`, an image request
    alone), nothing joining them and they joining nothing, so timing never decides which rows share a batch."""

    requests: list[Request]


class HFBatching(HFDecodeLoop):
    """The worker thread of `HFEngine` (which sets every attribute declared here and starts the thread)."""

    batch_wait_s: float
    batch_wait_full: bool
    prefix_caching: bool
    join_running: bool
    join_ratio: float
    join_wait_steps: int
    max_batch_tokens: int | None
    deferred_requests: int
    _resumable: bool
    _parameters: list[Any]
    _weights_seen: tuple[tuple[int, int], ...] | None
    _queue: queue.SimpleQueue[Request | FixedBatch | None]
    _pending: collections.deque[Request | FixedBatch | None]
    _waiting: collections.deque[tuple[Request, int]]
    _lock: threading.Lock
    _sending: int
    _taken: list[Request]

    def _serve(self) -> None:
        running = True
        while running and not self._abort.is_set():
            first = self._next(None)
            if first is None:
                break
            if isinstance(first, FixedBatch):
                self._run_fixed(first)
                continue
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
                if isinstance(item, FixedBatch):  # it runs after this batch, on its own
                    self._pending.appendleft(item)
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
            for request in late.requests if isinstance(late, FixedBatch) else [] if late is None else [late]:
                if request.future.set_running_or_notify_cancel():
                    fail_request(request.future, EngineUnavailable("hf: the engine was closed before this request ran"))

    def _next(self, timeout: float | None) -> Request | FixedBatch | None:
        """The next request (or the close marker): one a running batch took but could not join first."""
        if self._pending:
            return self._pending.popleft()
        if timeout == 0:
            return self._queue.get_nowait()
        return self._queue.get(timeout=timeout)

    def _newcomers(self, room: int, running: list[Row], width: int, step: int) -> list[Request]:
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
            if item is None or isinstance(item, FixedBatch) or item.vision is not None:
                self._pending.append(item)
            elif not item.future.cancelled():
                self._waiting.append((item, step))
        live = sum(1 for row in running if not row.done)
        if not self._waiting or room < 1:
            return []
        if len(self._waiting) < self.join_ratio * live and step - self._waiting[0][1] < self.join_wait_steps:
            return []
        joining: list[Request] = []
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

    def _run_fixed(self, fixed: FixedBatch) -> None:
        """Run `fixed`'s requests in their order: the text ones in runs of at most `max_batch_size` rows (cut
        early where `max_batch_tokens` would be passed), an image request alone; no joining either way."""
        live = [r for r in fixed.requests if r.future.set_running_or_notify_cancel()]
        groups: list[list[Request]] = []
        footprint = self._footprint()
        for request in live:
            if request.vision is not None:
                groups.append([request])
                footprint = self._footprint()
                continue
            grown = footprint.plus(self, request)
            current = groups[-1] if groups and groups[-1][0].vision is None else None
            if current is None or len(current) >= self.max_batch_size or not self._within(grown):
                groups.append([request])
                footprint = self._footprint().plus(self, request)
            else:
                current.append(request)
                footprint = grown
        for group in groups:
            self._taken = group
            self._run_group(group, join=False)
        self._taken = []

    def _run(self, batch: list[Request]) -> None:
        """Run the text requests as one batch and each image request alone."""
        plain = [r for r in batch if r.vision is None]
        for group in [plain] * bool(plain) + [[r] for r in batch if r.vision is not None]:
            self._run_group(group, join=self.join_running)

    def _run_group(self, batch: list[Request], *, join: bool) -> None:
        """Run `batch` (requests that join it are appended to it); if it fails, retry alone, without joining,
        each request it had not answered yet."""
        if self._abort.is_set():
            self._fail_closed(batch)
            return
        started = time.perf_counter()
        self.batch_sizes[len(batch)] += 1
        try:
            self._generate_batch(batch, join=join)
        except Closed:
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
            fail_requests(unanswered, error)
            return
        logger.debug("hf_batch_done", batch_size=len(batch), seconds=round(time.perf_counter() - started, 4))

    def _fail_closed(self, batch: list[Request]) -> None:
        fail_requests(batch, EngineUnavailable("hf: the engine was closed while this request ran"))

    def _weights_version(self) -> tuple[tuple[int, int], ...]:
        # a parameter's version counter moves on every in-place write, its data pointer on `param.data = ...`
        return tuple((p._version, p.data_ptr()) for p in self._parameters)

    @torch.inference_mode()
    def _generate_batch(self, batch: list[Request], *, join: bool) -> None:
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
            intake = self._newcomers if join and vision is None and self._resumable else None
            self._decode(batch, intake=intake, caching=caching, vision=vision)
        finally:
            self._requeue_waiting()  # what did not join runs first in the next batch

    def _footprint(self, running: Sequence[Row] = (), width: int = 0) -> _Footprint:
        """A batch about to form (empty), or the rows of `running` still generating in a cache of `width` positions
        (done rows leave the batch when requests join it). Empty without `max_batch_tokens`: nothing is counted."""
        live = [row for row in running if not row.done] if self.max_batch_tokens is not None else []
        left = max((row.request.budget - len(row.ids) for row in live), default=0)
        return _Footprint(rows=len(live), width=width, left=left)

    def _within(self, footprint: _Footprint) -> bool:
        """Whether a batch of that footprint stays within `max_batch_tokens` (always, without the bound)."""
        return self.max_batch_tokens is None or footprint.positions <= self.max_batch_tokens

    def _defer(self, request: Request) -> None:
        """`request` waits, first in line, for the next batch: this one has no room for it in tokens."""
        self._pending.appendleft(request)
        self.deferred_requests += 1


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

    def plus(self, engine: HFBatching, request: Request) -> _Footprint:
        """This footprint with `request`'s row added (its kept prefix as `_row` will find it); without the bound,
        itself: nothing is counted."""
        if engine.max_batch_tokens is None:
            return self
        kept = engine.prefix_cache.reusable(request.prompt) if engine.prefix_caching else 0
        reused = reused_count(kept, len(request.prompt))
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


def fail_requests(requests: list[Request], error: BaseException) -> None:
    """Fail each of `requests` that has no answer yet with the one `error`."""
    for request in requests:
        fail_request(request.future, error)
