"""What does taking new requests into a running batch buy, and when should they join? `HFEngine` with
`join_running=True` (the default: waiting requests join once they are `join_ratio` times the running rows, or after
`join_wait_steps` steps) side by side with the same engine with joining off, and with every request joining at the
next step (`join_ratio=0, join_wait_steps=0`: "at once", how joining worked before the join rule), on the tests' tiny
random-weight Qwen3 (CPU, float32), interleaved in one run.

- N turns arriving apart: 8 episodes' first turns (about 200-id openings, `--new-tokens` greedy ids, logprobs
  asked) sent `gap` ms apart, as turns come back from their tools at different times. Reported: the mean time from
  a turn's send to its answer (what a waiting agent sees), and the time until the last answer.
- 64 episodes x 4 turns on a model of the calculator demo's shape, with the local trainer's batching (up to 256
  rows, 50 ms wait): a rollout as `apps/train` runs it, without the environment (see `bench_hf_engine.py`).

Every side starts each repeat with an empty prefix cache. Every case's ids must be equal on all sides (joined rows
compute what they compute alone), or the script fails. Each repeat runs every side, alternating the order; reported:
min and median per side, off / on and at once / on (above 1: the default is faster).

    uv run python bench/bench_hf_join.py [--gaps 5 10 20] [--new-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_hf_engine import (  # noqa: E402
    SameIds,
    demo_shaped_model,
    interleaved,
    opening,
    print_table,
    staggered_turns,
    timed_rollout,
    tiny_engine,
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gaps", type=float, nargs="+", default=[5.0, 10.0, 20.0], help="ms between arrivals")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    on = tiny_engine()
    from agent_runtime import SamplingParams
    from agent_runtime.engines.hf import HFEngine

    engines = {
        "off": HFEngine(on.model, on.tokenizer, join_running=False),
        "at once": HFEngine(on.model, on.tokenizer, join_ratio=0, join_wait_steps=0),
        "on": on,
    }
    demo_model = demo_shaped_model()
    demo_options: dict[str, Any] = {"max_batch_size": 256, "batch_wait_s": 0.05}  # the local trainer's
    demo_engines = {
        "off": HFEngine(demo_model, on.tokenizer, join_running=False, **demo_options),
        "at once": HFEngine(demo_model, on.tokenizer, join_ratio=0, join_wait_steps=0, **demo_options),
        "on": HFEngine(demo_model, on.tokenizer, **demo_options),
    }
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    prompts = [opening(on, 200, seed) for seed in range(8)]

    cases: dict[str, Callable[[str], float]] = {}
    same = SameIds()

    def staggered_case(gap_ms: float) -> None:
        last: dict[str, float] = {}

        def mean_latency(side: str) -> float:
            started = time.perf_counter()
            seconds, ids = staggered_turns(engines[side], prompts, sampling, gap_ms / 1e3)
            last[side] = time.perf_counter() - started
            same.record(f"gap {gap_ms}", side, ids)
            return seconds

        cases[f"8 turns {gap_ms:g} ms apart: mean latency"] = mean_latency
        cases[f"8 turns {gap_ms:g} ms apart: until the last answer"] = lambda side: last[side]

    def rollout_case(side: str) -> float:
        seconds, ids = timed_rollout(demo_engines[side], sampling)
        same.record("rollout", side, ids)
        return seconds

    for gap in args.gaps:
        staggered_case(gap)
    cases["64 episodes x 4 turns, demo-shaped model"] = rollout_case

    times = interleaved(cases, list(engines), args.repeats)
    same.check("off", "on")
    same.check("off", "at once")

    def joined(side: str) -> str:
        on_side = (engines[side], demo_engines[side])
        return f"{sum(e.joined_requests for e in on_side)} requests in {sum(e.joins for e in on_side)} joins"

    print(f"CPU float32, {args.new_tokens} new greedy tokens per turn, {args.repeats} interleaved repeats; ids equal")
    print(f"on every side in every case; on: {joined('on')}, at once: {joined('at once')}\n")
    print_table(times, "off", "on")
    print()
    print_table(times, "at once", "on")
    for engine in [*engines.values(), *demo_engines.values()]:
        asyncio.run(engine.close())


if __name__ == "__main__":
    main()
