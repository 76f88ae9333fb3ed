"""RL rollouts for the local trainer, through the same executor OpenRLHF calls (`AgentExecutor.execute`).

    rollouts = Rollouts(recipe, engine, max_length=512)             # engine: an LLMEngine, e.g. HFEngine
    records = await rollouts.collect(rows, group_size=8, temperature=1.0, seed=step)

Each prompt is run `group_size` times. Every episode goes through `AgentExecutor.execute(prompt, label,
sampling_params, max_length, hf_tokenizer, llm_engine)` with vLLM's own `SamplingParams` and
`LocalRolloutEngine` (OpenRLHF's rollout-engine contract answered by the local engine), and the dict OpenRLHF
would train on (`observation_tokens`, `action_ranges`, `reward`, `rollout_log_probs`) is what this trainer trains
on. The local trainer and an OpenRLHF job therefore see the same token streams, masks and rewards.

Seeds: episode `i` of a call samples with seed ``seed * 100_003 + i``, so a run is reproducible up to float
rounding between batch shapes. This module knows the executor's contract; it knows nothing about losses.
OpenRLHF and vLLM are imported when a `Rollouts` is made, not with the module (`RolloutRecord` is light).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import structlog

from agent_runtime import LLMEngine, Recipe
from agent_train.task import encode_task, label_of

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
    """Samples groups of episodes of `recipe` on `engine` through `AgentExecutor`."""

    def __init__(self, recipe: Recipe, engine: LLMEngine, *, max_length: int | None = None) -> None:
        from agent_train.executor import AgentExecutor  # OpenRLHF (and torch)
        from agent_train.local_rollout_engine import LocalRolloutEngine  # vLLM

        self.recipe = recipe
        self.engine = engine
        self.executor = AgentExecutor(recipe)
        self.rollout_engine = LocalRolloutEngine(engine)
        self.max_length = int(max_length or recipe.max_context_tokens or engine.context_length)

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
        """`_one`, inside the batch's boundary: the executor already records what a model, tool, reward or
        engine did to an episode; what still raises (a row whose prompt cannot be rendered, a bug) drops that
        one episode, logged, and never the batch. Group baselines take groups of any size."""
        try:
            return await self._one(group, row, temperature=temperature, seed=seed)
        except Exception as e:
            logger.warning("rollout_lost", group=group, error_type=type(e).__name__, error=str(e)[:500])
            return None

    async def _one(self, group: int, row: Mapping[str, Any], *, temperature: float, seed: int) -> RolloutRecord:
        from vllm import SamplingParams as VLLMSamplingParams  # loaded by __init__ already

        params = VLLMSamplingParams(
            temperature=temperature,
            top_p=1.0,
            max_tokens=self.recipe.max_new_tokens,
            logprobs=0,  # the sampled token's logprob only, as OpenRLHF asks vLLM
            seed=seed,
        )
        out = await self.executor.execute(
            encode_task(row), label_of(row), params, self.max_length, self.engine.tokenizer, self.rollout_engine
        )
        ids = [int(i) for i in out["observation_tokens"]]
        logprobs = out["rollout_log_probs"]
        return RolloutRecord(
            group=group,
            ids=ids,
            loss_mask=loss_mask_from_ranges(len(ids), out["action_ranges"]),
            logprobs=[float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids),
            reward=float(out["reward"]),
            truncated=bool(out["truncated"]),
            extra_logs={k: float(v) for k, v in out["extra_logs"].items()},
        )
