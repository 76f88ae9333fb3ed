"""`EngineVersions`: the weight version of OpenRLHF's vLLM rollout actor, and the version that sampled each token.

The rollout actor is OpenRLHF 0.11.2's `RolloutRayActor` (openrlhf/trainer/ray/vllm_engine.py); the executor runs
inside it and gets it as ``llm_engine``, and its vLLM `AsyncLLM` is ``llm_engine.llm``. `EngineVersions.of` installs
itself once per actor on that `AsyncLLM` object (instance attributes, nothing in OpenRLHF's or vLLM's classes), over
the three calls every weight sync and every generation of the actor go through:

- **the version** (`version`) counts the weight syncs this actor has loaded since the executor first ran in it (0:
  the weights it held then, the pretrained model on a fresh run). OpenRLHF's trainer broadcasts a sync as one
  ``update_weight`` (or ``update_weight_cuda_ipc``) per parameter, the last one with ``empty_cache=True``; each is
  ``await self.llm.collective_rpc(...)``, which returns once vLLM's workers have run it, so when the last one
  returns the new weights are loaded. Then, and only then, the version is bumped.
- **each token's version**: ``llm.generate`` (which OpenRLHF's ``RolloutRayActor.generate`` iterates to its last
  output) is tapped; each streamed `RequestOutput` carries the request's ids so far (vLLM's cumulative outputs),
  and the ids new since the previous chunk get the version current when the chunk is read. The last output carries
  the list as `VERSIONS_ATTRIBUTE`, one version per id, which `OpenRLHFEngine` reads into `Generation.versions`.

Why no chunk is misattributed. Tokens are sampled only while the engine steps. Without partial rollouts OpenRLHF
never samples during a sync (hybrid mode sleeps vLLM; async mode holds its `VLLMLock` over a whole batch). With
``--train.partial_rollout_enable`` it calls ``pause_generation(mode="keep")`` before the sync and
``resume_generation`` after it: vLLM's engine core then stops stepping (``PAUSED_ALL``) and completes the pause
only when it is idle and has written every output it produced to its output socket, before the pause's own reply;
the client reads that socket in order, so when the pause returns every token sampled with the old weights is in
the client's outputs queue or beyond, and no token is sampled until the resume, which comes after the sync. A
chunk could still be read late: the output handler may not have moved it into its request's collector yet, or the
generate loop may not have taken it. So before bumping, `_drain` waits until the outputs queue is empty with the
output handler waiting on it, and every request's collector has been taken (vLLM's generate loop yields what it
takes without an await in between, and the tap tags it before yielding it on); then every token read so far was
sampled with the old weights, and every token read from now on is sampled after the resume, with the new ones. A
drain that does not finish in `DRAIN_TIMEOUT_S` is logged and recorded (``drained: false``) and the version is
bumped anyway. With ``--device cpu`` each bump is recorded in the run's checks (`cpu_checks`, kind ``version``)
with the number of requests that had sampled part of their tokens when generation paused (a turn paused mid-way).

What it does not know: a sync broadcast before the executor first ran in this actor (OpenRLHF's resume from a
checkpoint broadcasts before any rollout) is the actor's version 0; vLLM internals this reads (`engine_core`'s
`outputs_queue`, `output_handler`, `output_processor.request_states`) are those of vLLM 0.29, and an actor without
them (a test's stand-in, another engine) gets no versions (`of` returns None). This module imports neither vLLM
nor OpenRLHF.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import structlog

from agent_train.openrlhf import cpu_checks

__all__ = ["DRAIN_TIMEOUT_S", "SYNC_METHODS", "VERSIONS_ATTRIBUTE", "EngineVersions", "output_versions"]

logger = structlog.get_logger(__name__)

VERSIONS_ATTRIBUTE: Final = "agent_policy_versions"
"""The attribute of a tapped `RequestOutput` holding one weight version per generated id."""
SYNC_METHODS: Final = frozenset({"update_weight", "update_weight_cuda_ipc"})
"""The worker methods OpenRLHF's sync calls once per parameter; ``empty_cache=True`` (the last argument) ends a sync."""
DRAIN_TIMEOUT_S: Final = 30.0
_ATTACHED: Final = "_agent_engine_versions"


