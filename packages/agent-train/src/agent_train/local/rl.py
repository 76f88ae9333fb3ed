"""The RL update of the local trainer: per-episode advantages by OpenRLHF's estimators, a token-level clipped
policy-gradient loss on action tokens only, and an optional KL penalty to a frozen reference model.

    advantages = episode_advantages(records, "grpo")          # one per record, its episode's
    records, advantages = trained_records(records, advantages, mask_summaries=False, mask_overlong=True)
    stats = rl_update(model, optimizer, records, advantages, pad_id=pad, ref_model=ref, kl_coef=0.01)

Advantages (one per episode, given to each of its action tokens), named and computed as OpenRLHF 0.11.2's
`RemoteExperienceMaker.compute_advantages_and_returns` (openrlhf/trainer/ppo_utils/experience_maker.py) does for
a reward at the episode's last action token, no KL in the reward and ``gamma = 1``:

- ``reinforce`` (REINFORCE++): the reward itself, then whitened over the batch;
- ``reinforce_baseline`` (REINFORCE++-baseline): ``r - mean of its group``, then whitened over the batch;
- ``rloo``: ``r - mean of the other samples of its group`` (leave-one-out), not whitened;
- ``grpo`` (OpenRLHF's ``group_norm``): ``(r - mean of its group) / (std of its group + 1e-6)``;
- ``dr_grpo`` (Dr. GRPO): ``r - mean of its group``, not divided by any std.

"Whitened" is OpenRLHF's token-level normalization: mean and (population) variance over every action token of
the batch, so an episode weighs as many tokens as it trains (`token_counts`; one each when not given). The
group std is the unbiased one, as torch's `std`; OpenRLHF adds 1e-9 to it where this adds 1e-6 (the local
default's, kept so that the CI learning check is unchanged). OpenRLHF groups a batch by reshaping it into rows of
`n_samples_per_prompt`; here a group is the episodes that share a `group` id, of any size (a lost episode leaves
a smaller group; ``rloo`` gives a group of one a zero advantage).

A compacted episode is several records, one per segment (`agent_train.local.rollout`). Advantages are computed per
EPISODE, over the groups of episodes of each prompt (`episode_advantages`: the episode's reward, its group, and
for whitening the action tokens of all its segments), then the same advantage is given to every segment of the
episode, the summary turns included: the episode's outcome is what each of its contexts, and each summary that
carried it on, earned (ReSum-GRPO, SUPO and Context Folding broadcast the trajectory's advantage the same way,
undiscounted). The loss then averages over every trained token of all segments of a minibatch (token-mean), so
a segment weighs as many tokens as it trains; an episode of three segments weighs what its tokens weigh, as
one long sequence would. An episode that never compacted is one record whose advantage is exactly what
`group_advantages` gives it, so uncompacted training is unchanged.

`trained_records` applies the two loss masks of a compacting run: ``mask_summaries`` zeroes the summary turns'
tokens (the ablation: summaries then get no gradient), ``mask_overlong`` drops the episodes that ran out of budget
without answering (`agent_train.sample.ended_by_budget`, the episodes the OpenRLHF job masks; SUPO's overlong
masking: an episode cut off by the budget says nothing about whether its course would have worked). Both act on the
loss only; the advantages are the groups' as sampled.

DAPO's dynamic filtering is `informative_groups`: the groups whose rewards are not all equal (OpenRLHF's
`SamplesGenerator._generate_vllm` drops a prompt whose mean score is outside ``dynamic_filtering_range``,
(0, 1) by default: with 0/1 rewards, exactly the all-wrong and all-right groups); the trainer refills the batch.

Episodes whose advantage is zero carry no signal and are dropped before the forward pass. The loss is PPO's
clipped surrogate against the rollout's own logprobs (the engine's raw logprobs, as vLLM reports them), averaged
over every action token of a minibatch (OpenRLHF's ``token-mean``), plus ``kl_coef`` times the k3 estimate of
KL(policy || reference) on the same tokens. With one minibatch the ratio is 1 up to float rounding and this is
plain REINFORCE with the estimator's baseline. This module knows tensors; nothing about sessions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import msgspec
import torch

from agent_train.local.batch import pad_batch, token_logprobs, values_on_targets
from agent_train.local.config import ESTIMATORS, GROUP_ESTIMATORS, Estimator, ISMode
from agent_train.local.rollout import RolloutRecord

__all__ = ["ESTIMATORS", "GROUP_ESTIMATORS", "Estimator", "episode_advantages", "group_advantages",
           "informative_groups", "is_coefficients", "policy_loss", "rl_update", "trained_records"]  # fmt: skip

_EPS = 1e-6


def group_advantages(
    rewards: Sequence[float],
    groups: Sequence[int],
    estimator: Estimator,
    *,
    token_counts: Sequence[int] | None = None,
) -> list[float]:
    """One advantage per episode (see the module docstring); `token_counts` weigh the batch whitening of
    ``reinforce`` and ``reinforce_baseline`` (the number of action tokens of each episode)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if len(rewards) != len(groups):
        raise ValueError(f"got {len(rewards)} rewards for {len(groups)} group ids")
    weights = [1.0] * len(rewards) if token_counts is None else [float(n) for n in token_counts]
    if len(weights) != len(rewards):
        raise ValueError(f"got {len(weights)} token counts for {len(rewards)} rewards")
    members: dict[int, list[float]] = {}
    for reward, group in zip(rewards, groups, strict=True):
        members.setdefault(group, []).append(reward)
    sums = {g: sum(v) for g, v in members.items()}
    centered = [r - sums[g] / len(members[g]) for r, g in zip(rewards, groups, strict=True)]
    if estimator == "grpo":
        stds = {g: _std(v) for g, v in members.items()}
        return [c / (stds[g] + _EPS) for c, g in zip(centered, groups, strict=True)]
    if estimator == "dr_grpo":
        return centered
    if estimator == "rloo":
        return [
            r - (sums[g] - r) / (len(members[g]) - 1) if len(members[g]) > 1 else 0.0
            for r, g in zip(rewards, groups, strict=True)
        ]
    return _whiten(list(rewards) if estimator == "reinforce" else centered, weights)


