"""`LocalTrainConfig`: every hyperparameter of the local trainer, with defaults that train the demo agent on
two CPU cores in about eight minutes, and a `ci` preset (a third of the RL steps, half the held-out problems) that
the test suite runs in about five.

    config = LocalTrainConfig()                       # the full run of `uv run apps/train`
    config = preset("ci")                             # the shortened run the test suite asserts on
    config = msgspec.structs.replace(config, seed=3)

The phases: a tokenizer trained on the task's text, a freshly initialized tiny Qwen3 model, a short supervised
warm start on expert episodes (enough to learn the format, not enough to copy every digit right), then RL on
groups of sampled episodes, with held-out evaluations before training, after SFT and every `eval_every` RL steps.
The config is stored with every checkpoint; resuming checks it is unchanged. This module holds numbers only.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from agent_train.demo.model import DemoModelSpec

__all__ = ["PRESETS", "LocalTrainConfig", "preset"]


class LocalTrainConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Hyperparameters of one local training run (see the module docstring for the phases)."""

    seed: int = 0
    # tokenizer and model
    vocab_size: int = 1024
    tokenizer_episodes: int = 3000
    model: DemoModelSpec = msgspec.field(default_factory=DemoModelSpec)
    # supervised warm start on expert episodes
    sft_episodes: int = 3000
    sft_steps: int = 200
    sft_batch_size: int = 32
    sft_lr: float = 2e-3
    sft_warmup_steps: int = 20
    sft_final_lr_ratio: float = 1.0  # < 1: cosine decay to this fraction of sft_lr by the last step; 1: constant
    sft_min_reward: float = 1.0  # imitate the expert episodes that earned at least this much
    # RL: `rl_prompts` prompts per step, `rl_group_size` samples each
    rl_steps: int = 60
    rl_prompts: int = 16
    rl_group_size: int = 8
    rl_lr: float = 2e-4
    rl_warmup_steps: int = 1  # linear warmup of rl_lr over this many steps (1: none)
    rl_temperature: float = 1.0
    rl_estimator: Literal["grpo", "reinforce_baseline"] = "grpo"
    rl_kl_coef: float = 0.0
    rl_clip_eps: float = 0.2
    rl_minibatches: int = 1
    # held-out evaluation (greedy): every `sft_eval_every` SFT steps and every `eval_every` RL steps
    eval_size: int = 200
    sft_eval_every: int = 50
    eval_every: int = 10
    # engine and bookkeeping
    max_batch_size: int = 256
    checkpoint_every: int = 20


PRESETS: Final[dict[str, LocalTrainConfig]] = {
    "default": LocalTrainConfig(),
    "ci": LocalTrainConfig(
        rl_steps=20,
        eval_size=100,
        sft_eval_every=1000,
        eval_every=5,
    ),
}


def preset(name: str) -> LocalTrainConfig:
    """A named configuration: ``default`` (the full demo run) or ``ci`` (the shortened test run)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
