"""How much the runtime costs per step, with no model time: 1,000 concurrent episodes on the scripted engine.

Each episode asks a calculator question; the scripted engine answers with real Qwen3 token ids (three tool calls,
then a final answer), so every step does the full work of a live one: append the generated ids, decode and parse
them, run the calculator tool through the environment, score the step, render the feedback and tokenize it alone.

The floor, measured in the same run on the same feedback texts, is tokenizing the feedback delta alone, which is
the least any token-in-token-out loop must do per step. Reported: steps/s, time per step, and the ratio of the
runtime's per-step cost to that floor.

    uv run python bench/bench_runtime.py [--episodes 1000] [--calls 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline  # noqa: E402
from agent_protocol import HFTokenizer, get_protocol  # noqa: E402
from agent_runtime import AgentRuntime, AgentSession, ScriptedEngine  # noqa: E402
from tests.support.qwen3_tokenizer import qwen3_tokenizer_path  # noqa: E402

TOOL_RESPONSE = 151665  # <tool_response>


def build(tokenizer: HFTokenizer, calls: int) -> tuple[AgentRuntime, list[str]]:
    protocol = get_protocol("qwen3")
    call_ids = [
        tokenizer.encode(
            protocol.render_generation(
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": f"Step {k}: compute with the tool.",
                    "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": f"{k} * 17 + 4"}}}],
                }
            )
        )
        for k in range(calls)
    ]
    answer_ids = tokenizer.encode(
        protocol.render_generation({"role": "assistant", "content": "The answer is 55.", "reasoning_content": "Done."})
    )

    def policy(prompt_ids: list[int]) -> list[int]:
        done = prompt_ids.count(TOOL_RESPONSE)
        return call_ids[done] if done < calls else answer_ids

    engine = ScriptedEngine(tokenizer, policy=policy)
    calculator = CalculatorTool()  # tools are read-only and shared; each episode gets its own environment
    session = AgentSession(
        protocol=protocol,
        environment=lambda: FunctionCallEnvironment(tools=[calculator], max_steps=calls + 2),
        rewards=RewardPipeline(result=[MatchingReward()]),
    )
    feedback = [protocol.render_feedback([{"role": "tool", "content": str(k * 17 + 4)}]) for k in range(calls)]
    return AgentRuntime(engine, session), feedback


def run(episodes: int, calls: int) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # warnings off the hot path
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_path())
    runtime, feedback = build(tokenizer, calls)
    prompts = [f"What is {i} * 17 + 4, three times over?" for i in range(episodes)]

    asyncio.run(runtime.run_many(prompts[:10]))  # warm up
    t0 = time.perf_counter()
    results = asyncio.run(runtime.run_many(prompts, tasks=[{"answer": "55"}] * episodes))
    wall = time.perf_counter() - t0
    steps = sum(r.trajectory.turns for r in results)
    assert all(r.stop_reason == "final_answer" for r in results), "every episode must finish normally"

    # The floor: tokenizing the same feedback deltas alone, as many times as the run did.
    t0 = time.perf_counter()
    for _ in range(episodes):
        for text in feedback:
            tokenizer.encode(text)
    floor = time.perf_counter() - t0
    tool_steps = episodes * calls
    return {
        "episodes": episodes,
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "us_per_step": wall / steps * 1e6,
        "floor_us_per_feedback": floor / tool_steps * 1e6,
        "ratio_step_over_floor": (wall / steps) / (floor / tool_steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000, help="concurrent episodes (default 1000)")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per episode before the answer (default 3)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    result = run(args.episodes, args.calls)
    print(
        f"{result['episodes']} concurrent episodes, {result['steps']} steps in {result['wall_s']:.2f} s: "
        f"{result['steps_per_s']:.0f} steps/s, {result['us_per_step']:.0f} us per step; "
        f"floor (tokenize the feedback delta alone) {result['floor_us_per_feedback']:.0f} us; "
        f"step / floor = {result['ratio_step_over_floor']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
