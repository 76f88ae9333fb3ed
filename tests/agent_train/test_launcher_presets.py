"""Every `--algo` preset (and `--is-correction`) builds a command that OpenRLHF's own `train_ppo_ray` argument code
accepts and reads back as the algorithm it names, in both placement modes, from the library and from
`uv run apps/train --backend openrlhf --algo NAME --dry-run`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import structlog

from agent_runtime.recipe import Recipe, load_recipe
from agent_train import LaunchConfig, LaunchError, check_plan, plan_launch
from agent_train.openrlhf.presets import ALGORITHMS
from tests.support.train_app import load_train_app

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "calculator.py"
ESTIMATOR = {
    "ppo": "gae", "reinforce": "reinforce", "reinforce_baseline": "reinforce_baseline", "rloo": "rloo",
    "grpo": "group_norm", "dr_grpo": "dr_grpo", "dapo": "group_norm",
}  # fmt: skip
GROUP = {"reinforce_baseline", "rloo", "grpo", "dr_grpo", "dapo"}


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return load_recipe(RECIPE)


def config(tmp_path: Path, **changes: object) -> LaunchConfig:
    return LaunchConfig(recipe=str(RECIPE), pretrain="Qwen/Qwen3-4B", run_dir=str(tmp_path), **changes)  # type: ignore[arg-type]


def test_the_presets_are_the_algorithms_openrlhf_names() -> None:
    assert set(ALGORITHMS) == set(ESTIMATOR)
    assert {name for name, preset in ALGORITHMS.items() if preset.group} == GROUP


@pytest.mark.parametrize("mode", ["hybrid", "async"])
@pytest.mark.parametrize("algorithm", list(ESTIMATOR))
def test_each_preset_is_accepted_and_read_back_by_openrlhf(
    tmp_path: Path, recipe: Recipe, algorithm: str, mode: str
) -> None:
    args = check_plan(plan_launch(config(tmp_path, algorithm=algorithm, mode=mode), recipe)).args
    assert args.algo.advantage.estimator == ESTIMATOR[algorithm]
    assert args.algo.kl.init_coef == ALGORITHMS[algorithm].kl_coef > 0
    assert args.algo.kl.use_loss == (algorithm not in {"ppo", "reinforce", "rloo"})  # those: KL in the reward
    assert args.algo.advantage.is_correction_level == "off"
    if algorithm == "ppo":  # the critic: the actor's weights, on the actor's GPUs
        assert args.critic.model_name_or_path == "Qwen/Qwen3-4B"
        assert (args.critic.num_nodes, args.critic.num_gpus_per_node) == (1, 8)
        assert args.critic.adam.lr == 9e-6
    else:
        assert args.critic.model_name_or_path is None
    dapo = algorithm == "dapo"
    assert args.algo.dynamic_filtering_enable == dapo
    assert tuple(args.algo.dynamic_filtering_range) == (0.0, 1.0)
    assert tuple(args.actor.eps_clip_low_high) == ((0.2, 0.27) if dapo else (0.2, 0.2))
    assert args.actor.loss_agg_mode == "token-mean"


@pytest.mark.parametrize("algorithm", sorted(GROUP))
def test_group_presets_refuse_one_sample_per_prompt(tmp_path: Path, recipe: Recipe, algorithm: str) -> None:
    with pytest.raises(LaunchError, match=r"--algo \w+ compares the samples .* needs --samples-per-prompt > 1, got 1"):
        plan_launch(config(tmp_path, algorithm=algorithm, samples_per_prompt=1), recipe)
    check_plan(plan_launch(config(tmp_path, algorithm=algorithm, samples_per_prompt=2), recipe))


@pytest.mark.parametrize("algorithm", ["ppo", "reinforce"])
def test_single_sample_presets_run_with_one_sample_per_prompt(tmp_path: Path, recipe: Recipe, algorithm: str) -> None:
    args = check_plan(plan_launch(config(tmp_path, algorithm=algorithm, samples_per_prompt=1), recipe)).args
    assert args.rollout.n_samples_per_prompt == 1


@pytest.mark.parametrize("mode", ["hybrid", "async"])
def test_is_correction_turns_on_openrlhfs_token_mask(tmp_path: Path, recipe: Recipe, mode: str) -> None:
    args = check_plan(plan_launch(config(tmp_path, algorithm="dapo", mode=mode, is_correction=True), recipe)).args
    assert args.algo.advantage.is_correction_level == "token"
    assert args.algo.advantage.is_correction_mode == "mask"
    assert list(args.algo.advantage.is_correction_threshold) == [0.5, 5.0]


def test_kl_coef_overrides_the_preset_and_zero_drops_the_reference(tmp_path: Path, recipe: Recipe) -> None:
    args = check_plan(plan_launch(config(tmp_path, algorithm="rloo", kl_coef=0.05), recipe)).args
    assert args.algo.kl.init_coef == 0.05 and not args.algo.kl.use_loss
    args = check_plan(plan_launch(config(tmp_path, algorithm="grpo", kl_coef=0.0), recipe)).args
    assert args.algo.kl.init_coef == 0.0 and not args.algo.kl.use_loss
    with pytest.raises(LaunchError, match="kl_coef must be at least 0"):
        plan_launch(config(tmp_path, kl_coef=-1.0), recipe)


def test_the_critic_is_placed_with_the_actor_or_on_its_own_gpus(tmp_path: Path, recipe: Recipe) -> None:
    own = config(tmp_path, algorithm="ppo", mode="async", gpus_per_node=4, vllm_engines=4, critic_gpus_per_node=2)
    args = check_plan(plan_launch(own, recipe)).args
    assert (args.critic.num_nodes, args.critic.num_gpus_per_node) == (1, 2)
    assert args.train.async_enable and not args.train.colocate_all
    with pytest.raises(LaunchError, match="hybrid mode colocates the critic with the actor"):
        plan_launch(config(tmp_path, algorithm="ppo", critic_gpus_per_node=2), recipe)
    with pytest.raises(LaunchError, match="--algo grpo has no critic"):
        plan_launch(config(tmp_path, algorithm="grpo", critic_nodes=2), recipe)


# -- the app ---------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def app() -> ModuleType:
    return load_train_app("apps_train_main_presets")


@pytest.mark.parametrize("algorithm", list(ESTIMATOR))
def test_the_app_dry_runs_every_preset(
    app: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm: str
) -> None:
    argv = ["--backend", "openrlhf", "--recipe", str(RECIPE), "--pretrain", "Qwen/Qwen3-4B", "--algo", algorithm]
    assert app.main([*argv, "--run-dir", str(tmp_path), "--is-correction", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"--algo.advantage.estimator {ESTIMATOR[algorithm]}" in out
    assert "--algo.advantage.is_correction_level token" in out
    assert ("--critic.model_name_or_path Qwen/Qwen3-4B" in out) == (algorithm == "ppo")
    assert ("--algo.dynamic_filtering_enable" in out) == (algorithm == "dapo")
    assert (tmp_path / "data" / "train.jsonl").is_file()


def test_the_app_explains_each_preset_and_refuses_a_group_of_one(
    app: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = app.build_parser().format_help()
    for name, preset in ALGORITHMS.items():
        line = next(line for line in text.splitlines() if line.strip().startswith(f"--algo {name} "))
        assert preset.summary in line and ("[group]" in line) == (name in GROUP)
    assert "--is-correction" in text and "needs --samples-per-prompt > 1" in text
    argv = ["--backend", "openrlhf", "--recipe", str(RECIPE), "--pretrain", "m", "--algo", "rloo"]
    assert app.main([*argv, "--samples-per-prompt", "1", "--run-dir", str(tmp_path), "--dry-run"]) == 2
    assert "--algo rloo compares the samples of each prompt" in capsys.readouterr().err
