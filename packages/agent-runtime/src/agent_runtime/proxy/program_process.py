"""`run_program_process`: one episode of a command-line agent program (`AgentProgram.command`), a process started
for the episode, reaching its endpoint through the gateway; whatever it does becomes an outcome, never an
exception of the caller's.

    (answer, code, message), reward = await run_program_process(program, command, endpoint, task, gateway=gateway)

The process gets its session's ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` in its environment
(added to `ProgramCommand.env`, or to this process's), with ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` for
the same session (an `anthropic` client appends ``/v1/messages`` to its base URL), the task as one JSON object on
its stdin (``{"prompt", "row", "model"}``, then stdin is closed), and runs in a session and process group of its own
(``start_new_session``), so that everything it starts can be stopped with it. Its answer is the last non-empty
line of its stdout (None if it printed nothing), unless it posted one to its session's ``/end`` first.

What the caller gets (answer, code, message), as `run_program_thread` gives it for a function program:

- the answer, no code: it exited with status 0, or posted ``/end`` (it is then stopped as below);
- ``program_error``: it exited with another status or was killed by a signal (the message ends with the last
  500 characters of its stderr), it wrote more than `ProgramCommand.max_output_bytes` to its stdout (read no
  further: it is stopped), or it could not be started (no such file, not executable) or sent its task;
- ``program_timeout``: it ran past `timeout_s`;
- the endpoint's code (``too_many_requests``, ``too_many_conversations``) when the endpoint ended the episode first.

Stopping: SIGTERM to its process group, SIGKILL after `ProgramCommand.kill_grace_s` to whatever is left (so an
episode may overrun its `timeout_s` by that grace), and SIGKILL to the group once the program has exited, for any
child it left behind. Its stderr is drained all along and only its last `max_output_bytes` kept. The reward it
posted (``/reward``) comes back beside the outcome. The caller's cancellation stops the process too.

Without a `gateway` from the rollout worker, the episode starts one of its own for its duration (a loopback port).
At most `AgentProgram.max_concurrent` episodes of one program run at once on one loop (`program_thread.gate`).
This module knows processes, the gateway and the endpoint's end; nothing about records or rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any, Final

import msgspec

from agent_runtime.agent_program import AgentProgram, ProgramCommand, ProgramTask
from agent_runtime.proxy.endpoint import EpisodeEndpoint
from agent_runtime.proxy.gateway import Gateway, GatewaySession
from agent_runtime.proxy.program_thread import Outcome, describe, gate

__all__ = ["run_program_process"]

_STDERR_TAIL: Final = 500  # characters of stderr quoted in a failure's message
_DRAIN_S: Final = 2.0  # how long the output pipes may stay open after the process is gone (its children killed)
_CHUNK: Final = 1 << 16


async def run_program_process(
    program: AgentProgram,
    command: ProgramCommand,
    endpoint: EpisodeEndpoint,
    task: ProgramTask,
    *,
    gateway: Gateway | None = None,
) -> tuple[Outcome, float | None]:
    """Run `command` once on `task` against `endpoint` (see the module docstring)."""
    async with gate(program), contextlib.AsyncExitStack() as stack:
        if gateway is None:
            gateway = await stack.enter_async_context(Gateway())
        session = gateway.open(endpoint)
        stack.callback(gateway.close, session)
        try:
            async with asyncio.timeout(program.timeout_s) as deadline:
                outcome = await _run(command, session, task)
        except TimeoutError as e:
            if not deadline.expired():
                outcome = None, "program_error", describe(e)
            else:
                outcome = None, "program_timeout", f"the program ran past its {program.timeout_s} s budget"
        return outcome, session.reward


async def _run(command: ProgramCommand, session: GatewaySession, task: ProgramTask) -> Outcome:
    try:
        payload = msgspec.json.encode(task) + b"\n"
    except (TypeError, ValueError, OverflowError) as e:  # a row value JSON cannot hold
        return None, "program_error", f"the task cannot be sent to the command as JSON: {describe(e)}"
    env = dict(os.environ if command.env is None else command.env)
    env.update(OPENAI_BASE_URL=session.base_url, OPENAI_API_KEY=session.key, OPENAI_MODEL=task.model)
    # the same session for the anthropic SDK, which adds /v1/messages to its base URL itself
    env.update(ANTHROPIC_BASE_URL=session.base_url.removesuffix("/v1"), ANTHROPIC_API_KEY=session.key)
    try:
        process = await asyncio.create_subprocess_exec(
            *command.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=command.cwd, start_new_session=True,
        )  # fmt: skip
    except (OSError, ValueError) as e:
        return None, "program_error", f"the command {command.argv[0]!r} could not be started: {describe(e)}"
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None  # PIPE
    feeding = asyncio.ensure_future(_feed(process.stdin, payload))
    out = asyncio.ensure_future(_read_capped(process.stdout, command.max_output_bytes))
    err = asyncio.ensure_future(_tail(process.stderr, command.max_output_bytes))
    leader = _exit_of(process)
    endpoint = session.endpoint
    try:
        await asyncio.wait((out, leader, endpoint.ended, session.finished), return_when=asyncio.FIRST_COMPLETED)
        if endpoint.ended.done() and not endpoint.ended.cancelled():
            code, message = endpoint.ended.result()
            return None, code, message
        if session.finished.done() and not session.finished.cancelled():
            return session.finished.result(), None, ""
        if out.done() and out.result()[1]:
            message = f"the command wrote more than {command.max_output_bytes} bytes to its stdout"
            return None, "program_error", f"{message} (ProgramCommand.max_output_bytes)"
        await leader
        _kill_group(process.pid)  # whatever it left running would hold its pipes open
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DRAIN_S):
                await asyncio.wait((out, err))
                await process.wait()  # reaped: its status is known
        if process.returncode != 0:
            how = (
                f"was killed by signal {-process.returncode}" if process.returncode and process.returncode < 0
                else f"exited with status {process.returncode}"
            )  # fmt: skip
            tail = _text(err.result() if err.done() and not err.cancelled() else b"")[-_STDERR_TAIL:]
            return None, "program_error", f"the command {how}; its stderr ends with: {tail!r}"
        if endpoint.ended.done() and not endpoint.ended.cancelled():  # a cap ended it as it exited
            code, message = endpoint.ended.result()
            return None, code, message
        stdout = out.result()[0] if out.done() and not out.cancelled() else b""
        return _last_line(stdout), None, ""
    finally:
        await _stop(process, leader, command.kill_grace_s)
        await _close(process, leader, feeding, out, err)


def _exit_of(process: Any) -> asyncio.Future[None]:
    """Done when the process itself exits: not `Process.wait`, which also waits for its pipes to close (and a
    child it left behind may hold them). A pidfd on the loop; a poll where there is none."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or already gone (reaped)
        return asyncio.ensure_future(_poll_exit(process))

    held = [fd]

    def release(_: object = None) -> None:  # once: on exit, or when the caller cancels the wait
        while held:
            loop.remove_reader(held[0])
            os.close(held.pop())

    def exited() -> None:
        release()
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, exited)
    done.add_done_callback(release)
    return done


