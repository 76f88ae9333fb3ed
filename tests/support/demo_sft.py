"""The demo agents' models after supervised training only: what tests on real engines need when the model must call
tools and answer (an untrained model never does), built by the local trainer's own ``ci`` preset with no RL.

    path = sft_demo_model("calculator", tmp_path)      # about 80 s on 2 cores (the compaction demo: longer)

The directory is the trainer's own model (tokenizer, chat template, weights), so every engine loads it as
`apps/serve` would. Seed 0: the calculator demo's SFT model answers about 65% of held-out problems greedily, so
sampled groups of a few episodes get rewards that differ.

A model is kept in ``<repo>/.cache/sft-<demo>-seed<seed>/`` (git-ignored) and reused while nothing that decides it
changed: `sft_key` digests the SFT configuration (the preset with its seed and SFT steps, no RL) and every file under
``packages/*/src`` (the trainer, the demos' data and models). A full run of the local trainer writes the same model on
its way (``run_dir/sft``, before RL starts), and `keep_sft_model` keeps it: tests/agent_train's ``ci`` runs of the
calculator and compaction demos keep theirs, so the vLLM CPU step that `scripts/check` runs after pytest (another
virtual environment, the same checkout) loads them instead of training them again (its two fixtures: 117 and 194 s
before, 24 and 21 s after). Which PyTorch build trained a model is not in the key: these models are what the engines
under test load (hf against vLLM on the same weights, OpenRLHF's job starting from them), not figures.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from tests.support.model_dir import REPO, cached_model_dir

if TYPE_CHECKING:
    from agent_train.local.config import LocalTrainConfig

__all__ = ["keep_sft_model", "sft_config", "sft_demo_model", "sft_key"]

STAMP = "sft.json"  # the key the kept directory was built for
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def sft_config(demo: str, *, seed: int = 0, sft_steps: int | None = None) -> LocalTrainConfig:
    """`demo`'s ``ci`` preset at `seed`, SFT only (`sft_steps` overrides the preset's)."""
    from agent_train.local.demos import get_demo

    preset = get_demo(demo).presets["ci"]
    return msgspec.structs.replace(preset, seed=seed, rl_steps=0, sft_steps=sft_steps or preset.sft_steps)


def sft_key(config: LocalTrainConfig) -> str:
    """A digest of what decides the model after `config`'s SFT: the configuration with its RL steps left out, and
    every file the packages are built from."""
    digest = hashlib.sha256(msgspec.json.encode(msgspec.structs.replace(config, rl_steps=0)))
    for path in sorted((REPO / "packages").glob("*/src/**/*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def sft_demo_model(
    demo: str, run_dir: Path, *, seed: int = 0, sft_steps: int | None = None, cache_dir: Path | None = None
) -> Path:
    """`demo`'s model after SFT (the ``ci`` preset, no RL steps; `sft_steps` overrides the preset's): the kept one
    when its key matches, else trained in `run_dir` and kept. Returns the model directory (do not write to it)."""
    from agent_train.local.trainer import train_local

    config = sft_config(demo, seed=seed, sft_steps=sft_steps)
    return _kept(config, lambda: Path(train_local(config, run_dir, progress=False).model_dir), cache_dir)


def keep_sft_model(config: LocalTrainConfig, run_dir: Path, *, cache_dir: Path | None = None) -> Path | None:
    """Keep the SFT model a finished run of `config` wrote (``run_dir/sft``) for `sft_demo_model`, unless one is
    kept already or the run wrote none (no SFT steps). Returns the kept directory, or None."""
    written = run_dir / "sft"
    if config.sft_steps <= 0 or not (written / "model.safetensors").is_file():
        return None
    return _kept(config, lambda: written, cache_dir)


def _kept(config: LocalTrainConfig, model: Callable[[], Path], cache_dir: Path | None) -> Path:
    """The kept directory of `config`'s key; when there is none, `model()` gives the model directory to keep."""
    key = sft_key(config)

    def build(into: Path) -> None:
        shutil.copytree(model(), into)
        (into / STAMP).write_text(json.dumps({"id": key}) + "\n", encoding="utf-8")

    return cached_model_dir(
        f"sft-{config.demo}-seed{config.seed}", build=build, expected_id=key, needed=NEEDED, cache_dir=cache_dir,
        stamp=STAMP,
    )  # fmt: skip
