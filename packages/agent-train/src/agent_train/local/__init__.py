"""The local trainer: the demo agent trained on one CPU machine, SFT on expert episodes then RL on episodes the
`hf` engine samples through `AgentRuntime` (the session serving and OpenRLHF's executor run), trained from the
episodes' transcript records. One idea per module:

- `config`: `LocalTrainConfig` and its presets (``default``, ``ci``);
- `batch`: padded token batches and per-token logprobs;
- `sft`: expert episodes through the recipe's session, and the cross-entropy step;
- `rollout`: groups of episodes through `AgentRuntime`, one record per segment read from its transcript record;
  `program_rollouts`: the same for an agent-program recipe, each episode run by `AgentExecutor.rollout` (the proxy);
- `lockstep`: `LockstepEngine`, the trainer's engine: each wave of the episodes' requests batched in episode order,
  never by arrival time, so a seed gives the same run, bit for bit, on the same machine;
- `rl`: group-normalized advantages and the clipped policy-gradient step (optional KL to the SFT model, OpenRLHF's
  token-level IS correction for rollouts of older weights);
- `pipeline`: `RolloutPipeline`, asynchronous RL (``--async K``): batches sampled on a copy of the weights, at most
  K versions behind the update that trains them;
- `evaluate`: greedy held-out success through `AgentRuntime`;
- `paired`: two saved models on the same held-out problems, fixed / broken and a sign test;
- `metrics` (JSONL), `plot` (PNG), `checkpoint` (HF model directory + trainer state, resume);
- `trajectory_log`: every RL step's, evaluation's and expert's episodes as the trajectory viewer reads them;
- `trainer`: `train_local`, the phases in order; `cli`: `main(argv)`, what `uv run apps/train` runs;
- `program_training`: an agent-program recipe trained from the warm start through `ProgramRollouts`, what
  `uv run apps/train --recipe R` runs (`run_program_cli`).

Importing this package is light; `train_local` and `TrainResult` load torch and transformers on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent_train.local.config import PRESETS, LocalTrainConfig, preset

if TYPE_CHECKING:
    from agent_train.local.trainer import TrainResult, train_local

__all__ = ["PRESETS", "LocalTrainConfig", "TrainResult", "preset", "run_cli", "run_program_cli", "train_local"]

_LAZY = {"train_local": "agent_train.local.trainer", "TrainResult": "agent_train.local.trainer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_cli(argv: Sequence[str] | None = None) -> int:
    """The local trainer's command line (`agent_train.local.cli`), loaded on call: torch, transformers and vLLM
    load from here on."""
    from agent_train.local.cli import main

    return main(argv)


def run_program_cli(argv: Sequence[str] | None = None) -> int:
    """The command line of an agent-program recipe's training (`agent_train.local.program_training`); a recipe it
    cannot train raises `agent_runtime.RecipeError` before torch loads."""
    from agent_train.local.program_training import main

    return main(argv)
