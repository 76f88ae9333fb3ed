"""`RolloutPipeline`: the local trainer's asynchronous rollouts. Batches are sampled on a second copy of the policy
while the trainer updates the first, each batch with the weights of a version the trainer published, so that at
most `ahead` (K) versions separate the weights that sampled a batch from the weights that train on it.

    pipeline = RolloutPipeline.on_copy(recipe, model, tokenizer, ahead=1, group_size=8)
    weights = snapshot(model)
    for j in range(2): pipeline.submit(j, prompts[j], version=0, weights=weights)  # batches 0..K: version 0
    batch = await pipeline.next()      # batch 0's records, sampled by version 0, every action span tagged 0
    ...                                # train on it (version 0 -> 1), then: submit(2, prompts[2], version=1, ...)
    await pipeline.close()

The schedule: batch j is sampled with the weights of version max(0, j - K), published by the trainer once its
update j - K - 1 is done, and trained at version j; so batch j + 1 is generated while batch j trains (K = 1), and
every token of a batch comes from one version. This is prime-rl's (rollouts of step n from the policy of step
n - async_level, ``max_async_level``), verl's one-step-off-policy recipe at K = 1, and AReaL's bound
(``max_head_offpolicyness``): staleness is bounded where the batch is generated, so no episode needs dropping;
`fresh_records` still drops (never masks) any episode staler than K at training time, counted in the metrics, as
a guard that the schedule held (torchrl's `StalenessAwareSampler` and DI-engine's `staleness_check` drop the same
way; verl's fully-async ``staleness_threshold``, OpenRLHF's ``async_queue_size`` and Tinker's
``sampling_steps_ahead`` bound the lead instead, and keep what they sampled). A weight swap never lands inside a
batch here, so nothing is partial: OpenRLHF's ``--train.partial_rollout_enable`` is the OpenRLHF backend's.

Determinism: batch j's records depend only on its prompts, its seed and the weights of its version (the rollout
copy is swapped between batches, and the engine is lockstep, `agent_train.local.lockstep`), never on how the two
threads interleave; the trainer draws the prompts and publishes the weights in its own order. With K = 0 the
pipeline waits for each update before the next batch, so it may sample on the trainer's own engine and weights
(the trainer does so): the synchronous loop's records, bit for bit. (On a copy the same batches come out equal up
to float rounding: the shared engine resumes from prefixes its evaluations left in its cache, a copy's does not.)

A failure on the generating side (the weight swap, the engine, a batch in which no episode generated a token) ends
the producer; `next` then raises it as a `TrainError` instead of waiting for a batch that will not come. This
module knows engines, rollouts and versions; the loss is `agent_train.local.rl`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from agent_protocol import Tokenizer
from agent_runtime import Recipe
from agent_runtime.engines import HFEngine
from agent_train.errors import TrainError
from agent_train.local.lockstep import LockstepEngine
from agent_train.local.rollout import ROLLOUT_BATCHING, RolloutRecord, Rollouts

__all__ = [
    "PipelineBatch", "RolloutPipeline", "fresh_records", "record_versions", "snapshot", "staleness_stats",
    "staleness_totals",
]  # fmt: skip

logger = structlog.get_logger(__name__)


def snapshot(model: Any) -> dict[str, torch.Tensor]:
    """A copy of `model`'s weights (detached clones), what the trainer publishes for a version."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def record_versions(record: RolloutRecord) -> list[int]:
    """The policy versions of `record`'s action tokens, one per token (`RolloutRecord.versions` without the -1 of
    the other tokens); empty where the engine tracked none."""
    return [version for version in record.versions if version >= 0]


