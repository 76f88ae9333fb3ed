"""Supervised warm start: expert episodes run through the recipe's own `AgentSession`, then next-token
cross-entropy on their action tokens.

    trajectories = await expert_trajectories(recipe, tokenizer, rows, policy)   # ScriptedEngine(policy=...)
    examples = sft_examples(trajectories)                                       # ids + loss masks, as recorded
    for step in range(steps):
        loss = sft_step(model, optimizer, batch_of(examples), pad_id=pad)

The expert plays through `AgentRuntime` exactly as a model would in serving: its turns are token ids appended
to the transcript, tool results are real calculator outputs rendered by the protocol. The training data is each
episode's transcript as recorded (ids and loss mask), never re-rendered, so the model learns the very token stream
it will later be sampled on. This module knows sessions and torch; it knows nothing about the demo task.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
import structlog
import torch

from agent_protocol import Tokenizer
from agent_runtime import AgentRuntime, Recipe, ScriptedEngine, Trajectory
from agent_runtime.engines import Policy
from agent_train.local.batch import pad_batch, token_logprobs

__all__ = ["SFTExample", "expert_trajectories", "learns_from", "sample_batch", "sft_examples", "sft_step"]

logger = structlog.get_logger(__name__)


class SFTExample(msgspec.Struct, frozen=True, kw_only=True):
    """One training sequence: the ids of a transcript segment and its loss mask (1 on generated tokens)."""

    ids: list[int]
    loss_mask: list[int]


async def expert_trajectories(
    recipe: Recipe, tokenizer: Tokenizer, rows: Iterable[Mapping[str, Any]], policy: Policy
) -> list[Trajectory]:
    """Run the expert `policy` (prompt ids -> its turn) on every row through the recipe's session."""
    engine = ScriptedEngine(tokenizer, policy=policy, context_length=recipe.max_context_tokens or 32768)
    runtime = AgentRuntime(engine, recipe.make_session(tokenizer), sampling=recipe.sampling)
    rows = list(rows)
    results = await runtime.run_many([row["prompt"] for row in rows], tasks=rows)
    trajectories = [result.trajectory for result in results]
    solved = sum(1 for t in trajectories if t.reward > 0)
    logger.info("expert_trajectories_collected", episodes=len(trajectories), solved=solved)
    return trajectories


def sft_examples(trajectories: Iterable[Trajectory], *, min_reward: float = 1.0) -> list[SFTExample]:
    """The training sequences of the expert episodes that earned at least `min_reward` and ended without an
    error (every segment)."""
    return [
        SFTExample(ids=list(segment.ids), loss_mask=list(segment.loss_mask))
        for trajectory in trajectories
        if learns_from(trajectory, min_reward=min_reward)
        for segment in trajectory.segments
    ]


def learns_from(trajectory: Trajectory, *, min_reward: float = 1.0) -> bool:
    """Whether SFT trains on an expert episode (`sft_examples`): it earned `min_reward` and answered, error-free."""
    return trajectory.reward >= min_reward and not trajectory.errors and trajectory.final_answer is not None


def sample_batch(examples: Sequence[SFTExample], batch_size: int, rng: random.Random) -> list[SFTExample]:
    """`batch_size` examples drawn without replacement (with replacement when there are fewer)."""
    if len(examples) >= batch_size:
        return rng.sample(list(examples), batch_size)
    return [rng.choice(examples) for _ in range(batch_size)]


def sft_step(model: Any, optimizer: torch.optim.Optimizer, batch: Sequence[SFTExample], *, pad_id: int) -> float:
    """One optimizer step of mean token cross-entropy over the batch's action tokens; returns the loss."""
    tokens = pad_batch([e.ids for e in batch], [e.loss_mask for e in batch], pad_id=pad_id)
    model.train()
    logprobs = token_logprobs(model, tokens, trained_only=True)
    mask = tokens.target_mask
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())
