"""Run a turn's tool calls and turn every outcome into an `Observation`; never raise.

`ToolRunner.run(calls)` answers each call, in call order, with exactly one observation:

1. a call the protocol could not parse (`ToolCall.error`) is answered with its parse code; nothing runs;
2. calls past `max_calls_per_step` are refused (``too_many_calls``);
3. an unknown tool name gets ``unknown_tool`` and the list of tools (and the closest name);
4. arguments are checked before the call; a mismatch gets ``invalid_arguments`` naming the field;
5. the tool runs under its timeout (the tool's `timeout_s`, else the runner's default, 30 s), counted from
   when its own code starts: an isolated call that waited for its thread to run (a busy GIL, a burst of calls)
   gets up to one timeout more, and a result that is in when the deadline comes is taken. A tool that
   does not finish gets ``timeout`` and is abandoned: an async tool is cancelled, a sync tool's thread is
   left to finish on its own (see `_threads.py`), so a tool that hangs forever cannot hang the episode;
6. a tool that raised gets ``tool_error`` with the exception's type and message (`ToolError` shows its own
   message, code and hint). That includes a `BaseException` (SystemExit, KeyboardInterrupt, GeneratorExit,
   a tool's own CancelledError): only the cancellation of the call itself propagates;
7. a tool whose earlier calls still hang past their timeout (its `max_hung_calls`, default 16), or a process
   that already runs too many worker threads (`WORKER_THREADS`: 1024 live, 128 hung), gets
   ``tool_unavailable`` at once and nothing is started;
8. a `ToolOutput` (text with images) has its images checked against the runner's `ImageLimits` (readable, a
   known type, within the byte and pixel limits, not too many; see `tool_output.py`): one that breaks a rule
   gets ``invalid_image`` naming the image and the rule; the others keep their images on the observation;
9. a result that is not a string (or a `ToolOutput`'s text) is serialized to JSON (msgspec; unknown objects
   fall back to `str()`);
10. output longer than the limit is cut with a visible marker and the code ``output_truncated`` (the text
    only: images are never cut).

What an async tool must do, and what is enforced. An async tool must await and never block: no
``time.sleep``, no long CPU loop, no blocking client inside ``async def`` (put blocking work in a sync tool,
which runs on its own thread). By default (`ToolBase.event_loop` ``"isolated"``) each call of an async tool
runs on a fresh event loop in its own daemon thread, so a tool that blocks anyway blocks only that thread:
the caller's loop and every other episode go on, the call gets ``timeout`` on time, and a loop that does not
take the cancellation within a second is logged (``tool_blocked_its_event_loop``); its thread is left to
finish and counts as hung. A tool bound to the caller's loop (`MCPTool`, a client or lock created there)
sets ``event_loop = "shared"``: its coroutine runs on the caller's loop, where nothing can interrupt a block;
the runner then only reports it (``tool_stalled_the_event_loop`` when the call came back well past its
timeout). An isolated call has a loop of its own, so an asyncio object shared between calls (a client, a lock,
a semaphore made elsewhere) cannot be used from it: such a tool is a shared one. Isolation costs a thread and
a fresh loop per call (about half a millisecond). Not contained: ``os._exit``, a crash in C code, or a shared
tool's own background task raising SystemExit.

A tool whose work is small, bounded and never awaits (the calculator) sets ``event_loop = "inline"``: its call
runs in place, within the caller's step, with no task, no timer and no thread budget. No timeout applies (code
that does not await cannot be interrupted on any loop; an inline tool bounds its own work, as the calculator's
limits do), a call that comes back well past its timeout is reported as a shared one is, and an inline tool that
awaits anyway gets ``tool_error`` saying it must be a shared one (its coroutine is closed). Measured: `run`
with one calculator call, 17.7 us shared and 14.0 us inline (min of three 20,000-call loops; the task a shared
call needs in case it awaits is the difference), and more in a rollout, where every allocation weighs on a
loaded heap (`bench/bench_runtime.py`: 202 -> 195 us a step, measured with three small per-episode trims beside it).

Valid calls in one turn run concurrently. What a common turn costs: a single call runs without a task group,
and a shared tool's coroutine starts eagerly (`asyncio.Task(..., eager_start=True)`): one that finishes without
awaiting is answered at once, with no trip through the event loop and no timer; one that awaits is waited for
under its timeout like every other call. A call's logger is bound only where it logs.

A runner holds no per-episode state, so one runner (and its tools) can serve many concurrent episodes. The
hung-call count of a tool lives with the tool object (in a weak map here), so it is shared by every runner and
episode that uses that tool.

This module knows tools and observations; it knows nothing about episodes, steps or chat formats.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Final, NamedTuple, NoReturn

import msgspec
import structlog

from agent_env._threads import (
    WORKER_THREADS,
    ThreadBudget,
    WorkClock,
    run_coroutine_in_thread,
    thread_budget,
    timed,
)
from agent_env.errors import ArgumentError, ContainedBaseException, ThreadLimitError, ToolDefinitionError, ToolError
from agent_env.observation import Observation, ObservationCode
from agent_env.tool import EVENT_LOOP_MODES, ToolBase, ToolContext
from agent_env.tool_output import DEFAULT_IMAGE_LIMITS, ImageLimits, ToolOutput, check_tool_images
from agent_protocol import ToolCall, ToolSpec

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "DEFAULT_TOOL_TIMEOUT_S",
    "WORKER_THREADS",
    "ToolRunner",
    "render_result",
    "truncate",
]

logger = structlog.get_logger(__name__)

DEFAULT_TOOL_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_OUTPUT_CHARS: Final = 8000
_MAX_MESSAGE_CHARS: Final = 1000
_CANCEL_GRACE_S: Final = 1.0
_STALL_REPORT_S: Final = 0.25
_UNAVAILABLE_HINT: Final = (
    "This tool is stuck right now (earlier calls never finished); do not call it again soon: "
    "use another tool or answer without it."
)
_tool_budgets: Final[weakref.WeakKeyDictionary[ToolBase, ThreadBudget]] = weakref.WeakKeyDictionary()
_budgets_by_id: Final[dict[int, ThreadBudget]] = {}  # tools that cannot be weak dict keys (e.g. eq dataclasses)


def _fallback_encode(value: Any) -> Any:
    return str(value)


_result_encoder: Final = msgspec.json.Encoder(enc_hook=_fallback_encode)


def render_result(value: object) -> str:
    """A tool's result as the text the model reads: strings as they are, bytes decoded, anything else as
    JSON (objects msgspec cannot encode are written with `str()`), None as ``(no output)``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if value is None:
        return "(no output)"
    return _result_encoder.encode(value).decode()


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """Cut `text` to `limit` characters and append a marker saying how much was cut."""
    if len(text) <= limit:
        return text, False
    marker = f"\n[output truncated: showing the first {limit} of {len(text)} characters]"
    return text[:limit] + marker, True


