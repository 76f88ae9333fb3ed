"""What does `HFEngine(max_batch_tokens=...)` keep down, and what does it cost? The same engine without the bound (the
default) side by side with it, on the tests' tiny random-weight Qwen3 (CPU, float32), interleaved in one run.

A long prompt among short turns: `--turns` short openings (`--short` ids each; 6 by default, so the long one is the
7th row of `max_batch_size` 8) sent together, and one long opening
(`--long` ids) sent `--late-ms` after them (0: with them, so it meets them as the batch forms; above 0: it arrives
while their batch runs, where it would join), every request `--new-tokens` greedy ids. Without the bound the long
prompt shares the short turns' cache, and every row holds its positions; with it, the long prompt waits for the
next batch. Reported per side: `peak_batch_tokens` (the most key/value positions a forward pass held: rows x
positions, padding included; memory is this x the bytes per position, 2 KiB on this model, 144 KiB on Qwen3-8B in
bfloat16), the mean time from send to answer of the short turns, of the long one, and until the last answer.

Both sides start each repeat with an empty prefix cache; every request's ids must be equal on both sides, or the
script fails. Each repeat runs both sides, alternating which goes first; reported: min and median per side, and
unbounded / bounded (above 1: the bounded side is lower).

    uv run python bench/bench_hf_batch_tokens.py [--turns 6] [--short 200] [--long 3000] [--late-ms 0 5] [--bound 4096]
                                                 [--new-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_hf_engine import SameIds, opening, sent_after, tiny_engine  # noqa: E402

SIDES = ("unbounded", "bounded")


def run_once(
    engine: Any, shorts: list[list[int]], long: list[int], sampling: Any, late_s: float
) -> tuple[dict[str, float], list[list[int]]]:
    """One round from an empty prefix cache: the figures of the module docstring, and every request's ids."""
    engine.clear_prefix_cache()
    engine.peak_batch_tokens = 0

    async def everything() -> list[tuple[float, list[int]]]:
        sends = [sent_after(engine, p, sampling, 0.0) for p in shorts] + [sent_after(engine, long, sampling, late_s)]
        return list(await asyncio.gather(*sends))

    started = time.perf_counter()
    answers = asyncio.run(everything())
    total = time.perf_counter() - started
    figures = {
        "peak key/value positions": float(engine.peak_batch_tokens),
        "short turns: mean latency (ms)": statistics.mean(s for s, _ in answers[:-1]) * 1e3,
        "long prompt: latency (ms)": answers[-1][0] * 1e3,
        "until the last answer (ms)": total * 1e3,
    }
    return figures, [ids for _, ids in answers]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=6, help="short turns (default 6; max_batch_size is 8)")
    parser.add_argument("--short", type=int, default=200, help="ids in each short opening (default 200)")
    parser.add_argument("--long", type=int, default=3000, help="ids in the long opening (default 3000)")
    parser.add_argument("--late-ms", type=float, nargs="+", default=[0.0, 5.0], help="when the long one is sent")
    parser.add_argument("--bound", type=int, default=4096, help="max_batch_tokens of the bounded side (4096)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    unbounded = tiny_engine()
    from agent_runtime import SamplingParams
    from agent_runtime.engines.hf import HFEngine

    engines = {
        "unbounded": unbounded,
        "bounded": HFEngine(unbounded.model, unbounded.tokenizer, max_batch_tokens=args.bound),
    }
    if args.long + args.new_tokens > unbounded.context_length:
        parser.error(f"--long {args.long} + --new-tokens leaves no room in the model's {unbounded.context_length}")
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    shorts = [opening(unbounded, args.short, seed) for seed in range(args.turns)]
    long = opening(unbounded, args.long, 99)

    same = SameIds()
    results: dict[str, dict[str, dict[str, list[float]]]] = {}  # case -> figure -> side -> values
    for repeat in range(args.repeats):
        order = SIDES if repeat % 2 == 0 else tuple(reversed(SIDES))
        for late in args.late_ms:
            case = f"long prompt sent {late:g} ms after the short turns"
            for side in order:
                figures, ids = run_once(engines[side], shorts, long, sampling, late / 1e3)
                same.record(case, side, ids)
                for name, value in figures.items():
                    results.setdefault(case, {}).setdefault(name, {}).setdefault(side, []).append(value)
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
    same.check(*SIDES)

    deferred = engines["bounded"].deferred_requests
    print(
        f"CPU float32, {args.turns} x {args.short}-id turns and one {args.long}-id prompt, "
        f"{args.new_tokens} new greedy ids each;"
    )
    print(f"bounded: max_batch_tokens={args.bound}; {args.repeats} interleaved repeats; ids equal on both sides;")
    print(f"the bounded side put a request back {deferred} times\n")
    print("| case | figure | unbounded min / median | bounded min / median | unbounded / bounded (median) |")
    print("|---|---|---:|---:|---:|")
    for case, figures in results.items():
        for name, by_side in figures.items():
            a, b = by_side["unbounded"], by_side["bounded"]
            digits = 0 if name.startswith("peak") else 1
            print(
                f"| {case} | {name} | {min(a):.{digits}f} / {statistics.median(a):.{digits}f} "
                f"| {min(b):.{digits}f} / {statistics.median(b):.{digits}f} "
                f"| {statistics.median(a) / statistics.median(b):.2f}x |"
            )
    for engine in engines.values():
        asyncio.run(engine.close())


if __name__ == "__main__":
    main()
