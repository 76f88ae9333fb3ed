"""Run blocking work, or a coroutine on its own event loop, on a counted daemon thread and await it.

Why not `asyncio.to_thread`: a tool that hangs forever would hold one of the default executor's few workers
(six on a two-core machine) for good, so a handful of hung tools would stall every later `to_thread` in the
process, sibling episodes included; and `asyncio.run` joins that executor at exit, so one hung thread would
hang the program's shutdown. Here each call gets a fresh daemon thread: a caller that stops waiting (a
timeout) gets control back at once, the abandoned thread finishes or dies with the process, and nothing else
waits for it. Python cannot kill a thread, so an abandoned thread that never finishes is leaked.

Leaks are bounded. Every thread started here counts against `WORKER_THREADS` (the whole process) and against
the `ThreadBudget`s the caller put in scope with `thread_budget(...)` (the tool runner puts one per tool).
A budget counts `live` threads and, of those, `hung` ones: still running after their caller stopped waiting.
When starting a thread would pass a budget's `max_live` or when its `hung` count has reached `max_hung`,
the call raises `ThreadLimitError` at once and starts nothing. A thread frees its slots when it finishes.

`run_coroutine_in_thread` runs a coroutine on a fresh event loop in such a thread: if the coroutine blocks
(``time.sleep``, a CPU loop) it blocks only that thread, and the caller's loop, and its timeouts, go on.
Cancelling the caller cancels the coroutine on its loop; a loop that does not take the cancellation within
`STALL_GRACE_S` is logged (``tool_blocked_its_event_loop``, or ``agent_program_...``: named for the caller's
`what`) and left to finish on its own.

Time spent waiting is not the work's own time. A caller can put a `WorkClock` in scope (`timed(clock)`): the
thread records when the work itself started and that it finished, before its outcome is handed back. A caller
with a timeout can then tell a call that ran too long from one that waited too long to run (a busy GIL, many
threads starting at once) or whose result is already on its way to a loop that was busy. Only the outermost
thread records; helpers the work starts itself do not move the clock.

A `BaseException` raised on a worker thread (SystemExit, KeyboardInterrupt, GeneratorExit...) reaches the
caller as `ContainedBaseException`, an ordinary exception. The outcome is always delivered: one whose
``__str__`` raises is named as unreadable, never left to kill the thread while its caller waits.

This module knows nothing about tools; it runs callables and coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from agent_env.errors import ContainedBaseException, ThreadLimitError

__all__ = [
    "STALL_GRACE_S",
    "WORKER_THREADS",
    "ThreadBudget",
    "WorkClock",
    "run_coroutine_in_thread",
    "run_in_daemon_thread",
    "thread_budget",
    "timed",
]

logger = structlog.get_logger(__name__)

STALL_GRACE_S: Final = 1.0
"""How long a cancelled coroutine's loop may take to act on the cancellation before it counts as blocked."""

_LEFTOVER_GRACE_S: Final = 1.0


@dataclass(eq=False)
class ThreadBudget:
    """Caps on the daemon threads started under it. `max_live` / `max_hung` None: no cap.

    `live`: threads still running; `hung`: those whose caller stopped waiting (timed out or cancelled).
    Counters change under a lock: threads release their slots themselves when they finish."""

    name: str
    max_live: int | None = None
    max_hung: int | None = None
    live: int = 0
    hung: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _refusal(self) -> str | None:
        if self.max_hung is not None and self.hung >= self.max_hung:
            return (
                f"{self.hung} earlier calls under {self.name} are still running after their caller stopped "
                f"waiting (at most {self.max_hung} may hang)"
            )
        if self.max_live is not None and self.live >= self.max_live:
            return f"{self.live} worker threads are running under {self.name} (at most {self.max_live})"
        return None


WORKER_THREADS: Final = ThreadBudget("the process budget", max_live=1024, max_hung=128)
"""The process-wide budget every thread started here counts against. Set its fields to change the caps.

`max_live` bounds threads (and, for `run_coroutine_in_thread`, event loops: about 3 file descriptors each)
whatever their state; `max_hung` bounds leaked ones. Past either, new calls are refused, not queued."""

_scope: contextvars.ContextVar[tuple[ThreadBudget, ...]] = contextvars.ContextVar("agent_env_thread_budgets")


