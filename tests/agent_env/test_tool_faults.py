"""Tool faults stay inside the call: a tool that raises anything, blocks its event loop or hangs forever gets
a coded observation, on time, and cannot end the process, stall other calls or pile up threads.

Each fault a test throws at the runner is tallied (`FaultTally`): whether it was contained (the run returned, the
faulty call got the expected code, the call beside it was answered) and, for the hung and blocking tools, the
threads and stalls measured. The module prints the tally at its end and fails if a fault was not contained
(``uv run pytest tests/agent_env/test_tool_faults.py -s``; with ``-k``, the selected tests' faults)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent_env.errors import ToolDefinitionError
from agent_env.observation import Observation
from agent_env.tool import EventLoopMode, FunctionTool, ToolBase, ToolContext, tool
from agent_env.tool_runner import WORKER_THREADS, ToolRunner
from agent_protocol.types import ToolCall

gate = threading.Event()


@dataclass
class FaultTally:
    """The faults thrown at the runner, whether each was contained, and the figures of the hung and blocking
    tools."""

    contained: Tally[str] = field(default_factory=Tally)  # code of each contained fault -> count
    escaped: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)

    def record(self, fault: str, observation: Observation, expected: str, beside: Observation | None = None) -> None:
        if observation.code == expected and (beside is None or beside.ok):
            self.contained[expected] += 1
        else:
            self.escaped.append(f"{fault}: {observation.code}")

    def summary(self) -> str:
        total = self.contained.total() + len(self.escaped)
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(self.contained.items()))
        line = f"tool faults: {self.contained.total()} / {total} contained ({codes}); not contained: {self.escaped}"
        return "\n".join([line, *self.figures] if total else self.figures)


@pytest.fixture(scope="module", autouse=True)
def faults() -> Iterator[FaultTally]:
    """The module's tally, printed (and checked) once its last test ran."""
    tally = FaultTally()
    yield tally
    print(f"\n{tally.summary()}")
    assert not tally.escaped, tally.summary()


@pytest.fixture(autouse=True)
def _open_the_gate() -> Iterator[None]:
    gate.clear()
    yield
    gate.set()  # every blocked or hung tool thread of the test finishes now, and frees its slots
    deadline = time.monotonic() + 5
    while any(t.name.startswith("tool-") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)


class Custom(BaseException):
    """A BaseException that is none of Python's own."""


RAISED: dict[str, Callable[[], BaseException]] = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "Custom": lambda: Custom("custom base exception"),
}


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def raiser(kind: str, *, asynchronous: bool, event_loop: EventLoopMode | None = None) -> FunctionTool:
    async def raise_async() -> str:
        raise RAISED[kind]()

    def raise_sync() -> str:
        raise RAISED[kind]()

    return FunctionTool(raise_async if asynchronous else raise_sync, name="boom", event_loop=event_loop)


