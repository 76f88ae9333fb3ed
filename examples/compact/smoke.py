"""Smoke mode of the compact example: an episode longer than its context, served over HTTP and rolled out by
OpenRLHF's executor, on CPU.

    uv run python -m examples.compact.smoke          # from the repository root

The policy plays a model that reads logbook pages one at a time and keeps a running total. It knows only what
its current context shows: the task, the summary it resumed from (if any) and the pages read since. When the
session asks for a summary it writes one line with the pages read and the total so far, and after the context
restarts from that line it carries on with the next page.

1. Serving: the real server (`agent_runtime.serving.create_app`, uvicorn on a free loopback port in a background
   thread) and the official `openai` client in agent mode (no `tools` in the request), streaming: each runtime
   event arrives as an `agent_event` chunk (tool calls, tool results, each compaction with its summary, the final
   event), the answer as an ordinary content delta. Then the trajectory the server logged
   (`ServeConfig.trajectory_log`): one segment per context. A live request carries no reference answer, so the
   server's own reward for it is 0.0 (the exact-match reward has nothing to match); the smoke scores the served
   answer against the row's reference with the recipe's rewards, as a training rollout would have.
2. Rollout: the same episode through OpenRLHF's executor, `AgentExecutor.execute(...)`, called the way an
   OpenRLHF rollout actor calls it (the encoded dataset row, vLLM's own `SamplingParams`, the recipe's context as
   ``--max-len``, a transformers tokenizer, and `LocalRolloutEngine` answering with vLLM's own `RequestOutput`),
   and the dict OpenRLHF trains on: the last segment, the episode's reward. `AgentExecutor.rollout(...)` (the
   local trainer's entry) gives the whole trajectory, to compare with the server's segment by segment.
3. A batch of more episodes in process (`AgentRuntime.run_many`), concurrently.

`main()` exits 1 unless every episode is right and the executor's token streams equal the server's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from openai import AsyncOpenAI

from agent_env import EpisodeRecord
from agent_runtime import (
    CompactionEvent,
    CompactionPolicy,
    FinalEvent,
    Recipe,
    ScriptedEngine,
    Trajectory,
    load_recipe,
    read_trajectories,
)
from agent_runtime.serving import AGENT_EVENT_FIELD, ServeConfig, create_app
from examples._smoke import (
    LiveServer,
    Prompt,
    describe,
    event_from_wire,
    quiet_logs,
    qwen3_tokenizer_file,
    reply,
    runtime_for,
    scripted_engine,
    tool_call,
)

RECIPE_PATH: Final = Path(__file__).with_name("recipe.py")

_TASK: Final = re.compile(r"logbook '([^']+)' has (\d+) pages")
_SUMMARY: Final = re.compile(r"pages 1-(\d+) of \d+ read, crates so far (\d+)")
_CRATES: Final = re.compile(r"^Crates unloaded: (\d+)\.$", re.M)
_LOG_WAIT_S: Final = 10.0


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


def token_streams(trajectory: Trajectory) -> list[tuple[list[int], list[int]]]:
    """Each segment's token ids and loss mask: what training = inference promises are equal."""
    return [(segment.ids, segment.loss_mask) for segment in trajectory.segments]


@dataclass(frozen=True)
class Served:
    """The episode as the `openai` client saw it stream, and as the server logged it."""

    lines: list[str]  # each agent_event chunk, described, in arrival order
    event_types: list[str]  # each agent_event chunk's "type"
    summaries: list[str]  # the compaction events' summaries
    answer: str  # the content deltas, joined
    finish_reason: str | None
    reward: float | None  # the final event's (0.0: the request carries no reference answer)
    scored: float  # the served answer scored against the row's reference with the recipe's rewards
    trajectory: Trajectory  # the server's trajectory log record


@dataclass(frozen=True)
class Executed:
    """The episode through OpenRLHF's executor: the dict `execute` returns, and `rollout`'s whole trajectory."""

    sample: dict[str, Any]
    trajectory: Trajectory
    rollout_engine_calls: int  # generate calls LocalRolloutEngine answered (one per turn, summaries included)


@dataclass(frozen=True)
class SmokeResult:
    expected: str
    served: Served
    executed: Executed
    batch_rewards: list[float]  # more episodes, concurrently, in process
    batch_compactions: list[int]

    @property
    def ok(self) -> bool:
        """Every episode right, and the executor's token streams the server's."""
        served, sample = self.served, self.executed.sample
        last = served.trajectory.segments[-1]
        return (
            served.scored == 1.0
            and served.answer == f"Answer: {self.expected}"
            and len(served.trajectory.segments) >= 2
            and sample["reward"] == 1.0
            and sample["observation_tokens"] == last.ids
            and token_streams(self.executed.trajectory) == token_streams(served.trajectory)
            and all(r == 1.0 for r in self.batch_rewards)
        )


