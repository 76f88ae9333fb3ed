"""Held-out evaluation: greedy episodes of the recipe against an engine, summarized as success rate and friends.

    result = await evaluate(engine, recipe, rows)      # AgentRuntime, temperature 0
    result.success                                     # fraction of episodes with reward >= 1

Evaluation runs the agent the way `apps/serve` does (an `AgentRuntime` over the recipe's session), so the number
is what a user of the served model would see. All episodes are started at once; the engine batches them. This
module knows runtimes and trajectories; it knows nothing about training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import msgspec.structs

from agent_runtime import AgentRuntime, LLMEngine, Recipe, Trajectory

__all__ = ["EvalResult", "evaluate", "summarize"]


class EvalResult(msgspec.Struct, frozen=True, kw_only=True):
    """Held-out figures: `success` (reward >= 1), mean reward, and how episodes went (tool use, answers)."""

    episodes: int
    success: float
    mean_reward: float
    tool_call_rate: float  # fraction of episodes with at least one tool call
    answer_rate: float  # fraction of episodes that ended with a final answer
    mean_turns: float
    mean_completion_tokens: float


def summarize(trajectories: Sequence[Trajectory]) -> EvalResult:
    n = len(trajectories)
    if n == 0:
        raise ValueError("cannot summarize zero episodes")
    return EvalResult(
        episodes=n,
        success=sum(t.reward >= 1.0 for t in trajectories) / n,
        mean_reward=sum(t.reward for t in trajectories) / n,
        tool_call_rate=sum(t.tool_calls > 0 for t in trajectories) / n,
        answer_rate=sum(t.final_answer is not None for t in trajectories) / n,
        mean_turns=sum(t.turns for t in trajectories) / n,
        mean_completion_tokens=sum(t.usage.completion_tokens for t in trajectories) / n,
    )


async def evaluate(
    engine: LLMEngine, recipe: Recipe, rows: Sequence[Mapping[str, Any]]
) -> tuple[EvalResult, list[Trajectory]]:
    """Greedy episodes on `rows` (each with "prompt" and a reference answer); the summary and the trajectories."""
    sampling = msgspec.structs.replace(recipe.sampling, temperature=0.0, logprobs=False, seed=None)
    runtime = AgentRuntime(engine, recipe.make_session(engine.tokenizer), sampling=sampling)
    results = await runtime.run_many([row["prompt"] for row in rows], tasks=list(rows))
    trajectories = [result.trajectory for result in results]
    return summarize(trajectories), trajectories
