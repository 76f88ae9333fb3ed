"""`deadline(seconds)`: `asyncio.timeout` for the hot path, without a timer per use; `Alarm`, the shared timer
under it, for any "call this after S seconds unless discarded" on the hot path.

Every engine call and every reward runs under a timeout, so a rollout of a thousand concurrent episodes keeps
thousands of `asyncio.timeout`s alive: each one puts a `TimerHandle` on the event loop's heap (a Python object,
pushed with Python-level comparisons) and cancels it when the block ends, and the loop keeps the cancelled handles
on its heap until it rebuilds it. Measured: about 6-8 us a use on an idle loop, more on a loaded one.

`deadline` behaves as `asyncio.timeout` does where it matters (the block's task is cancelled when the time is up
and `TimeoutError` comes out of the block; a cancellation from outside stays a `CancelledError`; None is no limit)
and shares timers: deadlines that fall due in the same window (1 % of the timeout, at least 10 ms) share one
timer, and a block that ends only leaves its window's set. So a deadline fires up to 1 % of its timeout late
(6 s for the engine's 600 s; 50 ms for a 5 s reward), never early.

`Alarm(seconds, callback)` is that shared timer by itself: the callback runs once `seconds` have passed, in the same
windows, unless `cancel()` came first. The server uses it to watch a plain completion's client only once the
completion has run 50 ms (`agent_runtime.serving.disconnect`). This module knows asyncio; nothing about episodes.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

__all__ = ["Alarm", "deadline"]

MIN_GRAIN_S: Final = 0.01
"""The narrowest window deadlines share a timer in (a 1 s timeout fires up to 10 ms late)."""
GRAIN_FRACTION: Final = 0.01
"""A deadline's window is this fraction of its timeout (at least `MIN_GRAIN_S`)."""


class Alarm:
    """``Alarm(seconds, callback)``: `callback()` runs on the running loop once `seconds` have passed, unless
    `cancel()` came first. It runs up to 1 % of `seconds` late (at least `MIN_GRAIN_S`), never early: alarms due in
    the same window share one loop timer, and a cancelled one only leaves its window's set."""

    __slots__ = ("_callback", "_window")

    def __init__(self, seconds: float, callback: Callable[[], object]) -> None:
        loop = asyncio.get_running_loop()
        self._callback = callback
        self._window: set[Alarm] | None = _timers_of(loop).add(loop, self, loop.time() + seconds, seconds)

    @property
    def pending(self) -> bool:
        """Neither run nor cancelled yet."""
        return self._window is not None

    def cancel(self) -> None:
        if self._window is not None:
            self._window.discard(self)
            self._window = None

    def _ring(self) -> None:
        self._window = None
        self._callback()


class deadline:  # a context manager named like a function, as asyncio.timeout is
    """``async with deadline(seconds): ...`` raises `TimeoutError` when the block runs past `seconds`
    (None: no limit). See the module docstring for how it differs from `asyncio.timeout` (it may fire late)."""

    __slots__ = ("_alarm", "_cancelling", "_expired", "_seconds", "_task")
    _task: asyncio.Task[Any]
    _cancelling: int

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._expired = False
        self._alarm: Alarm | None = None

    async def __aenter__(self) -> deadline:
        if self._seconds is None:
            return self
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("deadline() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._alarm = Alarm(self._seconds, self._expire)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._seconds is None:
            return
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        # As asyncio.timeout: take back the cancellation this deadline made; if it is what ended the block, and
        # nothing else asked to cancel the task, the block timed out.
        cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
        if self._expired and self._task.uncancel() <= self._cancelling and cancelled:
            raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        """Whether the time ran out (the block was cancelled by this deadline)."""
        return self._expired

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()


class _Timers:
    """One loop's alarms, by the time their window falls due; one timer per window. It does not hold the loop (its
    pending timers do, in the loop's own queue), so a weak map's value never keeps its key alive."""

    __slots__ = ("due",)

    def __init__(self) -> None:
        self.due: dict[float, set[Alarm]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, item: Alarm, when: float, seconds: float) -> set[Alarm]:
        grain = max(MIN_GRAIN_S, seconds * GRAIN_FRACTION)
        at = math.ceil(when / grain) * grain  # the end of the window `when` falls in: never early
        window = self.due.get(at)
        if window is None:
            window = self.due[at] = set()
            loop.call_at(at, self._fire, loop, at)
        window.add(item)
        return window

    def _fire(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        window = self.due.pop(at, None)
        for item in list(window or ()):  # a callback may cancel another alarm of this window, or set a new one
            if item._window is not window:
                continue  # cancelled by an earlier callback of this window
            try:
                item._ring()
            except Exception as e:  # one failing callback must not keep the rest of its window from running
                loop.call_exception_handler({"message": "an Alarm's callback failed", "exception": e})


_timers: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Timers]] = weakref.WeakKeyDictionary()
_ATTRIBUTE: Final = "_agent_env_deadline_timers"


def _timers_of(loop: asyncio.AbstractEventLoop) -> _Timers:
    """The loop's timers, kept on the loop itself (they go with it; asyncio's and uvloop's loops take attributes),
    or in a weak map for a loop that takes none."""
    timers: _Timers | None = getattr(loop, _ATTRIBUTE, None)
    if timers is not None:
        return timers
    timers = _timers.get(loop)
    if timers is None:
        timers = _Timers()
        try:
            setattr(loop, _ATTRIBUTE, timers)
        except AttributeError:
            _timers[loop] = timers
    return timers