class thread_budget:  # a context manager named like a function, as contextlib's are
    """Count threads started in this context (and in tasks created from it) against `budgets` as well.

    A class, not a generator context manager: the tool runner enters one per call, and this costs a third."""

    __slots__ = ("_budgets", "_token")

    def __init__(self, *budgets: ThreadBudget) -> None:
        self._budgets = budgets

    def __enter__(self) -> None:
        self._token = _scope.set((*_scope.get(()), *self._budgets))

    def __exit__(self, *exc: object) -> None:
        _scope.reset(self._token)


@dataclass(eq=False)
class WorkClock:
    """When the work itself ran (`time.monotonic()`), set by the thread that runs it; read by its caller."""

    started: float | None = None
    finished: bool = False  # set before the outcome is posted to the caller's loop


_clock: Final[contextvars.ContextVar[WorkClock | None]] = contextvars.ContextVar("agent_env_work_clock", default=None)


@contextlib.contextmanager
def timed(clock: WorkClock) -> Iterator[None]:
    """Record on `clock` when the next thread started in this context (or in tasks created from it) runs its work."""
    token = _clock.set(clock)
    try:
        yield
    finally:
        _clock.reset(token)


def _thread_context() -> contextvars.Context:
    """The caller's contextvars for a worker thread, without the clock: only the outermost thread records."""
    context = contextvars.copy_context()
    context.run(_clock.set, None)
    return context


class _Slot:
    """One thread's place in its budgets: taken before the thread starts, given back once it ends."""

    def __init__(self) -> None:
        budgets = dict.fromkeys((*_scope.get(()), WORKER_THREADS))  # a budget in scope twice counts once
        self.budgets = tuple(sorted(budgets, key=id))  # one lock order for every slot
        self.lock = threading.Lock()
        self.hung = False
        self.finished = False
        with contextlib.ExitStack() as stack:
            for budget in self.budgets:
                stack.enter_context(budget._lock)
            for budget in self.budgets:
                refusal = budget._refusal()
                if refusal is not None:
                    raise ThreadLimitError(refusal)
            for budget in self.budgets:
                budget.live += 1

    def abandon(self) -> None:
        """The caller stopped waiting: the thread, if it still runs, is hung."""
        with self.lock:
            if self.finished or self.hung:
                return
            self.hung = True
            for budget in self.budgets:
                with budget._lock:
                    budget.hung += 1

    def release(self) -> None:
        """The thread ends: give its slots back."""
        with self.lock:
            self.finished = True
            for budget in self.budgets:
                with budget._lock:
                    budget.live -= 1
                    if self.hung:
                        budget.hung -= 1


def _contain(error: BaseException) -> BaseException:
    """What the caller gets for `error`; never raises, so the worker thread always delivers an outcome."""
    if isinstance(error, Exception):
        return error
    try:
        return ContainedBaseException(error)  # reads its message defensively (describe_error)
    except BaseException:  # a KeyboardInterrupt out of its __str__: nobody on this thread can take it
        return RuntimeError(f"{type(error).__name__} raised on a worker thread; its message could not be read")


