"""The launcher's algorithm presets: one named `--algo` choice per OpenRLHF algorithm, as OpenRLHF 0.11.2's flags.

    preset = ALGORITHMS["dapo"]
    preset.flags(samples_per_prompt=8, kl_coef=None)   # ["--algo.advantage.estimator", "group_norm", ...]

Each preset is an advantage estimator of `openrlhf/cli/train_ppo_ray.py` (``--algo.advantage.estimator``, computed
in `RemoteExperienceMaker.compute_advantages_and_returns`, openrlhf/trainer/ppo_utils/experience_maker.py), how the
KL to the reference enters (as a loss with the k2/k3 estimator, or subtracted from the reward with k1, OpenRLHF's
default) and its default coefficient, and any further flags. The defaults are those of OpenRLHF's own example
scripts (examples/scripts/ in the OpenRLHF repository), named in `source`; where OpenRLHF ships no script for an
estimator, `source` says which script's settings are borrowed.

Group presets compare the samples of one prompt (a group mean, a leave-one-out mean, a group std, or DAPO's
filtering of all-equal groups); with one sample per prompt every advantage is zero (OpenRLHF asserts this for
``rloo``, ``reinforce_baseline``, ``group_norm`` and ``dr_grpo``, and its dynamic filtering would drop every 0/1
prompt), so the launcher refuses them with ``--samples-per-prompt 1``.

`IS_CORRECTION_FLAGS` switch on OpenRLHF's importance-sampling correction of the policy loss (`PolicyLoss` in
openrlhf/models/loss.py): the ratio of the training policy to the rollout policy, per token, masks the tokens
outside [0.5, 5] (ICEPOP). It reads the rollout logprobs, which vLLM returns once the correction is on and which
agent-train's executor passes through as ``rollout_log_probs``. This module is data; it imports nothing heavy.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

__all__ = ["ALGORITHMS", "IS_CORRECTION_FLAGS", "Algorithm", "AlgorithmPreset"]

Algorithm = Literal["ppo", "reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo", "dapo"]


class AlgorithmPreset(msgspec.Struct, frozen=True, kw_only=True):
    """One `--algo` choice: the estimator, the KL's form and default coefficient, further flags, a one-line
    `summary` for ``--help``, and the OpenRLHF example script the defaults come from."""

    estimator: str
    summary: str
    source: str
    kl_coef: float
    kl_loss: Literal["k2", "k3"] | None = None  # None: KL (k1) is subtracted from the reward
    group: bool = False  # needs --samples-per-prompt > 1
    critic: bool = False  # a critic model (PPO's value function), placed like the actor
    extra: tuple[str, ...] = ()

    def flags(self, *, kl_coef: float | None = None) -> list[str]:
        """The preset's OpenRLHF flags; `kl_coef` overrides its default (0 drops the KL and the reference)."""
        coef = self.kl_coef if kl_coef is None else kl_coef
        args = ["--algo.advantage.estimator", self.estimator, "--algo.kl.init_coef", str(coef)]
        if coef > 0 and self.kl_loss is not None:
            args += ["--algo.kl.use_loss", "--algo.kl.estimator", self.kl_loss]
        return args + list(self.extra)


ALGORITHMS: Final[dict[str, AlgorithmPreset]] = {
    "ppo": AlgorithmPreset(
        estimator="gae",
        summary="PPO: GAE advantages from a critic (value model, initialized from --pretrain, placed with the actor)",
        source="train_ppo_ray_hybrid_engine.sh (critic lr 9e-6, KL 0.01 in the reward)",
        kl_coef=0.01,
        critic=True,
        extra=("--critic.adam.lr", "9e-6"),
    ),
    "reinforce": AlgorithmPreset(
        estimator="reinforce",
        summary="REINFORCE++: the reward, whitened over the batch; no critic, no group",
        source="train_reinforce_ray_hybrid_engine.sh (KL 1e-4 in the reward)",
        kl_coef=1e-4,
    ),
    "reinforce_baseline": AlgorithmPreset(
        estimator="reinforce_baseline",
        summary="REINFORCE++-baseline: reward minus its group's mean, whitened over the batch; KL as a k2 loss",
        source="train_reinforce_baseline_hybrid_engine.sh (k2 KL loss, 1e-5)",
        kl_coef=1e-5,
        kl_loss="k2",
        group=True,
    ),
    "rloo": AlgorithmPreset(
        estimator="rloo",
        summary="RLOO: reward minus the mean of the prompt's other samples",
        source="train_reinforce_ray_hybrid_engine.sh, which names rloo as its alternative (KL 1e-4 in the reward)",
        kl_coef=1e-4,
        group=True,
    ),
    "grpo": AlgorithmPreset(
        estimator="group_norm",
        summary="GRPO: reward minus its group's mean, over the group's std; KL as a k3 loss",
        source="train_grpo_ray_hybrid_engine.sh (group_norm, k3 KL loss 1e-3)",
        kl_coef=1e-3,
        kl_loss="k3",
        group=True,
    ),
    "dr_grpo": AlgorithmPreset(
        estimator="dr_grpo",
        summary="Dr. GRPO: reward minus its group's mean, no std division; token-level loss",
        source="OpenRLHF ships no dr_grpo script: GRPO's settings (train_grpo_ray_hybrid_engine.sh)",
        kl_coef=1e-3,
        kl_loss="k3",
        group=True,
        extra=("--actor.loss_agg_mode", "token-mean"),
    ),
    "dapo": AlgorithmPreset(
        estimator="group_norm",
        summary="DAPO: GRPO advantages, dynamic filtering of all-equal groups, clip-higher (0.2, 0.27), token-level "
        "loss",
        source="train_dapo_ray_hybrid_engine.sh (dynamic filtering range 0 1, eps_clip_low_high 0.2 0.27, k3 1e-3)",
        kl_coef=1e-3,
        kl_loss="k3",
        group=True,
        extra=(  # dynamic filtering keeps prompts whose mean score is in (0, 1): not all wrong, not all right
            *("--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1"),
            *("--actor.eps_clip_low_high", "0.2", "0.27", "--actor.loss_agg_mode", "token-mean"),
        ),
    ),
}
"""Every `--algo` choice, by name."""

IS_CORRECTION_FLAGS: Final[tuple[str, ...]] = (
    "--algo.advantage.is_correction_level", "token",
    "--algo.advantage.is_correction_mode", "mask",
    "--algo.advantage.is_correction_threshold", "0.5", "5.0",
)  # fmt: skip
"""``--is-correction``: ICEPOP, token-level masking of the train/rollout ratio outside [0.5, 5] (the scheme of
train_reinforce_baseline_hybrid_engine.sh; OpenRLHF 0.11.2 spells it with these three flags)."""