def episode_advantages(records: Sequence[RolloutRecord], estimator: Estimator) -> list[float]:
    """One advantage per record: its episode's, computed by `group_advantages` over the batch's episodes (one
    reward and group each, whitening weighted by the trained action tokens of all the episode's segments)."""
    episodes: dict[int, list[RolloutRecord]] = {}
    for record in records:
        episodes.setdefault(record.episode, []).append(record)
    for segments in episodes.values():
        first = segments[0]
        if any(r.group != first.group or r.reward != first.reward for r in segments):
            raise ValueError(f"episode {first.episode}: its segments disagree on the group or the reward")
    order = list(episodes)
    advantages = group_advantages(
        [episodes[e][0].reward for e in order],
        [episodes[e][0].group for e in order],
        estimator,
        token_counts=[sum(sum(r.loss_mask) for r in episodes[e]) for e in order],
    )
    by_episode = dict(zip(order, advantages, strict=True))
    return [by_episode[record.episode] for record in records]


def trained_records(
    records: Sequence[RolloutRecord],
    advantages: Sequence[float],
    *,
    mask_summaries: bool = False,
    mask_overlong: bool = True,
) -> tuple[list[RolloutRecord], list[float]]:
    """The records and advantages the loss sees: with `mask_overlong`, the segments of episodes that ran out of
    budget without answering are left out; with `mask_summaries`, each record's summary turn has loss mask 0
    (see the module docstring)."""
    if len(records) != len(advantages):
        raise ValueError(f"got {len(advantages)} advantages for {len(records)} records")
    kept: list[RolloutRecord] = []
    kept_advantages: list[float] = []
    for record, advantage in zip(records, advantages, strict=True):
        if mask_overlong and record.overlong:
            continue
        if mask_summaries and record.summary_ranges:
            mask = list(record.loss_mask)
            for start, end in record.summary_ranges:
                mask[start:end] = [0] * (end - start)
            record = msgspec.structs.replace(record, loss_mask=mask)
        kept.append(record)
        kept_advantages.append(advantage)
    return kept, kept_advantages