def call(name: str, call_id: str = "c1", **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def run_guarded(coroutine: Coroutine[Any, Any, list[Observation]]) -> list[Observation]:
    """Run the runner; a BaseException that gets out fails the test instead of ending pytest."""
    try:
        return asyncio.run(coroutine)
    except BaseException as e:  # the point of the test
        pytest.fail(f"{type(e).__name__} escaped the tool runner: {e!r}")


def message_of(observation: Observation) -> str:
    text: str = json.loads(observation.content)["error"]["message"]
    return text


@pytest.mark.parametrize("kind", sorted(RAISED))
@pytest.mark.parametrize("event_loop", ["isolated", "shared", "inline"])
def test_an_async_tool_that_raises_a_base_exception_is_a_tool_error(
    kind: str, event_loop: EventLoopMode, faults: FaultTally
) -> None:
    runner = ToolRunner([raiser(kind, asynchronous=True, event_loop=event_loop), add])
    boom, after = run_guarded(runner.run([call("boom"), call("add", "c2", a=1, b=2)]))
    faults.record(f"async {kind} ({event_loop})", boom, "tool_error", after)
    assert boom.code == "tool_error" and message_of(boom).startswith(f"{kind}")
    assert after.ok and after.content == "3"


@pytest.mark.parametrize("kind", sorted(RAISED))
@pytest.mark.parametrize("event_loop", [None, "inline"])
def test_a_sync_tool_that_raises_a_base_exception_is_a_tool_error(
    kind: str, event_loop: EventLoopMode | None, faults: FaultTally
) -> None:
    runner = ToolRunner([raiser(kind, asynchronous=False, event_loop=event_loop), add])
    boom, after = run_guarded(runner.run([call("boom"), call("add", "c2", a=1, b=2)]))
    faults.record(f"sync {kind} ({event_loop or 'thread'})", boom, "tool_error", after)
    assert boom.code == "tool_error" and message_of(boom).startswith(f"{kind}")
    assert after.ok and after.content == "3"


def test_a_tool_that_raises_cancelled_error_itself_is_a_tool_error(faults: FaultTally) -> None:
    async def fn() -> str:
        raise asyncio.CancelledError

    modes: tuple[EventLoopMode, ...] = ("isolated", "shared", "inline")
    for event_loop in modes:
        runner = ToolRunner([FunctionTool(fn, name="quit", event_loop=event_loop)])
        [observation] = run_guarded(runner.run([call("quit")]))
        faults.record(f"self-cancel ({event_loop})", observation, "tool_error")
        assert observation.code == "tool_error" and "cancelled" in message_of(observation)


@pytest.mark.parametrize("event_loop", ["isolated", "shared"])
def test_cancelling_the_caller_still_cancels_the_tool(event_loop: EventLoopMode) -> None:
    cleaned_up = threading.Event()

    async def fn() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned_up.set()
        return "never"

    runner = ToolRunner([FunctionTool(fn, name="wait", event_loop=event_loop)])

    async def main() -> None:
        task = asyncio.create_task(runner.run([call("wait")]))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cleaned_up.wait(2)


# An async tool that blocks instead of awaiting: on a shared loop it would freeze every other episode.
@tool(timeout_s=0.3)
async def stuck() -> str:
    """Block the thread that runs this coroutine."""
    gate.wait(3)
    return "unstuck"


@tool(timeout_s=0.3)
async def spin() -> str:
    """Burn CPU without awaiting."""
    deadline = time.monotonic() + 3
    while not gate.is_set() and time.monotonic() < deadline:
        pass
    return "done spinning"


async def heartbeat(gaps: list[float], stop: asyncio.Event) -> None:
    """Tick every 10 ms on the caller's loop and record the longest gap between ticks."""
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


@pytest.mark.parametrize("blocking", [stuck, spin], ids=["blocks", "spins"])
def test_a_blocking_async_tool_times_out_on_time_and_the_loop_keeps_running(
    blocking: FunctionTool, faults: FaultTally
) -> None:
    runner = ToolRunner([blocking, add])

    async def main() -> tuple[list[Observation], float, float]:
        gaps: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(heartbeat(gaps, stop))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        observations = await runner.run([call(blocking.name), call("add", "c2", a=2, b=2)])
        elapsed = time.monotonic() - started
        stop.set()
        await ticker
        return observations, elapsed, max(gaps)

    [observation, after], elapsed, longest_gap = asyncio.run(main())
    faults.record(f"async tool that {blocking.name}s", observation, "timeout", after)
    faults.figures.append(f"a blocking async tool ({blocking.name}): answered in {elapsed:.2f} s at its 0.3 s "
                          f"timeout; the caller's loop stalled at most {longest_gap:.3f} s")  # fmt: skip
    assert observation.code == "timeout" and after.content == "4"
    assert elapsed < 1.2, f"the 0.3 s timeout came after {elapsed:.2f} s"
    assert longest_gap < 0.5, f"the caller's loop stalled for {longest_gap:.2f} s"


def test_a_blocked_loop_is_detected_and_logged() -> None:
    runner = ToolRunner([stuck])

    async def main() -> list[Observation]:
        observations = await runner.run([call("stuck")])
        await asyncio.sleep(1.5)  # past the grace a cancelled coroutine gets to stop
        return observations

    with capture_logs() as logs:
        [observation] = asyncio.run(main())
    assert observation.code == "timeout"
    [event] = [e for e in logs if e["event"] == "tool_blocked_its_event_loop"]
    assert event["log_level"] == "warning" and event["thread"] == "tool-stuck"


def test_a_shared_loop_tool_runs_on_the_callers_loop_and_an_overrun_is_logged() -> None:
    async def on_loop() -> str:
        return "same" if asyncio.get_running_loop() is caller_loop else "other"

    async def block() -> str:
        time.sleep(0.5)  # blocks the caller's loop: nothing can stop it, but it is reported
        return "late"

    shared = ToolRunner(
        [
            FunctionTool(on_loop, name="where", event_loop="shared"),
            FunctionTool(block, name="block", event_loop="shared", timeout_s=0.1),
        ]
    )
    isolated = ToolRunner([FunctionTool(on_loop, name="where")])

    async def main() -> list[Observation]:
        global caller_loop
        caller_loop = asyncio.get_running_loop()
        return [*await shared.run([call("where"), call("block", "c2")]), *await isolated.run([call("where")])]

    with capture_logs() as logs:
        same, late, other = asyncio.run(main())
    assert same.content == "same" and other.content == "other"
    assert late.content == "late"
    [event] = [e for e in logs if e["event"] == "tool_stalled_the_event_loop"]
    assert event["tool"] == "block" and event["overrun_s"] >= 0.3


caller_loop: asyncio.AbstractEventLoop | None = None


@tool(timeout_s=0.2)
async def quick() -> str:
    """Finish well inside the timeout, on its own loop."""
    await asyncio.sleep(0.05)
    return "in time"


def test_waiting_for_the_thread_to_start_does_not_count_against_the_timeout(faults: FaultTally) -> None:
    """Many calls at once while another thread keeps the GIL busy, as the hf engine's does in rollouts: each call
    waits for its thread to get going, and only the tool's own time counts."""
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(1000))

    runner = ToolRunner([quick])
    burner = threading.Thread(target=busy, daemon=True)
    burner.start()
    try:

        async def main() -> list[Observation]:
            return await asyncio.gather(*(runner.run_one(call("quick", f"c{i}"), ToolContext()) for i in range(300)))

        started = time.monotonic()
        observations = asyncio.run(main())
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        burner.join()
    codes = [o.code for o in observations if not o.ok]
    timed_out = f"{codes.count('timeout')} / 300 timed out, {len(codes)} failed, in {elapsed:.2f} s"
    faults.figures.append(f"300 calls of a 0.2 s-timeout tool beside a thread that keeps the GIL busy: {timed_out}")
    assert codes == [], f"{len(codes)} of 300 calls failed ({set(codes)}) in {elapsed:.2f} s"


