"""Smoke mode of the compact example: an episode longer than its context, in serving and in a rollout, on CPU.

    uv run python -m examples.compact.smoke          # from the repository root

The policy plays a model that reads logbook pages one at a time and keeps a running total. It knows only what
its current context shows: the task, the summary it resumed from (if any) and the pages read since. When the
session asks for a summary it writes one line with the pages read and the total so far, and after the context
restarts from that line it carries on with the next page.

1. Serving: the episode streamed through `AgentRuntime`, as `apps/serve` streams it (`agent_event` chunks):
   tool calls, results, each compaction with its summary, the final answer and its reward.
2. Rollout: the same episode run as the training executor runs it (the recipe's context as OpenRLHF's
   ``--max-len``, logprobs on), then its trajectory: each segment's length and action ranges, and the record
   OpenRLHF trains on (`agent_train.sample_from_trajectory`: the last segment, the episode's reward).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from agent_runtime import AgentRuntime, CompactionEvent, FinalEvent, Recipe, ScriptedEngine, Trajectory, load_recipe
from agent_train import sample_from_trajectory
from examples._smoke import Prompt, describe, quiet_logs, reply, runtime_for, scripted_engine, tool_call

RECIPE_PATH: Final = Path(__file__).with_name("recipe.py")

_TASK: Final = re.compile(r"logbook '([^']+)' has (\d+) pages")
_SUMMARY: Final = re.compile(r"pages 1-(\d+) of \d+ read, crates so far (\d+)")
_CRATES: Final = re.compile(r"^Crates unloaded: (\d+)\.$", re.M)


def make_policy(instruction: str) -> Callable[[Prompt], str]:
    """The logbook reader; `instruction` is the recipe's compaction instruction (how it knows to summarize)."""

    def policy(prompt: Prompt) -> str:
        task = _TASK.search(prompt.question)
        if task is None:
            return reply("I only read harbour logbooks.", None)
        logbook, pages = task.group(1), int(task.group(2))
        read, total = 0, 0
        if prompt.summary and (resumed := _SUMMARY.search(prompt.summary)):
            read, total = int(resumed.group(1)), int(resumed.group(2))
        for result in prompt.tool_results():
            if found := _CRATES.search(result):
                read, total = read + 1, total + int(found.group(1))
        if prompt.last.role == "user" and prompt.last.body == instruction:
            return reply(f"Logbook {logbook}: pages 1-{read} of {pages} read, crates so far {total}.", None)
        if read < pages:
            return tool_call("read_page", {"logbook": logbook, "page": read + 1, "pages": pages}, None)
        return reply(f"Answer: {total}", None)

    return policy


@dataclass(frozen=True)
class SmokeResult:
    expected: str
    served_answer: str | None
    served_reward: float
    summaries: list[str]
    trajectory: Trajectory
    openrlhf_sample: dict[str, Any]
    batch_rewards: list[float]  # more episodes, concurrently
    batch_compactions: list[int]


def _engine_and_recipe() -> tuple[Recipe, ScriptedEngine]:
    recipe = load_recipe(RECIPE_PATH)
    if recipe.compaction is None:
        raise ValueError(f"recipe {recipe.name!r} does not compact")
    return recipe, scripted_engine(make_policy(recipe.compaction.instruction), logprob=-0.25)


async def run_smoke(count: int = 4, *, out: bool = True) -> SmokeResult:
    recipe, engine = _engine_and_recipe()
    rows = list(recipe.rows("test"))[:count]
    row = rows[0]
    say = print if out else (lambda _: None)

    say(f"== serving: {recipe.name}, context {recipe.max_context_tokens} tokens ==\nuser: {row['prompt']}")
    serving = runtime_for(recipe, engine)
    summaries: list[str] = []
    served_answer: str | None = None
    served_reward = 0.0
    async for event in serving.stream(row["prompt"], task=row):
        say("  " + describe(event))
        if isinstance(event, CompactionEvent):
            summaries.append(event.summary)
        if isinstance(event, FinalEvent):
            served_answer, served_reward = event.answer, event.reward

    say("== rollout: the same episode as the training executor runs it ==")
    sampling = msgspec.structs.replace(recipe.sampling, max_new_tokens=recipe.max_new_tokens)
    rollout = AgentRuntime(
        engine, recipe.make_session(), sampling=sampling, max_context_tokens=recipe.max_context_tokens
    )
    result = await rollout.run(row["prompt"], task=row)
    trajectory = result.trajectory
    for index, segment in enumerate(trajectory.segments):
        trained = sum(segment.loss_mask)
        say(f"  segment {index}: {len(segment.ids)} tokens, {trained} generated, action ranges {segment.action_ranges}")
    record = sample_from_trajectory(
        trajectory,
        prompt=row["prompt"],
        label=row["answer"],
        rewards=recipe.rewards,
        with_logprobs=True,
        truncated=False,
    )
    sample = record.to_openrlhf()
    logs = sample["extra_logs"]
    say(
        f"  OpenRLHF record: {len(sample['observation_tokens'])} tokens (the last segment), action ranges "
        f"{sample['action_ranges']}, reward {sample['reward']}, compactions {logs['agent_compactions']:.0f}, "
        f"untrained tokens of earlier segments {logs['agent_untrained_tokens']:.0f}"
    )

    batch = await runtime_for(recipe, engine).run_many([r["prompt"] for r in rows], tasks=rows)
    rewards, compactions = [b.reward for b in batch], [b.trajectory.compactions for b in batch]
    say(f"== {len(batch)} more episodes: rewards {rewards}, compactions {compactions} ==")
    return SmokeResult(
        expected=row["answer"],
        served_answer=served_answer,
        served_reward=served_reward,
        summaries=summaries,
        trajectory=trajectory,
        openrlhf_sample=sample,
        batch_rewards=rewards,
        batch_compactions=compactions,
    )


def main() -> int:
    quiet_logs()
    result = asyncio.run(run_smoke())
    ok = result.served_reward == 1.0 and len(result.trajectory.segments) >= 2 and all(result.batch_rewards)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
