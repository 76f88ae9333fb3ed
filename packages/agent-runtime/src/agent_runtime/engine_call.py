"""`call_engine`: the one boundary around an engine call, used by the runtime (agent mode, rollouts) and by
tools-mode serving alike.

    outcome = await call_engine(engine, request.prompt_ids, sampling, timeout_s=600)
    if isinstance(outcome, EngineFailure):      # the episode or the request ends; nothing else does
        ...outcome.code, outcome.message
    else:
        generation = outcome

Whatever the engine does, the caller gets a `Generation` or an `EngineFailure`: past `timeout_s` (measured by
`agent_env.deadlines.deadline`: up to 1 % late, with no timer per call) it is ``engine_timeout``; an `EngineError`
says its own code (``engine_error``, ``engine_bad_output``, ``engine_timeout``); anything else it raises, any
`BaseException` (`SystemExit`, `GeneratorExit`, its own `CancelledError`...), is ``engine_error``. The caller's
own cancellation and `KeyboardInterrupt` propagate (`agent_env.containment`). Retries belong to the engines that
can retry (the HTTP engine retries what is worth retrying, within its own deadline). A context with images goes to
an engine that takes them (`LLMEngine.accepts_images`), with them; a text-only engine gets no call, and the failure
says why. A generation's policy versions, when the engine tags them, are checked here whatever the engine
(`check_versions`: one per id, ints >= 0, never decreasing), so wrong ones are ``engine_bad_output``.
This module knows engines and codes, not sessions or HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import structlog

from agent_env import deadline
from agent_runtime.boundary import boundary
from agent_runtime.engines.base import Generation, LLMEngine, SamplingParams, check_versions
from agent_runtime.engines.session_key import session_key
from agent_runtime.errors import EngineError, EngineErrorCode

__all__ = ["EngineFailure", "call_engine"]

logger = structlog.get_logger(__name__)


class EngineFailure(msgspec.Struct, frozen=True, kw_only=True):
    """An engine call that gave no generation: the code the episode or request records, and why."""

    code: EngineErrorCode
    message: str


async def call_engine(
    engine: LLMEngine,
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    *,
    timeout_s: float | None,
    images: Sequence[str] = (),
    session: str | None = None,
) -> Generation | EngineFailure:
    """One generation, or the failure that stood in its way (see the module docstring). `images`: the context's
    images, in the order of their pads in `prompt_ids`. `session`: the episode (or conversation) the call belongs
    to, for an engine that keeps its turns on one upstream (`engines/session_key.py`)."""
    if images and not engine.accepts_images:
        message = f"{engine.name} is a text-only engine; the conversation holds {len(images)} image(s)"
        return EngineFailure(code="engine_error", message=message)
    with boundary("engine", limit=None) as failed:  # any engine failure fails this episode or request only
        try:
            with session_key(session):
                async with deadline(timeout_s):  # asyncio.timeout's behaviour, without a timer per call
                    if images:
                        generation = await engine.generate(prompt_ids, sampling, images=images)
                    else:
                        generation = await engine.generate(prompt_ids, sampling)
            if generation.versions is not None:  # whatever engine tagged them: never record a wrong version
                check_versions(engine.name, generation.versions, len(generation.ids))
            return generation
        except TimeoutError:
            logger.warning("engine_timed_out", engine=engine.name, timeout_s=timeout_s)
            return EngineFailure(code="engine_timeout", message=f"{engine.name} did not answer within {timeout_s} s")
    raised = failed.exception
    code: EngineErrorCode = raised.code if isinstance(raised, EngineError) else "engine_error"
    why, error_type = failed.message, type(raised).__name__
    logger.warning("engine_failed", engine=engine.name, code=code, error_type=error_type, error=why[:500])
    return EngineFailure(code=code, message=f"{engine.name} failed: {why}")