def tool_threads(name: str) -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == f"tool-{name}")


@tool(timeout_s=0.05, max_hung_calls=4)
def hang_forever() -> str:
    """Never return (until the test ends)."""
    gate.wait(30)
    return "released"


@tool(timeout_s=0.05, max_hung_calls=4)
async def block_forever() -> str:
    """Block its loop's thread and never return (until the test ends)."""
    gate.wait(30)
    return "released"


@pytest.mark.parametrize("hung", [hang_forever, block_forever], ids=["sync", "async"])
def test_hung_calls_do_not_pile_up_threads(hung: FunctionTool, faults: FaultTally) -> None:
    runner = ToolRunner([hung])

    async def main() -> tuple[list[Observation], int]:
        answers: list[Observation] = []
        most = 0
        for i in range(200):
            answers.extend(await runner.run([call(hung.name, f"c{i}")]))
            most = max(most, tool_threads(hung.name))
        return answers, most

    started = time.monotonic()
    answers, most = asyncio.run(main())
    codes = [answer.code for answer in answers]
    faults.figures.append(f"200 hung calls one after another ({hung.name}): at most {most} threads alive "
                          f"(max_hung_calls=4); {codes.count('timeout')} timeout, "
                          f"{codes.count('tool_unavailable')} tool_unavailable")  # fmt: skip
    assert time.monotonic() - started < 5
    assert most <= 4, f"{most} threads of {hung.name} were alive at once"
    assert codes == ["timeout"] * 4 + ["tool_unavailable"] * 196
    assert "4 earlier calls" in message_of(answers[-1])


def test_a_hung_thread_that_finishes_frees_its_slot() -> None:
    runner = ToolRunner([hang_forever])

    async def main() -> list[Observation]:
        return await runner.run([call("hang_forever")])

    for _ in range(4):
        assert [o.code for o in asyncio.run(main())] == ["timeout"]
    assert [o.code for o in asyncio.run(main())] == ["tool_unavailable"]
    gate.set()
    deadline = time.monotonic() + 2
    while tool_threads("hang_forever") and time.monotonic() < deadline:
        time.sleep(0.01)
    [observation] = asyncio.run(main())
    assert observation.ok and observation.content == "released"


def test_concurrent_hung_calls_stop_at_the_process_cap(faults: FaultTally) -> None:
    runner = ToolRunner([hang_forever], max_calls_per_step=200)
    limit, WORKER_THREADS.max_live = WORKER_THREADS.max_live, 16
    try:

        async def main() -> tuple[list[Observation], int]:
            task = asyncio.create_task(runner.run([call("hang_forever", f"c{i}") for i in range(200)]))
            most = 0
            while not task.done():
                most = max(most, tool_threads("hang_forever"))
                await asyncio.sleep(0.005)
            return task.result(), most

        started = time.monotonic()
        answers, most = asyncio.run(main())
    finally:
        WORKER_THREADS.max_live = limit
    codes = [answer.code for answer in answers]
    counts = f"{codes.count('timeout')} timeout, {codes.count('tool_unavailable')} tool_unavailable"
    faults.figures.append(
        f"200 hung calls at once under a 16-thread process cap: at most {most} threads alive; {counts}"
    )
    assert time.monotonic() - started < 3
    assert most <= 16
    assert codes.count("timeout") + codes.count("tool_unavailable") == 200
    assert codes.count("timeout") <= 16
    refused = next(answer for answer in answers if answer.code == "tool_unavailable")
    assert "worker threads" in message_of(refused)