def fresh_records(
    records: Sequence[RolloutRecord], *, version: int, bound: int
) -> tuple[list[RolloutRecord], dict[int, int], int]:
    """The records of the episodes whose oldest token is at most `bound` versions behind `version` (the trainer's),
    the episodes counted by staleness (``{staleness: episodes}``, every episode, dropped ones included), and how many
    episodes were dropped. A whole episode goes: its segments share one advantage. An episode without versions
    counts as fresh (staleness 0)."""
    oldest: dict[int, int] = {}
    for record in records:
        versions = record_versions(record)
        low = min(versions, default=version)
        oldest[record.episode] = min(oldest.get(record.episode, low), low)
    staleness = {episode: version - low for episode, low in oldest.items()}
    histogram: dict[int, int] = {}
    for value in staleness.values():
        histogram[value] = histogram.get(value, 0) + 1
    stale = {episode for episode, value in staleness.items() if value > bound}
    if stale:
        logger.warning("rollouts_too_stale", dropped=len(stale), version=version, bound=bound)
    return [r for r in records if r.episode not in stale], dict(sorted(histogram.items())), len(stale)


def staleness_stats(histogram: Mapping[int, int], dropped: int) -> dict[str, float]:
    """A step's staleness metrics: the episodes at each staleness (``staleness_<s>``), the mean and the max over
    episodes, and the episodes dropped as staler than the bound."""
    episodes = sum(histogram.values())
    stats: dict[str, float] = {f"staleness_{value}": float(count) for value, count in histogram.items()}
    stats["staleness_mean"] = round(sum(v * c for v, c in histogram.items()) / max(1, episodes), 4)
    stats["staleness_max"] = float(max(histogram, default=0))
    stats["stale_dropped"] = float(dropped)
    return stats


def _check_generated(index: int, records: Sequence[RolloutRecord]) -> None:
    """Raise a `TrainError` for a batch in which no episode generated a token: the rollout engine is gone (each
    episode recorded its engine error), and waiting for the next batch would train on nothing, step after step."""
    if any(any(record.loss_mask) for record in records):
        return
    errors = [e for r in records if r.trajectory is not None for e in r.trajectory.errors]
    reason = f"{errors[0].code}: {errors[0].message}" if errors else "every episode was lost (rollout_lost warnings)"
    raise TrainError(f"batch {index}: no episode generated a token ({reason})")


