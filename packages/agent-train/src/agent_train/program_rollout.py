"""Rollouts of an agent-program recipe (`Recipe.agent`): the program's episode through the proxy
(`agent_runtime.proxy.run_program`), as the records OpenRLHF and the local trainer train.

An agent program's episode is one or more segments: one per conversation it continued token-exactly, and a new
one at every prefix break (a rewritten history, a second conversation). They become one record each with
`segment_samples`, as a compacted episode's segments do, every one with the episode's reward, so that every
segment is trained with the episode's advantage (the segment extension under OpenRLHF, the local trainer's own
per-episode advantages).

`extra_logs` gets the program's keys (`program_log_keys`, the same for every episode of a run): requests made,
segments, history rewrites (``agent_prefix_breaks``: every reason but ``new_conversation``, which is a second
conversation, not a rewrite), whether there was one (``agent_prefix_broken``: its batch mean is the fraction of
episodes whose client rewrote its history), how many requests of each history-edit kind the episode made
(``agent_edit_<kind>``, `agent_runtime.proxy.EDIT_KINDS`: ``append``, ``reasoning_stripped``,
``last_turn_rewritten`` and the six break reasons; each kind's training rule is `EDIT_RULES`), and each
`ProgramCode` (program errors, timeouts, spent token budgets, programs that never called the model). This module
knows the proxy and the rollout records.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agent_runtime import PROGRAM_CODES, LLMEngine, ProgramTask, Recipe, SamplingParams
from agent_runtime.proxy import EDIT_KINDS, Gateway, ProgramEpisode, run_program
from agent_train.sample import RolloutSample, segment_samples
from agent_train.task import AgentTask

__all__ = ["program_log_keys", "program_logs", "program_samples"]


def program_log_keys() -> list[str]:
    """The `extra_logs` keys an agent-program episode adds, in order."""
    return [
        "agent_program_requests",
        "agent_segments",
        "agent_prefix_broken",
        "agent_prefix_breaks",
        *(f"agent_edit_{kind}" for kind in EDIT_KINDS),
        *(f"agent_program_{code}" for code in PROGRAM_CODES),
    ]


def program_logs(episode: ProgramEpisode) -> dict[str, float]:
    """The episode's numbers under `program_log_keys()`."""
    outcome = episode.outcome
    logs = dict.fromkeys(program_log_keys(), 0.0)
    logs["agent_program_requests"] = float(outcome.requests)
    logs["agent_segments"] = float(len(episode.trajectory.segments))
    rewrites = sum(1 for b in outcome.breaks if b.reason != "new_conversation")
    logs["agent_prefix_breaks"] = float(rewrites)
    logs["agent_prefix_broken"] = float(rewrites > 0)
    for kind, count in outcome.edits.items():
        logs[f"agent_edit_{kind}"] = float(count)
    if outcome.code is not None:
        logs[f"agent_program_{outcome.code}"] = 1.0
    return logs


async def program_samples(
    recipe: Recipe,
    task: AgentTask,
    engine: LLMEngine,
    *,
    prompt: Any,
    label: Any,
    sampling: SamplingParams,
    max_length: int | None,
    with_logprobs: bool,
    engine_timeout_s: float | None,
    gateway: Gateway | None = None,
) -> tuple[ProgramEpisode, list[RolloutSample]]:
    """One episode of `recipe`'s program on `task`, and its records (one per segment, in order). A command program
    reaches its endpoint through `gateway`, the rollout worker's (`WorkerGateway`)."""
    episode = await run_program(
        recipe,
        engine,
        ProgramTask(prompt=task.prompt, row=task.row),
        sampling=sampling,
        max_context_tokens=max_length,
        engine_timeout_s=engine_timeout_s,
        gateway=gateway,
    )
    samples = segment_samples(
        episode.trajectory,
        prompt=prompt,
        label=label,
        rewards=recipe.rewards,
        with_logprobs=with_logprobs,
        truncated=episode.truncated,
    )
    logs = program_logs(episode)
    return episode, [msgspec.structs.replace(s, extra_logs={**s.extra_logs, **logs}) for s in samples]
