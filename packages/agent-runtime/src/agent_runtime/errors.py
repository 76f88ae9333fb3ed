"""Exceptions of agent-runtime, one per boundary.

Inside an episode these are caught and recorded on the trajectory (`Trajectory.errors`, `stop_reason`); they
reach a caller only from APIs that run one request (an engine's `generate`, `AgentRuntime.run`).
"""

from __future__ import annotations

__all__ = ["ContextBudgetExceeded", "EngineError", "EngineUnavailable", "RuntimeAgentError", "SessionStateError"]


class RuntimeAgentError(Exception):
    """Base class of every error agent-runtime raises."""


class EngineError(RuntimeAgentError):
    """A generation failed: the engine raised, answered garbage, or timed out. The message says which engine
    and why; the original exception is chained."""


class EngineUnavailable(EngineError):
    """The engine cannot be reached or is not installed (e.g. the vllm extra is missing, the server is down)."""


class ContextBudgetExceeded(RuntimeAgentError):
    """A prompt would not fit the engine's context. Sessions end the episode instead of raising this; an engine
    raises it when called directly with a prompt that is too long."""


class SessionStateError(RuntimeAgentError):
    """A session method was called out of order (step before reset, step after the episode ended)."""
