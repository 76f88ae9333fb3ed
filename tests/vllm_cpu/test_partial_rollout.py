"""OpenRLHF's async job with partial rollouts, on this machine's CPUs: every token's policy version checked.

`apps/train --backend openrlhf --device cpu --mode async --partial-rollout` runs OpenRLHF 0.11.2's `train_ppo_ray`
with ``--train.async_enable --train.partial_rollout_enable`` (and its token-level IS correction): the rollouts of
the next batch run on their own vLLM engine while the actor trains on the last one, and each weight broadcast
pauses vLLM's generation in place (``pause_generation(mode="keep")``) and resumes it, so an episode may continue
across an update, between two turns or inside one turn's generation. The executor's `OpenRLHFEngine` tags every
generated token with the number of weight syncs the engine had loaded when it was sampled
(`agent_train.openrlhf.engine_versions`); the trajectory log keeps it on each action span.

One run, GRPO on the calculator demo's SFT model (`conftest.calculator_sft_model`), 8 prompts x 4 samples a step,
`STEPS` steps, the async queue of 1 (OpenRLHF's default). With ``--rollout.vllm_generate_batch_size 96`` one vLLM
call generates twelve steps' batches (384 episodes); the generator starts the second call when the trainer takes
the first call's last batch, so the next sync, one training step later, is the one that can land while episodes
run. Whether it does must not depend on the host: with the demo's instant calculator a call's 384 episodes took
5.8 s on one machine and the sync landed 5.2 s in, and on the CI host no episode crossed it. So the job trains
on the demo agent with a calculator that answers `slow_tool_recipe.LATENCY_S` (20 s) late, as a networked tool
does: every episode then lasts longer than a GRPO step on the CPU (2-5 s), and the sync lands inside the second
call's episodes, between their two turns or inside a turn still generating. Checked from the run's own records
(the trajectory log and ``cpu_checks.jsonl``):

- the versions on tokens are exactly syncs that happened: every one is in 0..S, S the number of syncs the actor
  broadcast and the engine loaded (recorded by the actor, by vLLM's worker and by the version counter);
- staleness (the engine's version at an episode's end minus its oldest token's) is at most the queue size, 1;
- updates landed inside episodes: between two turns (an episode whose turns carry different versions) and while
  a turn was paused mid-generation (one generation split into two action spans); the counts are printed;
- every sampled token keeps its logprob and its version (each action token is in a versioned action span and has
  a finite logprob), and the drain before each bump finished (no token read after a bump was sampled before it);
- the segment extension still trains every segment: the trainer made one sample per logged segment, each with
  vLLM's logprobs for the IS correction, and the job's own checks (weights synced byte for byte) held.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import Trajectory, read_trajectories
from agent_train.openrlhf.cpu_checks import CheckReport, verdict

REPO = Path(__file__).resolve().parents[2]
SLOW_TOOL_RECIPE = Path(__file__).resolve().with_name("slow_tool_recipe.py")  # the demo agent, its tool 20 s late
STEPS = 24
PROMPTS, SAMPLES = 8, 4
GENERATE_PROMPTS = 12 * PROMPTS  # one vLLM call generates twelve steps' batches (OpenRLHF's over-sampling)
QUEUE_SIZE = 1  # OpenRLHF's --train.async_queue_size default
JOB_TIMEOUT_S = 1200


def rows(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "cpu_checks.jsonl").read_text(encoding="utf-8").splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == kind]


def action_spans(trajectory: Trajectory) -> list[list[Any]]:
    """Each segment's action spans."""
    return [[span for span in segment.spans if span.kind == "action"] for segment in trajectory.segments]


def generations(trajectory: Trajectory) -> list[list[int | None]]:
    """The versions of each generation (turn) of `trajectory`, in order (`action_ranges`: the action spans of one
    generation that a sync split where its version changed are one range)."""
    return [
        [span.version for span in segment.spans if span.kind == "action" and start <= span.start < end]
        for segment in trajectory.segments
        for start, end in segment.action_ranges
    ]


def paused_mid_turn(trajectory: Trajectory) -> bool:
    """Whether a sync landed inside one of the episode's generations."""
    return any(len(versions) > 1 for versions in generations(trajectory))


def updated_between_turns(trajectory: Trajectory) -> bool:
    """Whether a sync landed between two of the episode's generations."""
    turns = generations(trajectory)
    return any(before[-1] != after[0] for before, after in pairwise(turns))


