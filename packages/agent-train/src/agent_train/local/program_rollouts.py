"""RL rollouts of an agent-program recipe (`Recipe.agent`) for the local trainer: `Rollouts`' interface and
records, each episode run by `AgentExecutor.rollout`, which runs the program through the proxy.

    rollouts = ProgramRollouts(recipe, engine)                      # engine: an LLMEngine, e.g. HFEngine
    records = await rollouts.collect(rows, group_size=8, temperature=1.0, seed=step)

Everything but the episode is `Rollouts`' (`agent_train.local.rollout`): groups, seeds (episode `i` samples with
seed ``seed * 100_003 + i``), the generation cap, logprobs, and one `RolloutRecord` per segment carrying its
episode's index, so that an episode broken into segments by its client is trained as a compacted one is: every
segment with the episode's advantage. An episode the program failed is a record like any other (its error coded
in `extra_logs`); only one that could not run at all is left out (logged as ``rollout_lost``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import structlog

from agent_runtime import LLMEngine, Recipe, RecipeError
from agent_train.executor import AgentExecutor
from agent_train.local.rollout import RolloutRecord, loss_mask_from_ranges
from agent_train.task import encode_task

__all__ = ["ProgramRollouts"]

logger = structlog.get_logger(__name__)


class ProgramRollouts:
    """Samples groups of episodes of `recipe`'s agent program on `engine`."""

    def __init__(self, recipe: Recipe, engine: LLMEngine, *, max_length: int | None = None) -> None:
        if recipe.agent is None:
            raise RecipeError(f"recipe {recipe.name!r} names no agent program; use Rollouts")
        self.recipe = recipe
        self.engine = engine
        self.max_length = int(max_length or recipe.max_context_tokens or engine.context_length)
        self.executor = AgentExecutor(recipe)
        self.sampling = msgspec.structs.replace(recipe.sampling, max_new_tokens=recipe.max_new_tokens, logprobs=True)

    async def collect(
        self, rows: Sequence[Mapping[str, Any]], *, group_size: int, temperature: float = 1.0, seed: int = 0
    ) -> list[RolloutRecord]:
        """As `Rollouts.collect`: `group_size` episodes per row, all at once, records grouped by row."""
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        jobs = [(group, row) for group, row in enumerate(rows) for _ in range(group_size)]
        async with asyncio.TaskGroup() as tasks:
            running = [
                tasks.create_task(self._kept(group, index, row, temperature=temperature, seed=seed * 100_003 + index))
                for index, (group, row) in enumerate(jobs)
            ]
        return [record for job in running for record in job.result()]

    async def _kept(
        self, group: int, episode: int, row: Mapping[str, Any], *, temperature: float, seed: int
    ) -> list[RolloutRecord]:
        try:
            return await self._one(group, episode, row, temperature=temperature, seed=seed)
        except Exception as e:  # the batch's boundary: a row that cannot run drops that episode only
            logger.warning("rollout_lost", group=group, error_type=type(e).__name__, error=str(e)[:500])
            return []

    async def _one(
        self, group: int, episode: int, row: Mapping[str, Any], *, temperature: float, seed: int
    ) -> list[RolloutRecord]:
        sampling = msgspec.structs.replace(self.sampling, temperature=temperature, top_p=1.0, seed=seed)
        rollout = await self.executor.rollout(
            encode_task(row), None, self.engine, max_length=self.max_length, sampling=sampling, with_logprobs=True
        )
        stop_reason = rollout.trajectory.stop_reason
        return [
            RolloutRecord(
                group=group,
                ids=list(sample.observation_tokens),
                loss_mask=loss_mask_from_ranges(len(sample.observation_tokens), sample.action_ranges),
                logprobs=list(sample.rollout_log_probs or [0.0] * len(sample.observation_tokens)),
                reward=sample.reward,
                truncated=sample.truncated,
                extra_logs=sample.extra_logs,
                episode=episode,
                segment=index,
                stop_reason=stop_reason,
            )
            for index, sample in enumerate(rollout.segments)
        ]
