"""The local trainer, synchronous against ``--async K``, side by side: wall time and held-out success per seed, and
the staleness the asynchronous runs trained at.

For each seed, `apps/train -- --seed S --run-dir RUNS/<demo>-s<S>-sync` and then the same with ``--async K
--branch-from RUNS/<demo>-s<S>-sync`` (into ``...-async<K>``): RL from the very SFT model and RNG state the
synchronous run started RL with, so the two differ in RL only; one after the other, each in its own process
(``--no-install --no-progress --no-tensorboard``, and ``--no-ablation`` for the compaction demo: the ablation is
another RL run). A run directory that already holds a finished run (its ``summary.json``) is read instead of run
again, so a table can be built up seed by seed, and the same command prints it again later. Reported per run, from
the run's own ``summary.json`` and ``metrics.jsonl``: the trainer's wall time (``elapsed_s``: SFT, RL,
evaluations; a branched run counts its source's SFT) and its RL part (from the ``after_sft`` evaluation to the end:
what the two runs do differently), held-out success after SFT and after RL, and for ``--async`` the staleness of
the trained episodes (how many episodes at each staleness, summed over the steps), the episodes dropped as too
stale, and the mean IS ratio;
then per seed the ratio async / sync of the RL time, and the means over seeds.

    uv run python bench/bench_async_local.py --demo calculator --seeds 0 1 2 [--ahead 1] [--runs-dir runs/async]
    uv run python bench/bench_async_local.py --demo compaction --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_dir(runs: Path, demo: str, seed: int, ahead: int | None) -> Path:
    return runs / f"{demo}-s{seed}-{'sync' if ahead is None else f'async{ahead}'}"


def train(directory: Path, demo: str, seed: int, ahead: int | None, branch_from: Path | None) -> None:
    argv = [sys.executable, str(ROOT / "apps" / "train" / "__main__.py"), "--demo", demo, "--"]
    argv += ["--seed", str(seed), "--run-dir", str(directory), "--no-install", "--no-progress", "--no-tensorboard"]
    argv += ["--no-ablation"] if demo == "compaction" else []
    argv += [] if ahead is None else ["--async", str(ahead)]
    argv += [] if branch_from is None else ["--branch-from", str(branch_from)]
    print(f"running: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def read_run(directory: Path) -> dict[str, Any]:
    summary = json.loads((directory / "summary.json").read_text())
    records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines() if line.strip()]
    sft_done = next(r["time_s"] for r in records if r["kind"] == "eval" and r.get("label") == "after_sft")
    steps = [r for r in records if r["kind"] == "rl"]
    histogram: dict[int, int] = {}
    for step in steps:
        for key, value in step.items():
            if key.startswith("staleness_") and key[len("staleness_") :].isdigit():
                histogram[int(key[len("staleness_") :])] = histogram.get(int(key[len("staleness_") :]), 0) + int(value)
    ratios = [s["is_ratio_mean"] for s in steps if "is_ratio_mean" in s]
    return {
        "wall_s": summary["elapsed_s"],
        "rl_s": round(summary["elapsed_s"] - sft_done, 1),
        "after_sft": summary["figures"].get("after_sft"),
        "after_rl": summary["figures"].get("after_rl"),
        "episodes": summary["eval_episodes"],
        "staleness": dict(sorted(histogram.items())),
        "dropped": int(sum(s.get("stale_dropped", 0) for s in steps)),
        "is_ratio": round(statistics.fmean(ratios), 4) if ratios else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", choices=["calculator", "compaction"], default="calculator")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ahead", type=int, default=1, help="K of --async K (default 1)")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "async")
    parser.add_argument("--no-run", action="store_true", help="only read finished runs; skip the missing ones")
    args = parser.parse_args()
    rows: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    for seed in args.seeds:
        runs = []
        for ahead in (None, args.ahead):
            directory = run_dir(args.runs_dir, args.demo, seed, ahead)
            finished = (directory / "summary.json").is_file() and json.loads(
                (directory / "summary.json").read_text()
            ).get("finished")
            if not finished and not args.no_run:
                started = time.perf_counter()
                source = run_dir(args.runs_dir, args.demo, seed, None) if ahead is not None else None
                train(directory, args.demo, seed, ahead, source)
                print(f"  took {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
                finished = True
            runs.append(read_run(directory) if finished else None)
        if runs[0] is not None and runs[1] is not None:
            rows.append((seed, runs[0], runs[1]))
    print(f"{args.demo}: synchronous vs --async {args.ahead} (trainer's wall time; held-out success, greedy)")
    print("| seed | run | wall | RL part | RL time vs sync | after SFT | after RL | staleness (episodes) | dropped "
          "| IS ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seed, sync, asynchronous in rows:
        for name, run in (("sync", sync), (f"async {args.ahead}", asynchronous)):
            ratio = run["rl_s"] / sync["rl_s"]
            staleness = ", ".join(f"{s}: {n}" for s, n in run["staleness"].items()) or "0 (all)"
            print(
                f"| {seed} | {name} | {run['wall_s'] / 60:.1f} min | {run['rl_s'] / 60:.1f} min | {ratio:.2f}x | "
                f"{run['after_sft']:.1%} | {run['after_rl']:.1%} | {staleness} | {run['dropped']} | "
                f"{run['is_ratio'] if run['is_ratio'] is not None else '-'} |"
            )
    if rows:
        mean = statistics.fmean
        ratio = mean(a["rl_s"] / s["rl_s"] for _, s, a in rows)
        sync_rl, async_rl = mean(s["after_rl"] for _, s, _ in rows), mean(a["after_rl"] for _, _, a in rows)
        print(
            f"mean over {len(rows)} seed(s): RL time async/sync {ratio:.2f}x; after RL sync {sync_rl:.1%}, "
            f"async {async_rl:.1%}"
        )


if __name__ == "__main__":
    main()
