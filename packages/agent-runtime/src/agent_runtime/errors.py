"""Exceptions of agent-runtime, one per boundary.

Inside an episode these are caught and recorded on the trajectory (`Trajectory.errors`, `stop_reason`); they
reach a caller only from APIs that run one request (an engine's `generate`, `AgentRuntime.run`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

__all__ = [
    "ContextBudgetExceeded",
    "EngineBadOutput",
    "EngineError",
    "EngineErrorCode",
    "EngineTimeout",
    "EngineUnavailable",
    "RuntimeAgentError",
    "SessionStateError",
]

EngineErrorCode = Literal["engine_error", "engine_bad_output", "engine_timeout"]
"""The code an episode records for an engine failure: it failed or could not be reached (`engine_error`), it
answered something that must not be trained on or served (`engine_bad_output`), it ran past its deadline
(`engine_timeout`)."""


class RuntimeAgentError(Exception):
    """Base class of every error agent-runtime raises."""


class EngineError(RuntimeAgentError):
    """A generation failed: the engine raised, answered garbage, or timed out. The message says which engine
    and why; the original exception is chained. `code` is what the episode records."""

    code: ClassVar[EngineErrorCode] = "engine_error"


class EngineUnavailable(EngineError):
    """The engine cannot be reached or is not installed (e.g. the vllm extra is missing, the server is down)."""


class EngineBadOutput(EngineError):
    """The engine answered, but not with a generation that may reach a transcript: ids that are not plain ints
    inside the tokenizer's vocabulary, more ids than `max_tokens`, logprobs that are not finite or not one per
    id, an unknown finish reason, or a body that is not the expected JSON. Not retried: it is data, not luck."""

    code: ClassVar[EngineErrorCode] = "engine_bad_output"


class EngineTimeout(EngineError):
    """The engine gave no complete answer within its overall deadline (every retry and the whole body read
    included). Not a `TimeoutError`, so a caller's own `asyncio.timeout` is never mistaken for it."""

    code: ClassVar[EngineErrorCode] = "engine_timeout"


class ContextBudgetExceeded(RuntimeAgentError):
    """A prompt would not fit the engine's context. Sessions end the episode instead of raising this; an engine
    raises it when called directly with a prompt that is too long."""


class SessionStateError(RuntimeAgentError):
    """A session method was called out of order (step before reset, step after the episode ended)."""
