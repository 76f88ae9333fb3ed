"""`RewardPipeline`: process rewards at every step, result rewards at the end, a total and a breakdown.

    pipeline = RewardPipeline(
        result=[MathReward()],
        process=[ToolCallReward(), FormatReward()],
        weights={"math": 1.0, "tool_calls": 0.5},
    )
    step_reward = await pipeline.score_step(step, episode)   # during the episode, if wanted
    breakdown = await pipeline.score(episode)                 # at the end: total + per-strategy scores

The total is ``sum(weight * result score) + sum over steps of sum(weight * process score)``; weights default
to 1. Strategies of one call run concurrently. A strategy that raises, hangs past `timeout_s` or returns a
non-finite number never breaks scoring: it gets its `fallback` value and a code (``reward_error``,
``reward_timeout``, ``reward_invalid``) in the breakdown, and a warning is logged.

`RewardBreakdown` is a msgspec Struct for logs and metrics: `result` and `process` map strategy names to
unweighted scores (process scores summed over steps), `steps` keeps each step's scores, `codes` says which
strategy fell back and why. The pipeline holds no per-episode state: one pipeline serves every episode.

This module knows reward strategies and records; it knows nothing about engines, tokens or environments.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

import msgspec
import structlog

from agent_env.containment import describe_error, propagates
from agent_env.deadlines import deadline
from agent_env.reward import (
    EpisodeRecord,
    ProcessRewardStrategy,
    ResultRewardStrategy,
    RewardScore,
    StepRecord,
    strategy_name,
)

__all__ = ["RewardBreakdown", "RewardPipeline", "StepReward"]

logger = structlog.get_logger(__name__)

_DEFAULT_TIMEOUT_S: Final = 60.0


class StepReward(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The process rewards of one step: weighted `total`, unweighted `scores`, fallback `codes`."""

    total: float
    scores: dict[str, float] = msgspec.field(default_factory=dict)
    codes: dict[str, str] = msgspec.field(default_factory=dict)


class RewardBreakdown(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything the pipeline computed for an episode. See the module docstring."""

    total: float
    result: dict[str, float] = msgspec.field(default_factory=dict)
    process: dict[str, float] = msgspec.field(default_factory=dict)
    steps: tuple[StepReward, ...] = ()
    weights: dict[str, float] = msgspec.field(default_factory=dict)
    codes: dict[str, str] = msgspec.field(default_factory=dict)


class RewardPipeline:
    """Weighted process and result rewards; never raises for a strategy's failure."""

    def __init__(
        self,
        *,
        result: Sequence[ResultRewardStrategy] = (),
        process: Sequence[ProcessRewardStrategy] = (),
        weights: Mapping[str, float] | None = None,
        timeout_s: float = _DEFAULT_TIMEOUT_S,
    ) -> None:
        for strategy in result:
            if not isinstance(strategy, ResultRewardStrategy):
                raise TypeError(f"result strategies must be ResultRewardStrategy, got {type(strategy).__name__}")
        for step_strategy in process:
            if not isinstance(step_strategy, ProcessRewardStrategy):
                raise TypeError(f"process strategies must be ProcessRewardStrategy, got {type(step_strategy).__name__}")
        self.result = {strategy_name(s): s for s in result}
        self.process = {strategy_name(s): s for s in process}
        names = [strategy_name(s) for s in result] + [strategy_name(s) for s in process]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"reward strategy names must be unique; repeated: {', '.join(duplicates)}")
        unknown = sorted(set(weights or {}) - set(names))
        if unknown:
            raise ValueError(f"weights name unknown strategies: {', '.join(unknown)}; known: {', '.join(names)}")
        self.weights = {name: float((weights or {}).get(name, 1.0)) for name in names}
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s

    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> StepReward:
        """The process rewards of one step."""
        scores = await self._run_all(
            {name: (functools.partial(s.score_step, step, episode), s.fallback) for name, s in self.process.items()},
            context={"step": step.index},
        )
        return StepReward(
            total=sum((self.weights[name] * score.value for name, score in scores.items()), 0.0),
            scores={name: score.value for name, score in scores.items()},
            codes={name: score.code for name, score in scores.items() if score.code is not None},
        )

    async def score(self, episode: EpisodeRecord) -> RewardBreakdown:
        """Score a finished episode: process rewards for each of its steps, then result rewards."""
        results_of = self._run_all(
            {name: (functools.partial(s.score, episode), s.fallback) for name, s in self.result.items()}, context={}
        )
        if not self.process:  # no step has anything to run: no task per step, and one (frozen) zero for every step
            steps = (StepReward(total=0.0),) * len(episode.steps)
            results = await results_of
        else:
            async with asyncio.TaskGroup() as group:
                step_tasks = [group.create_task(self.score_step(step, episode)) for step in episode.steps]
                result_task = group.create_task(results_of)
            steps = tuple(task.result() for task in step_tasks)
            results = result_task.result()
        process = {name: sum((step.scores.get(name, 0.0) for step in steps), 0.0) for name in self.process}
        codes = {name: score.code for name, score in results.items() if score.code is not None}
        for step in steps:
            for name, code in step.codes.items():
                codes.setdefault(name, code)
        total = sum((self.weights[name] * score.value for name, score in results.items()), 0.0)
        total += sum((step.total for step in steps), 0.0)
        return RewardBreakdown(
            total=total,
            result={name: score.value for name, score in results.items()},
            process=process,
            steps=steps,
            weights=dict(self.weights),
            codes=codes,
        )

    async def _run_all(
        self,
        calls: Mapping[str, tuple[Callable[[], Awaitable[float | RewardScore]], float]],
        *,
        context: dict[str, int],
    ) -> dict[str, RewardScore]:
        if len(calls) <= 1:  # nothing to run beside it: awaited here, without a task
            return {name: await self._guarded(name, run, fallback, context) for name, (run, fallback) in calls.items()}
        async with asyncio.TaskGroup() as group:  # _guarded never raises, so no sibling is cancelled
            tasks = {
                name: group.create_task(self._guarded(name, run, fallback, context))
                for name, (run, fallback) in calls.items()
            }
        return {name: task.result() for name, task in tasks.items()}

    async def _guarded(
        self,
        name: str,
        run: Callable[[], Awaitable[float | RewardScore]],
        fallback: float,
        context: dict[str, int],
    ) -> RewardScore:
        try:
            async with deadline(self.timeout_s):
                outcome = await run()
            score = outcome if isinstance(outcome, RewardScore) else RewardScore(value=float(outcome))
        except TimeoutError:
            logger.warning("reward_timed_out", strategy=name, **context, timeout_s=self.timeout_s)
            return RewardScore(value=fallback, code="reward_timeout")
        except BaseException as e:  # any BaseException (see `containment`): in a task, SystemExit would end the loop
            if propagates(e):
                raise
            detail = describe_error(e)
            logger.warning("reward_failed", strategy=name, **context, error_type=type(e).__name__, error=detail)
            return RewardScore(value=fallback, code="reward_error", detail=detail)
        if not math.isfinite(score.value):
            logger.warning("reward_invalid", strategy=name, **context, value=score.value)
            return RewardScore(value=fallback, code="reward_invalid", detail=f"returned {score.value}")
        return score