async def _poll_exit(process: Any) -> None:
    while process.returncode is None:
        await asyncio.sleep(0.1)


async def _feed(stdin: asyncio.StreamWriter, payload: bytes) -> None:
    """The task on stdin, then EOF; a program that does not read it (or exits first) is no failure."""
    with contextlib.suppress(ConnectionError, OSError):
        stdin.write(payload)
        await stdin.drain()
        stdin.close()
        await stdin.wait_closed()


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Up to `cap` bytes until EOF; (bytes, True) as soon as there are more."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(_CHUNK):
        size += len(chunk)
        if size > cap:
            return b"", True
        chunks.append(chunk)
    return b"".join(chunks), False


async def _tail(stream: asyncio.StreamReader, cap: int) -> bytes:
    """Everything until EOF, keeping the last `cap` bytes only."""
    kept = b""
    while chunk := await stream.read(_CHUNK):
        kept = (kept + chunk)[-cap:]
    return kept


async def _stop(process: Any, leader: asyncio.Future[None], grace_s: float) -> None:
    """SIGTERM to the group, SIGKILL after `grace_s` (at once when the leader is gone: its children are left)."""
    if not leader.done():
        _signal_group(process.pid, signal.SIGTERM)
        await asyncio.wait((leader,), timeout=grace_s)
    _kill_group(process.pid)
    if not leader.done():
        with contextlib.suppress(ProcessLookupError):
            process.kill()  # the leader, should it have left its group (setsid of its own)
        await asyncio.wait((leader,), timeout=_DRAIN_S)


async def _close(
    process: Any, leader: asyncio.Future[None], feeding: asyncio.Future[None], *readers: asyncio.Future[Any]
) -> None:
    """Read the pipes of the stopped process to their end (so that its transport closes on this loop, not at
    garbage collection after the loop is gone), then cancel whatever is left."""
    leader.cancel()  # gives its pidfd back if the process never said it exited
    feeding.cancel()
    out = readers[0]
    if out.done() and not out.cancelled() and out.result()[1]:  # cut off: throw away the rest
        readers = (asyncio.ensure_future(_discard(process.stdout)), *readers[1:])
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_DRAIN_S):
            await asyncio.wait(readers)
    for running in (feeding, *readers):
        running.cancel()
    await asyncio.gather(feeding, *readers, return_exceptions=True)


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(_CHUNK):
        pass


def _kill_group(pid: int) -> None:
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pid, sig)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _last_line(stdout: bytes) -> str | None:
    for line in reversed(_text(stdout).splitlines()):
        if line.strip():
            return line.strip()
    return None
