"""How much the runtime costs per step, with no model time: 1,000 concurrent episodes on a replay engine, this tree
side by side with a baseline commit, interleaved in one run.

Each episode asks a calculator question; the engine answers with real Qwen3 token ids (three tool calls, then a
final answer), so every step does the full work of a live one: append the generated ids, read them (decode or the
engine's text) and parse them, run the calculator tool through the environment, score the step, render the
feedback and tokenize it alone. Per step = the run's wall time (prompts rendered and tokenized included) over its
steps.

The floor is tokenizing the same feedback deltas alone, as many times as the run does: the least any
token-in-token-out loop must do per step. It is measured in the same process right before and right after the run
(the mean of the two), so the ratio step / floor of one run compares two timings taken under the same load.

Each repeat runs both sides, each in a fresh process with its own sources first on `sys.path` (the baseline from a
temporary git worktree), alternating which side goes first; reported per side: the min and median over the
repeats of the time per step, the floor and their ratio.

What changed in how it measures (before: one in-process run of `ScriptedEngine`, the floor taken once after it):
the engine is `ReplayEngine` below, which answers in O(1) from the end of the prompt and returns a prepared
`Generation` (`ScriptedEngine` copied every prompt, counted tool responses over the whole prompt and decoded
every reply: O(history) per step, and memory that grew); the floor is taken around each run; the baseline runs in
the same session, interleaved, and each side runs `--repeats` times. The prepared generation says its text is
exactly the decode of its ids where the tree's `Generation` has that field (`exact_text`); a tree without it
decodes, which is the difference being measured.

    uv run python bench/bench_runtime.py [--episodes 1000] [--calls 3] [--repeats 3] [--baseline ee63069]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent-protocol", "agent-env", "agent-runtime")
DEFAULT_BASELINE = "ee63069"  # main before issue 17


def build(calls: int) -> tuple[Any, Any, list[str]]:
    """The runtime (replay engine, calculator session), the tokenizer and the feedback texts of one episode."""
    import logging

    import structlog

    from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
    from agent_protocol import HFTokenizer, get_protocol
    from agent_runtime import AgentRuntime, AgentSession, Generation, LLMEngine, SamplingParams
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))  # logs off the hot path
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_path())
    protocol = get_protocol("qwen3")
    exact = {"exact_text": True} if "exact_text" in Generation.__struct_fields__ else {}

    def reply(message: dict[str, Any]) -> Any:
        ids = tokenizer.encode(protocol.render_generation(message))
        return Generation(ids=ids, text=tokenizer.decode(ids), logprobs=None, finish_reason="stop", **exact)

    calls_made = [
        reply({
            "role": "assistant", "content": "", "reasoning_content": f"Step {k}: compute with the tool.",
            "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": f"{k} * 17 + 4"}}}],
        })
        for k in range(calls)
    ]  # fmt: skip
    answer = reply({"role": "assistant", "content": "The answer is 55.", "reasoning_content": "Done."})
    feedback = [protocol.render_feedback([{"role": "tool", "content": str(k * 17 + 4)}]) for k in range(calls)]
    # The prompt of turn k+1 ends with the feedback of turn k: its tail says which reply comes next.
    after = [
        (tokenizer.encode(text), calls_made[k + 1] if k + 1 < calls else answer) for k, text in enumerate(feedback)
    ]

    class ReplayEngine(LLMEngine):
        """Answers from the last few ids of the prompt and returns a prepared generation: copies nothing."""

        name = "replay"

        def __init__(self) -> None:
            self.tokenizer = tokenizer
            self.context_length = 32768
            self.stop_token_ids = (151645,)  # <|im_end|>

        async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Any:
            size = len(prompt_ids)
            for tail, generation in after:
                if prompt_ids[size - len(tail) :] == tail:
                    return generation
            return calls_made[0]

    calculator = CalculatorTool()  # tools are read-only and shared; each episode gets its own environment
    session = AgentSession(
        protocol=protocol,
        environment=lambda: FunctionCallEnvironment(tools=[calculator], max_steps=calls + 2),
        rewards=RewardPipeline(result=[MatchingReward()]),
    )
    return AgentRuntime(ReplayEngine(), session), tokenizer, feedback


def floor_s(tokenizer: Any, feedback: list[str], episodes: int) -> float:
    t0 = time.perf_counter()
    for _ in range(episodes):
        for text in feedback:
            tokenizer.encode(text)
    return time.perf_counter() - t0


def measure(episodes: int, calls: int) -> dict[str, float]:
    """One run of this process's sources: time per step, and the floor taken around it."""
    runtime, tokenizer, feedback = build(calls)
    prompts = [f"What is {i} * 17 + 4, three times over?" for i in range(episodes)]
    asyncio.run(runtime.run_many(prompts[:20]))  # warm up
    floor_before = floor_s(tokenizer, feedback, episodes)
    t0 = time.perf_counter()
    results = asyncio.run(runtime.run_many(prompts, tasks=[{"answer": "55"}] * episodes))
    wall = time.perf_counter() - t0
    floor_after = floor_s(tokenizer, feedback, episodes)
    if not all(r.stop_reason == "final_answer" for r in results):
        raise RuntimeError("every episode must finish normally")
    steps = sum(r.trajectory.turns for r in results)
    floor = (floor_before + floor_after) / 2 / (episodes * calls)
    return {"us_per_step": wall / steps * 1e6, "floor_us": floor * 1e6, "ratio": wall / steps / floor, "steps": steps}


def run_side(paths: list[str], cwd: Path, episodes: int, calls: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    argv = [sys.executable, __file__, "--measure-only", "--episodes", str(episodes), "--calls", str(calls)]
    out = subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("us_per_step", "floor_us", "ratio"):
        values = [r[key] for r in runs]
        out[f"{key}_min"] = round(min(values), 2)
        out[f"{key}_median"] = round(statistics.median(values), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000, help="concurrent episodes (default 1000)")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per episode before the answer (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help=f"git ref to compare with ({DEFAULT_BASELINE})")
    parser.add_argument("--no-baseline", action="store_true", help="measure this tree only")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_only:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(measure(args.episodes, args.calls)))
        return
    sides = {"this tree": ([str(ROOT / "packages" / p / "src") for p in PACKAGES] + [str(ROOT)], ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        if not args.no_baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.baseline],
                           check=True)  # fmt: skip
            sides[f"baseline {args.baseline}"] = ([str(tree / "packages" / p / "src") for p in PACKAGES] + [str(tree)],
                                                  tree)  # fmt: skip
        try:
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
            for repeat in range(args.repeats):
                order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
                for name in order:
                    runs[name].append(run_side(*sides[name], args.episodes, args.calls))
        finally:
            if not args.no_baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    result = {name: {**summary(values), "runs": values} for name, values in runs.items()}
    print(f"{args.episodes} concurrent episodes x {args.calls} tool calls; {args.repeats} interleaved repeats")
    print("| code | us per step (min / median) | floor us (min / median) | step / floor (min / median) |")
    print("|---|---:|---:|---:|")
    for name, s in result.items():
        cells = [f"{s[f'{key}_min']:.{digits}f} / {s[f'{key}_median']:.{digits}f}"
                 for key, digits in (("us_per_step", 0), ("floor_us", 1), ("ratio", 1))]  # fmt: skip
        print(f"| {name} | {' | '.join(cells)} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
