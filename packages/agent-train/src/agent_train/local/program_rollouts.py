"""RL rollouts of an agent-program recipe (`Recipe.agent`) for the local trainer: `Rollouts`' interface and
records, each episode run by `AgentExecutor.rollout`, which runs the program through the proxy.

    rollouts = ProgramRollouts(recipe, engine)                      # engine: an LLMEngine, e.g. HFEngine
    records = await rollouts.collect(rows, group_size=8, temperature=1.0, seed=step)

Everything but the episode is `Rollouts`' (`agent_train.local.rollout`): groups, seeds (episode `i` samples with
seed ``seed * 100_003 + i``), the generation cap, logprobs, and one `RolloutRecord` per segment carrying its
episode's index, so that an episode broken into segments by its client is trained as a compacted one is: every
segment with the episode's advantage. An episode the program failed is a record like any other (its error coded
in `extra_logs`); only one that could not run at all is left out (logged as ``rollout_lost``).

A command program's episodes share the rollouts' one listening gateway (`AgentExecutor.gateway`), started on the
loop of the first of them; `aclose()` (or ``async with``) stops it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from agent_runtime import LLMEngine, Recipe, RecipeError
from agent_train.local.rollout import RolloutRecord, Rollouts, episode_records
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.task import encode_task

__all__ = ["ProgramRollouts"]


class ProgramRollouts(Rollouts):
    """Samples groups of episodes of `recipe`'s agent program on `engine`: `Rollouts`' `collect` and boundary, with
    each episode run by the executor instead of the runtime."""

    def __init__(self, recipe: Recipe, engine: LLMEngine, *, max_length: int | None = None) -> None:
        if recipe.agent is None:
            raise RecipeError(f"recipe {recipe.name!r} names no agent program; use Rollouts")
        self.recipe = recipe
        self.engine = engine
        self.max_length = int(max_length or recipe.max_context_tokens or engine.context_length)
        self.executor = AgentExecutor(recipe)
        self.sampling = msgspec.structs.replace(recipe.sampling, max_new_tokens=recipe.max_new_tokens, logprobs=True)

    async def _one(
        self, group: int, episode: int, row: Mapping[str, Any], *, temperature: float, seed: int
    ) -> list[RolloutRecord]:
        sampling = msgspec.structs.replace(self.sampling, temperature=temperature, top_p=1.0, seed=seed)
        rollout = await self.executor.rollout(
            encode_task(row), None, self.engine, max_length=self.max_length, sampling=sampling, with_logprobs=True
        )
        return episode_records(  # the program's segments are prefix breaks, not summaries: no summary ranges
            rollout.trajectory,
            group=group,
            episode=episode,
            truncated=rollout.sample.truncated,
            logs=rollout.sample.extra_logs,  # the episode's, with the program's own counts
        )

    async def aclose(self) -> None:
        """Stop the rollouts' gateway, if a command program started one (on the loop it runs on)."""
        await self.executor.aclose()

    async def __aenter__(self) -> ProgramRollouts:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
