"""`RolloutSample`: what OpenRLHF trains from one episode, built from the episode's `Trajectory`.

OpenRLHF's agent contract (`AgentExecutorBase.execute`) returns one dict per rollout: a single token sequence
(`observation_tokens`), the half-open `action_ranges` inside it (loss mask 1), one `rollout_log_probs` value per
token (0.0 outside actions; None when vLLM was not asked for logprobs), `reward` and `scores`, `truncated`, and
`extra_logs`, plus the prompt fields it echoes and, for a vision-language model, `images` (echoed) and
`mm_train_inputs` (the processor's tensors for the record's images, set by the executor, which holds the
processor). `RolloutSample` is that dict as a typed record.

Which tokens are trained: every segment, each as a record of its own (`segment_samples`). Without compaction that
is the one record of the whole episode. After a compaction, each earlier segment (ending with its summary turn)
was generated under a context that no longer exists in the next one; OpenRLHF computes every token's logprob from
the tokens before it in its sequence, so each segment is a sequence of its own, exact on its own, and every
record carries the episode's reward (the advantage is the episode's, see `segments`).
`sample_from_trajectory` is the last record alone, what plain OpenRLHF trains. `overlong` marks the records of an
episode that `ended_by_budget` (SUPO's over-long rollouts, masked from the loss by default).

`extra_logs` carries one float per key, and the keys are the same for every episode of a run (OpenRLHF stacks
each key over the batch and rejects a key that some samples lack): counts of turns, generations, tool calls,
compactions and errors by code, whether the episode gave a final answer, the action tokens of the last segment
(`agent_trained_tokens`) and of the earlier ones (`agent_untrained_tokens`: trained too where the segment
extension or the local trainer runs), each reward strategy's unweighted score, and the policy versions the
episode's tokens were sampled with (`VERSION_KEYS`: the oldest, the newest, and the staleness, the engine's version
when the record was built minus the oldest; all three -1.0 when the engine tracks no versions, since every key must
be present for every sample, and a real version or staleness is never negative). This module knows trajectories
and numbers; it runs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final, TypedDict, Unpack

import msgspec

from agent_env import RewardPipeline
from agent_protocol import TranscriptRecord
from agent_runtime import ERROR_CODES as OUTCOME_ERROR_CODES
from agent_runtime import Trajectory

__all__ = [
    "BUDGET_STOPS",
    "ERROR_CODES",
    "VERSION_KEYS",
    "RolloutSample",
    "SampleFields",
    "action_logprobs",
    "action_versions",
    "ended_by_budget",
    "extra_log_keys",
    "extra_logs",
    "mean_logs",
    "sample_from_trajectory",
    "segment_samples",
    "version_logs",
]

ERROR_CODES: Final[tuple[str, ...]] = tuple(sorted(code for code in OUTCOME_ERROR_CODES if code != "output_truncated"))
"""The error codes that get their own `agent_error_<code>` count; any other code counts as `agent_error_other`."""

BUDGET_STOPS: Final[tuple[str, ...]] = ("context_exhausted", "max_steps")
"""The stop reasons of an episode that ran out of budget (its context, its steps) instead of ending on its own."""

_COUNTS: Final = (
    "agent_turns",
    "agent_generations",
    "agent_tool_calls",
    "agent_compactions",
    "agent_final_answer",
    "agent_trained_tokens",
    "agent_untrained_tokens",
    "agent_errors",
)

VERSION_KEYS: Final[tuple[str, ...]] = ("policy_version_min", "policy_version_max", "staleness")
"""The `extra_logs` keys of an episode's policy versions (-1.0 each when untracked; see the module docstring)."""


class RolloutSample(msgspec.Struct, frozen=True, kw_only=True):
    """One OpenRLHF rollout record; `to_openrlhf()` gives OpenRLHF's dict for it. `overlong` marks a record of an
    episode that `ended_by_budget` (every segment of it); it is not part of OpenRLHF's dict."""

    prompt: Any
    label: Any
    observation_tokens: list[int]
    action_ranges: list[tuple[int, int]]
    reward: float
    scores: float
    rollout_log_probs: list[float] | None = None
    truncated: bool = False
    extra_logs: dict[str, float] = msgspec.field(default_factory=dict)
    images: Any = None
    mm_train_inputs: Any = None
    overlong: bool = False

    def to_openrlhf(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "label": self.label,
            "images": self.images,
            "mm_train_inputs": self.mm_train_inputs,
            "reward": self.reward,
            "scores": self.scores,
            "observation_tokens": list(self.observation_tokens),
            "action_ranges": [tuple(r) for r in self.action_ranges],
            "rollout_log_probs": None if self.rollout_log_probs is None else list(self.rollout_log_probs),
            "truncated": self.truncated,
            "extra_logs": dict(self.extra_logs),
        }


def _key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _reward_names(rewards: RewardPipeline | None) -> list[str]:
    if rewards is None:
        return []
    return list(dict.fromkeys([*rewards.result, *rewards.process]))


def extra_log_keys(rewards: RewardPipeline | None) -> list[str]:
    """Every key `extra_logs` has for a recipe with this reward pipeline, in order."""
    return [
        *_COUNTS,
        *(f"agent_error_{code}" for code in ERROR_CODES),
        "agent_error_other",
        *(f"agent_reward_{_key(name)}" for name in _reward_names(rewards)),
        *VERSION_KEYS,
    ]