def _engine_and_recipe() -> tuple[Recipe, Callable[[], ScriptedEngine]]:
    """The recipe, and a maker of engines that all play the same policy (one engine per path)."""
    recipe = load_recipe(RECIPE_PATH)
    if not isinstance(recipe.context, CompactionPolicy):
        raise ValueError(f"recipe {recipe.name!r} does not compact")
    policy = make_policy(recipe.context.instruction_text)
    return recipe, lambda: scripted_engine(policy, logprob=-0.25)


async def _logged(path: Path) -> Trajectory:
    """The one record the server writes for the episode. The stream's last frame can reach the client just before
    the server records the episode, so wait for it (a few milliseconds)."""
    deadline = time.monotonic() + _LOG_WAIT_S
    while True:
        records = list(read_trajectories(path)) if path.exists() else []
        if records:
            if len(records) != 1:
                raise RuntimeError(f"{path}: expected one trajectory, the server logged {len(records)}")
            return records[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path}: the server logged no trajectory within {_LOG_WAIT_S:.0f} s")
        await asyncio.sleep(0.01)


async def _score(recipe: Recipe, answer: str, reference: str) -> float:
    if recipe.rewards is None:
        raise ValueError(f"recipe {recipe.name!r} has no rewards")
    return (await recipe.rewards.score(EpisodeRecord(final_answer=answer, references=(reference,)))).total


async def serve_episode(
    recipe: Recipe, engine: ScriptedEngine, row: dict[str, Any], log: Path, say: Callable[[str], None]
) -> Served:
    """One agent-mode request to the real server, streamed through the official `openai` client."""
    app = create_app(engine, recipe, ServeConfig(model_name=recipe.name, trajectory_log=str(log)))
    lines: list[str] = []
    types: list[str] = []
    summaries: list[str] = []
    answer: list[str] = []
    finish: str | None = None
    reward: float | None = None
    with LiveServer(app) as server:
        say(f"  (server on {server.url}, model {recipe.name!r})")
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
            stream = await client.chat.completions.create(
                model=recipe.name,
                messages=[{"role": "user", "content": row["prompt"]}],
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                wire = (chunk.model_extra or {}).get(AGENT_EVENT_FIELD)
                if wire is not None:  # a runtime event: no choices, the event in `agent_event`
                    event = event_from_wire(wire)
                    types.append(wire["type"])
                    lines.append(describe(event))
                    say("  agent_event " + lines[-1])
                    if isinstance(event, CompactionEvent):
                        summaries.append(event.summary)
                    elif isinstance(event, FinalEvent):
                        reward = event.reward
                for choice in chunk.choices:
                    answer.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
                if chunk.usage is not None:
                    say(
                        f"  usage: {chunk.usage.prompt_tokens} prompt + {chunk.usage.completion_tokens} completion "
                        "tokens, over every context"
                    )
        say(f"  content: {''.join(answer)!r}, finish_reason {finish!r}")
        trajectory = await _logged(log)
    scored = await _score(recipe, "".join(answer), row["answer"])
    say(
        f"  the request carried no reference answer, so the server's reward is {reward}; the served answer "
        f"scored against the row's reference ({row['answer']}) with the recipe's rewards: {scored}"
    )
    say(
        f"  the server's trajectory log: {len(trajectory.segments)} segments (one per context), "
        f"{trajectory.compactions} compactions, stop {trajectory.stop_reason}, reward {trajectory.reward}"
    )
    for index, segment in enumerate(trajectory.segments):
        trained = sum(segment.loss_mask)
        ranges = segment.action_ranges
        say(f"    segment {index}: {len(segment.ids)} tokens, {trained} generated, action ranges {ranges}")
    return Served(
        lines=lines,
        event_types=types,
        summaries=summaries,
        answer="".join(answer),
        finish_reason=finish,
        reward=reward,
        scored=scored,
        trajectory=trajectory,
    )


async def execute_episode(recipe: Recipe, make_engine: Callable[[], ScriptedEngine], row: dict[str, Any]) -> Executed:
    """The episode as an OpenRLHF rollout actor runs it, and the same through `rollout` for the whole trajectory.
    Imported here: the executor brings OpenRLHF, torch and vLLM, which only this path needs."""
    from transformers import PreTrainedTokenizerFast
    from vllm import SamplingParams as VLLMSamplingParams

    from agent_train.openrlhf.executor import AgentExecutor
    from agent_train.task import encode_task, label_of
    from tests.support.local_rollout_engine import LocalRolloutEngine

    if recipe.max_context_tokens is None:
        raise ValueError(f"recipe {recipe.name!r} sets no max_context_tokens (what --max-len defaults to)")
    max_length = recipe.max_context_tokens  # OpenRLHF's --max-len; apps/train defaults it to the recipe's context
    params = VLLMSamplingParams(  # as OpenRLHF's SamplesGenerator makes them, logprobs on
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_tokens=recipe.max_new_tokens,
        min_tokens=1,
        skip_special_tokens=False,
        logprobs=1,
    )
    # what OpenRLHF passes: the model's transformers tokenizer (untyped)
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(qwen3_tokenizer_file()))  # type: ignore[no-untyped-call]
    executor = AgentExecutor(recipe)
    rollout_engine = LocalRolloutEngine(make_engine())
    sample = await executor.execute(encode_task(row), label_of(row), params, max_length, hf_tokenizer, rollout_engine)
    rollout = await executor.rollout(
        encode_task(row), label_of(row), make_engine(), max_length=max_length, with_logprobs=True
    )
    return Executed(sample=sample, trajectory=rollout.trajectory, rollout_engine_calls=rollout_engine.calls)


