"""What does deterministic batching cost the local trainer? One RL step's rollouts (`--prompts` training problems x
`--group` samples at temperature 1, through `Rollouts` and `AgentRuntime`, as `apps/train` samples them) and one
greedy held-out evaluation (`--eval` problems), on a saved demo model, with the local trainer's `HFEngine` batching
by arrival (``arrival``: 50 ms window, turns join running batches at once) and with the same engine in lockstep
(``lockstep``: `LockstepEngine`, waves in episode order). Each repeat runs both sides, alternating which goes first,
so load on a shared host falls on both alike; reported: min and median seconds per side and lockstep / arrival.

    uv run python bench/bench_lockstep.py runs/demo/sft [--prompts 16] [--group 8] [--eval 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from agent_demo import make_recipe
from agent_runtime import LLMEngine
from agent_runtime.engines import HFEngine
from agent_train.demo.model import is_model_dir
from agent_train.local.evaluate import evaluate
from agent_train.local.lockstep import LockstepEngine
from agent_train.local.rollout import ROLLOUT_BATCHING, Rollouts


async def one_side(model_dir: Path, lockstep: bool, prompts: int, group: int, eval_size: int) -> tuple[float, float]:
    recipe = make_recipe()
    inner = HFEngine.from_pretrained(model_dir, max_batch_size=256, **ROLLOUT_BATCHING)
    engine: LLMEngine = LockstepEngine(inner) if lockstep else inner
    try:
        rows = list(recipe.rows("train"))[:prompts]
        started = time.perf_counter()
        await Rollouts(recipe, engine).collect(rows, group_size=group, temperature=1.0, seed=11)
        rollout_s = time.perf_counter() - started
        started = time.perf_counter()
        await evaluate(engine, recipe, list(recipe.rows("test"))[:eval_size])
        return rollout_s, time.perf_counter() - started
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("model_dir", type=Path, help="a demo model directory (runs/demo/sft, ...)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--eval", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not is_model_dir(args.model_dir):
        parser.error(f"{args.model_dir} is not a model directory")
    times: dict[str, list[tuple[float, float]]] = {"arrival": [], "lockstep": []}
    for repeat in range(args.repeats):
        for side in ("arrival", "lockstep") if repeat % 2 == 0 else ("lockstep", "arrival"):
            run = one_side(args.model_dir, side == "lockstep", args.prompts, args.group, args.eval)
            times[side].append(asyncio.run(run))
    print(f"{args.prompts} x {args.group} rollouts, {args.eval} held-out problems, {args.repeats} repeats (seconds)")
    print(f"{'side':<10} {'rollout min':>12} {'median':>8} {'eval min':>9} {'median':>8}")
    for side, rows in times.items():
        rollout, held_out = [r for r, _ in rows], [e for _, e in rows]
        print(
            f"{side:<10} {min(rollout):>12.2f} {statistics.median(rollout):>8.2f} "
            f"{min(held_out):>9.2f} {statistics.median(held_out):>8.2f}"
        )
    for index, what in enumerate(("rollout", "eval")):
        a = statistics.median(r[index] for r in times["arrival"])
        b = statistics.median(r[index] for r in times["lockstep"])
        print(f"lockstep / arrival, {what} median: {b / a:.2f}")


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main()
