"""The OpenRLHF launcher: every command it builds is parsed and validated by OpenRLHF's own `train_ppo_ray`
argument code (taken from the installed OpenRLHF), so a renamed flag fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_runtime.recipe import Recipe, load_recipe
from agent_train import (
    AGENT_FUNC_PATH,
    INPUT_KEY,
    LABEL_KEY,
    LaunchConfig,
    LaunchError,
    build_parser,
    check_arguments,
    check_plan,
    format_command,
    plan_launch,
    prepare_data,
)

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "calculator.py"


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return load_recipe(RECIPE)


def config(tmp_path: Path, **changes: object) -> LaunchConfig:
    return LaunchConfig(recipe=str(RECIPE), pretrain="Qwen/Qwen3-4B", run_dir=str(tmp_path), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("algorithm", ["reinforce_baseline", "grpo"])
@pytest.mark.parametrize("mode", ["hybrid", "async"])
def test_presets_are_accepted_by_openrlhf(tmp_path: Path, recipe: Recipe, algorithm: str, mode: str) -> None:
    plan = plan_launch(config(tmp_path, algorithm=algorithm, mode=mode), recipe)
    parsed = vars(build_parser().parse_args(plan.train_args))  # OpenRLHF's parser: every flag is real
    assert parsed["train.agent_func_path"] == AGENT_FUNC_PATH
    assert parsed["data.input_key"] == INPUT_KEY and parsed["data.label_key"] == LABEL_KEY
    assert parsed["data.apply_chat_template"] is False  # the executor renders prompts with the protocol
    assert parsed["data.max_len"] == 8192  # the recipe's context

    args = check_plan(plan).args  # and OpenRLHF's own validation, up to train(args)
    assert (
        args.algo.advantage.estimator == {"reinforce_baseline": "reinforce_baseline", "grpo": "group_norm"}[algorithm]
    )
    assert args.algo.kl.use_loss and args.algo.kl.estimator == {"reinforce_baseline": "k2", "grpo": "k3"}[algorithm]
    assert args.rollout.n_samples_per_prompt == 8
    assert args.reward.remote_url == ["agent"]  # OpenRLHF's marker for an agent executor
    assert args.critic.model_name_or_path is None
    if mode == "hybrid":
        assert args.train.colocate_all and args.vllm.enable_sleep and args.ds.enable_sleep
        assert args.vllm.num_engines * args.vllm.tensor_parallel_size == 8
    else:
        assert args.train.async_enable and not args.train.colocate_all and not args.vllm.enable_sleep
    assert plan.env["AGENT_RECIPE"] == str(RECIPE)


def test_extra_flags_are_appended_and_checked(tmp_path: Path, recipe: Recipe) -> None:
    plan = plan_launch(config(tmp_path, extra_args=("--ckpt.save_steps", "20", "--rollout.temperature", "0.7")), recipe)
    args = check_plan(plan).args
    assert args.ckpt.save_steps == 20
    assert args.rollout.temperature == 0.7  # a later flag overrides the preset

    bad = plan_launch(config(tmp_path, extra_args=("--actor.pretrain", "x")), recipe)
    with pytest.raises(LaunchError, match=r"unrecognized arguments: --actor\.pretrain"):
        check_plan(bad)


def test_openrlhf_own_checks_run(tmp_path: Path, recipe: Recipe) -> None:
    # a group estimator given through raw flags: the launcher's own preset check does not see it, OpenRLHF's does
    raw = ("--algo.advantage.estimator", "group_norm")
    plan = plan_launch(config(tmp_path, algorithm="reinforce", samples_per_prompt=1, extra_args=raw), recipe)
    with pytest.raises(LaunchError, match="requires n_samples_per_prompt > 1"):
        check_plan(plan)
    minimal = ["--actor.model_name_or_path", "m", "--train.agent_func_path", AGENT_FUNC_PATH]
    assert check_arguments(minimal).args.actor.model_name_or_path == "m"
    with pytest.raises(LaunchError, match="AttributeError"):  # OpenRLHF itself fails without a reward source
        check_arguments(minimal[:2])


def test_sizes_and_no_kl(tmp_path: Path, recipe: Recipe) -> None:
    plan = plan_launch(
        config(
            tmp_path, nodes=2, gpus_per_node=4, vllm_tensor_parallel=2, kl_coef=0.0, max_len=4096, max_new_tokens=512
        ),
        recipe,
    )
    args = check_plan(plan).args
    assert (args.actor.num_nodes, args.actor.num_gpus_per_node) == (2, 4)
    assert (args.vllm.num_engines, args.vllm.tensor_parallel_size) == (4, 2)
    assert args.algo.kl.init_coef == 0.0 and not args.algo.kl.use_loss  # no reference model
    assert args.data.max_len == 4096 and args.rollout.max_new_tokens == 512
    with pytest.raises(LaunchError, match="hybrid mode shares every GPU"):
        plan_launch(config(tmp_path, vllm_engines=3), recipe)


def test_local_run_and_cluster_submission(tmp_path: Path, recipe: Recipe) -> None:
    local = plan_launch(config(tmp_path), recipe)
    assert local.command[1:3] == ["-m", "agent_train.openrlhf.main"]  # OpenRLHF's train_ppo_ray, with segments
    assert local.env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0"
    text = format_command(local)
    log = Path(local.run_dir) / "trajectories" / "rollouts.jsonl"
    assert text.startswith(f"AGENT_RECIPE={RECIPE} AGENT_TRAJECTORY_LOG={log} RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 ")
    assert "\\\n  --train.agent_func_path " in text

    remote = plan_launch(
        config(tmp_path, ray_address="http://head:8265", working_dir=str(tmp_path), engine_timeout_s=300.0), recipe
    )
    cut = remote.command.index("--")
    assert remote.command[:5] == ["ray", "job", "submit", "--address", "http://head:8265"]
    runtime_env = json.loads(remote.command[remote.command.index("--runtime-env-json") + 1])
    assert runtime_env == {
        "env_vars": {
            "AGENT_RECIPE": str(RECIPE),
            "AGENT_TRAJECTORY_LOG": str(Path(remote.run_dir) / "trajectories" / "rollouts.jsonl"),
            "AGENT_ENGINE_TIMEOUT_S": "300.0",
        },
        "working_dir": str(tmp_path),
    }
    assert remote.command[cut + 1 :] == ["python3", "-m", "agent_train.openrlhf.main", *remote.train_args]
    check_plan(remote)


def test_overlong_masking_is_on_unless_turned_off(tmp_path: Path, recipe: Recipe) -> None:
    assert "AGENT_MASK_OVERLONG" not in plan_launch(config(tmp_path), recipe).env  # the extension's default: on
    off = plan_launch(config(tmp_path, mask_overlong=False), recipe)
    assert off.env["AGENT_MASK_OVERLONG"] == "0"
    remote = plan_launch(config(tmp_path, mask_overlong=False, ray_address="http://head:8265"), recipe)
    runtime_env = json.loads(remote.command[remote.command.index("--runtime-env-json") + 1])
    assert runtime_env["env_vars"]["AGENT_MASK_OVERLONG"] == "0"  # read by the trainer, on the cluster


def test_the_job_logs_its_rollouts_where_the_viewer_opens_them(tmp_path: Path, recipe: Recipe) -> None:
    from agent_train.openrlhf.agent_func import TRAJECTORY_LOG_ENV  # what the executor in the job reads

    plan = plan_launch(config(tmp_path), recipe)
    assert plan.env[TRAJECTORY_LOG_ENV] == str(Path(plan.run_dir) / "trajectories" / "rollouts.jsonl")
    remote = plan_launch(config(tmp_path, ray_address="http://head:8265"), recipe)
    runtime_env = json.loads(remote.command[remote.command.index("--runtime-env-json") + 1])
    assert runtime_env["env_vars"][TRAJECTORY_LOG_ENV] == plan.env[TRAJECTORY_LOG_ENV]


def test_prepare_data_writes_the_prompt_dataset(tmp_path: Path, recipe: Recipe) -> None:
    plan = plan_launch(config(tmp_path, eval_split="test"), recipe)
    assert prepare_data(plan, recipe) == 2048
    first = json.loads(Path(plan.dataset).read_text().splitlines()[0])
    assert set(first) == {INPUT_KEY, LABEL_KEY}
    assert plan.eval_dataset is not None and len(Path(plan.eval_dataset).read_text().splitlines()) == 256
    assert check_plan(plan).args.eval.dataset == plan.eval_dataset
