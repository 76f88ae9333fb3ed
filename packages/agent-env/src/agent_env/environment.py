"""The `Environment` contract: one instance per episode, `reset`, `step(action) -> StepResult`, the tool
manifest, `max_steps` and a step counter.

`step` is a template: it counts the step, calls the member's `transition(action)`, enforces `max_steps`, and
turns an exception escaping `transition` into an ended episode (``stop_reason="environment_error"``), so
nothing a model or a tool does can raise out of `step`. Stepping an episode that is over is a caller bug and
raises `EnvironmentStateError`.

An environment holds one episode's mutable state (its counter, `state` for tools); what is expensive and
read-only (tools, a search index) is built once and passed to each new instance, so concurrent episodes
share nothing mutable.

`StepResult` unpacks as the pair the design talks about: ``observations, done = await env.step(action)``.

This module knows the protocol's `Action` and the observations; it knows nothing about rendering, tokens,
engines or rewards.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, TypedDict

import msgspec
import structlog

from agent_env.errors import EnvironmentStateError
from agent_env.observation import Observation
from agent_env.tool import ToolBase, ToolContext
from agent_env.tool_output import DEFAULT_IMAGE_LIMITS, ImageLimits
from agent_env.tool_runner import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TOOL_TIMEOUT_S, ToolRunner
from agent_protocol import Action, Message, ToolSpec

__all__ = ["Environment", "EnvironmentOptions", "StepResult", "StopReason"]

logger = structlog.get_logger(__name__)

StopReason = Literal["final_answer", "max_steps", "environment_error"]


class StepResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one step gave: the observations to show the model (one per tool call, in call order, then any
    turn-level notice), whether the episode is over, and why.

    `final_answer` is set when the episode ended on an answer. `info` carries member-specific extras for
    logs (e.g. the parse issues of the turn).
    """

    observations: tuple[Observation, ...] = ()
    done: bool = False
    final_answer: str | None = None
    stop_reason: StopReason | None = None
    step: int = 0
    info: dict[str, Any] = msgspec.field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        """``observations, done = result``."""
        yield list(self.observations)
        yield self.done

    def messages(self) -> list[Message]:
        """The observations as tool messages."""
        return [observation.to_message() for observation in self.observations]


class EnvironmentOptions(TypedDict, total=False):
    """`Environment`'s keyword arguments, for a member that adds its own and passes these on unchanged
    (``**options: Unpack[EnvironmentOptions]``). Defaults and meaning: `Environment`."""

    tools: Sequence[ToolBase]
    max_steps: int
    tool_timeout_s: float
    max_output_chars: int
    max_calls_per_step: int
    episode_id: str | None
    image_limits: ImageLimits


class Environment(ABC):
    """Base of every environment. Members implement `transition`; everything else is here.

    Arguments: `tools` (shared, read-only tool objects), `max_steps` (assistant turns allowed; the step that
    reaches it ends the episode), `tool_timeout_s` (default per-tool timeout), `max_output_chars` (default
    output limit per call), `max_calls_per_step` (calls run per turn; the rest are refused), `image_limits` (what
    images a tool may return per call; see `agent_env.tool_output`).
    """

    def __init__(
        self,
        *,
        tools: Sequence[ToolBase] = (),
        max_steps: int = 8,
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_calls_per_step: int = 16,
        episode_id: str | None = None,
        image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
    ) -> None:
        if max_steps <= 0:
            raise ValueError(f"max_steps must be positive, got {max_steps}")
        self.runner = ToolRunner(
            tools,
            default_timeout_s=tool_timeout_s,
            max_output_chars=max_output_chars,
            max_calls_per_step=max_calls_per_step,
            image_limits=image_limits,
        )
        self.max_steps = max_steps
        self.episode_id = episode_id or os.urandom(6).hex()  # 12 random hex digits (uuid4's object is 3x the cost)
        self.step_count = 0
        self.done = False
        self.task: dict[str, Any] = {}
        self.state: dict[str, Any] = {}

    @property
    def tools(self) -> list[ToolSpec]:
        """The tool manifest for the prompt."""
        return self.runner.specs

    async def reset(self, task: Mapping[str, Any] | None = None) -> None:
        """Start the episode over: counter, `done` and `state` cleared; `task` (the dataset row, if any) kept
        for members and tools that need it (tools read it as `ToolContext.task`)."""
        self.step_count = 0
        self.done = False
        self.task = dict(task or {})
        self.state = {}

    async def step(self, action: Action) -> StepResult:
        """Apply one parsed assistant turn. Never raises for anything the model or a tool did."""
        if self.done:
            raise EnvironmentStateError(f"episode {self.episode_id} is over; create a new environment")
        if not isinstance(action, Action):
            raise TypeError(f"step() takes an agent_protocol Action, got {type(action).__name__}")
        self.step_count += 1
        try:
            result = await self.transition(action)
        except Exception as e:
            logger.bind(episode_id=self.episode_id, step=self.step_count).error(
                "environment_step_failed", error_type=type(e).__name__, error=str(e)
            )
            result = StepResult(done=True, stop_reason="environment_error", info={"error": f"{type(e).__name__}: {e}"})
        # One copy per step (the step number, and the max_steps ending); nothing is logged on this path: binding a
        # logger for a filtered-out debug event cost more than the rest of the bookkeeping.
        if not result.done and self.step_count >= self.max_steps:
            result = msgspec.structs.replace(result, done=True, stop_reason="max_steps", step=self.step_count)
        else:
            result = msgspec.structs.replace(result, step=self.step_count)
        self.done = result.done
        return result

    @abstractmethod
    async def transition(self, action: Action) -> StepResult:
        """The member's rule for one turn. `step` has already counted it; return a `StepResult`."""

    def tool_context(self) -> ToolContext:
        """The context tool calls of the current step run with (the episode's own `state`, and its `task`)."""
        return ToolContext.of(self.episode_id, self.step_count, "", self.state, self.task)

    async def run_tools(self, action: Action) -> list[Observation]:
        """Answer every call of `action` (see `ToolRunner.run`)."""
        return await self.runner.run(action.tool_calls, self.tool_context())
