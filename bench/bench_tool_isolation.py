"""What running a tool call on its own thread and loop costs, against running it on the caller's loop.

The same calculator call, `--calls` at once through one `ToolRunner`, once with ``event_loop="isolated"`` (a
daemon thread and a fresh event loop per call, the default for async tools) and once with ``"shared"`` (the
caller's loop; what `CalculatorTool` uses), each with `--busy` other threads spinning in Python, as the `hf`
engine's worker thread does during rollouts. Reported: wall time per mode, the ratio isolated / shared, and
how many calls did not succeed (a timeout here means time spent waiting for a thread counted against the tool).

    uv run python bench/bench_tool_isolation.py [--calls 128] [--busy 0 1 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_env import CalculatorTool  # noqa: E402
from agent_env.tool_runner import ToolRunner  # noqa: E402
from agent_protocol.types import ToolCall  # noqa: E402


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


async def burst(runner: ToolRunner, calls: int) -> tuple[float, int]:
    batch = [ToolCall(id=f"c{i}", name="calculator", arguments={"expression": "12 * 34 + 5"}) for i in range(calls)]
    started = time.perf_counter()
    answers = await asyncio.gather(*(runner.run([call]) for call in batch))
    return time.perf_counter() - started, sum(1 for [answer] in answers if not answer.ok)


def measure(mode: str, calls: int, busy: int, repeats: int) -> dict[str, float]:
    tool = CalculatorTool()
    tool.event_loop = mode  # type: ignore[assignment]  # the bench compares both modes on one tool
    runner = ToolRunner([tool])
    stop = threading.Event()
    spinners = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(busy)]
    for thread in spinners:
        thread.start()
    try:
        runs = [asyncio.run(burst(runner, calls)) for _ in range(repeats)]
    finally:
        stop.set()
        for thread in spinners:
            thread.join()
    return {"seconds": statistics.median(s for s, _ in runs), "failed": sum(f for _, f in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=128, help="concurrent calls per burst (default 128)")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="busy threads to try (default 0 1 2)")
    parser.add_argument("--repeats", type=int, default=3, help="bursts per setting; the median is shown (default 3)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rows = []
    for busy in args.busy:
        isolated = measure("isolated", args.calls, busy, args.repeats)
        shared = measure("shared", args.calls, busy, args.repeats)
        rows.append(
            {
                "busy_threads": busy,
                "isolated_s": round(isolated["seconds"], 4),
                "shared_s": round(shared["seconds"], 4),
                "isolated_over_shared": round(isolated["seconds"] / shared["seconds"], 1),
                "failed_isolated": isolated["failed"],
                "failed_shared": shared["failed"],
            }
        )
        print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