def _short(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


class ToolRunner:
    """Runs tool calls against a fixed set of tools. See the module docstring for what each outcome gives."""

    def __init__(
        self,
        tools: Iterable[ToolBase] = (),
        *,
        default_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_calls_per_step: int = 16,
        image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
    ) -> None:
        if default_timeout_s <= 0:
            raise ValueError(f"default_timeout_s must be positive, got {default_timeout_s}")
        if max_output_chars <= 0:
            raise ValueError(f"max_output_chars must be positive, got {max_output_chars}")
        if max_calls_per_step <= 0:
            raise ValueError(f"max_calls_per_step must be positive, got {max_calls_per_step}")
        self._tools: dict[str, ToolBase] = {}
        for item in tools:
            if not isinstance(item, ToolBase):
                raise ToolDefinitionError(f"expected a ToolBase, got {type(item).__name__}")
            if item.name in self._tools:
                raise ToolDefinitionError(f"two tools are named {item.name!r}")
            if item.event_loop not in EVENT_LOOP_MODES:
                modes = ", ".join(EVENT_LOOP_MODES)
                raise ToolDefinitionError(
                    f"tool {item.name!r}: event_loop must be one of {modes}, not {item.event_loop!r}"
                )
            if item.max_hung_calls is not None and item.max_hung_calls < 1:
                raise ToolDefinitionError(f"tool {item.name!r}: max_hung_calls must be at least 1 (or None)")
            self._tools[item.name] = item
        self.default_timeout_s = default_timeout_s
        self.max_output_chars = max_output_chars
        self.max_calls_per_step = max_calls_per_step
        self.image_limits = image_limits

    @property
    def tools(self) -> dict[str, ToolBase]:
        return dict(self._tools)

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    async def run(self, calls: Sequence[ToolCall], context: ToolContext | None = None) -> list[Observation]:
        """Answer every call, in call order; runnable calls run concurrently."""
        base = context if context is not None else ToolContext()
        if len(calls) == 1:  # nothing to run beside it: no task group (max_calls_per_step is at least 1)
            return [await self.run_one(calls[0], _for_call(base, calls[0].id))]
        answers: list[Observation | None] = [None] * len(calls)
        async with asyncio.TaskGroup() as group:  # run_one never raises, so no sibling is ever cancelled
            tasks: dict[int, asyncio.Task[Observation]] = {}
            for index, call in enumerate(calls):
                if index >= self.max_calls_per_step and call.error is None:
                    answers[index] = self._failure(
                        call,
                        "too_many_calls",
                        f"this turn made {len(calls)} calls; at most {self.max_calls_per_step} run",
                        hint=f"Make at most {self.max_calls_per_step} tool calls in one turn.",
                    )
                    continue
                tasks[index] = group.create_task(self.run_one(call, _for_call(base, call.id)))
        for index, task in tasks.items():
            answers[index] = task.result()
        return [answer for answer in answers if answer is not None]

    async def run_one(self, call: ToolCall, context: ToolContext) -> Observation:
        """Answer one call; never raises (except when the caller itself is cancelled)."""
        if call.error is not None:
            return Observation.from_parse_issue(call.error, tool_call_id=call.id, name=call.name)
        target = self._tools.get(call.name)
        if target is None:
            return self._unknown(call)
        started = time.perf_counter()
        try:
            arguments = target.parse_arguments(dict(call.arguments))
        except ArgumentError as e:
            return self._failure(call, "invalid_arguments", _short(str(e)), hint=_arguments_hint(target))
        except Exception as e:
            _log(call, context).warning("tool_validation_raised", error=repr(e))
            return self._failure(call, "tool_error", f"argument check failed: {type(e).__name__}: {e}", started)
        timeout = target.timeout_s if target.timeout_s is not None else self.default_timeout_s
        if target.event_loop == "inline":  # runs here and now: no task, timer or thread to arrange
            settled = self._settle(call, context, started, functools.partial(_run_inline, target, arguments, context))
            _report_stall(call, context, started, timeout)
        else:
            clock = WorkClock()
            loop = asyncio.get_running_loop()
            work = _invoke(target, arguments, context, clock)
            task = (
                asyncio.Task(work, loop=loop, eager_start=True)
                if target.event_loop == "shared"
                else loop.create_task(work)
            )
            if task.done():  # a shared tool that finished in its first step, within this call: nothing to wait for
                done = True
            else:
                task.add_done_callback(_consume_outcome)
                try:
                    done = await _wait_own_time(task, clock, timeout)
                except asyncio.CancelledError:
                    task.cancel()
                    raise
            if target.event_loop == "shared":
                _report_stall(call, context, started, timeout)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=_CANCEL_GRACE_S)
                _log(call, context).warning("tool_timed_out", timeout_s=timeout)
                return self._failure(call, "timeout", f"{call.name} did not finish within {timeout:g} s", started)
            settled = self._settle(call, context, started, task.result)
        if isinstance(settled, Observation):
            return settled
        result = settled.value
        images: tuple[str, ...] = ()
        if isinstance(result, ToolOutput):
            if result.images:  # reading and encoding images is blocking work: off the caller's loop
                try:
                    images = await asyncio.to_thread(check_tool_images, result.images, self.image_limits)
                except ValueError as e:
                    _log(call, context).info("tool_image_refused", error=_short(str(e)))
                    return self._failure(call, "invalid_image", _short(str(e)), started)
            result = result.text
        try:
            text = render_result(result)
        except Exception as e:
            message = f"the result ({type(result).__name__}) could not be serialized: {e}"
            return self._failure(call, "tool_error", _short(message), started)
        limit = target.max_output_chars if target.max_output_chars is not None else self.max_output_chars
        text, cut = truncate(text, limit)
        elapsed = time.perf_counter() - started
        if target.event_loop == "isolated":  # a call on this loop is the hot path: its time is on the observation
            _log(call, context).debug("tool_succeeded", elapsed_s=round(elapsed, 4), truncated=cut)
        return Observation(
            tool_call_id=call.id,
            name=call.name,
            content=text,
            ok=True,
            code="output_truncated" if cut else None,
            elapsed_s=elapsed,
            images=images,
        )

    def _settle(
        self, call: ToolCall, context: ToolContext, started: float, outcome: Callable[[], object]
    ) -> _Result | Observation:
        """The call's result (`outcome()` gives it or raises what the tool raised), or the failure it makes."""
        try:
            return _Result(outcome())
        except ToolError as e:
            _log(call, context).info("tool_failed", code=e.code, error=_short(e.message))
            return self._failure(call, e.code, _short(e.message), started, hint=e.hint)
        except ThreadLimitError as e:
            _log(call, context).warning("tool_unavailable", error=str(e))
            message = _short(f"{call.name} was not started: {e}")
            return self._failure(call, "tool_unavailable", message, started, hint=_UNAVAILABLE_HINT)
        except ContainedBaseException as e:
            _log(call, context).warning(
                "tool_raised_base_exception", error_type=type(e.original).__name__, error=_short(str(e))
            )
            if isinstance(e.original, asyncio.CancelledError):
                return self._failure(call, "tool_error", f"{call.name} was cancelled", started)
            return self._failure(call, "tool_error", _short(str(e)), started)
        except asyncio.CancelledError:
            return self._failure(call, "tool_error", f"{call.name} was cancelled", started)
        except Exception as e:
            _log(call, context).warning("tool_raised", error_type=type(e).__name__, error=_short(str(e)))
            return self._failure(call, "tool_error", _short(f"{type(e).__name__}: {e}"), started)

    def _unknown(self, call: ToolCall) -> Observation:
        names = list(self._tools)
        close = difflib.get_close_matches(call.name, names, n=1)
        hint = f"Call one of: {', '.join(names)}." if names else "No tools are available; answer directly."
        if close:
            hint = f"Did you mean {close[0]!r}? " + hint
        return self._failure(call, "unknown_tool", f"there is no tool named {call.name!r}", hint=hint)

    @staticmethod
    def _failure(
        call: ToolCall, code: ObservationCode, message: str, started: float | None = None, *, hint: str | None = None
    ) -> Observation:
        """The answer to `call` when it fails or is refused; `started` (its `perf_counter` start) where it ran."""
        return Observation.failure(
            tool_call_id=call.id,
            name=call.name,
            code=code,
            message=message,
            hint=hint,
            elapsed_s=0.0 if started is None else time.perf_counter() - started,
        )


