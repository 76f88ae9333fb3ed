"""bench/bench_serve_parts.py runs end to end at a small size: every configuration's children start (as many as
asked), answer their batches with 200s (the driver raises on anything else), and the figures come out where they
must (an episode costs more CPU than a canned response; the raw numbers hold every round of every child);
`--baseline` runs agent mode on another checkout's packages in the same rounds (here this checkout's own), and
`--baseline-python` under another interpreter (here this one), each named in the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_serve_parts_small_run(tmp_path: Path) -> None:
    out = tmp_path / "parts.json"
    done = subprocess.run(
        [sys.executable, "bench/bench_serve_parts.py", "--requests", "32", "--rounds", "2", "--processes", "2",
         "--json", str(out), "--baseline", str(ROOT), "--baseline-python", sys.executable],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| agent mode + a trajectory log (`--trajectory-log`) |" in done.stdout
    result = json.loads(out.read_text())
    assert set(result["median"]) == {"bare", "agent", "agent_trajectory", "agent_quiet", "agent_baseline"}
    version = sys.version.split()[0]
    assert f"on the baseline's packages ({ROOT}), on CPython {version} (" in done.stdout
    assert f"Children on CPython {version} (" in done.stdout
    assert all(len(batches) == 2 * 2 for batches in result["rounds_own_us"].values())  # rounds x children
    assert all(len(medians) == 2 for medians in result["process_medians_own_us"].values())
    median = result["median"]
    assert median["agent"]["own_us"] > median["bare"]["own_us"] > 0
    assert median["agent"]["model_us"] > 0 == median["bare"]["model_us"]


def test_bench_serve_parts_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/bench_serve_parts.py", "--requests", "3"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "--requests must be at least 16" in done.stderr
    done = subprocess.run(
        [sys.executable, "bench/bench_serve_parts.py", "--baseline", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert "not a checkout of this repository (no packages/agent-protocol/src)" in done.stderr
    done = subprocess.run(
        [sys.executable, "bench/bench_serve_parts.py", "--baseline-python", str(tmp_path / "python")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--baseline-python" in done.stderr and "not an executable file" in done.stderr
