"""Exceptions of agent-env.

Two kinds live here. *Caller* mistakes raise and stay raised: a tool defined with an untyped parameter, two
tools with one name, stepping an episode that is over, a corpus file that cannot be read. *Episode* failures
are raised only to be caught: a tool raises `ToolError` (or anything else) and the tool runner turns it into
an `Observation`; an `ArgumentError` from validation becomes an `invalid_arguments` observation. Nothing a
model or a tool does escapes `Environment.step`.

This module knows nothing about observations or rewards; it only names the failures.
"""

from __future__ import annotations

from typing import Literal

from agent_env.containment import describe_error

__all__ = [
    "AgentEnvError",
    "ArgumentError",
    "ContainedBaseException",
    "EnvironmentStateError",
    "MCPBridgeError",
    "SearchIndexError",
    "ThreadLimitError",
    "ToolDefinitionError",
    "ToolError",
]


class AgentEnvError(Exception):
    """Base class of every error agent-env raises."""


class ToolDefinitionError(AgentEnvError, TypeError):
    """A tool cannot be built from what was given (an untyped parameter, `*args`, a duplicate name...)."""


class ArgumentError(AgentEnvError, ValueError):
    """Arguments a model gave a tool do not match the tool's schema.

    `field` is the argument's path the way the schema names it (``a``, ``filters.year``, or ``""`` for the
    arguments object as a whole); `problem` says why, in words the model can act on.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"argument `{field}`: {problem}" if field else problem)


class ToolError(AgentEnvError):
    """Raised by a tool to report a failure the model should read (division by zero, no such document).

    The tool runner shows `message` and `hint` to the model as-is, under `code`: ``tool_error`` for an
    ordinary failure, ``timeout`` for a limit the tool enforces itself (the python tool's CPU limit).
    """

    def __init__(
        self,
        message: str,
        *,
        code: Literal["tool_error", "timeout"] = "tool_error",
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.code: Literal["tool_error", "timeout"] = code
        self.hint = hint
        super().__init__(message)


class EnvironmentStateError(AgentEnvError, RuntimeError):
    """An environment was driven out of order, e.g. `step()` after the episode ended."""


class SearchIndexError(AgentEnvError, ValueError):
    """A search corpus cannot be read or indexed. The message names the file and line."""


class MCPBridgeError(AgentEnvError):
    """An MCP server could not be started, reached or listed."""


class ContainedBaseException(AgentEnvError):
    """Tool code raised a `BaseException` that is not an `Exception` (SystemExit, KeyboardInterrupt,
    GeneratorExit, a custom one) where it would end the process or the episode; it was caught and is carried
    by this ordinary exception instead. `original` is what was raised. Building it never raises: an original
    whose ``__str__`` raises is named as such (see `describe_error`)."""

    def __init__(self, original: BaseException) -> None:
        self.original = original
        super().__init__(describe_error(original, limit=None))


class ThreadLimitError(AgentEnvError, RuntimeError):
    """A worker thread was not started because a thread budget is full (too many hung calls of one tool, or
    too many worker threads in the process). Nothing ran; the message says which budget and its cap."""
