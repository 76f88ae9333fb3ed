"""RL rollouts for the local trainer: the recipe's episodes through `AgentRuntime`, trained from their
`Trajectory` segments directly.

    rollouts = Rollouts(recipe, engine, max_length=512)             # engine: an LLMEngine, e.g. HFEngine
    records = await rollouts.collect(rows, group_size=8, temperature=1.0, seed=step)

Each prompt is run `group_size` times, all at once (the engine batches them), through the same runtime, session
and `Conversation` that serving and OpenRLHF's executor run. A record (`episode_records`) is one segment of an
episode read from its transcript record as the session wrote it: its token ids, its loss mask (1 exactly on the
action tokens) and the engine's logprobs of those tokens, with the episode's reward and `extra_logs`. An episode
that never compacted is one record; a compacted one is one record per context it ran in, each ending with its
summary turn but the last, and every record carries the index of its episode, so that advantages are computed per
episode and given to all of its segments (`agent_train.local.rl`). OpenRLHF's wire format (`RolloutSample`'s
`observation_tokens` and `action_ranges`) is not a step on this path, so it imports neither vLLM nor OpenRLHF; the
executor equivalence tests show that an OpenRLHF job gets the same ids, masks and rewards from the executor.

A record also says which of its action tokens are the summary turn (`summary_ranges`: the last action of every
segment but the last, and of the last when the episode ended on an empty summary) and whether the episode ran out
of budget without answering (`overlong`: `agent_train.sample.ended_by_budget`, the episodes the OpenRLHF job
masks too), so that the trainer can mask summaries (the ablation) or leave those episodes out of the loss, and the
policy version each token was sampled with (`versions`, -1 where none: `agent_train.sample.action_versions`), so that
an asynchronous trainer knows how stale each token is (`Trajectory.staleness` for the episode).

Seeds: episode `i` of a call samples with seed ``seed * 100_003 + i``. On a `LockstepEngine` (the local trainer's)
every episode of a call is registered with it (`as_episode`), so the engine batches the episodes' turns in episode
order, not by arrival, and a call repeats bit for bit on the same machine; on another engine the episodes run as
before, batched by arrival, reproducible up to float rounding between batch shapes. This module knows runtimes
and trajectories; nothing about losses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec
import structlog

from agent_env import describe_error, propagates
from agent_runtime import AgentRuntime, AssistantEvent, LLMEngine, Recipe, Trajectory
from agent_train.local.lockstep import as_episode
from agent_train.sample import action_logprobs, action_versions, ended_by_budget, extra_logs

__all__ = ["ROLLOUT_BATCHING", "RolloutRecord", "Rollouts", "episode_records", "summary_ranges"]

#: How the local trainer's `HFEngine`s batch what reaches them outside its lockstep (`agent_train.local.lockstep`,
#: whose waves go as fixed batches): requests that reach the engine within 50 ms start one batch (the wait
#: ends sooner once no episode is still sending: `HFEngine`'s `batch_wait_full=False`), and a turn
#: that comes back while a batch runs joins it at the next step, as before the engine's join rule (made for serving,
#: where one turn's latency counts; a rollout counts its wall time). `bench/bench_hf_join.py`, 64 demo-shaped
#: episodes x 4 turns: at once took 0.89x, 0.83x and 0.99-1.01x the rule's time in three runs (medians of 3), so the
#: trainer keeps joining at once.
ROLLOUT_BATCHING: Final[dict[str, Any]] = {"batch_wait_s": 0.05, "join_ratio": 0.0, "join_wait_steps": 0}

logger = structlog.get_logger(__name__)


class RolloutRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One segment of a sampled episode (its transcript record's ids, loss mask and action logprobs), plus the
    indices of its prompt group, its episode and the segment within the episode (0 for an episode that never
    compacted), and the episode's `trajectory`. `overlong`: the episode ran out of budget without answering
    (`ended_by_budget`)."""

    group: int
    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    truncated: bool
    extra_logs: dict[str, float] = msgspec.field(default_factory=dict)
    episode: int = 0
    segment: int = 0
    summary_ranges: list[tuple[int, int]] = msgspec.field(default_factory=list)
    stop_reason: str | None = None
    overlong: bool = False
    #: the episode's record, shared by its segments' records: what the trainer's trajectory log writes
    #: (`agent_train.local.trajectory_log`); the loss reads the fields above
    trajectory: Trajectory | None = None
    #: the policy version each token was sampled with (`action_versions`: -1 outside the action tokens and where
    #: the engine tracked none); empty for a record built without them
    versions: list[int] = msgspec.field(default_factory=list)


def summary_ranges(trajectory: Trajectory) -> list[list[tuple[int, int]]]:
    """Per segment, the action ranges of its summary turn: a segment that was compacted ends with it; the last
    segment holds one only when the episode ended on its summary (``compaction_failed``: an empty one)."""
    ranges: list[list[tuple[int, int]]] = []
    last = len(trajectory.segments) - 1
    for index, segment in enumerate(trajectory.segments):
        actions = segment.action_ranges
        ends_with_summary = index < last or trajectory.stop_reason == "compaction_failed"
        ranges.append([actions[-1]] if actions and ends_with_summary else [])
    return ranges


