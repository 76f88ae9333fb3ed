"""scripts/check fails when the vLLM CPU step cannot run, unless AGENT_ALLOW_VLLM_CPU_SKIP=1 says a skip is fine.

The script runs as it is, from a copy, with `uv` and `scripts/vllm_cpu_env` replaced by stand-ins: `uv` succeeds
at everything (the other steps are not under test here), `vllm_cpu_env` exits 3, its code for "cannot be built
here"."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "bin").mkdir()
    shutil.copy(ROOT / "scripts" / "check", tmp_path / "scripts" / "check")
    for stub, code in ((tmp_path / "scripts" / "vllm_cpu_env", 3), (tmp_path / "bin" / "uv", 0)):
        stub.write_text(f"#!/bin/sh\nexit {code}\n")
        stub.chmod(0o755)
    environment = {k: v for k, v in os.environ.items() if k != "AGENT_ALLOW_VLLM_CPU_SKIP"}
    environment.update(env, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return subprocess.run(
        [str(tmp_path / "scripts" / "check"), "--fast"], env=environment, capture_output=True, text=True, timeout=60
    )


def test_a_run_without_the_vllm_cpu_tests_fails(tmp_path: Path) -> None:
    done = run_check(tmp_path)
    assert done.returncode == 3
    assert "AGENT_ALLOW_VLLM_CPU_SKIP=1" in done.stderr
    assert "all checks passed" not in done.stdout


def test_an_allowed_skip_passes_and_says_so(tmp_path: Path) -> None:
    done = run_check(tmp_path, AGENT_ALLOW_VLLM_CPU_SKIP="1")
    assert done.returncode == 0
    assert done.stdout.rstrip().endswith(
        "all checks passed EXCEPT tests/vllm_cpu, skipped (AGENT_ALLOW_VLLM_CPU_SKIP=1)"
    )