def extra_logs(trajectory: Trajectory, rewards: RewardPipeline | None) -> dict[str, float]:
    """The episode's numbers under the fixed keys of `extra_log_keys(rewards)`."""
    *earlier, last = trajectory.segments
    logs: dict[str, float] = dict.fromkeys(extra_log_keys(rewards), 0.0)
    logs["agent_turns"] = float(trajectory.turns)
    logs["agent_generations"] = float(trajectory.usage.generations)
    logs["agent_tool_calls"] = float(trajectory.tool_calls)
    logs["agent_compactions"] = float(trajectory.compactions)
    logs["agent_final_answer"] = float(trajectory.final_answer is not None)
    logs["agent_trained_tokens"] = float(sum(last.loss_mask))
    logs["agent_untrained_tokens"] = float(sum(sum(s.loss_mask) for s in earlier))
    logs["agent_errors"] = float(len(trajectory.errors))
    for error in trajectory.errors:
        key = f"agent_error_{error.code}" if error.code in ERROR_CODES else "agent_error_other"
        logs[key] += 1.0
    breakdown = trajectory.breakdown
    if breakdown is not None:
        for name in _reward_names(rewards):
            score = breakdown.result.get(name, breakdown.process.get(name, 0.0))
            logs[f"agent_reward_{_key(name)}"] = float(score)
    logs.update(version_logs(trajectory))
    return logs


def version_logs(trajectory: Trajectory) -> dict[str, float]:
    """The episode's `VERSION_KEYS`: its oldest and newest token's policy version and its staleness; -1.0 for what
    is unknown (an engine that tracks no versions; a staleness without the engine's current version)."""
    versions, staleness = trajectory.policy_versions, trajectory.staleness
    return {
        "policy_version_min": float(versions[0]) if versions else -1.0,
        "policy_version_max": float(versions[-1]) if versions else -1.0,
        "staleness": float(staleness) if staleness is not None else -1.0,
    }


def ended_by_budget(trajectory: Trajectory, *, truncated: bool) -> bool:
    """Whether the episode ran out of budget without answering: it stopped for one of `BUDGET_STOPS`, or its last
    turn was cut by the length limit, and it gave no final answer. The one definition of an "overlong" episode:
    SUPO's over-long rollouts (and DAPO's truncated ones), which the OpenRLHF segment extension
    (`RolloutSample.overlong`, ``agent_overlong``) and the local trainer (`RolloutRecord.overlong`) leave out of
    the loss unless told not to; its reward still counts in its group's baseline. An episode that answered is
    never overlong, whatever budget it used."""
    if trajectory.final_answer is not None:
        return False
    return trajectory.stop_reason in BUDGET_STOPS or truncated


class SampleFields(TypedDict):
    """What a record needs beside the trajectory (`segment_samples`' keywords)."""

    prompt: Any
    label: Any
    rewards: RewardPipeline | None
    with_logprobs: bool
    truncated: bool


def sample_from_trajectory(trajectory: Trajectory, **fields: Unpack[SampleFields]) -> RolloutSample:
    """The OpenRLHF record of an episode: its last segment's tokens and actions, the episode's reward (the last of
    `segment_samples`, which says what the keywords are).

    With `with_logprobs`, every action token must carry the logprob the engine reported (0.0 stands in for one
    it did not report) and every other token gets 0.0, as OpenRLHF's own executors do."""
    return segment_samples(trajectory, **fields)[-1]


def segment_samples(
    trajectory: Trajectory,
    *,
    prompt: Any,
    label: Any,
    rewards: RewardPipeline | None,
    with_logprobs: bool,
    truncated: bool,
) -> list[RolloutSample]:
    """One record per segment of the episode, in order, each with the episode's reward and `extra_logs`: a
    compacted episode's earlier segments (each ending with its summary turn) as well as its last. Each is exact on
    its own, its tokens sampled under exactly the context it holds. Without compaction this is the one record of
    `sample_from_trajectory`."""
    logs = extra_logs(trajectory, rewards)
    return [
        _record(trajectory, segment, prompt, label, logs, with_logprobs, truncated) for segment in trajectory.segments
    ]


def action_logprobs(segment: TranscriptRecord) -> list[float]:
    """One logprob per token of `segment`: the engine's for an action token (0.0 where it reported none), 0.0 for
    every other token, as OpenRLHF's own executors give `rollout_log_probs`."""
    return [
        float(lp) if mask and lp is not None else 0.0
        for lp, mask in zip(segment.logprobs, segment.loss_mask, strict=True)
    ]


def action_versions(segment: TranscriptRecord) -> list[int]:
    """One policy version per token of `segment`: its action span's for an action token, -1 for every other token
    and for an action token whose engine tracked none (as `action_logprobs` puts 0.0 where there is no logprob)."""
    versions = [-1] * len(segment.ids)
    for span in segment.spans:
        if span.kind == "action" and span.version is not None:
            versions[span.start : span.end] = [span.version] * (span.end - span.start)
    return versions


def _record(
    trajectory: Trajectory,
    segment: TranscriptRecord,
    prompt: Any,
    label: Any,
    logs: dict[str, float],
    with_logprobs: bool,
    truncated: bool,
) -> RolloutSample:
    log_probs = action_logprobs(segment) if with_logprobs else None
    reward = float(trajectory.reward)
    return RolloutSample(
        prompt=prompt,
        label=label,
        observation_tokens=list(segment.ids),
        action_ranges=list(segment.action_ranges),
        reward=reward,
        scores=reward,
        rollout_log_probs=log_probs,
        truncated=truncated,
        extra_logs=dict(logs),
        overlong=ended_by_budget(trajectory, truncated=truncated),
    )


def mean_logs(samples: Iterable[RolloutSample]) -> dict[str, float]:
    """The per-key mean of the samples' `extra_logs` (what OpenRLHF logs for a batch)."""
    totals: dict[str, float] = {}
    count = 0
    for sample in samples:
        count += 1
        for key, value in sample.extra_logs.items():
            totals[key] = totals.get(key, 0.0) + value
    return {key: value / count for key, value in totals.items()} if count else {}