class _Result(NamedTuple):
    """A tool's result (whatever it returned, an `Observation` included), told apart from a failure."""

    value: object


def _run_inline(target: ToolBase, arguments: Any, context: ToolContext) -> object:
    """Run an inline tool's call to its end, here: its coroutine must finish without awaiting. A BaseException
    it raises comes out as `ContainedBaseException` (a CancelledError included: nothing can cancel code that
    does not await, so it is the tool's own)."""
    coroutine = target.call(arguments, context)
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value
    except Exception:
        raise
    except BaseException as e:
        raise ContainedBaseException(e) from None
    coroutine.close()
    raise RuntimeError(
        f"{target.name} is an inline tool and awaited something; an inline tool must finish without awaiting "
        "(declare it event_loop='shared' if it has to wait)"
    )


def _for_call(base: ToolContext, call_id: str) -> ToolContext:
    """`base` for one call (`dataclasses.replace` costs tens of microseconds; a plain ToolContext is rebuilt)."""
    if type(base) is ToolContext:
        return ToolContext.of(base.episode_id, base.step, call_id, base.state, base.task)
    return replace(base, call_id=call_id)


def _report_stall(call: ToolCall, context: ToolContext, started: float, timeout: float) -> None:
    """Log a call that ran on the caller's loop (shared or inline) and came back well past its timeout: nothing
    could interrupt it, and every episode on the loop waited for it."""
    overrun = time.perf_counter() - started - timeout
    if overrun > _STALL_REPORT_S:
        _log(call, context).warning(
            "tool_stalled_the_event_loop",
            overrun_s=round(overrun, 3),
            timeout_s=timeout,
            advice="a tool on the caller's loop must not block; isolated tools cannot stall the loop",
        )


