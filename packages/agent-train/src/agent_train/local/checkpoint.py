"""Checkpoints of the local trainer: a Hugging Face model directory plus the trainer's state, written atomically,
so a run can resume where it stopped and every checkpoint can be served or loaded with `from_pretrained`.

    save_checkpoint(run_dir / "checkpoint", model=m, tokenizer=t, optimizer=o, state=s, rng=r)
    checkpoint = load_checkpoint(run_dir / "checkpoint")       # None when there is none

A checkpoint directory holds the model files of `save_model_dir` (config, safetensors, tokenizer, chat template)
and ``trainer_state.json`` (`TrainerState`: phase, steps, figures so far, the config), ``optimizer.pt`` and
``rng.pt`` (the Python, torch and sampling RNG states). It is written into a temporary sibling directory and
renamed into place, so a crash mid-save leaves the previous checkpoint whole. This module knows files, torch and
msgspec; it knows nothing about how the phases train.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import torch
from tokenizers import Tokenizer

from agent_train.atomic_dir import replacing_dir
from agent_train.demo.model import is_model_dir, load_demo_model, save_model_dir
from agent_train.local.config import LocalTrainConfig

__all__ = ["Checkpoint", "TrainerState", "load_checkpoint", "save_checkpoint"]

_STATE: Final = "trainer_state.json"
_OPTIMIZER: Final = "optimizer.pt"
_RNG: Final = "rng.pt"

Phase = Literal["sft", "rl", "done"]


class TrainerState(msgspec.Struct, kw_only=True):
    """Where a run is: `phase` is the phase to run next (or ``done``), `sft_step`/`rl_step` the steps finished in
    each, `figures` the held-out success measured so far (``before``, ``after_sft``, ``after_rl``)."""

    config: LocalTrainConfig
    phase: Phase = "sft"
    sft_step: int = 0
    rl_step: int = 0
    figures: dict[str, float] = msgspec.field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def step(self) -> int:
        """The global step: SFT steps, then RL steps counted on."""
        return self.sft_step + self.rl_step


@dataclass
class Checkpoint:
    model: Any
    tokenizer: Tokenizer
    state: TrainerState
    optimizer_state: dict[str, Any] | None
    rng: dict[str, Any]


def save_checkpoint(
    path: str | Path,
    *,
    model: Any,
    tokenizer: Tokenizer,
    state: TrainerState,
    optimizer: torch.optim.Optimizer | None,
    rng: dict[str, Any],
) -> Path:
    """Write the checkpoint at `path`, replacing the previous one only once the new one is complete."""
    with replacing_dir(path) as scratch:
        save_model_dir(model, tokenizer, scratch)
        (scratch / _STATE).write_bytes(msgspec.json.format(msgspec.json.encode(state)) + b"\n")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), scratch / _OPTIMIZER)
        torch.save(rng, scratch / _RNG)
    return Path(path)


def load_checkpoint(path: str | Path) -> Checkpoint | None:
    """The checkpoint at `path`, or None when there is no complete one."""
    source = Path(path)
    if not (source / _STATE).is_file() or not is_model_dir(source):
        return None
    state = msgspec.json.decode((source / _STATE).read_bytes(), type=TrainerState)
    optimizer_state = torch.load(source / _OPTIMIZER, weights_only=False) if (source / _OPTIMIZER).is_file() else None
    rng = torch.load(source / _RNG, weights_only=False) if (source / _RNG).is_file() else {}
    return Checkpoint(
        model=load_demo_model(source),
        tokenizer=Tokenizer.from_file(str(source / "tokenizer.json")),
        state=state,
        optimizer_state=optimizer_state,
        rng=rng,
    )
