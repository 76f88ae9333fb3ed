"""The RL update of the local trainer: group-normalized advantages and a token-level clipped policy-gradient loss
on action tokens only, with an optional KL penalty to a frozen reference model.

    advantages = group_advantages([r.reward for r in records], [r.group for r in records], "grpo")
    stats = rl_update(model, optimizer, records, advantages, pad_id=pad, ref_model=ref, kl_coef=0.01)

Advantages (one per episode, given to each of its action tokens), the two estimators of OpenRLHF's presets:

- ``grpo`` (OpenRLHF's ``group_norm``): ``(r - mean of its group) / (std of its group + 1e-6)``;
- ``reinforce_baseline`` (REINFORCE++-baseline): ``r - mean of its group``, divided by the batch's std.

Episodes whose advantage is zero (a group where every sample scored the same) carry no signal and are dropped
before the forward pass. The loss is PPO's clipped surrogate against the rollout's own logprobs (the engine's
raw logprobs, as vLLM reports them), averaged over every action token of a minibatch, plus ``kl_coef`` times the
k3 estimate of KL(policy || reference) on the same tokens. With one minibatch the ratio is 1 up to float
rounding and this is plain REINFORCE with a group baseline. This module knows tensors; nothing about sessions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, Literal

import torch

from agent_train.local.batch import pad_batch, token_logprobs, values_on_targets
from agent_train.local.rollout import RolloutRecord

__all__ = ["Estimator", "group_advantages", "policy_loss", "rl_update"]

Estimator = Literal["grpo", "reinforce_baseline"]
_EPS = 1e-6


def group_advantages(rewards: Sequence[float], groups: Sequence[int], estimator: Estimator) -> list[float]:
    """One advantage per episode (see the module docstring)."""
    if len(rewards) != len(groups):
        raise ValueError(f"got {len(rewards)} rewards for {len(groups)} group ids")
    members: dict[int, list[float]] = {}
    for reward, group in zip(rewards, groups, strict=True):
        members.setdefault(group, []).append(reward)
    means = {g: sum(v) / len(v) for g, v in members.items()}
    centered = [r - means[g] for r, g in zip(rewards, groups, strict=True)]
    if estimator == "grpo":
        stds = {g: _std(v) for g, v in members.items()}
        return [c / (stds[g] + _EPS) for c, g in zip(centered, groups, strict=True)]
    if estimator == "reinforce_baseline":
        scale = _std(centered)
        return [c / (scale + _EPS) for c in centered]
    raise ValueError(f"unknown advantage estimator {estimator!r}; use 'grpo' or 'reinforce_baseline'")


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate plus `kl_coef` * k3 KL, averaged over the tokens where `mask` is 1.

    `logprobs`, `old_logprobs`, `ref_logprobs` and `mask` are [B, T]; `advantages` is [B]."""
    tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    pg = -(surrogate * mask).sum() / tokens
    loss = pg
    stats = {
        "pg_loss": float(pg.detach()),
        "clip_frac": float((((ratio - 1.0).abs() > clip_eps).float() * mask).sum() / tokens),
        "ratio_max": float((ratio * mask).max().detach()) if mask.any() else 1.0,
    }
    if ref_logprobs is not None and kl_coef > 0:
        log_ratio = ref_logprobs - logprobs
        kl = ((torch.exp(log_ratio) - log_ratio - 1.0) * mask).sum() / tokens
        loss = loss + kl_coef * kl
        stats["kl"] = float(kl.detach())
    stats["loss"] = float(loss.detach())
    return loss, stats


def rl_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    records: Sequence[RolloutRecord],
    advantages: Sequence[float],
    *,
    pad_id: int,
    ref_model: Any | None = None,
    kl_coef: float = 0.0,
    clip_eps: float = 0.2,
    minibatches: int = 1,
    max_grad_norm: float = 1.0,
    rng: random.Random | None = None,
) -> dict[str, float]:
    """One pass over the episodes with a non-zero advantage, in `minibatches` optimizer steps. Returns the
    minibatch-mean of the loss statistics, plus `samples` and `tokens` trained on."""
    kept = [(r, a) for r, a in zip(records, advantages, strict=True) if abs(a) > _EPS and sum(r.loss_mask) > 0]
    if not kept:
        return {"samples": 0.0, "tokens": 0.0}
    (rng or random.Random(0)).shuffle(kept)
    chunks = [kept[i::minibatches] for i in range(minibatches) if kept[i::minibatches]]
    totals: dict[str, float] = {}
    model.train()
    for chunk in chunks:
        batch = pad_batch([r.ids for r, _ in chunk], [r.loss_mask for r, _ in chunk], pad_id=pad_id)
        width = batch.input_ids.shape[1]
        old = values_on_targets([r.logprobs for r, _ in chunk], width)
        adv = torch.tensor([a for _, a in chunk], dtype=torch.float32)
        ref = None
        if ref_model is not None and kl_coef > 0:
            with torch.no_grad():
                ref = token_logprobs(ref_model, batch)
        logprobs = token_logprobs(model, batch)
        loss, stats = policy_loss(
            logprobs, old, adv, batch.target_mask, clip_eps=clip_eps, ref_logprobs=ref, kl_coef=kl_coef
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
        optimizer.step()
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value / len(chunks)
    totals["samples"] = float(len(kept))
    totals["tokens"] = float(sum(sum(r.loss_mask) for r, _ in kept))
    return totals