class _Delivery[T]:
    """Hands a worker thread's outcome to a future on the caller's loop, if anyone still waits for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()

    def _set(self, value: T | None, error: BaseException | None) -> None:
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(value)  # type: ignore[arg-type]  # value is a T when error is None

    def post(self, value: T | None, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(self._set, value, error)


async def run_in_daemon_thread[T](fn: Callable[[], T], *, name: str = "agent-env-worker") -> T:
    """Run `fn()` on a new daemon thread (with the caller's contextvars) and return its result.

    Raises `ThreadLimitError` without starting anything when a budget in scope is full. Cancelling the
    awaiting coroutine returns immediately; the thread keeps running until `fn` returns (counted as hung),
    and its result is then dropped.
    """
    delivery: _Delivery[T] = _Delivery(asyncio.get_running_loop())
    context = _thread_context()
    return await _run_on_thread(lambda: context.run(fn), delivery, name)


async def _run_on_thread[T](call: Callable[[], T], delivery: _Delivery[T], name: str) -> T:
    """Run `call()` on a new daemon thread that holds a budget slot, deliver its outcome (a BaseException
    contained) to `delivery`'s loop and await it. Cancelled, the slot counts as hung until the thread ends."""
    clock = _clock.get()
    slot = _Slot()  # last: nothing may fail between taking the slot and starting the thread

    def target() -> None:
        if clock is not None:
            clock.started = time.monotonic()
        try:
            value = call()
        except BaseException as error:
            outcome: tuple[T | None, BaseException | None] = (None, _contain(error))
        else:
            outcome = (value, None)
        try:
            if clock is not None:
                clock.finished = True
            delivery.post(*outcome)
        finally:
            slot.release()

    thread = threading.Thread(target=target, name=name, daemon=True)
    try:
        thread.start()
    except BaseException:
        slot.release()
        raise
    try:
        return await delivery.future
    except asyncio.CancelledError:
        slot.abandon()
        raise


async def run_coroutine_in_thread[T](
    factory: Callable[[], Coroutine[Any, Any, T]], *, name: str = "agent-env-loop", what: str = "tool"
) -> T:
    """Run `factory()`'s coroutine on a fresh event loop in a new daemon thread; return its result.

    The coroutine runs with the caller's contextvars. Cancelling the caller cancels the coroutine on its own
    loop and returns at once; if that loop is blocked, the thread is left to finish (counted as hung) and the
    block is logged, as ``{what}_blocked_its_event_loop`` (`what`: the kind of code it runs, ``tool`` or
    ``agent_program``). Raises `ThreadLimitError` without starting anything when a budget in scope is full.
    """
    caller_loop = asyncio.get_running_loop()
    delivery: _Delivery[T] = _Delivery(caller_loop)
    context = _thread_context()
    worker = _WorkerLoop(name, what)
    try:
        return await _run_on_thread(lambda: worker.run(factory, context), delivery, name)
    except asyncio.CancelledError:
        worker.cancel()
        caller_loop.call_later(STALL_GRACE_S, worker.check_stalled)
        raise


class _WorkerLoop:
    """The event loop of one `run_coroutine_in_thread` call, and the cancellation sent to it."""

    def __init__(self, name: str, what: str) -> None:
        self.name = name
        self.what = what  # what runs on it ("tool", "agent_program"): the stall events are named for it
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.lock = threading.Lock()
        self.cancel_requested: float | None = None
        self.cancel_taken = False
        self.done = False

    def run[T](self, factory: Callable[[], Coroutine[Any, Any, T]], context: contextvars.Context) -> T:
        loop = asyncio.new_event_loop()
        try:
            with self.lock:
                if self.cancel_requested is not None:
                    raise asyncio.CancelledError
                task: asyncio.Task[T] = loop.create_task(factory(), context=context)
                self.loop, self.task = loop, task
            return loop.run_until_complete(task)
        finally:
            with self.lock:
                self.done = True
            _close(loop)

    def cancel(self) -> None:
        """Ask the worker loop to cancel the coroutine (from the caller's thread)."""
        with self.lock:
            self.cancel_requested = time.monotonic()
            loop, task = self.loop, self.task
            if loop is None or task is None or self.done:
                return
            with contextlib.suppress(RuntimeError):  # the loop just closed
                loop.call_soon_threadsafe(self._take_cancel, task)

    def _take_cancel(self, task: asyncio.Task[Any]) -> None:
        self.cancel_taken = True
        if self.cancel_requested is not None:
            late = time.monotonic() - self.cancel_requested
            if late > STALL_GRACE_S:
                logger.warning(
                    f"{self.what}_event_loop_unblocked", thread=self.name, what=self.what, blocked_s=round(late, 3)
                )
        task.cancel()

    def check_stalled(self) -> None:
        """Log a worker loop that has not taken its cancellation within the grace period."""
        with self.lock:
            if self.done or self.cancel_taken:
                return
        kind = self.what.replace("_", " ")
        logger.warning(
            f"{self.what}_blocked_its_event_loop",
            thread=self.name,
            what=self.what,
            grace_s=STALL_GRACE_S,
            advice=f"an async {kind} must await, never block; its thread is left to finish on its own",
        )


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what the coroutine left running (bounded), then close the loop."""
    try:
        leftovers = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            loop.run_until_complete(asyncio.wait(leftovers, timeout=_LEFTOVER_GRACE_S))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except BaseException as error:  # a leftover task raised SystemExit while we waited: nothing left to tell
        logger.warning("tool_event_loop_cleanup_failed", error=repr(error))
    finally:
        loop.close()