@dataclass
class Counter(ToolBase):
    """A dataclass tool: compares by value, so it cannot be a dict key."""

    name: str = "counter"
    calls: int = 0

    async def call(self, arguments: Any, context: ToolContext) -> int:
        self.calls += 1
        return self.calls


def test_an_unhashable_tool_still_gets_its_thread_budget() -> None:
    runner = ToolRunner([Counter()])
    [observation] = asyncio.run(runner.run([call("counter")]))
    assert observation.ok and observation.content == "1"


def test_bad_isolation_settings_are_refused_when_the_runner_is_built() -> None:
    broken = Counter(name="broken")
    broken.max_hung_calls = 0
    with pytest.raises(ToolDefinitionError, match="max_hung_calls must be at least 1"):
        ToolRunner([broken])
    with pytest.raises(ToolDefinitionError, match="event_loop must be"):
        FunctionTool(add.fn, event_loop="main")  # type: ignore[arg-type]


def test_an_inline_tool_runs_in_place_in_the_callers_task_and_thread() -> None:
    """No task, no thread: the call runs inside the caller's own step (the calculator's hot path)."""
    seen: dict[str, object] = {}

    async def where_async() -> str:
        seen["task"], seen["thread"] = asyncio.current_task(), threading.get_ident()
        return "async"

    def where_sync() -> str:
        seen["sync_thread"] = threading.get_ident()
        return "sync"

    runner = ToolRunner(
        [
            FunctionTool(where_async, name="a", event_loop="inline"),
            FunctionTool(where_sync, name="s", event_loop="inline"),
        ]
    )

    async def main() -> tuple[list[Observation], object, int]:
        return await runner.run([call("a")]), asyncio.current_task(), len(asyncio.all_tasks())

    [answer], caller, tasks = asyncio.run(main())
    assert answer.ok and answer.content == "async"
    assert seen["task"] is caller and seen["thread"] == threading.get_ident() and tasks == 1
    [both_a, both_s] = run_guarded(runner.run([call("a"), call("s", "c2")]))
    assert both_a.content == "async" and both_s.content == "sync"
    assert seen["sync_thread"] == threading.get_ident()


def test_an_inline_tool_that_awaits_is_a_tool_error_and_its_coroutine_is_closed(faults: FaultTally) -> None:
    closed = threading.Event()

    async def waits() -> str:
        try:
            await asyncio.sleep(0.01)
        finally:
            closed.set()
        return "never"

    runner = ToolRunner([FunctionTool(waits, name="waits", event_loop="inline"), add])
    with capture_logs() as logs:
        waited, after = run_guarded(runner.run([call("waits"), call("add", "c2", a=2, b=3)]))
    faults.record("inline tool that awaits", waited, "tool_error", after)
    assert waited.code == "tool_error" and "inline tool and awaited" in message_of(waited)
    assert "event_loop='shared'" in message_of(waited)
    assert closed.is_set() and after.ok and after.content == "5"
    assert [e["tool"] for e in logs if e["event"] == "tool_raised"] == ["waits"]


def test_an_inline_tool_past_its_timeout_is_answered_and_reported_not_cut() -> None:
    async def slow() -> str:
        time.sleep(0.4)  # nothing can interrupt code that does not await: it is reported instead
        return "late"

    runner = ToolRunner([FunctionTool(slow, name="slow", event_loop="inline", timeout_s=0.1)])
    with capture_logs() as logs:
        [late] = run_guarded(runner.run([call("slow")]))
    assert late.ok and late.content == "late"
    [event] = [e for e in logs if e["event"] == "tool_stalled_the_event_loop"]
    assert event["tool"] == "slow" and event["overrun_s"] >= 0.2


def test_an_unknown_event_loop_mode_is_refused_with_the_modes() -> None:
    with pytest.raises(ToolDefinitionError, match="isolated, shared, inline"):
        FunctionTool(add.fn, name="x", event_loop="elsewhere")  # type: ignore[arg-type]

    class Odd(ToolBase):
        name = "odd"
        event_loop = "elsewhere"  # type: ignore[assignment]

        async def call(self, arguments: Any, context: ToolContext) -> str:
            return ""

    with pytest.raises(ToolDefinitionError, match="not 'elsewhere'"):
        ToolRunner([Odd()])
