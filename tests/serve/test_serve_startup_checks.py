"""`apps/serve` refuses flags it cannot serve with before it loads a model or starts Ray, as a user runs it (a real
subprocess): a `--store` Redis that does not answer fails one process and `--replicas` alike, at once (not after
Ray Serve's retries of each replica, minutes), exit 2 with the same message naming `--store`; `--replicas` where Ray
Serve is not installed says which extra to install. The Redis URL is a free loopback port nothing listens on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.serve_process import APP, ROOT, free_port

pytest.importorskip("redis")


def run_serve(args: list[str], *, without_ray: bool = False) -> tuple[int, str, float]:
    """`apps/serve *args` to its end: exit status, stderr, seconds. `without_ray`: as where Ray is not installed
    (`ray` set to None in `sys.modules`, so `import ray` raises ImportError, as it does without the package)."""
    prelude = "import runpy, sys; sys.modules['ray'] = None; "
    command = [sys.executable, str(APP), *args]
    if without_ray:
        command = [sys.executable, "-c", prelude + f"runpy.run_path({str(APP)!r}, run_name='__main__')", *args]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr, time.monotonic() - started


def startup_error(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if '"startup_failed"' in line]
    event = json.loads(line)
    assert event["event"] == "startup_failed", line
    return str(event["error"])


def test_an_unreachable_store_fails_one_process_and_replicas_at_once_with_one_message(tiny_qwen3_dir: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    base = ["--model", str(tiny_qwen3_dir), "--port", str(free_port()), "--store", url, "--log-format", "json"]
    one = run_serve(base)
    replicas = run_serve([*base, "--replicas", "2"])
    for status, stderr, _ in (one, replicas):
        assert status == 2, stderr[-3000:]
        assert startup_error(stderr).startswith(f"--store: redis store at {url}: ping failed: ConnectionError")
        assert "hf_engine_loaded" not in stderr and "Traceback" not in stderr  # nothing loaded, no stack trace
    assert startup_error(one[1]) == startup_error(replicas[1])
    assert replicas[2] < 60, replicas[2]  # not Ray Serve's retries (about 150 s); the import of the app is most


def test_replicas_without_ray_serve_name_the_extra_to_install(tiny_qwen3_dir: Path) -> None:
    status, stderr, _ = run_serve(
        ["--model", str(tiny_qwen3_dir), "--port", str(free_port()), "--replicas", "2", "--log-format", "json"],
        without_ray=True,
    )
    assert status == 2, stderr[-3000:]
    message = startup_error(stderr)
    assert message.startswith("--replicas needs Ray Serve, which is not installed here"), message
    assert "agent-runtime[replicas]" in message
