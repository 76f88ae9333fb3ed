"""OpenRLHF's real job, started by the launcher's own command, on this machine's CPUs: every step checked.

`apps/train --backend openrlhf --device cpu` runs `python -m agent_train.openrlhf.main`, which is OpenRLHF 0.11.2's
`train_ppo_ray` with the segment extension and the CPU bridges (`agent_train.openrlhf.cpu_bridges`): a local Ray given
fake GPUs, DeepSpeed's CPU accelerator under ZeRO-3 for the actor and the reference model, vLLM's CPU build as the
rollout engine driven by our `AgentExecutor`, the weights synced to vLLM over gloo after every step, and a saved model.
Nothing here stands in for a part of the job: the processes are the real ones, and what they checked at each step is
read from the file they wrote (`agent_train.openrlhf.cpu_checks`).

Two runs of GRPO (hybrid layout, reference model for the KL loss), three steps each, from the demo agents' SFT
models (`conftest.calculator_sft_model`, `compaction_sft_model`):

- the calculator demo: 8 prompts x 4 samples a step; the model answers about 65% of problems, so rewards vary
  within groups and a step has a gradient. Checked: both steps trained and synced; what vLLM received is what the
  actor sent, byte for byte; vLLM's weights changed when the actor's had, and the tensors vLLM keeps in the
  checkpoint's layout equal the actor's after each load; the vLLM-vs-actor logprob gap on every step's samples
  stays under `MAX_LOGPROB_GAP` (vLLM sampled with the synced weights); a non-zero advantage; OpenRLHF's own KL
  to the reference is logged above 0; the extension was installed in every Ray worker; the model was saved.
- the compaction demo: its episodes summarize and continue, so the experience maker makes more samples than
  episodes (the extension at work in the trainer's Ray worker), and every segment of an episode carries the
  episode's advantage.

What this does not prove, and `scripts/gpu_check.py` and a GPU job must: NCCL and CUDA IPC weight sync, vLLM's
and DeepSpeed's sleep modes, flash-attention, several GPUs per engine, speed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_train.openrlhf.cpu_checks import MAX_LOGPROB_GAP, CheckReport, verdict

REPO = Path(__file__).resolve().parents[2]
STEPS = 3  # OpenRLHF's warmup gives the first step a learning rate of 0: the third samples after a real update
JOB_TIMEOUT_S = 1200


def run_job(recipe: str, model: Path, run_dir: Path, *, prompts: int, samples: int) -> tuple[str, CheckReport]:
    """The launcher's command for `STEPS` GRPO steps of `prompts` x `samples` on the CPU; its output and checks."""
    command = [
        sys.executable, "apps/train", "--backend", "openrlhf", "--device", "cpu",
        "--recipe", recipe, "--pretrain", str(model), "--run-dir", str(run_dir),
        "--algo", "grpo", "--samples-per-prompt", str(samples), "--rollout-batch-size", str(prompts),
        "--train-batch-size", str(prompts * samples), "--micro-train-batch-size", "8",
        "--micro-rollout-batch-size", "8", "--lr", "1e-4",
        "--", "--data.max_samples", str(prompts * STEPS),
    ]  # fmt: skip
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    output = done.stdout + done.stderr
    (run_dir / "job.log").write_text(output, encoding="utf-8")
    assert done.returncode == 0, f"the job failed (exit {done.returncode}); the end of its output:\n{output[-6000:]}"
    return output, verdict(run_dir / "cpu_checks.jsonl", min_steps=STEPS)


def global_steps(output: str) -> list[dict[str, float]]:
    """The numbers of OpenRLHF's per-step logs (``Global step N: {'kl': ..., ...}``), in order."""
    number = r"'([\w/]+)': (-?[0-9.]+(?:e-?[0-9]+)?)"
    return [
        {key: float(value) for key, value in re.findall(number, line)}
        for line in output.splitlines()
        if re.search(r"Global step \d+: \{", line)
    ]


def rows(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "cpu_checks.jsonl").read_text(encoding="utf-8").splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == kind]


@pytest.fixture(scope="module")
def calculator_job(calculator_sft_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Any]:
    run_dir = tmp_path_factory.mktemp("real-job-calculator")
    output, report = run_job("agent_demo.recipe", calculator_sft_model, run_dir, prompts=8, samples=4)
    return run_dir, output, report


def test_every_step_trains_syncs_and_samples_with_the_synced_weights(calculator_job: Any) -> None:
    run_dir, _, report = calculator_job
    assert report.ok, report.summary()
    assert (report.steps, report.syncs, report.engines) == (STEPS, STEPS, 1), report.summary()
    sent, loaded = rows(run_dir, "sent"), rows(run_dir, "loaded")
    assert [row["received"] for row in loaded] == [row["digest"] for row in sent]
    assert all(row["equal"] == row["comparable"] > 0 for row in loaded)
    assert loaded[-2]["changed"]  # step 2 moved the actor, and vLLM with it; step 3 sampled with those weights
    assert report.max_logprob_gap is not None and report.max_logprob_gap <= MAX_LOGPROB_GAP
    assert all(row["with_logprobs"] == row["samples"] == 32 for row in rows(run_dir, "train"))
    assert any(a > 0 for a in report.mean_abs_advantage)


def test_the_job_logs_its_steps_keeps_a_reference_and_saves_the_model(calculator_job: Any) -> None:
    run_dir, output, report = calculator_job
    steps = global_steps(output)
    assert len(steps) == STEPS
    assert steps[-1]["kl"] > 0  # the reference model is there, and the actor has moved away from it
    assert all(0.0 <= step["reward"] <= 1.0 for step in steps)
    assert all(step["agent_tool_calls"] > 0 for step in steps)  # the agent called its tool on vLLM
    assert report.workers >= 4 and report.workers_without_segments == 0  # trainer, actor, reference, vLLM
    assert any(path.suffix == ".safetensors" for path in (run_dir / "model").rglob("*"))


def test_compacted_episodes_train_every_segment_with_the_episodes_advantage(
    compaction_sft_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_dir = tmp_path_factory.mktemp("real-job-compaction")
    _, report = run_job("agent_demo.running_total", compaction_sft_model, run_dir, prompts=4, samples=4)
    assert report.ok, report.summary()
    assert report.samples > report.episodes == STEPS * 16, report.summary()
    assert report.advantage_spread is not None and report.advantage_spread <= 1e-5
    assert any(a > 0 for a in report.mean_abs_advantage)  # rewards varied: the one advantage per episode is not 0
    assert report.workers_without_segments == 0
