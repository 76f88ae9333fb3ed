"""``apps/train --recipe R`` on the local backend: an agent-program recipe trained end to end in a process of its
own (the example's plain loop, `examples/any_agent/recipe.py`, on the ``tiny`` preset: the demo's warm start, the
program's held-out reward, one RL step through `ProgramRollouts`, ``summary.json``); and the recipes it refuses,
with exit status 2 and what is missing, before anything trains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "train"


def train(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(APP), *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_the_app_trains_a_program_recipe(tmp_path: Path) -> None:
    run_dir = tmp_path / "any-agent"
    done = train("--recipe", "examples/any_agent/recipe.py", "--", "--preset", "tiny", "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["step_rewards"]) == 1 and summary["segments_per_episode"] == 1.0
    assert 0.0 <= summary["before"] <= 1.1 and 0.0 <= summary["after"] <= 1.1
    assert (run_dir / "warm_start" / "metrics.jsonl").is_file()  # the local trainer's warm start ran
    assert f"held-out reward before RL {summary['before']:.3f}, after {summary['after']:.3f}" in done.stdout
    assert f"summary in {run_dir}/summary.json" in done.stdout


def test_a_recipe_it_cannot_train_is_an_error_naming_what_is_missing(tmp_path: Path) -> None:
    no_program = train("--recipe", "recipes/calculator.py", "--", "--run-dir", str(tmp_path / "a"), timeout=120)
    assert no_program.returncode == 2
    assert "names no agent program (Recipe.agent)" in no_program.stderr and "--backend openrlhf" in no_program.stderr

    no_dataset = tmp_path / "no_dataset.py"
    no_dataset.write_text(
        f"import dataclasses, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from examples.any_agent.recipe import make_recipe\n"
        "recipe = dataclasses.replace(make_recipe(), name='bare', dataset=None)\n"
    )
    done = train("--recipe", str(no_dataset), "--", "--run-dir", str(tmp_path / "b"), timeout=120)
    assert done.returncode == 2
    assert "recipe 'bare' defines no dataset (Recipe.dataset)" in done.stderr and "'train' split" in done.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before anything was written

    both = train("--demo", "compaction", "--recipe", "examples/any_agent/recipe.py", timeout=120)
    assert both.returncode == 2 and "--demo and --recipe" in both.stderr
