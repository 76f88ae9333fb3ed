"""`apps/train` and `apps/serve`, run as a user runs them, print nothing from libraries they do not use.

Each app runs as a subprocess from the repository root, with the cheapest options that still reach what the full
command does: the local trainer (both demos) past its checkpoints, the model install and (compaction) the
ablation; the server (both demos, serving the models those runs installed) through startup, one chat request and
Ctrl-C. Both streams are read: DeepSpeed's logger, for one, prints to stdout. A line matching one of `FOREIGN`
fails the test, which prints every such line with the command that printed it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.serve_process import free_port

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["--preset", "ci", "--sft-steps", "3", "--rl-steps", "2", "--eval-size", "2", "--no-progress"]

FOREIGN: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern)
    for name, pattern in {
        "DeepSpeed": r"(?i)\bdeepspeed\b|Setting accelerator to|real_accelerator\.py|\bds_accelerator\b",
        "Ray": r"\bRay\b|\bray\._private\b|\braylet\b|Started a local Ray instance|RAY_[A-Z_]+=",
        "vLLM": r"\bvLLM\b|\bvllm\.\w|^(INFO|WARNING|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d \[",
        "TensorFlow": r"TensorFlow|\btensorflow\b|oneDNN|TF_ENABLE_ONEDNN_OPTS|Unable to register cu(DNN|FFT|BLAS)",
        "tokenizers fork": r"huggingface/tokenizers: The current process just got forked",
        "torch pynvml": r"pynvml package is deprecated",
        "a third-party Python warning": r"site-packages/\S+:\d+: \w*Warning\b",
        "FutureWarning or DeprecationWarning": r"\b(Future|Deprecation|PendingDeprecation)Warning\b",
        "triton or inductor": r"\btriton\b|torch\._inductor|torch\._dynamo",
        "numexpr": r"NumExpr defaulting to",
    }.items()
}
"""Known foreign output, by source. A pattern names a library or its message, never our own events."""


def foreign_lines(text: str) -> list[str]:
    """Each line of `text` that matches a `FOREIGN` pattern, prefixed with the pattern's name."""
    return [f"[{name}] {line}" for line in text.splitlines() for name, p in FOREIGN.items() if p.search(line)]


@dataclass
class Output:
    command: str
    stdout: str
    stderr: str

    def foreign(self) -> list[str]:
        return [f"{self.command}: {line}" for line in foreign_lines(self.stdout + "\n" + self.stderr)]


def _train(args: list[str], env: dict[str, str]) -> Output:
    command = [sys.executable, "apps/train", *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return Output(" ".join(["apps/train", *args]), done.stdout, done.stderr)


def _serve_one_request(args: list[str], env: dict[str, str], logs: Path) -> Output:
    """Start `apps/serve`, wait for its banner, send one chat request for the served model, stop it with Ctrl-C."""
    port = free_port()
    command = [sys.executable, "apps/serve", *args, "--port", str(port)]
    out, err = logs / f"serve-{port}.out", logs / f"serve-{port}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True)
    try:
        deadline = time.monotonic() + 300
        while "Serving at" not in out.read_text():
            assert process.poll() is None, f"apps/serve exited {process.returncode}:\n{err.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "apps/serve did not start within 300 s"
            time.sleep(0.5)
        base = f"http://127.0.0.1:{port}/v1"
        with urllib.request.urlopen(f"{base}/models", timeout=60) as response:
            model = json.load(response)["data"][0]["id"]
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is 12 * 7 + 3?"}]})
        request = urllib.request.Request(
            f"{base}/chat/completions", data=body.encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            assert json.load(response)["choices"][0]["message"]["role"] == "assistant"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, f"apps/serve stopped with {process.returncode}:\n{err.read_text()[-3000:]}"
    return Output(" ".join(["apps/serve", *args]), out.read_text(), err.read_text())


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Output]]:
    """Both apps, both demos: train (installing into a private cache), then serve what was installed."""
    tmp = tmp_path_factory.mktemp("apps")
    env = {**os.environ, "OPENRLHF_AGENT_HOME": str(tmp / "home")}
    env.pop("PYTHONWARNINGS", None)  # as a user runs them: Python's default warning filters
    yield [
        _train(["--", *TRAIN, "--run-dir", str(tmp / "calculator")], env),
        _serve_one_request([], env, tmp),
        _train(["--demo", "compaction", "--", *TRAIN, "--run-dir", str(tmp / "compaction")], env),
        _serve_one_request(["--demo", "compaction"], env, tmp),
    ]


def test_the_patterns_catch_what_they_name_and_spare_our_own_output() -> None:
    caught = [
        "[2026-12-05 09:35:02,228] [WARNING] [real_accelerator.py:199:get_accelerator] Setting accelerator to CPU. "
        "If you have GPU or other accelerator, we were unable to detect it.",
        "/x/.venv/lib/python3.12/site-packages/torch/cuda/__init__.py:64: FutureWarning: The pynvml package is "
        "deprecated.",
        "/x/site-packages/transformers/utils/hub.py:111: UserWarning: something",
        "huggingface/tokenizers: The current process just got forked, after parallelism has already been used.",
        "2026-12-05 09:35:02.1: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.",
        "INFO 12-05 09:35:02 [__init__.py:235] Automatically detected platform cpu.",
        "2026-12-05 09:35:02,1 INFO worker.py:1888 -- Started a local Ray instance.",
    ]
    assert [line for line in caught if not foreign_lines(line)] == []
    ours = [
        "held-out success (2 problems, greedy): before 0.0% | after SFT 0.0% | after RL 0.0%   (seed 0, 0.2 min)",
        "tensorboard: /tmp/pytest-of-root/pytest-3/apps0/calculator/tensorboard/calculator",
        '{"engine": "hf", "model": "/tmp/apps0/home/demo/model", "recipe": "demo-calculator", "event": '
        '"engine_loading", "logger": "apps.serve", "level": "info"}',
        "Serving at http://127.0.0.1:8000  (web chat: http://127.0.0.1:8000/  API: http://127.0.0.1:8000/v1)",
        "installed as the compaction demo model: /tmp/apps0/home/demo/compaction/model",
    ]
    assert foreign_lines("\n".join(ours)) == []


def test_apps_train_and_apps_serve_print_nothing_from_libraries_they_do_not_use(outputs: list[Output]) -> None:
    found = [line for output in outputs for line in output.foreign()]
    assert not found, "foreign output:\n" + "\n".join(found)


def test_apps_train_with_no_progress_prints_no_progress_bar_of_transformers(outputs: list[Output]) -> None:
    """transformers' own bars ("Loading weights": the ablation's start; "Writing model shards": every checkpoint)
    are a library we use, not a foreign one, but `--no-progress` means no bar, and mid-run they cut through ours."""
    train = [output for output in outputs if output.command.startswith("apps/train")]
    bars = [
        f"{output.command}: {line}"
        for output in train
        for line in (output.stdout + "\n" + output.stderr).splitlines()
        if "Loading weights" in line or "Writing model shards" in line
    ]
    assert len(train) == 2 and not bars, "\n".join(bars)