async def run_smoke(count: int = 4, *, out: bool = True) -> SmokeResult:
    recipe, make_engine = _engine_and_recipe()
    rows = list(recipe.rows("test"))[:count]
    row = rows[0]
    say: Callable[[str], None] = print if out else (lambda _: None)

    say(f"== serving: {recipe.name} over HTTP, context {recipe.max_context_tokens} tokens ==\nuser: {row['prompt']}")
    with tempfile.TemporaryDirectory(prefix="compact-smoke-") as scratch:
        served = await serve_episode(recipe, make_engine(), row, Path(scratch) / "trajectories.jsonl", say)

    say("== rollout: the same episode through OpenRLHF's executor (AgentExecutor.execute) ==")
    executed = await execute_episode(recipe, make_engine, row)
    sample, logs = executed.sample, executed.sample["extra_logs"]
    say(
        f"  OpenRLHF record: observation_tokens {len(sample['observation_tokens'])} (the last segment), "
        f"action_ranges {sample['action_ranges']}, reward {sample['reward']}, "
        f"rollout_log_probs {len(sample['rollout_log_probs'] or [])}, truncated {sample['truncated']}"
    )
    say(
        f"  extra_logs: agent_compactions {logs['agent_compactions']:.0f}, agent_untrained_tokens "
        f"{logs['agent_untrained_tokens']:.0f} (earlier segments' generated tokens), "
        f"{executed.rollout_engine_calls} generate calls to the rollout engine"
    )
    same_last = sample["observation_tokens"] == served.trajectory.segments[-1].ids
    same_all = token_streams(executed.trajectory) == token_streams(served.trajectory)
    say(f"  observation_tokens == the server's last segment: {same_last}")
    segments = len(executed.trajectory.segments)
    say(f"  AgentExecutor.rollout: {segments} segments, ids and loss masks == the server's: {same_all}")

    batch = await runtime_for(recipe, make_engine()).run_many([r["prompt"] for r in rows], tasks=rows)
    rewards, compactions = [b.reward for b in batch], [b.trajectory.compactions for b in batch]
    say(f"== {len(batch)} more episodes in process (AgentRuntime.run_many) ==")
    say(f"  rewards {rewards}, compactions {compactions}")
    return SmokeResult(
        expected=row["answer"],
        served=served,
        executed=executed,
        batch_rewards=rewards,
        batch_compactions=compactions,
    )


def _quiet_executor_imports() -> None:
    """The executor imports OpenRLHF, torch and vLLM, which announce on import that this machine has no GPU (and
    OpenRLHF that one of its regexes has an invalid escape)."""
    from agent_runtime.torch_warnings import ignore_pynvml_deprecation

    ignore_pynvml_deprecation()
    warnings.filterwarnings("ignore", message=r"invalid escape sequence", category=SyntaxWarning)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def main() -> int:
    quiet_logs()
    _quiet_executor_imports()
    result = asyncio.run(run_smoke())
    if not result.ok:
        print("FAILED: an episode went wrong or the executor's tokens differ from the server's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
