"""What the trajectory viewer's index costs on a large trajectory file, side by side with reading the file whole.

A file of `--records` calculator episodes (real Qwen3 token ids through the real session, a scripted engine; each
record about 5 kB, one in four an engine failure) is written once. Then, each in a fresh `TrajectoryFiles`:
the first page of 50 (what opening the viewer costs), one record's view with every token's piece, a filter that
matches nothing (every line read and summarized, the worst case), the same filter again on the warm index, and,
as the baseline, `read_trajectories` over the whole file (what reading the log by hand costs). Each repeat
starts from a fresh index; reported: the shortest wall time of each step, first page / whole read, and the
process's resident size at the end.

    uv run python bench/bench_viewer.py [--records 40000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    """The process's resident size now (Linux), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_file(path: Path, records: int) -> None:
    from agent_protocol import HFTokenizer
    from agent_runtime import AgentRuntime, ScriptedEngine
    from tests.support.calculator_policy import calculator_policy
    from tests.support.calculator_recipe import calculator_recipe
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_path())
    recipe = calculator_recipe()
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
    runtime = AgentRuntime(engine, recipe.make_session(tokenizer))
    questions = ["What is 17 * 23?", "What is 101 * 7?", "What is 6 * 7? Then explode.", "What is 12 + 30?"]
    results = asyncio.run(runtime.run_many(questions))
    lines = [msgspec.json.encode(result.trajectory) + b"\n" for result in results]
    with open(path, "wb") as out:
        for i in range(records):
            out.write(lines[i % len(lines)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from agent_protocol import HFTokenizer
    from agent_runtime import read_trajectories
    from agent_runtime.serving import TrajectoryFiles, TrajectoryFilter
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "trajectories.jsonl"
        write_file(path, args.records)
        print(f"{args.records} records, {path.stat().st_size / 1e6:.1f} MB")
        tokenizer = HFTokenizer.from_file(qwen3_tokenizer_path())
        before = rss_mb()
        nothing = TrajectoryFilter(error_code="no_such_code")
        best: dict[str, float] = {}
        for _ in range(args.repeats):  # each repeat on a fresh index; the shortest time of each step is reported
            files = TrajectoryFiles(path, tokenizer=tokenizer)
            steps = {
                "first page of 50": lambda files=files: files.page(0, 50),
                "one record, every token's piece": lambda files=files: files.record("0:0"),
                "a filter that matches nothing (every line)": lambda files=files: files.page(
                    0, 50, nothing, max_scan=10**9
                ),
                "the same filter on the warm index": lambda files=files: files.page(0, 50, nothing, max_scan=10**9),
                "baseline: read_trajectories, the whole file": lambda: sum(1 for _ in read_trajectories(path)),
            }
            for label, work in steps.items():
                start = time.perf_counter()
                work()
                best[label] = min(best.get(label, math.inf), time.perf_counter() - start)
        for label, seconds in best.items():
            print(f"{label:<48} {seconds * 1000:>10.1f} ms")
        print(f"RSS: {before:.0f} MB before the first index, {rss_mb():.0f} MB with the last one holding every record")
        first, whole = best["first page of 50"], best["baseline: read_trajectories, the whole file"]
        print(f"first page / whole read: {first / whole:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
