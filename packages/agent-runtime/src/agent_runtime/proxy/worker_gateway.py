"""`WorkerGateway`: the one `Gateway` of a rollout worker, started on the worker's loop the first time a command
program needs it, shared by every episode after, stopped when the worker ends.

    gateways = WorkerGateway()                 # the address from the environment (below), else loopback:0
    gateway = await gateways.get()             # started on the running loop the first time; the same one after
    await run_program(recipe, engine, task, sampling=sampling, gateway=gateway)
    await gateways.aclose()                    # the worker's close: stop listening (the port is closed)

Address (the same for every worker of a process; the port is the system's choice by default, so that the workers
of one machine never collide):

- ``AGENT_GATEWAY_HOST``: where it listens (default ``127.0.0.1``; ``0.0.0.0`` for programs on other machines);
- ``AGENT_GATEWAY_PORT``: the port (default 0, an ephemeral one; a fixed port suits one worker per machine only);
- ``AGENT_GATEWAY_ADVERTISED_HOST``: the host in the sessions' base URLs, as the programs reach this machine
  (default: the listening host, or this machine's address when that is a wildcard).

Arguments given to `WorkerGateway` win over the environment. A gateway lives on one event loop (its endpoints'):
asked on another loop (a caller that runs each phase under its own `asyncio.run`), the holder starts a new one
there and forgets the old, whose loop is gone. A worker that is never closed (OpenRLHF's executor lives as long as
its vLLM actor) stops its gateway at interpreter exit (an `atexit` hook, registered through a weak reference, so
it keeps nothing alive): on its loop if that loop still runs on another thread, else the process's exit closes the
socket.

This module knows the gateway's lifetime and address; nothing about episodes.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import weakref
from typing import Final

import structlog

from agent_runtime.proxy.gateway import Gateway, GatewayError

__all__ = ["GATEWAY_ENV", "WorkerGateway"]

logger = structlog.get_logger(__name__)

GATEWAY_ENV: Final = ("AGENT_GATEWAY_HOST", "AGENT_GATEWAY_PORT", "AGENT_GATEWAY_ADVERTISED_HOST")
_EXIT_STOP_S: Final = 5.0


class WorkerGateway:
    """A rollout worker's gateway, started lazily (see the module docstring). `host`, `port`, `advertised_host`:
    the address (None: the environment's, else loopback and an ephemeral port)."""

    def __init__(self, *, host: str | None = None, port: int | None = None, advertised_host: str | None = None):
        env_port = os.environ.get("AGENT_GATEWAY_PORT", "").strip()
        try:
            self.port = port if port is not None else int(env_port or 0)
        except ValueError:
            raise GatewayError(f"AGENT_GATEWAY_PORT must be a port number, got {env_port!r}") from None
        if not 0 <= self.port <= 65535:
            raise GatewayError(f"the gateway's port must be in 0..65535, got {self.port}")
        self.host = host or os.environ.get("AGENT_GATEWAY_HOST", "").strip() or "127.0.0.1"
        self.advertised_host = advertised_host or os.environ.get("AGENT_GATEWAY_ADVERTISED_HOST", "").strip() or None
        self._gateway: Gateway | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None
        self.started = 0  # how many gateways this worker has started (one per loop it ran on)
        atexit.register(_stop_at_exit, weakref.ref(self))

    @property
    def gateway(self) -> Gateway | None:
        """The running gateway, if one is started."""
        return self._gateway

    async def get(self) -> Gateway:
        """The worker's gateway on the running loop, started the first time it is asked for there."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._starting is None:  # first use, or a new loop: the old one's is gone
            if self._gateway is not None:
                logger.warning("gateway_loop_changed", started=self.started)
            self._gateway, self._loop, self._starting = None, loop, asyncio.Lock()
        async with self._starting:  # concurrent first episodes start one gateway between them
            if self._gateway is None:
                gateway = Gateway(host=self.host, port=self.port, advertised_host=self.advertised_host)
                await gateway.start()
                self._gateway = gateway
                self.started += 1
            return self._gateway

    async def aclose(self) -> None:
        """Stop the gateway (on its loop, the running one); a later `get` starts another."""
        if self._gateway is None:
            return
        if self._loop is not asyncio.get_running_loop():  # kept: its own loop can still stop it
            raise GatewayError("close the worker's gateway on the loop it runs on")
        gateway, self._gateway = self._gateway, None
        await gateway.stop()


def _stop_at_exit(ref: weakref.ReferenceType[WorkerGateway]) -> None:
    """At interpreter exit: stop a gateway nobody closed, if its loop still runs on another thread."""
    holder = ref()
    if holder is None or holder._gateway is None or holder._loop is None:
        return
    loop, gateway = holder._loop, holder._gateway
    if loop.is_closed() or not loop.is_running():
        return  # nothing can run on it any more; the process's exit closes the socket
    try:
        if asyncio.get_running_loop() is loop:
            return  # pragma: no cover - atexit does not run on a running loop's thread
    except RuntimeError:
        pass
    future = asyncio.run_coroutine_threadsafe(gateway.stop(), loop)
    try:
        future.result(timeout=_EXIT_STOP_S)
    except Exception as e:  # exiting (a timeout included): say so, never raise
        logger.warning("gateway_stop_at_exit_failed", error=str(e) or type(e).__name__)
