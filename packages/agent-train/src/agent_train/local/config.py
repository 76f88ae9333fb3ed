"""`LocalTrainConfig`: every hyperparameter of the local trainer, with defaults that train the demo agent on
two CPU cores in about eight minutes, and a `ci` preset (a third of the RL steps, half the held-out problems) that
the test suite runs in about five.

    config = LocalTrainConfig()                       # the full run of `uv run apps/train`
    config = preset("ci")                             # the shortened run the test suite asserts on
    config = msgspec.structs.replace(config, seed=3)

The phases: a tokenizer trained on the task's text, a freshly initialized tiny Qwen3 model, a short supervised
warm start on expert episodes (enough to learn the format, not enough to copy every digit right), then RL on
groups of sampled episodes, with held-out evaluations before training, after SFT and every `eval_every` RL steps.
The RL advantage estimator is one of OpenRLHF's, by its name (`ESTIMATORS`; see `agent_train.local.rl`), and
``rl_dynamic_filtering`` adds DAPO's dynamic filtering. The config is stored with every checkpoint; resuming checks
it is unchanged. This module holds numbers and names only.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from agent_train.demo.model import DemoModelSpec

__all__ = [
    "ESTIMATORS", "GROUP_ESTIMATORS", "PRESETS", "Estimator", "ISMode", "LocalTrainConfig", "check_config", "preset"
]  # fmt: skip

Estimator = Literal["reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo"]
ISMode = Literal["mask", "clip"]
"""OpenRLHF's ``--algo.advantage.is_correction_mode``: a token whose IS ratio leaves the band is dropped (``mask``,
ICEPOP, its default) or its ratio clamped into the band (``clip``, TIS)."""
ESTIMATORS: Final[dict[str, str]] = {
    "reinforce": "REINFORCE++: the reward, whitened over the batch's action tokens (no group baseline)",
    "reinforce_baseline": "REINFORCE++-baseline: reward minus its group's mean, whitened over the batch",
    "rloo": "RLOO: reward minus the mean of the other samples of its group",
    "grpo": "GRPO (OpenRLHF's group_norm): reward minus its group's mean, divided by the group's std",
    "dr_grpo": "Dr. GRPO: reward minus its group's mean, no std division",
}
"""The local estimators, by OpenRLHF's names (``grpo`` is its ``group_norm``), each with a one-line description."""
GROUP_ESTIMATORS: Final = frozenset({"reinforce_baseline", "rloo", "grpo", "dr_grpo"})
"""The estimators whose baseline is the prompt's group: they need more than one sample per prompt."""


class LocalTrainConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Hyperparameters of one local training run (see the module docstring for the phases)."""

    seed: int = 0
    demo: str = "calculator"  # which demo agent (`agent_train.local.demos`): "calculator" or "compaction"
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
    rl_estimator: Estimator = "grpo"
    rl_kl_coef: float = 0.0
    rl_clip_eps: float = 0.2
    rl_minibatches: int = 1
    # DAPO's dynamic filtering: drop the groups whose rewards are all equal and sample more prompts to refill the
    # step's `rl_prompts` groups, in at most `rl_filter_rounds` rollout rounds per step (then train on what passed)
    rl_dynamic_filtering: bool = False
    rl_filter_rounds: int = 3
    # compacted episodes train every segment with the episode's advantage (see `agent_train.local.rl`);
    # `rl_mask_summaries` gives the summary turns loss mask 0 (the ablation), `rl_mask_overlong` leaves out the
    # episodes that ran out of budget rather than answering (`agent_train.sample.ended_by_budget`, as OpenRLHF's)
    rl_mask_summaries: bool = False
    rl_mask_overlong: bool = True
    # held-out evaluation (greedy): every `sft_eval_every` SFT steps and every `eval_every` RL steps
    eval_size: int = 200
    sft_eval_every: int = 50
    eval_every: int = 10
    # engine and bookkeeping
    max_batch_size: int = 256
    checkpoint_every: int = 20
    # asynchronous RL (`agent_train.local.pipeline`): None trains on one shared copy of the weights, each batch
    # sampled by the weights it trains (the synchronous loop); K >= 0 samples on a second copy, batch j with the
    # weights of version max(0, j - K), while the earlier batches train: at most K versions of staleness, and from
    # K = 1 on the token-level IS correction of OpenRLHF (`rl_is_mode` over the band `rl_is_bounds`); K = 0 is that
    # pipeline without overlap, whose records equal the synchronous loop's
    rl_async: int | None = None
    rl_is_mode: ISMode = "mask"
    rl_is_bounds: tuple[float, float] = (0.5, 5.0)


PRESETS: Final[dict[str, LocalTrainConfig]] = {  # the calculator demo's; every demo's: `agent_train.local.demos`
    "default": LocalTrainConfig(),
    "ci": LocalTrainConfig(
        rl_steps=20,
        eval_size=100,
        sft_eval_every=1000,
        eval_every=5,
    ),
}


def check_config(config: LocalTrainConfig) -> LocalTrainConfig:
    """`config`, or a `ValueError` naming the field that cannot work (an unknown estimator, a group baseline or
    dynamic filtering with one sample per prompt)."""
    if config.rl_estimator not in ESTIMATORS:
        raise ValueError(f"rl_estimator: unknown {config.rl_estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if config.rl_group_size < 2 and (config.rl_estimator in GROUP_ESTIMATORS or config.rl_dynamic_filtering):
        what = "dynamic filtering" if config.rl_dynamic_filtering else f"the {config.rl_estimator} estimator"
        raise ValueError(f"rl_group_size: {what} compares the samples of a prompt and needs at least 2, got 1")
    if config.rl_filter_rounds < 1:
        raise ValueError(f"rl_filter_rounds must be at least 1, got {config.rl_filter_rounds}")
    if config.rl_async is not None:
        if config.rl_async < 0:
            raise ValueError(f"rl_async must be at least 0 (the versions of staleness allowed), got {config.rl_async}")
        if config.rl_dynamic_filtering:
            raise ValueError("rl_async: dynamic filtering refills a step with rounds that wait on its own results; "
                             "run it synchronously (rl_async=None)")  # fmt: skip
    if config.rl_is_mode not in ("mask", "clip"):
        raise ValueError(f"rl_is_mode: unknown {config.rl_is_mode!r}; choose mask or clip")
    low, high = config.rl_is_bounds
    if not 0.0 <= low < 1.0 < high:
        raise ValueError(f"rl_is_bounds must hold 1 inside, 0 <= low < 1 < high, got {config.rl_is_bounds}")
    return config


def preset(name: str) -> LocalTrainConfig:
    """A named configuration: ``default`` (the full demo run) or ``ci`` (the shortened test run)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