def staleness_totals(metrics: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """A run's staleness from its RL metrics records (`staleness_stats`'): the episodes at each staleness, summed
    over the steps (``{"0": n, "1": m}``), and ``dropped``."""
    totals: dict[int, int] = {}
    dropped = 0
    for record in metrics:
        if record.get("kind") != "rl":
            continue
        dropped += int(record.get("stale_dropped", 0))
        for key, value in record.items():
            suffix = key.removeprefix("staleness_")
            if key.startswith("staleness_") and suffix.isdigit():
                totals[int(suffix)] = totals.get(int(suffix), 0) + int(value)
    return {**{str(k): v for k, v in sorted(totals.items())}, "dropped": dropped}


@dataclass(frozen=True)
class PipelineBatch:
    """Batch `index`'s records, sampled with the weights of `version`, and how long the sampling took."""

    index: int
    version: int
    records: list[RolloutRecord]
    generate_s: float


@dataclass(frozen=True)
class _Job:
    index: int
    prompts: list[Mapping[str, Any]]
    version: int
    weights: Mapping[str, torch.Tensor] | None


class RolloutPipeline:
    """Samples the batches the trainer submits, in order, on `engine` (see the module docstring), whose model the
    pipeline loads each batch's weights into. `RolloutPipeline.on_copy` builds it on a copy of the trainer's model
    (K >= 1: the trainer updates its own copy meanwhile); with K = 0 it may share the trainer's engine and model,
    nothing running while a batch is sampled."""

    def __init__(
        self,
        recipe: Recipe,
        engine: LockstepEngine,
        *,
        ahead: int,
        group_size: int,
        temperature: float = 1.0,
        seed: int = 0,
        owns_engine: bool = False,
    ) -> None:
        if ahead < 0:
            raise ValueError(f"ahead must be at least 0 (the versions of staleness allowed), got {ahead}")
        self.ahead = ahead
        self.group_size = group_size
        self.temperature = temperature
        self.seed = seed
        self.engine = engine
        self.model: Any = engine.engine.model
        self.owns_engine = owns_engine
        self.rollouts = Rollouts(recipe, self.engine)
        self.version: int | None = None  # the version the engine's model holds (None: not set by the pipeline)
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self._done: asyncio.Queue[PipelineBatch] = asyncio.Queue()
        self._submitted = -1
        self._producer: asyncio.Task[None] | None = None

    @classmethod
    def on_copy(
        cls,
        recipe: Recipe,
        model: Any,
        tokenizer: Tokenizer,
        *,
        ahead: int,
        group_size: int,
        temperature: float = 1.0,
        seed: int = 0,
        max_batch_size: int = 256,
    ) -> RolloutPipeline:
        """A pipeline on its own copy of `model`, behind its own lockstep `HFEngine` (closed with the pipeline)."""
        copied = copy.deepcopy(model).requires_grad_(False)
        engine = LockstepEngine(
            HFEngine(
                copied,
                tokenizer,
                context_length=recipe.max_context_tokens,
                max_batch_size=max_batch_size,
                **ROLLOUT_BATCHING,
            )
        )
        return cls(
            recipe, engine, ahead=ahead, group_size=group_size, temperature=temperature, seed=seed, owns_engine=True
        )

    def submit(
        self,
        index: int,
        prompts: Iterable[Mapping[str, Any]],
        *,
        version: int,
        weights: Mapping[str, torch.Tensor] | None,
    ) -> None:
        """Queue batch `index` (the next one: 0, 1, ...), to be sampled from `prompts` with `weights` as `version`
        (None: the engine's model holds them already, as a pipeline sharing the trainer's model at K = 0 has it);
        versions never go back. Starts the producer on the first call."""
        if index != self._submitted + 1:
            raise ValueError(f"batches are submitted in order: expected batch {self._submitted + 1}, got {index}")
        if index - version > self.ahead or version > index:
            raise ValueError(f"batch {index} cannot be sampled by version {version} with at most {self.ahead} behind")
        self._submitted = index
        self._jobs.put_nowait(_Job(index, list(prompts), version, weights))
        if self._producer is None:
            self._producer = asyncio.get_running_loop().create_task(self._produce(), name="rollout-pipeline")

    async def next(self) -> PipelineBatch:
        """The next sampled batch, in submission order; a `TrainError` when the producer failed (never a hang)."""
        if self._producer is None:
            raise TrainError("the rollout pipeline has no batch submitted")
        waiting = asyncio.ensure_future(self._done.get())
        try:
            await asyncio.wait({waiting, self._producer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            return waiting.result()
        error = self._producer.exception() if not self._producer.cancelled() else None
        raise TrainError(f"rollout generation failed: {type(error).__name__}: {error}") from error

    async def _produce(self) -> None:
        while True:
            job = await self._jobs.get()
            started = time.perf_counter()
            if job.version != self.version:
                self._swap(job.version, job.weights)
            records = await self.rollouts.collect(
                job.prompts,
                group_size=self.group_size,
                temperature=self.temperature,
                seed=self.seed * 1_000_003 + job.index,
            )
            _check_generated(job.index, records)
            generate_s = time.perf_counter() - started
            logger.debug("pipeline_batch", index=job.index, version=job.version, seconds=round(generate_s, 3))
            self._done.put_nowait(PipelineBatch(job.index, job.version, records, generate_s))

    def _swap(self, version: int, weights: Mapping[str, torch.Tensor] | None) -> None:
        """Load `weights` (if any) into the engine's model and tag what it samples from now on with `version`. Runs
        between batches, when no forward pass of the model is running."""
        if weights is not None:
            with torch.no_grad():
                self.model.load_state_dict(weights, strict=True)
        self.engine.set_policy_version(version)
        self.version = version

    async def close(self) -> None:
        """Stop the producer (a batch being sampled is abandoned) and close the engine if the pipeline owns it."""
        if self._producer is not None and not self._producer.done():
            self._producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure: `next` reported it
                await self._producer
        if self.owns_engine:
            await self.engine.close()
