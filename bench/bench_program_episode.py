"""What an agent program's episode costs through the proxy: `AgentExecutor.rollout` of the example calculator agent
(two requests) on a `ScriptedEngine` replaying real Qwen3 ids with no delay, so that the figure is the proxy's own
work (the endpoint, the app, the records and, since each program got a thread of its own, the thread, its event
loop and two hand-offs per request).

    uv run python bench/bench_program_episode.py [--episodes 64] [--rounds 5]

Prints the milliseconds per episode of each round (`--episodes` run at once) and the best. Run it on two commits
side by side (PYTHONPATH pointing at the other tree's packages) for a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import time
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolCallReward
    from agent_protocol import HFTokenizer
    from agent_runtime import ScriptedEngine
    from agent_runtime.agent_program import AgentProgram
    from agent_runtime.recipe import Recipe
    from agent_train.openrlhf.executor import AgentExecutor
    from agent_train.task import encode_task
    from examples.any_agent.agent import calculator_agent
    from tests.support.calculator_policy import calculator_policy

    tokenizer = HFTokenizer.from_file(ROOT / ".cache" / "qwen3-tokenizer" / "tokenizer.json")
    recipe = Recipe(
        name="calc",
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
        rewards=RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()]),
        max_new_tokens=64,
    )
    executor = AgentExecutor(dataclasses.replace(recipe, agent=AgentProgram(calculator_agent)))
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))
    task = encode_task({"prompt": "What is 17 * 23?", "answer": "391"})

    async def batch() -> float:
        started = time.perf_counter()
        outs = await asyncio.gather(*(executor.rollout(task, "391", engine) for _ in range(args.episodes)))
        elapsed = time.perf_counter() - started
        assert all(o.sample.reward > 1.0 for o in outs)
        return elapsed

    asyncio.run(batch())  # warm-up: imports, caches
    per_episode = []
    for _ in range(args.rounds):
        per_episode.append(asyncio.run(batch()) / args.episodes * 1000)
        print(f"{per_episode[-1]:.2f} ms per episode ({args.episodes} at once)", flush=True)
    print(f"best {min(per_episode):.2f} ms per episode")


if __name__ == "__main__":
    main()
