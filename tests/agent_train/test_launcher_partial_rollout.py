"""`--partial-rollout`: OpenRLHF's partial rollouts (``--train.partial_rollout_enable``) with its token-level IS
correction, accepted and read back by OpenRLHF's own `train_ppo_ray` argument code, and refused outside async mode,
from the library and from `uv run apps/train --backend openrlhf --partial-rollout`."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from agent_runtime.recipe import Recipe, load_recipe
from agent_train import LaunchError, check_plan, plan_launch
from tests.agent_train.test_launcher import RECIPE, config
from tests.support.train_app import load_train_app


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return load_recipe(RECIPE)


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_partial_rollouts_pause_generation_and_correct_off_policy_tokens(
    tmp_path: Path, recipe: Recipe, device: str
) -> None:
    plan = plan_launch(config(tmp_path, algorithm="grpo", mode="async", partial_rollout=True, device=device), recipe)
    args = check_plan(plan).args  # OpenRLHF's parser and asserts (partial rollouts need async)
    assert args.train.async_enable and args.train.partial_rollout_enable
    assert not args.vllm.enable_sleep  # OpenRLHF refuses sleep mode in async
    # the IS correction reads vLLM's per-token logprobs (OpenRLHF asks vLLM for them once the level is not "off")
    assert args.algo.advantage.is_correction_level == "token"
    assert args.algo.advantage.is_correction_mode == "mask"
    assert list(args.algo.advantage.is_correction_threshold) == [0.5, 5.0]
    assert plan.train_args.count("--algo.advantage.is_correction_level") == 1


def test_is_correction_given_too_is_not_repeated(tmp_path: Path, recipe: Recipe) -> None:
    changes = {"mode": "async", "partial_rollout": True, "is_correction": True}
    plan = plan_launch(config(tmp_path, **changes), recipe)
    assert plan.train_args.count("--algo.advantage.is_correction_level") == 1
    assert check_plan(plan).args.train.partial_rollout_enable


def test_async_without_partial_rollouts_keeps_openrlhfs_lock(tmp_path: Path, recipe: Recipe) -> None:
    args = check_plan(plan_launch(config(tmp_path, mode="async"), recipe)).args
    assert args.train.async_enable and not args.train.partial_rollout_enable
    assert args.algo.advantage.is_correction_level == "off"


def test_partial_rollouts_outside_async_mode_are_refused(tmp_path: Path, recipe: Recipe) -> None:
    with pytest.raises(
        LaunchError, match=r"--partial-rollout .* only async mode .*: add --mode async \(got --mode hybrid"
    ):
        plan_launch(config(tmp_path, mode="hybrid", partial_rollout=True), recipe)


@pytest.fixture(scope="module")
def app() -> ModuleType:
    return load_train_app("apps_train_main_partial_rollout")


def test_the_app_passes_partial_rollout_and_explains_it(
    app: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--backend", "openrlhf", "--recipe", str(RECIPE), "--pretrain", "Qwen/Qwen3-4B", "--algo", "grpo"]
    assert app.main([*argv, "--mode", "async", "--partial-rollout", "--run-dir", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--train.partial_rollout_enable" in out and "--algo.advantage.is_correction_level token" in out
    assert app.main([*argv, "--partial-rollout", "--run-dir", str(tmp_path), "--dry-run"]) == 2
    assert "add --mode async (got --mode hybrid)" in capsys.readouterr().err
    text = app.build_parser().format_help()
    assert "--partial-rollout" in text and "pauses vLLM mid-generation" in text
