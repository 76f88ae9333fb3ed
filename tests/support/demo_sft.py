"""The demo agents' models after supervised training only: what tests on real engines need when the model must call
tools and answer (an untrained model never does), built by the local trainer's own ``ci`` preset with no RL.

    path = sft_demo_model("calculator", tmp_path)      # about 80 s on 2 cores (the compaction demo: longer)

The directory is the trainer's own final model (tokenizer, chat template, weights), so every engine loads it as
`apps/serve` would. Seed 0: the calculator demo's SFT model answers about 65% of held-out problems greedily, so
sampled groups of a few episodes get rewards that differ.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

__all__ = ["sft_demo_model"]


def sft_demo_model(demo: str, run_dir: Path, *, seed: int = 0, sft_steps: int | None = None) -> Path:
    """Train `demo`'s tokenizer and model through SFT (the ``ci`` preset, no RL steps; `sft_steps` overrides the
    preset's) into `run_dir`; returns the model directory."""
    from agent_train.local.demos import get_demo
    from agent_train.local.trainer import train_local

    preset = get_demo(demo).presets["ci"]
    config = msgspec.structs.replace(preset, seed=seed, rl_steps=0, sft_steps=sft_steps or preset.sft_steps)
    result = train_local(config, run_dir, progress=False)
    return Path(result.model_dir)