def _log(call: ToolCall, context: ToolContext) -> Any:
    """The logger bound to one call, built only when something is logged (a bind costs microseconds)."""
    return logger.bind(tool=call.name, call_id=call.id, episode_id=context.episode_id, step=context.step)


def _arguments_hint(target: ToolBase) -> str:
    properties = target.parameters.get("properties", {})
    required = set(target.parameters.get("required", []))
    if not properties:
        return f"{target.name} takes no arguments."
    parts = []
    for name, prop in properties.items():
        kind = prop.get("type", "value") if isinstance(prop, dict) else "value"
        parts.append(f"{name} ({kind}{', required' if name in required else ''})")
    return f"{target.name} takes: {', '.join(parts)}."


def _budget_of(target: ToolBase) -> ThreadBudget | None:
    """The tool's own thread budget (its hung calls), shared by every runner that runs this tool object."""
    if target.max_hung_calls is None:
        return None
    try:
        budget = _tool_budgets.get(target)
        if budget is None:
            budget = _tool_budgets[target] = ThreadBudget(f"tool {target.name!r}")
    except TypeError:  # unhashable or not weak-referenceable: the tool object lives as long as its runners
        budget = _budgets_by_id.setdefault(id(target), ThreadBudget(f"tool {target.name!r}"))
    budget.max_hung = target.max_hung_calls
    return budget


