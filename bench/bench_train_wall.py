"""The calculator demo's wall time, `apps/train` of this tree side by side with a baseline commit's.

Each side runs the same command, `apps/train -- --run-dir DIR --no-progress --no-install [--preset P]
[--seed S]`, in a fresh process with its own sources first on `sys.path` (the baseline from a temporary git
worktree), one after the other, alternating which side goes first when repeated. Reported per run: the wall time
of the process, the trainer's own time split (RL generation, RL updates, the rest: SFT, evaluations,
checkpoints), and the figures it printed, so a faster run that learned less shows it.

    uv run python bench/bench_train_wall.py [--baseline ee63069] [--preset ci] [--seed 0] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent-protocol", "agent-env", "agent-runtime", "agent-train", "agent-demo")
DEFAULT_BASELINE = "ee63069"  # main before issue 17


def run_side(tree: Path, run_dir: Path, preset: str | None, seed: int | None) -> dict[str, Any]:
    paths = [str(tree / "packages" / p / "src") for p in PACKAGES] + [str(tree)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    argv = [sys.executable, str(tree / "apps" / "train" / "__main__.py"), "--", "--run-dir", str(run_dir)]
    # --no-install: a side's model must not replace the demo model `apps/serve` uses (ee63069 has the flag too)
    argv += ["--no-progress", "--no-install", *(["--preset", preset] if preset else [])]
    argv += [] if seed is None else ["--seed", str(seed)]
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    summary = json.loads((run_dir / "summary.json").read_text())
    generate = update = 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        generate += record.get("generate_s", 0.0)
        update += record.get("update_s", 0.0)
    return {
        "wall_s": round(wall, 1),
        "rl_generate_s": round(generate, 1),
        "rl_update_s": round(update, 1),
        "rest_s": round(wall - generate - update, 1),
        "figures": summary["figures"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help=f"git ref to compare with ({DEFAULT_BASELINE})")
    parser.add_argument("--preset", help="local trainer preset (default: the full demo)")
    parser.add_argument("--seed", type=int, help="overrides the preset's seed")
    parser.add_argument("--repeats", type=int, default=1, help="runs per side (default 1)")
    parser.add_argument("--no-baseline", action="store_true", help="run this tree only")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"tree": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        base = Path(tmp) / "baseline"
        if not args.no_baseline:
            add = ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.baseline]
            subprocess.run(add, check=True)
        try:
            for repeat in range(args.repeats):
                order = [("tree", ROOT)] + ([] if args.no_baseline else [("baseline", base)])
                for side, tree in order if repeat % 2 == 0 else order[::-1]:
                    out = run_side(tree, Path(tmp) / f"{side}-{repeat}", args.preset, args.seed)
                    results[side].append(out)
                    print(side, json.dumps(out), flush=True)
        finally:
            if not args.no_baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
    ratios = [t["wall_s"] / b["wall_s"] for t, b in zip(results["tree"], results["baseline"], strict=False)]
    if ratios:
        print("tree / baseline wall time:", ", ".join(f"{r:.2f}" for r in ratios))
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "ratios": ratios}, indent=1) + "\n")


if __name__ == "__main__":
    main()