class EngineVersions:
    """The version counter and the generate tap of one vLLM `AsyncLLM` (see the module docstring)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.version = 0
        self.syncs_loaded = 0
        self._live: dict[int, int] = {}  # a live request's stream -> ids it has tagged so far
        self._real_generate: Callable[..., Any] = llm.generate
        self._real_rpc: Callable[..., Any] = llm.collective_rpc
        llm.generate = self._generate
        llm.collective_rpc = self._collective_rpc

    @classmethod
    def of(cls, rollout_actor: Any) -> EngineVersions | None:
        """The tracker of OpenRLHF's rollout actor, installed on its ``llm`` the first time; None when the actor
        has no vLLM `AsyncLLM` to track (a stand-in that only has ``generate``)."""
        llm = getattr(rollout_actor, "llm", None)
        if llm is None:
            return None
        attached = getattr(llm, _ATTACHED, None)
        if isinstance(attached, EngineVersions):
            return attached
        if not all(hasattr(llm, name) for name in ("generate", "collective_rpc", "engine_core", "output_processor")):
            return None
        tracker = cls(llm)
        setattr(llm, _ATTACHED, tracker)
        logger.info("engine_versions_installed")
        return tracker

    # ── generation ──

    def _generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._tap(self._real_generate(*args, **kwargs))

    async def _tap(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        key = id(stream)
        self._live[key] = 0
        versions: list[int] = []
        try:
            async for output in stream:
                completions = getattr(output, "outputs", None) or []
                count = len(completions[0].token_ids) if completions else 0
                if count > len(versions):
                    versions.extend([self.version] * (count - len(versions)))
                self._live[key] = len(versions)
                # the list itself, not a copy per chunk: the last output's is the whole generation's
                setattr(output, VERSIONS_ATTRIBUTE, versions)
                yield output
        finally:
            self._live.pop(key, None)

    # ── weight syncs ──

    async def _collective_rpc(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        result = await self._real_rpc(method, *args, **kwargs)
        if method in SYNC_METHODS and _ends_sync(args, kwargs):
            started = time.monotonic()
            drained = await self._drain()
            paused = sum(1 for tagged in self._live.values() if tagged)  # unfinished, part of their ids sampled
            self.version += 1
            self.syncs_loaded += 1
            waited = time.monotonic() - started
            if not drained:
                logger.error("engine_versions_drain_timeout", version=self.version, waited_s=round(waited, 3))
            cpu_checks.record(
                "version", version=self.version, live=len(self._live), paused_mid_turn=paused, drained=drained,
                drain_s=round(waited, 4),
            )  # fmt: skip
        return result

    def _settled(self) -> bool:
        """Every output vLLM's engine has sent is in its request's collector and taken by the generate loop."""
        core = self.llm.engine_core
        queue = getattr(core, "outputs_queue", None)
        handler = getattr(self.llm, "output_handler", None)
        working = queue is not None and (not queue.empty() or not getattr(queue, "_getters", None))
        if working and handler is not None and not handler.done():  # not yet waiting on an empty queue
            return False
        states = getattr(self.llm.output_processor, "request_states", {})
        return all(getattr(getattr(state, "queue", None), "output", None) is None for state in states.values())

    async def _drain(self) -> bool:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not self._settled():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0)
        return True


def _ends_sync(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a sync call's arguments mark the last parameter: ``collective_rpc(method, args=(..., empty_cache))``,
    as OpenRLHF's `RolloutRayActor.update_weight` / ``update_weight_cuda_ipc`` pass them."""
    call_args = kwargs.get("args", args[0] if args else ())
    return bool(call_args) and call_args[-1] is True


def output_versions(output: Any) -> list[int] | None:
    """The versions a tapped `RequestOutput` carries (None when it was not tapped)."""
    versions = getattr(output, VERSIONS_ATTRIBUTE, None)
    return list(versions) if isinstance(versions, list) else None