def episode_records(
    trajectory: Trajectory,
    *,
    group: int,
    episode: int,
    truncated: bool,
    logs: Mapping[str, float],
    summaries: Sequence[list[tuple[int, int]]] | None = None,
) -> list[RolloutRecord]:
    """The episode's segments as records, in order, read from its transcript records (`Trajectory.segments`), each
    with the episode's reward, `truncated` (its last turn was cut by the length limit), `logs` (its `extra_logs`)
    and `overlong`; `summaries` per segment, if any (`summary_ranges`)."""
    if summaries is not None and len(summaries) != len(trajectory.segments):
        raise ValueError(f"{len(summaries)} summary range lists for {len(trajectory.segments)} segments")
    overlong = ended_by_budget(trajectory, truncated=truncated)
    return [
        RolloutRecord(
            group=group,
            ids=list(segment.ids),
            loss_mask=list(segment.loss_mask),
            logprobs=action_logprobs(segment),
            reward=float(trajectory.reward),
            truncated=truncated,
            extra_logs=dict(logs),
            episode=episode,
            segment=index,
            summary_ranges=summaries[index] if summaries is not None else [],
            stop_reason=trajectory.stop_reason,
            overlong=overlong,
            trajectory=trajectory,
            versions=action_versions(segment),
        )
        for index, segment in enumerate(trajectory.segments)
    ]


class Rollouts:
    """Samples groups of episodes of `recipe` on `engine` through `AgentRuntime`."""

    def __init__(self, recipe: Recipe, engine: LLMEngine, *, max_length: int | None = None) -> None:
        self.recipe = recipe
        self.engine = engine
        self.max_length = int(max_length or recipe.max_context_tokens or engine.context_length)
        self.runtime = AgentRuntime(
            engine,
            recipe.make_session(engine.tokenizer),
            sampling=msgspec.structs.replace(recipe.sampling, max_new_tokens=recipe.generation_cap(), logprobs=True),
            max_context_tokens=self.max_length,
            engine_timeout_s=None,
        )

    async def collect(
        self, rows: Sequence[Mapping[str, Any]], *, group_size: int, temperature: float = 1.0, seed: int = 0
    ) -> list[RolloutRecord]:
        """`group_size` episodes for each row, all started at once (the engine batches them); records come back
        grouped by row (`group` is the row's index), an episode's segments in order (`episode` is its index among
        the episodes of this call). An episode that could not run at all is left out (logged as
        ``rollout_lost``); every other one comes back."""
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        jobs = [(group, row) for group, row in enumerate(rows) for _ in range(group_size)]
        async with asyncio.TaskGroup() as tasks:
            running = [
                tasks.create_task(
                    as_episode(
                        self.engine,
                        self._kept(group, index, row, temperature=temperature, seed=seed * 100_003 + index),
                    )
                )
                for index, (group, row) in enumerate(jobs)
            ]
        episodes = [job.result() for job in running]
        lost = sum(1 for segments in episodes if not segments)
        if lost:
            logger.warning("rollouts_lost", lost=lost, of=len(jobs))
        return [record for segments in episodes for record in segments]

    async def _kept(
        self, group: int, episode: int, row: Mapping[str, Any], *, temperature: float, seed: int
    ) -> list[RolloutRecord]:
        """`_one`, inside the batch's boundary: the runtime already records what a model, tool, reward or
        engine did to an episode; what still raises (a row whose prompt cannot be rendered, a bug) drops that
        one episode, logged, and never the batch. Group baselines take groups of any size."""
        try:
            return await self._one(group, episode, row, temperature=temperature, seed=seed)
        except BaseException as e:  # any BaseException but the two that propagate (agent_env.containment)
            if propagates(e):
                raise
            logger.warning("rollout_lost", group=group, error_type=type(e).__name__, error=describe_error(e))
            return []

    async def _one(
        self, group: int, episode: int, row: Mapping[str, Any], *, temperature: float, seed: int
    ) -> list[RolloutRecord]:
        sampling = msgspec.structs.replace(self.runtime.sampling, temperature=temperature, top_p=1.0, seed=seed)
        task = {key: value for key, value in row.items() if key != "prompt"}  # as the executor's task row
        result = await self.runtime.run(row["prompt"], task=task, sampling=sampling, keep_events=True)
        trajectory = result.trajectory
        if not trajectory.segments:
            raise ValueError(f"the episode has no transcript ({trajectory.stop_reason})")
        turns = [event for event in result.events if isinstance(event, AssistantEvent)]
        return episode_records(
            trajectory,
            group=group,
            episode=episode,
            truncated=bool(turns) and turns[-1].finish_reason == "length",
            logs=extra_logs(trajectory, self.recipe.rewards),
            summaries=summary_ranges(trajectory),
        )