def _whiten(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """OpenRLHF's batch normalization of advantages: ``(v - mean) / sqrt(max(var, 1e-8))``, the mean and the
    (population) variance taken over tokens, i.e. weighted by each episode's token count."""
    total = sum(weights)
    if total <= 0:
        return [0.0] * len(values)
    mean = sum(v * w for v, w in zip(values, weights, strict=True)) / total
    var = sum((v - mean) ** 2 * w for v, w in zip(values, weights, strict=True)) / total
    scale = 1.0 / math.sqrt(max(var, 1e-8))
    return [(v - mean) * scale for v in values]


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def informative_groups(records: Sequence[RolloutRecord]) -> list[RolloutRecord]:
    """DAPO's dynamic filtering: the records of the groups whose rewards are not all equal, in their order."""
    rewards: dict[int, set[float]] = {}
    for record in records:
        rewards.setdefault(record.group, set()).add(record.reward)
    return [record for record in records if len(rewards[record.group]) > 1]


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate plus `kl_coef` * k3 KL, averaged over the tokens where `mask` is 1.

    `logprobs`, `old_logprobs`, `ref_logprobs` and `mask` are [B, T]; `advantages` is [B]. `token_weights` ([B, T],
    no gradient): each token's surrogate is multiplied by it, as OpenRLHF's `PolicyLoss` multiplies by the IS
    coefficient (`is_coefficients`)."""
    tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    if token_weights is not None:
        surrogate = surrogate * token_weights
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


def is_coefficients(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: ISMode = "mask",
    bounds: tuple[float, float] = (0.5, 5.0),
) -> tuple[torch.Tensor, dict[str, float]]:
    """OpenRLHF 0.11.2's token-level IS correction (`PolicyLoss`, ``is_correction_level=token``, gating ``ratio``):
    the ratio ``exp(old - rollout)`` of the training policy's logprob (`old_logprobs`, computed by the model that
    trains, before its step) to the rollout's, detached; ``mask`` keeps it where it lies in `bounds` and zeroes the
    token outside (ICEPOP), ``clip`` clamps it into `bounds` (TIS). Returns the coefficients ([B, T]) and, over
    `mask`'s tokens, the ratio's mean, min and max, the fraction of tokens outside the band (``is_filtered``) and
    OpenRLHF's ``vllm_kl`` (the mean of rollout - old)."""
    low, high = bounds
    log_ratio = (old_logprobs - rollout_logprobs).detach()
    ratio = log_ratio.exp()
    outside = (ratio < low) | (ratio > high)
    coef = ratio.clamp(min=low, max=high) if mode == "clip" else torch.where(outside, 0.0, ratio)
    where = mask > 0
    tokens = where.sum().clamp(min=1)
    picked = ratio[where]
    stats = {
        "is_ratio_mean": float(picked.mean()) if picked.numel() else 1.0,
        "is_ratio_min": float(picked.min()) if picked.numel() else 1.0,
        "is_ratio_max": float(picked.max()) if picked.numel() else 1.0,
        "is_filtered": float((outside & where).sum() / tokens),
        "vllm_kl": float((-log_ratio * mask).sum() / tokens),
    }
    return coef * mask, stats


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
    is_correction: tuple[ISMode, tuple[float, float]] | None = None,
) -> dict[str, float]:
    """One pass over the episodes with a non-zero advantage, in `minibatches` optimizer steps. Returns the
    minibatch-mean of the loss statistics, plus `samples` and `tokens` trained on.

    `is_correction` (mode, bounds), for records sampled by older weights (asynchronous RL): as OpenRLHF with
    ``is_correction_level=token``, the PPO ratio is taken against the logprobs of `model` as it is before this
    update (computed for every minibatch first), and each token's surrogate is weighted by `is_coefficients` of
    those to the rollout's logprobs; the statistics then include the IS ratio's. None: the ratio is taken against
    the rollout's own logprobs, as before."""
    kept = [(r, a) for r, a in zip(records, advantages, strict=True) if abs(a) > _EPS and sum(r.loss_mask) > 0]
    if not kept:
        return {"samples": 0.0, "tokens": 0.0}
    (rng or random.Random(0)).shuffle(kept)
    chunks = [kept[i::minibatches] for i in range(minibatches) if kept[i::minibatches]]
    batches = [pad_batch([r.ids for r, _ in chunk], [r.loss_mask for r, _ in chunk], pad_id=pad_id) for chunk in chunks]
    rollout = [
        values_on_targets([r.logprobs for r, _ in chunk], batch.input_ids.shape[1])
        for chunk, batch in zip(chunks, batches, strict=True)
    ]
    proximal: list[torch.Tensor] = []
    if is_correction is not None:  # the training policy before the update: OpenRLHF's old_log_probs
        model.eval()
        with torch.no_grad():
            proximal = [token_logprobs(model, batch, trained_only=True) for batch in batches]
    totals: dict[str, float] = {}
    model.train()
    for index, (chunk, batch) in enumerate(zip(chunks, batches, strict=True)):
        old = rollout[index]
        weights: torch.Tensor | None = None
        is_stats: dict[str, float] = {}
        if is_correction is not None:
            mode, bounds = is_correction
            weights, is_stats = is_coefficients(proximal[index], old, batch.target_mask, mode=mode, bounds=bounds)
            old = proximal[index]
        adv = torch.tensor([a for _, a in chunk], dtype=torch.float32)
        ref = None
        if ref_model is not None and kl_coef > 0:
            with torch.no_grad():
                ref = token_logprobs(ref_model, batch, trained_only=True)
        logprobs = token_logprobs(model, batch, trained_only=True)
        loss, stats = policy_loss(
            logprobs,
            old,
            adv,
            batch.target_mask,
            clip_eps=clip_eps,
            ref_logprobs=ref,
            kl_coef=kl_coef,
            token_weights=weights,
        )
        stats.update(is_stats)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
        optimizer.step()
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value / len(chunks)
    totals["samples"] = float(len(kept))
    totals["tokens"] = float(sum(sum(r.loss_mask) for r, _ in kept))
    return totals
