"""RL rollouts for the local trainer: the recipe's episodes through `AgentRuntime`, trained from their
`Trajectory` segments directly.

    rollouts = Rollouts(recipe, engine, max_length=512)             # engine: an LLMEngine, e.g. HFEngine
    records = await rollouts.collect(rows, group_size=8, temperature=1.0, seed=step)

Each prompt is run `group_size` times, all at once (the engine batches them), through the same runtime, session
and `Conversation` that serving and OpenRLHF's executor run. A record is the trained segment of a trajectory as
the transcript holds it: ids, loss mask and the engine's logprobs, with the episode's reward. OpenRLHF's wire
format (`observation_tokens`, `action_ranges`) is not a step on this path; the executor equivalence test shows
that an OpenRLHF job gets the same ids, masks and rewards from the executor. So this path imports neither vLLM
nor OpenRLHF.

Seeds: episode `i` of a call samples with seed ``seed * 100_003 + i``, so a run is reproducible up to float
rounding between batch shapes. The trained segment is the last one, as in the executor (`sample.py`); a compacted
episode's earlier segments are not trained yet. This module knows runtimes and trajectories; nothing about losses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import structlog

from agent_runtime import AgentRuntime, AssistantEvent, LLMEngine, Recipe
from agent_train.sample import extra_logs

__all__ = ["RolloutRecord", "Rollouts", "loss_mask_from_ranges"]

logger = structlog.get_logger(__name__)


class RolloutRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One sampled episode as OpenRLHF receives it, plus the index of its prompt group."""

    group: int
    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    truncated: bool
    extra_logs: dict[str, float] = msgspec.field(default_factory=dict)


def loss_mask_from_ranges(length: int, action_ranges: Sequence[Sequence[int]]) -> list[int]:
    """OpenRLHF's half-open `action_ranges` as a 0/1 mask over `length` tokens."""
    mask = [0] * length
    for start, end in action_ranges:
        if not 0 <= start <= end <= length:
            raise ValueError(f"action range ({start}, {end}) is outside a sequence of {length} tokens")
        mask[start:end] = [1] * (end - start)
    return mask


class Rollouts:
    """Samples groups of episodes of `recipe` on `engine` through `AgentRuntime`."""

    def __init__(self, recipe: Recipe, engine: LLMEngine, *, max_length: int | None = None) -> None:
        self.recipe = recipe
        self.engine = engine
        self.max_length = int(max_length or recipe.max_context_tokens or engine.context_length)
        self.runtime = AgentRuntime(
            engine,
            recipe.make_session(engine.tokenizer),
            sampling=msgspec.structs.replace(recipe.sampling, max_new_tokens=recipe.max_new_tokens, logprobs=True),
            max_context_tokens=self.max_length,
            engine_timeout_s=None,
        )

    async def collect(
        self, rows: Sequence[Mapping[str, Any]], *, group_size: int, temperature: float = 1.0, seed: int = 0
    ) -> list[RolloutRecord]:
        """`group_size` episodes for each row, all started at once (the engine batches them); records come back
        grouped by row (`group` is the row's index). An episode that could not run at all is left out (logged
        as ``rollout_lost``); every other one comes back."""
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        jobs = [(group, row) for group, row in enumerate(rows) for _ in range(group_size)]
        async with asyncio.TaskGroup() as tasks:
            running = [
                tasks.create_task(self._kept(group, row, temperature=temperature, seed=seed * 100_003 + index))
                for index, (group, row) in enumerate(jobs)
            ]
        records = [record for job in running if (record := job.result()) is not None]
        if len(records) < len(jobs):
            logger.warning("rollouts_lost", lost=len(jobs) - len(records), of=len(jobs))
        return records

    async def _kept(self, group: int, row: Mapping[str, Any], *, temperature: float, seed: int) -> RolloutRecord | None:
        """`_one`, inside the batch's boundary: the runtime already records what a model, tool, reward or
        engine did to an episode; what still raises (a row whose prompt cannot be rendered, a bug) drops that
        one episode, logged, and never the batch. Group baselines take groups of any size."""
        try:
            return await self._one(group, row, temperature=temperature, seed=seed)
        except Exception as e:
            logger.warning("rollout_lost", group=group, error_type=type(e).__name__, error=str(e)[:500])
            return None

    async def _one(self, group: int, row: Mapping[str, Any], *, temperature: float, seed: int) -> RolloutRecord:
        sampling = msgspec.structs.replace(self.runtime.sampling, temperature=temperature, top_p=1.0, seed=seed)
        task = {key: value for key, value in row.items() if key != "prompt"}  # as the executor's task row
        result = await self.runtime.run(row["prompt"], task=task, sampling=sampling, keep_events=True)
        trajectory = result.trajectory
        if not trajectory.segments:
            raise ValueError(f"the episode has no transcript ({trajectory.stop_reason})")
        segment = trajectory.segments[-1]
        turns = [event for event in result.events if isinstance(event, AssistantEvent)]
        return RolloutRecord(
            group=group,
            ids=list(segment.ids),
            loss_mask=list(segment.loss_mask),
            logprobs=[0.0 if lp is None else float(lp) for lp in segment.logprobs],
            reward=trajectory.reward,
            truncated=bool(turns) and turns[-1].finish_reason == "length",
            extra_logs=extra_logs(trajectory, self.recipe.rewards),
        )