async def _invoke(target: ToolBase, arguments: Any, context: ToolContext, clock: WorkClock) -> object:
    """Run one call where the tool says (its own loop and thread, or this loop), with its thread budget.
    `clock` learns when the tool's own code started and finished: on its thread for an isolated tool, here for a
    shared one (whose threads, if it starts any, are its own business). A BaseException the tool raises comes out
    as `ContainedBaseException`, except the cancellation of this call itself, which propagates."""
    budget = _budget_of(target)
    scope = thread_budget(budget) if budget is not None else contextlib.nullcontext()
    if target.event_loop != "shared":
        with scope, timed(clock):
            return await run_coroutine_in_thread(
                lambda: _contained(lambda: target.call(arguments, context)), name=f"tool-{target.name}"
            )
    # The hot path (the calculator): one coroutine, no thread, no nested awaits of the runner's own.
    clock.started = time.monotonic()
    try:
        with scope:
            return await target.call(arguments, context)
    except Exception:
        raise
    except BaseException as e:
        _raise_contained(e)
    finally:
        clock.finished = True


async def _wait_own_time(task: asyncio.Task[object], clock: WorkClock, timeout: float) -> bool:
    """Wait for `task` until the tool has run `timeout` s of its own time; True when it is done.

    Time spent before the tool's code starts (its thread waiting for the GIL, a burst of threads starting) does
    not count, up to `timeout` more; an outcome already posted to this loop when the deadline comes is taken,
    not thrown away as a timeout (a loop busy past the deadline runs the timer and the delivery together)."""
    cap = time.monotonic() + 2 * timeout
    delivering = False
    while True:
        now = time.monotonic()
        if clock.finished:
            if delivering:
                return False  # posted, yet not delivered within the grace: the loop is gone or wedged
            delivering, wait_s = True, _CANCEL_GRACE_S
        else:
            wait_s = min((clock.started if clock.started is not None else now) + timeout, cap) - now
            if wait_s <= 0:
                return False
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if done:
            return True


async def _contained(start: Callable[[], Awaitable[object]]) -> object:
    """Await the tool (on its own loop); a BaseException it raises comes out as `_raise_contained` says."""
    try:
        return await start()
    except Exception:
        raise
    except BaseException as e:
        _raise_contained(e)


def _raise_contained(error: BaseException) -> NoReturn:
    """Raise what a tool's BaseException becomes: the cancellation of the call itself stays what it is (it must
    propagate); any other, a stray CancelledError included, is wrapped in `ContainedBaseException`."""
    if isinstance(error, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise error
    raise ContainedBaseException(error) from None


def _consume_outcome(task: asyncio.Task[object]) -> None:
    """Mark an abandoned task's exception as seen, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
