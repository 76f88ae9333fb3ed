"""The local trainer's estimators against OpenRLHF's own computation (`RemoteExperienceMaker.
compute_advantages_and_returns`) on the same rewards and action-token counts, with rewards that are not 0/1 and
episodes of different lengths; DAPO's dynamic filtering; the configuration and CLI that select them."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("openrlhf")

from agent_train.local.cli import build_parser  # noqa: E402
from agent_train.local.config import ESTIMATORS, LocalTrainConfig, check_config  # noqa: E402
from agent_train.local.rl import group_advantages, informative_groups  # noqa: E402
from agent_train.local.rollout import RolloutRecord  # noqa: E402
from tests.agent_train.test_presets_openrlhf_advantages import openrlhf_module  # noqa: E402

OPENRLHF_NAME = {"grpo": "group_norm"}
PROMPTS, SAMPLES = 5, 4


def openrlhf_advantages(estimator: str, rewards: list[float], lengths: list[int]) -> list[float]:
    """OpenRLHF's advantage of each episode: `lengths[i]` action tokens after a 3-token prompt, the reward at
    the last one, arguments as OpenRLHF's own parser leaves them."""
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from agent_train.openrlhf.arguments import check_arguments

    maker_module = openrlhf_module("openrlhf.trainer.ppo_utils.experience_maker")
    args = check_arguments(
        ["--actor.model_name_or_path", "m", "--train.agent_func_path", "agent.py",
         "--algo.advantage.estimator", OPENRLHF_NAME.get(estimator, estimator),
         "--rollout.n_samples_per_prompt", str(SAMPLES)]
    ).args  # fmt: skip
    width = 3 + max(lengths) + 2
    batch = []
    for index, (reward, length) in enumerate(zip(rewards, lengths, strict=True)):
        mask = torch.zeros(1, width - 1, dtype=torch.bool)
        mask[0, 2 : 2 + length] = True
        batch.append(
            Experience(
                action_mask=mask,
                rewards=torch.tensor([reward]),
                kl=torch.zeros(1, width - 1),
                index=[index],
            )
        )
    maker = maker_module.RemoteExperienceMaker(
        None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args), None
    )
    out = maker.compute_advantages_and_returns(batch)
    return [float(e.advantages[0][e.action_mask[0]][0]) for e in out]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("estimator", list(ESTIMATORS))
def test_each_local_estimator_is_openrlhfs(estimator: str, seed: int) -> None:
    rng = random.Random(seed)
    rewards = [rng.choice([0.0, 0.3, 1.0, 1.1, -0.5]) for _ in range(PROMPTS * SAMPLES)]
    rewards[SAMPLES : 2 * SAMPLES] = [1.0] * SAMPLES  # one group that all scored the same
    lengths = [rng.randint(1, 9) for _ in rewards]
    groups = [i // SAMPLES for i in range(len(rewards))]
    local = group_advantages(rewards, groups, estimator, token_counts=lengths)  # type: ignore[arg-type]
    assert local == pytest.approx(openrlhf_advantages(estimator, rewards, lengths), rel=1e-5, abs=1e-6)


def record(group: int, reward: float) -> RolloutRecord:
    return RolloutRecord(
        group=group, ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], reward=reward, truncated=False
    )


def test_dynamic_filtering_keeps_the_groups_whose_rewards_differ() -> None:
    records = [record(0, 1.0), record(0, 1.0), record(1, 0.0), record(1, 1.0), record(2, 0.0), record(2, 0.0)]
    assert [(r.group, r.reward) for r in informative_groups(records)] == [(1, 0.0), (1, 1.0)]
    assert informative_groups([]) == []


def test_the_config_and_cli_select_an_estimator_and_refuse_what_cannot_work() -> None:
    assert LocalTrainConfig().rl_estimator == "grpo" and not LocalTrainConfig().rl_dynamic_filtering
    for name in ESTIMATORS:
        check_config(LocalTrainConfig(rl_estimator=name))  # type: ignore[arg-type]
    check_config(LocalTrainConfig(rl_estimator="reinforce", rl_group_size=1))
    with pytest.raises(ValueError, match=r"rl_group_size: the rloo estimator .* needs at least 2"):
        check_config(LocalTrainConfig(rl_estimator="rloo", rl_group_size=1))
    with pytest.raises(ValueError, match="rl_group_size: dynamic filtering"):
        check_config(LocalTrainConfig(rl_estimator="reinforce", rl_group_size=1, rl_dynamic_filtering=True))
    with pytest.raises(ValueError, match="rl_estimator: unknown 'ppo'"):
        check_config(LocalTrainConfig(rl_estimator="ppo"))  # type: ignore[arg-type]

    args: Any = build_parser().parse_args(["--estimator", "dr_grpo", "--dynamic-filtering", "--filter-rounds", "2"])
    assert (args.estimator, args.dynamic_filtering, args.filter_rounds) == ("dr_grpo", True, 2)
    text = build_parser().format_help()
    assert all(name in text for name in ESTIMATORS) and "--dynamic-filtering" in text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--estimator", "gae"])


class _ScriptedRollouts:
    """`Rollouts.collect`'s contract (records grouped by row, `group` the row's index) with rewards taken in
    turn from `rounds`, one list of group rewards per call."""

    def __init__(self, rounds: list[list[list[float]]]) -> None:
        self.rounds, self.calls = rounds, []

    async def collect(self, rows: list[Any], *, group_size: int, temperature: float, seed: int) -> list[RolloutRecord]:
        rewards = self.rounds[len(self.calls)]
        self.calls.append((len(rows), seed))
        assert len(rewards) == len(rows) and all(len(g) == group_size for g in rewards)
        return [record(group, reward) for group, values in enumerate(rewards) for reward in values]


def test_the_trainer_refills_a_dynamically_filtered_step() -> None:
    import asyncio

    from agent_train.local.checkpoint import TrainerState
    from agent_train.local.trainer import _Run

    config = LocalTrainConfig(rl_prompts=3, rl_group_size=2, rl_dynamic_filtering=True, rl_filter_rounds=3)
    run = _Run.__new__(_Run)
    run.config, run.rng, run.train_rows = config, random.Random(0), [{"prompt": str(i)} for i in range(10)]
    run.state = TrainerState(config=config)
    first = [record(g, r) for g, rs in enumerate([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]) for r in rs]
    rollouts = _ScriptedRollouts([[[1.0, 0.0], [1.0, 1.0]], [[0.0, 1.0]]])  # round 2: 1 of 2 passes; round 3: 1
    kept, sampled, rounds = asyncio.run(run.dynamic_filter(rollouts, first))  # type: ignore[arg-type]
    assert rounds == 3 and [n for n, _ in rollouts.calls] == [2, 1]  # one new prompt per filtered one
    assert len({seed for _, seed in rollouts.calls}) == 2
    assert len(sampled) == 6 + 4 + 2 and len({r.group for r in sampled}) == 6  # group ids stay unique
    assert sorted({r.group for r in kept}) == [1, 3, 5] and len(kept) == 6

    run.config = msgspec.structs.replace(config, rl_filter_rounds=1)  # no refill: train on what passed
    kept, sampled, rounds = asyncio.run(run.dynamic_filter(_ScriptedRollouts([]), first))  # type: ignore[arg-type]
    assert rounds == 1 and [r.group for r in kept] == [1, 1]
