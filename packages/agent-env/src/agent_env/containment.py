"""What an episode boundary contains, and how it names what it contained: the rule written once.

    try:
        await environment.step(action)
    except BaseException as e:
        if propagates(e):
            raise
        record(describe_error(e))

A boundary around foreign code (an environment, a reward strategy, a parser, a tokenizer, an engine, a tool)
contains every `BaseException`: an `Exception`, `SystemExit`, `GeneratorExit`, a custom `BaseException`
subclass, a `BaseExceptionGroup` out of a plug-in's own `TaskGroup`, even a `CancelledError` the code raised
itself. Left to propagate, any of them ends the episode's task, and a bare `asyncio.gather` or a `TaskGroup` of
episodes (OpenRLHF's `generate_responses`, `AgentRuntime.run_many`) then loses every episode of the batch.

What propagates (`propagates`): `KeyboardInterrupt` (a person stopping the process; a group holding one too);
the cancellation of the current task from outside (a `CancelledError` while `asyncio.current_task().cancelling()`
is above 0: a timeout, a client that hung up, a caller that gave up); and, for a boundary inside a generator, the
`GeneratorExit` its consumer's ``close()``/``aclose()`` threw in at one of its own yields (its traceback holds
only the catching frame). A `CancelledError` seen while nothing cancels the task, or a `GeneratorExit` out of
code the boundary called, is that code's own and is contained.

`describe_error` never raises: an exception whose ``__str__`` raises is named as such, so reading the message of
what was contained cannot escape the boundary in its turn. This module knows asyncio; nothing about episodes.
"""

from __future__ import annotations

import asyncio
from typing import Final

__all__ = ["describe_error", "propagates"]

_PREVIEW: Final = 500


def propagates(error: BaseException) -> bool:
    """Whether a boundary must let `error` through (call it in the `except` clause that caught it):
    `KeyboardInterrupt` (alone or in a group), a `CancelledError` while the current task is being cancelled from
    outside, a `GeneratorExit` thrown in at the catching generator's own yield. Anything else it contains."""
    if isinstance(error, KeyboardInterrupt):
        return True
    if isinstance(error, asyncio.CancelledError):
        return _cancelled_from_outside()
    if isinstance(error, GeneratorExit):  # raised in the catching frame itself: thrown in at its yield
        trace = error.__traceback__
        return trace is not None and trace.tb_next is None
    if isinstance(error, BaseExceptionGroup):
        try:
            return error.subgroup(KeyboardInterrupt) is not None
        except Exception:  # a foreign group's own code (derive) raised: nothing to read, contain it
            return False
    return False


def _cancelled_from_outside() -> bool:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: nothing can cancel this code from outside
        return False
    return task is not None and task.cancelling() > 0


def describe_error(error: BaseException, *, limit: int | None = _PREVIEW) -> str:
    """``Type: message`` (or ``Type`` alone for an empty message), cut to `limit` characters (None: whole).
    Never raises: a message whose ``__str__`` raises is named as unreadable."""
    name = type(error).__name__
    try:
        message = str(error)
        text = f"{name}: {message}" if message else name  # inside: a str subclass's own methods may raise too
        return text if limit is None or len(text) <= limit else text[:limit] + "..."
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # foreign code's __str__
        return f"{name}: <its message could not be read: {type(e).__name__}>"