@pytest.fixture(scope="module")
def partial_job(calculator_sft_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CheckReport]:
    run_dir = tmp_path_factory.mktemp("partial-rollout")
    command = [
        sys.executable, "apps/train", "--backend", "openrlhf", "--device", "cpu",
        "--recipe", str(SLOW_TOOL_RECIPE), "--pretrain", str(calculator_sft_model), "--run-dir", str(run_dir),
        "--algo", "grpo", "--mode", "async", "--partial-rollout",
        "--samples-per-prompt", str(SAMPLES), "--rollout-batch-size", str(PROMPTS),
        "--train-batch-size", str(PROMPTS * SAMPLES), "--micro-train-batch-size", "8",
        "--micro-rollout-batch-size", "8", "--lr", "1e-4",
        "--", "--data.max_samples", str(PROMPTS * STEPS), "--rollout.vllm_generate_batch_size", str(GENERATE_PROMPTS),
    ]  # fmt: skip
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    output = done.stdout + done.stderr
    (run_dir / "job.log").write_text(output, encoding="utf-8")
    print(f"\npartial-rollout job: {time.monotonic() - started:.0f} s, exit {done.returncode}")
    checks = done.stdout[done.stdout.find("== --device cpu checks") :]
    assert done.returncode == 0, f"the job failed (exit {done.returncode}): {checks}\n{output[-4000:]}"
    return run_dir, verdict(run_dir / "cpu_checks.jsonl", min_steps=STEPS, on_policy=False)


@pytest.fixture(scope="module")
def trajectories(partial_job: tuple[Path, CheckReport]) -> list[Trajectory]:
    run_dir, _ = partial_job
    return list(read_trajectories(run_dir / "trajectories" / "rollouts.jsonl"))


def test_the_job_trained_and_synced_with_its_checks_held(partial_job: tuple[Path, CheckReport]) -> None:
    run_dir, report = partial_job
    assert report.ok, report.summary()
    assert (report.steps, report.syncs, report.engines) == (STEPS, STEPS, 1), report.summary()
    assert [row["received"] for row in rows(run_dir, "loaded")] == [row["digest"] for row in rows(run_dir, "sent")]


def test_token_versions_are_exactly_the_syncs_that_happened(
    partial_job: tuple[Path, CheckReport], trajectories: list[Trajectory]
) -> None:
    run_dir, report = partial_job
    bumps = rows(run_dir, "version")
    assert [row["version"] for row in bumps] == list(range(1, report.syncs + 1))  # one bump per loaded sync
    assert all(row["drained"] for row in bumps), bumps
    assert len(trajectories) == STEPS * PROMPTS * SAMPLES
    seen = sorted({v for t in trajectories for v in t.policy_versions})
    assert seen and set(seen) <= set(range(report.syncs + 1)), (seen, report.syncs)
    assert len(seen) >= 2  # rollouts were sampled by more than one policy
    for trajectory in trajectories:
        assert trajectory.policy_version is not None and trajectory.policy_version <= report.syncs
        assert trajectory.policy_versions == sorted(
            {span.version for spans in action_spans(trajectory) for span in spans if span.version is not None}
        )


def test_staleness_is_bounded_by_the_async_queue(trajectories: list[Trajectory]) -> None:
    staleness = [trajectory.staleness for trajectory in trajectories]
    assert all(s is not None and 0 <= s <= QUEUE_SIZE for s in staleness), staleness
    print(f"\nstaleness histogram: { {s: staleness.count(s) for s in sorted(set(staleness), key=str)} }")


def test_updates_landed_inside_episodes_between_turns_or_mid_turn(
    partial_job: tuple[Path, CheckReport], trajectories: list[Trajectory]
) -> None:
    run_dir, _ = partial_job
    mid_turn = [t for t in trajectories if paused_mid_turn(t)]
    between = [t for t in trajectories if updated_between_turns(t)]
    paused = sum(row["paused_mid_turn"] for row in rows(run_dir, "version"))
    print(
        f"\nepisodes across an update: {len(between)} between turns, {len(mid_turn)} with a turn paused mid-way "
        f"(of {len(trajectories)}); requests paused mid-generation at the syncs: {paused}"
    )
    assert between or mid_turn
    assert len(mid_turn) <= paused  # a split generation is one the engine saw paused with tokens sampled


def test_every_sampled_token_keeps_its_logprob_and_version(trajectories: list[Trajectory]) -> None:
    for trajectory in trajectories:
        for segment, spans in zip(trajectory.segments, action_spans(trajectory), strict=True):
            assert spans, "an episode with no generated token"
            for span in spans:
                assert span.version is not None
                for i in range(span.start, span.end):
                    logprob = segment.logprobs[i]
                    assert logprob is not None and math.isfinite(logprob) and logprob <= 0
                    assert segment.loss_mask[i] == 1
            covered = sum(span.end - span.start for span in spans)
            assert covered == sum(segment.loss_mask)  # no trained token outside a versioned action span


def test_the_segment_extension_trains_every_segment(
    partial_job: tuple[Path, CheckReport], trajectories: list[Trajectory]
) -> None:
    run_dir, report = partial_job
    segments = sum(len(trajectory.segments) for trajectory in trajectories)
    assert report.episodes == len(trajectories) and report.samples == segments
    assert all(row["with_logprobs"] == row["samples"] for row in rows(run_dir, "train"))  # IS correction's input
    assert sum(row["samples"] for row in rows(run_dir, "train")) == segments
