"""`run_program_thread`: one episode's agent program, on a thread and an event loop of its own, under its time
budget and its endpoint's caps; whatever it does becomes an outcome, never an exception of the caller's.

    answer, code, message = await run_program_thread(program, endpoint, task)

Why a thread: a program is foreign code written for the OpenAI API, and nothing stops it from blocking
(``time.sleep``, a synchronous HTTP client, a CPU loop inside ``async def``). On the rollout's loop that would stall
every other episode of the batch and its own timeout with them; on a loop of its own it stalls only itself, its
timeout fires on the rollout's loop at `timeout_s`, and the thread is left to finish on its own (agent-env's
`run_coroutine_in_thread`: counted against the process's cap on hung worker threads, cancelled on its loop as soon
as that loop takes it). Its requests reach the endpoint on the rollout's loop through the hand-off of
`EpisodeEndpoint.client`.

What the caller gets (answer, code, message):

- the program's return value (a str or None), no code;
- ``program_error``: it raised anything at all: an `Exception`, `SystemExit`, `KeyboardInterrupt` or
  `GeneratorExit` raised by its own code (a real Ctrl-C arrives on the main thread, not on the program's), a
  `CancelledError` of its own, a `BaseExceptionGroup` from its own `TaskGroup`, a `BaseException` subclass; or it
  returned something that is not awaitable (an `AgentProgram` is an async function);
- ``program_timeout``: it ran past `timeout_s`;
- the endpoint's code (``too_many_requests``, ``too_many_conversations``) when the endpoint ended the episode
  first; the program is then cancelled;
- ``program_unavailable``: no thread could be started (agent-env's `ThreadLimitError`: the process already holds
  too many threads, or too many programs that never stopped after their timeout).

Only the cancellation of the caller's own task propagates (the program is then cancelled too). The program gets
its own copy of the task: a thread cut off at its timeout may still be running while the episode is recorded.

At most `AgentProgram.max_concurrent` episodes of one program run at once on one rollout loop: the others wait
for a place (`gate`: an `asyncio.Semaphore` per loop and `AgentProgram` object, a command program's too) before
their clock starts. This module knows the endpoint and agent-env's threads; it knows nothing about records or rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import weakref
from typing import Any, Final

from agent_env import ContainedBaseException, ThreadLimitError, describe_error, run_coroutine_in_thread
from agent_runtime.agent_program import AgentProgram, ProgramCode, ProgramCommand, ProgramSync, ProgramTask
from agent_runtime.proxy.endpoint import EpisodeEndpoint

__all__ = ["Outcome", "describe", "gate", "run_program_thread"]

_PREVIEW: Final = 500

Outcome = tuple[Any, ProgramCode | None, str]

_gates: Final[
    weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, tuple[AgentProgram, asyncio.Semaphore]]]
] = weakref.WeakKeyDictionary()


def gate(program: AgentProgram) -> asyncio.Semaphore:
    """The loop's gate for `program`, by identity: an agent may be an unhashable callable (a dataclass instance)."""
    per_loop = _gates.setdefault(asyncio.get_running_loop(), {})
    found = per_loop.get(id(program))
    if found is None or found[0] is not program:
        found = per_loop[id(program)] = (program, asyncio.Semaphore(program.max_concurrent))
    return found[1]


async def run_program_thread(program: AgentProgram, endpoint: EpisodeEndpoint, task: ProgramTask) -> Outcome:
    """Run `program` once on `task` against `endpoint` (see the module docstring)."""
    async with gate(program):
        try:
            async with asyncio.timeout(program.timeout_s) as deadline:
                return await _race(program, endpoint, task)
        except TimeoutError as e:
            if deadline.expired():
                return None, "program_timeout", f"the program ran past its {program.timeout_s} s budget"
            return None, "program_error", describe(e)


async def _race(program: AgentProgram, endpoint: EpisodeEndpoint, task: ProgramTask) -> Outcome:
    """The program's thread against the endpoint's end of the episode; the first one decides."""
    own = ProgramTask(prompt=copy.deepcopy(task.prompt), row=copy.deepcopy(task.row), model=task.model)
    running = run_coroutine_in_thread(lambda: _main(program, endpoint, own), name="agent-program", what="agent_program")
    runner = asyncio.ensure_future(running)
    try:
        await asyncio.wait((runner, endpoint.ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not runner.done():
            runner.cancel()  # returns at once: a blocked program's thread is left to finish (see _threads)
            await asyncio.wait((runner,))
    ran = _result(runner) if not runner.cancelled() else None  # read even when the endpoint's end decides
    if endpoint.ended.done() and not endpoint.ended.cancelled():
        code, message = endpoint.ended.result()
        return None, code, message
    assert ran is not None  # the runner was only cancelled if the endpoint ended the episode
    return ran


def _result(runner: asyncio.Future[Any]) -> Outcome:
    error = runner.exception()
    if error is None:
        return runner.result(), None, ""
    if isinstance(error, ThreadLimitError):
        return None, "program_unavailable", f"the program could not be started: {error}"
    return None, "program_error", describe(error)


async def _main(program: AgentProgram, endpoint: EpisodeEndpoint, task: ProgramTask) -> Any:
    """The program on its own loop, with a client made on that loop (closed there, whatever happens)."""
    agent = program.agent
    if isinstance(agent, ProgramCommand):  # run_program gives those to program_process.py
        raise TypeError("a command program (AgentProgram.command) runs as a process, not on a thread")
    if isinstance(agent, ProgramSync):  # blocking calls on this thread: its loop runs nothing else
        sync_client = endpoint.sync_client()
        try:
            return agent.function(sync_client, task)
        finally:
            with contextlib.suppress(Exception):
                sync_client.close()
    client = endpoint.client()
    try:
        running = agent(client, task)
        if not inspect.isawaitable(running):
            raise TypeError(
                f"the program returned a {type(running).__name__}, not an awaitable: AgentProgram.agent must be "
                "an async function"
            )
        return await running
    finally:
        with contextlib.suppress(Exception):  # closing is best effort: the program's outcome is already decided
            await client.close()


def describe(error: BaseException, *, depth: int = 0) -> str:
    """``Type: message`` of what the program raised (`describe_error`, which never raises; a contained
    `BaseException` by its own type; a group with the types and messages of the first few it holds, two levels
    deep), cut to 500 characters."""
    if isinstance(error, ContainedBaseException):
        error = error.original
    text = describe_error(error, limit=_PREVIEW)
    if isinstance(error, BaseExceptionGroup) and depth < 2:
        text += " [" + "; ".join(describe(inner, depth=depth + 1) for inner in error.exceptions[:4]) + "]"
    return text[:_PREVIEW]
