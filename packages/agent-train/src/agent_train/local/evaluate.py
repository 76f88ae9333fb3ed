"""Held-out evaluation: greedy episodes of the recipe against an engine, summarized as success rate and friends.

    result = await evaluate(engine, recipe, rows)      # AgentRuntime, temperature 0
    result.success                                     # fraction of episodes with reward >= 1
    success_by(trajectories, rows, "phrasing")         # {"plain": 0.88, "word": 0.88}

From a shell, for any saved demo model (the SFT model and the final one of a run, say):

    uv run python -m agent_train.local.evaluate runs/demo/final [--size 200]

Evaluation runs the agent the way `apps/serve` does (an `AgentRuntime` over the recipe's session), so the number
is what a user of the served model would see. All episodes are started at once; the engine batches them. This
module knows runtimes and trajectories (and, in `main`, the demo recipe); it knows nothing about training. It
configures no logging: only run as a module (the ``__main__`` block, an entry point) does it quiet the episodes'
log lines and transformers' progress bars.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import msgspec.structs

from agent_runtime import AgentRuntime, LLMEngine, Recipe, Trajectory, ignore_pynvml_deprecation
from agent_train.local.lockstep import LockstepEngine, as_episode

__all__ = ["EvalResult", "evaluate", "main", "success_by", "summarize"]


class EvalResult(msgspec.Struct, frozen=True, kw_only=True):
    """Held-out figures: `success` (reward >= 1), mean reward, and how episodes went (tool use, answers)."""

    episodes: int
    success: float
    mean_reward: float
    tool_call_rate: float  # fraction of episodes with at least one tool call
    answer_rate: float  # fraction of episodes that ended with a final answer
    mean_turns: float
    mean_completion_tokens: float


def summarize(trajectories: Sequence[Trajectory]) -> EvalResult:
    n = len(trajectories)
    if n == 0:
        raise ValueError("cannot summarize zero episodes")
    return EvalResult(
        episodes=n,
        success=sum(t.reward >= 1.0 for t in trajectories) / n,
        mean_reward=sum(t.reward for t in trajectories) / n,
        tool_call_rate=sum(t.tool_calls > 0 for t in trajectories) / n,
        answer_rate=sum(t.final_answer is not None for t in trajectories) / n,
        mean_turns=sum(t.turns for t in trajectories) / n,
        mean_completion_tokens=sum(t.usage.completion_tokens for t in trajectories) / n,
    )


async def evaluate(
    engine: LLMEngine, recipe: Recipe, rows: Sequence[Mapping[str, Any]]
) -> tuple[EvalResult, list[Trajectory]]:
    """Greedy episodes on `rows` (each with "prompt" and a reference answer); the summary and the trajectories."""
    sampling = msgspec.structs.replace(recipe.sampling, temperature=0.0, logprobs=False, seed=None)
    runtime = AgentRuntime(engine, recipe.make_session(engine.tokenizer), sampling=sampling)
    # one episode per row; on a `LockstepEngine` (the local trainer's) in lockstep, so the figures never depend on
    # the timing of threads; `run_many` of one row records an episode's failure as `run_many` of all of them does
    jobs = [as_episode(engine, runtime.run_many([row["prompt"]], tasks=[row])) for row in rows]
    results = [result for (result,) in await asyncio.gather(*jobs)]
    trajectories = [result.trajectory for result in results]
    return summarize(trajectories), trajectories


def success_by(trajectories: Sequence[Trajectory], rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, float]:
    """Success rate per value of `rows[i][key]` (rows without the key count under ``"?"``)."""
    groups: dict[str, list[bool]] = {}
    for trajectory, row in zip(trajectories, rows, strict=True):
        groups.setdefault(str(row.get(key, "?")), []).append(trajectory.reward >= 1.0)
    return {name: sum(hits) / len(hits) for name, hits in sorted(groups.items())}


def main(argv: Sequence[str] | None = None) -> int:
    """Held-out success of a saved demo model, overall and by phrasing (plain / word problems)."""
    import argparse

    ignore_pynvml_deprecation()
    from agent_demo import make_recipe
    from agent_runtime.engines import HFEngine

    parser = argparse.ArgumentParser(
        prog="python -m agent_train.local.evaluate", description=main.__doc__.splitlines()[0] if main.__doc__ else None
    )
    parser.add_argument("model_dir", help="a demo model directory (runs/demo/final, runs/demo/sft, ...)")
    parser.add_argument("--size", type=int, default=200, help="held-out problems, the first N (default: 200)")
    args = parser.parse_args(argv)
    from agent_train.demo.model import is_model_dir

    if not is_model_dir(args.model_dir):
        parser.error(f"{args.model_dir} is not a model directory (no config.json, model.safetensors, ...)")
    recipe = make_recipe()
    rows = list(recipe.rows("test"))[: args.size]

    async def run() -> tuple[EvalResult, list[Trajectory]]:
        engine = LockstepEngine(HFEngine.from_pretrained(args.model_dir))
        try:
            return await evaluate(engine, recipe, rows)
        finally:
            await engine.close()

    result, trajectories = asyncio.run(run())
    groups = ", ".join(f"{name} {rate:.1%}" for name, rate in success_by(trajectories, rows, "phrasing").items())
    print(f"held-out success ({result.episodes} problems, greedy): {result.success:.1%} ({groups})")
    return 0


if __name__ == "__main__":
    import logging
    import sys

    import structlog
    from transformers.utils import logging as hf_logging

    # the entry point: every episode logs at info level, and 200 of them would bury the one line this prints
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    sys.exit(main())
