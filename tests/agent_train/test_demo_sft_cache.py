"""`tests/support/demo_sft.py`'s cache: a full ``ci`` run's SFT model is kept and served to `sft_demo_model` (how the
vLLM CPU step skips training the two SFT models again), and only for what decides that model."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import agent_train.local.trainer as trainer
import tests.support.demo_sft as demo_sft
from agent_train.local.config import LocalTrainConfig
from agent_train.local.demos import get_demo
from tests.support.demo_sft import NEEDED, keep_sft_model, sft_config, sft_demo_model, sft_key


class Trained(Exception):
    """What the stand-in for the trainer raises: a call that got here was not served from the cache."""


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def train_local(*args: object, **kwargs: object) -> None:
        raise Trained

    monkeypatch.setattr(trainer, "train_local", train_local)


def full_run(tmp_path: Path, name: str = "run") -> Path:
    """A run directory as the trainer leaves it after SFT: ``sft/`` with a model's files (their bytes our own)."""
    run_dir = tmp_path / name
    (run_dir / "sft").mkdir(parents=True)
    for file in NEEDED:
        (run_dir / "sft" / file).write_text(f"{name}:{file}")
    return run_dir


def ci(seed: int = 0) -> LocalTrainConfig:
    return msgspec.structs.replace(get_demo("calculator").presets["ci"], seed=seed)


def test_a_full_runs_sft_model_is_served_to_the_sft_only_request(tmp_path: Path, no_training: None) -> None:
    cache = tmp_path / "cache"
    kept = keep_sft_model(ci(), full_run(tmp_path), cache_dir=cache)
    assert kept is not None
    served = sft_demo_model("calculator", tmp_path / "unused", cache_dir=cache)
    assert served == kept
    assert (served / "model.safetensors").read_text() == "run:model.safetensors"
    # kept once: a second run of the same configuration does not replace it
    assert keep_sft_model(ci(), full_run(tmp_path, "again"), cache_dir=cache) == kept
    assert (kept / "model.safetensors").read_text() == "run:model.safetensors"


def test_another_seed_or_sft_length_is_trained_not_served(tmp_path: Path, no_training: None) -> None:
    cache = tmp_path / "cache"
    keep_sft_model(ci(), full_run(tmp_path), cache_dir=cache)
    with pytest.raises(Trained):
        sft_demo_model("calculator", tmp_path / "seed1", seed=1, cache_dir=cache)
    with pytest.raises(Trained):
        sft_demo_model("calculator", tmp_path / "short", sft_steps=3, cache_dir=cache)
    with pytest.raises(Trained):
        sft_demo_model("compaction", tmp_path / "other", cache_dir=cache)


def test_the_key_leaves_out_rl_steps_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sft_key(ci()) == sft_key(sft_config("calculator"))
    assert sft_key(ci(seed=1)) != sft_key(ci())
    assert sft_key(sft_config("calculator", sft_steps=3)) != sft_key(sft_config("calculator"))
    assert sft_key(msgspec.structs.replace(sft_config("calculator"), sft_lr=1e-9)) != sft_key(sft_config("calculator"))
    source = tmp_path / "packages" / "agent-x" / "src" / "agent_x" / "trainer.py"
    source.parent.mkdir(parents=True)
    source.write_text("STEPS = 1\n")
    monkeypatch.setattr(demo_sft, "REPO", tmp_path)
    before = sft_key(sft_config("calculator"))
    source.write_text("STEPS = 2\n")  # a change to any package's source is another model
    assert sft_key(sft_config("calculator")) != before


def test_a_run_without_sft_keeps_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "no-sft"
    run_dir.mkdir()
    assert keep_sft_model(ci(), run_dir, cache_dir=tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists()
