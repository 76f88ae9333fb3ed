"""The OpenRLHF launcher: a recipe and a model in, the full `train_ppo_ray` command (and its data) out.

    config = LaunchConfig(recipe="recipes/calculator.py", pretrain="Qwen/Qwen3-4B", algorithm="grpo")
    plan = plan_launch(config, load_recipe(config.recipe))
    prepare_data(plan, recipe)            # the recipe's dataset as OpenRLHF's prompt JSONL
    check_plan(plan)                      # OpenRLHF's own argument parser and checks, before anything starts
    print(format_command(plan)); run_plan(plan)

The command is `python -m agent_train.openrlhf.main`, which is OpenRLHF's `python -m openrlhf.cli.train_ppo_ray`
with agent-train's segment extension installed in every process (`segments`: every segment of a compacted
episode is a training sample with the episode's advantage; over-long episodes are masked unless `mask_overlong` is
off, ``AGENT_MASK_OVERLONG=0``), with openrlhf 0.11's dotted flags:

- the agent: ``--train.agent_func_path`` is agent-train's `agent_func.py`, and ``AGENT_RECIPE`` (set in the
  local environment, or in the Ray job's runtime environment) names the recipe; the data is the prepared JSONL
  (``--data.input_key agent_task --data.label_key label``, no chat template: the executor renders prompts);
- the algorithm preset (`presets.ALGORITHMS`): ``ppo`` (GAE with a critic placed like the actor: on the
  shared GPUs in hybrid mode, on GPUs of its own in async mode), ``reinforce``, ``reinforce_baseline``, ``rloo``,
  ``grpo``, ``dr_grpo`` or ``dapo``, with their KL form and coefficient from OpenRLHF's example scripts
  (`kl_coef` overrides it; 0 drops the KL and the reference model); the group presets need
  ``samples_per_prompt > 1``; `is_correction` adds the importance-sampling correction of off-policy rollouts;
- the placement preset: ``hybrid`` (vLLM, actor and reference share every GPU and sleep in turn:
  ``--train.colocate_all --vllm.enable_sleep --ds.enable_sleep``; one vLLM engine per `vllm_tensor_parallel`
  GPUs) or ``async`` (``--train.async_enable``: rollouts on their own vLLM GPUs overlap training; actor and
  reference share the training GPUs); with `partial_rollout` (async only) ``--train.partial_rollout_enable``:
  the weight broadcast pauses vLLM's generation in place (``pause_generation(mode="keep")``) instead of waiting
  for the batch, so a turn may be sampled by two policy versions; it turns on `is_correction` too, and every
  generated token is tagged with the weight version that sampled it (`engine_versions`);
- a vision-language recipe (its protocol `accepts_images`): ``--data.image_key images`` (the row's image column,
  `task.IMAGE_KEY`) and ``--data.max_images_per_prompt`` from `Recipe.max_images`, which OpenRLHF needs above 0
  to give vLLM images (its ``limit_mm_per_prompt``) and to collapse pads before vLLM expands them; OpenRLHF's own
  checks then refuse a critic (``ppo``) and sample packing for it;
- sizes (nodes, GPUs, batch sizes, lengths, learning rate, ...) and `extra_args`, appended verbatim last, so any
  OpenRLHF flag can be set or overridden.

With ``device="cpu"`` (``apps/train --device cpu``) the same job runs on this machine's CPUs as a debug mode:
``AGENT_OPENRLHF_DEVICE=cpu`` makes `main` apply the CPU bridges (`cpu_bridges`) and start Ray with fake
GPUs, the weights sync over gloo (``--vllm.sync_backend gloo``), the sleep modes are left out, and every process
records its checks in ``RUN_DIR/cpu_checks.jsonl`` (`cpu_checks`). Flags that call flash-attn (packing, ring
attention, its kernel) are refused where flash-attn is not installed.

With `ray_address` the command is wrapped in ``ray job submit --address ... --runtime-env-json ... --``;
without, it runs here and `train_ppo_ray` starts a local Ray (``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` keeps Ray from
re-creating the uv environment for its workers). Paths are made absolute: a cluster needs them on a shared
filesystem (or `working_dir` for the job's files) and agent-train installed on every node.
This module builds and runs commands; it imports neither OpenRLHF nor Ray.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final, Literal

import msgspec
import structlog

from agent_runtime import Recipe
from agent_train.errors import LaunchError
from agent_train.openrlhf.arguments import CheckedArguments, check_arguments
from agent_train.openrlhf.cpu_bridges import DEVICE_ENV, CpuBridgeError
from agent_train.openrlhf.cpu_bridges import check_pins as check_cpu_pins
from agent_train.openrlhf.cpu_checks import CHECKS_ENV
from agent_train.openrlhf.dataset import INPUT_KEY, LABEL_KEY, prepare_jsonl_dataset, prepare_recipe_dataset
from agent_train.openrlhf.optional_flash_attn import INSTALL_HINT, flash_attn_installed, needs_flash_attn
from agent_train.openrlhf.presets import ALGORITHMS, IS_CORRECTION_FLAGS, Algorithm
from agent_train.openrlhf.segments import MASK_OVERLONG_ENV
from agent_train.task import IMAGE_KEY

__all__ = [
    "AGENT_FUNC_PATH",
    "ALGORITHMS",
    "DEVICES",
    "MODES",
    "Algorithm",
    "Device",
    "LaunchConfig",
    "LaunchPlan",
    "Mode",
    "check_plan",
    "format_command",
    "image_flags",
    "plan_launch",
    "prepare_data",
    "run_plan",
]

logger = structlog.get_logger(__name__)

Mode = Literal["hybrid", "async"]
Device = Literal["gpu", "cpu"]

MODES: Final[tuple[str, ...]] = ("hybrid", "async")
DEVICES: Final[tuple[str, ...]] = ("gpu", "cpu")
CHECKS_FILE: Final = "cpu_checks.jsonl"
TRAIN_MODULE: Final = "agent_train.openrlhf.main"
AGENT_FUNC_PATH: Final = str(Path(__file__).resolve().with_name("agent_func.py"))
"""The installed file to pass as ``--train.agent_func_path`` (see `agent_func.py`)."""


class LaunchConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a launch needs; the defaults are a single 8-GPU node. `max_len` defaults to the recipe's
    `max_context_tokens` (else 8192); `max_new_tokens`, when set, caps each turn below the recipe's budget.
    `kl_coef` defaults to the algorithm preset's; `critic_nodes`/`critic_gpus_per_node` (``ppo`` only) to the
    actor's."""

    recipe: str
    pretrain: str
    algorithm: Algorithm = "reinforce_baseline"
    mode: Mode = "hybrid"
    nodes: int = 1
    gpus_per_node: int = 8
    vllm_engines: int | None = None
    vllm_tensor_parallel: int = 1
    vllm_gpu_memory_utilization: float | None = None
    samples_per_prompt: int = 8
    rollout_batch_size: int = 64
    train_batch_size: int = 512
    micro_train_batch_size: int = 2
    micro_rollout_batch_size: int = 4
    max_len: int | None = None
    max_new_tokens: int | None = None
    learning_rate: float = 1e-6
    kl_coef: float | None = None
    temperature: float = 1.0
    episodes: int = 1
    epochs: int = 1
    zero_stage: int = 3
    attn_implementation: str | None = None
    seed: int = 42
    run_dir: str | None = None
    split: str = "train"
    eval_split: str | None = None
    dataset: str | None = None
    ray_address: str | None = None
    working_dir: str | None = None
    python: str = "python3"
    agent_func_path: str | None = None
    engine_timeout_s: float | None = None
    extra_args: tuple[str, ...] = ()
    is_correction: bool = False
    partial_rollout: bool = False
    mask_overlong: bool = True
    critic_nodes: int | None = None
    critic_gpus_per_node: int | None = None
    device: Device = "gpu"


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A launch, fully decided: `train_args` are OpenRLHF's flags (after ``-m agent_train.openrlhf.main``), `command`
    the whole process to start, `env` the variables the run (and its Ray workers) need."""

    train_args: list[str]
    command: list[str]
    env: dict[str, str]
    run_dir: str
    dataset: str
    eval_dataset: str | None = None
    source_dataset: str | None = None
    split: str = "train"
    eval_split: str | None = None
    remote: bool = False


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise LaunchError(f"{name} must be at least 1, got {value}")


def _recipe_source(source: str) -> str:
    path = Path(source)
    return str(path.resolve()) if source.endswith(".py") or path.exists() else source


def _attn_implementation(config: LaunchConfig) -> str:
    if config.attn_implementation:
        return config.attn_implementation
    if config.device == "cpu":
        return "sdpa"
    if importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    logger.warning("flash_attn_missing", using="sdpa", hint="install flash-attn on GPU nodes for speed")
    return "sdpa"


def plan_launch(config: LaunchConfig, recipe: Recipe) -> LaunchPlan:
    """Decide the command for `config` and `recipe`. Pure: writes nothing, starts nothing."""
    for name in ("nodes", "gpus_per_node", "vllm_tensor_parallel", "samples_per_prompt", "rollout_batch_size"):
        _positive(name, getattr(config, name))
    if config.algorithm not in ALGORITHMS:
        raise LaunchError(f"unknown algorithm {config.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    preset = ALGORITHMS[config.algorithm]
    if preset.group and config.samples_per_prompt < 2:
        raise LaunchError(
            f"--algo {config.algorithm} compares the samples of each prompt (its baseline is the prompt's group): "
            f"it needs --samples-per-prompt > 1, got {config.samples_per_prompt}"
        )
    if config.kl_coef is not None and config.kl_coef < 0:
        raise LaunchError(f"kl_coef must be at least 0, got {config.kl_coef}")
    if config.mode not in MODES:
        raise LaunchError(f"unknown mode {config.mode!r}; choose one of {', '.join(MODES)}")
    if config.device not in DEVICES:
        raise LaunchError(f"unknown device {config.device!r}; choose one of {', '.join(DEVICES)}")
    if config.partial_rollout and config.mode != "async":
        raise LaunchError(
            "--partial-rollout lets an episode's generation continue across a weight update, which only async mode "
            f"overlaps with training: add --mode async (got --mode {config.mode})"
        )
    if config.device == "cpu" and config.ray_address:
        raise LaunchError("--device cpu runs the job on this machine's CPUs under a local Ray; drop --ray-address")
    training_gpus = config.nodes * config.gpus_per_node
    if training_gpus % config.vllm_tensor_parallel:
        raise LaunchError(
            f"{training_gpus} GPUs cannot be split into vLLM engines of {config.vllm_tensor_parallel} GPUs each"
        )
    engines = config.vllm_engines or training_gpus // config.vllm_tensor_parallel
    if config.mode == "hybrid" and engines * config.vllm_tensor_parallel != training_gpus:
        raise LaunchError(
            f"hybrid mode shares every GPU: {engines} vLLM engines x {config.vllm_tensor_parallel} GPUs must equal "
            f"{config.nodes} nodes x {config.gpus_per_node} GPUs"
        )
    run_dir = Path(config.run_dir or Path("runs") / recipe.name).resolve()
    max_len = config.max_len or recipe.max_context_tokens or 8192
    nodes, gpus = str(config.nodes), str(config.gpus_per_node)
    dataset = run_dir / "data" / f"{config.split}.jsonl"
    eval_dataset = run_dir / "data" / f"{config.eval_split}.jsonl" if config.eval_split else None

    args: list[str] = [
        "--actor.model_name_or_path", config.pretrain,
        "--train.agent_func_path", config.agent_func_path or AGENT_FUNC_PATH,
        "--data.prompt_dataset", str(dataset),
        "--data.input_key", INPUT_KEY,
        "--data.label_key", LABEL_KEY,
        "--data.max_len", str(max_len),
        # placement
        "--actor.num_nodes", nodes, "--actor.num_gpus_per_node", gpus,
        "--ref.num_nodes", nodes, "--ref.num_gpus_per_node", gpus,
        "--vllm.num_engines", str(engines),
        "--vllm.tensor_parallel_size", str(config.vllm_tensor_parallel),
        # algorithm
        *preset.flags(kl_coef=config.kl_coef),
        "--rollout.n_samples_per_prompt", str(config.samples_per_prompt),
        "--rollout.batch_size", str(config.rollout_batch_size),
        "--rollout.micro_batch_size", str(config.micro_rollout_batch_size),
        "--rollout.temperature", str(config.temperature),
        "--train.batch_size", str(config.train_batch_size),
        "--train.micro_batch_size", str(config.micro_train_batch_size),
        "--train.num_episodes", str(config.episodes),
        "--train.max_epochs", str(config.epochs),
        "--train.seed", str(config.seed),
        "--actor.adam.lr", str(config.learning_rate),
        # engine
        "--ds.zero_stage", str(config.zero_stage),
        "--ds.param_dtype", "bf16",
        "--ds.attn_implementation", _attn_implementation(config),
        "--actor.gradient_checkpointing_enable",
        # outputs
        "--ckpt.output_dir", str(run_dir / "model"),
        "--ckpt.path", str(run_dir / "ckpt"),
        "--ckpt.save_hf",
        "--logger.tensorboard_dir", str(run_dir / "tensorboard"),
    ]  # fmt: skip
    if preset.critic:  # PPO's value model: the actor's weights with a value head
        critic = (config.critic_nodes or config.nodes, config.critic_gpus_per_node or config.gpus_per_node)
        if config.mode == "hybrid" and critic != (config.nodes, config.gpus_per_node):
            raise LaunchError(
                f"hybrid mode colocates the critic with the actor on every GPU: the critic's {critic[0]} nodes x "
                f"{critic[1]} GPUs must equal {config.nodes} nodes x {config.gpus_per_node} GPUs"
            )
        args += ["--critic.model_name_or_path", config.pretrain]  # OpenRLHF's own default for an agent run
        args += ["--critic.num_nodes", str(critic[0]), "--critic.num_gpus_per_node", str(critic[1])]
    elif config.critic_nodes is not None or config.critic_gpus_per_node is not None:
        raise LaunchError(f"--algo {config.algorithm} has no critic; the critic's placement is for --algo ppo")
    args += image_flags(recipe)
    if config.is_correction or config.partial_rollout:  # a paused turn mixes two policies' tokens: correct for it
        args += list(IS_CORRECTION_FLAGS)
    if config.max_new_tokens is not None:
        args += ["--rollout.max_new_tokens", str(config.max_new_tokens)]
    if eval_dataset is not None:
        args += ["--eval.dataset", str(eval_dataset), "--eval.steps", "10"]
    if config.mode == "hybrid":
        args += ["--train.colocate_all"]
        if config.device == "gpu":  # vLLM's CPU backend refuses sleep mode, and has no GPU memory to share
            args += ["--vllm.enable_sleep", "--ds.enable_sleep"]
            args += ["--vllm.gpu_memory_utilization", str(config.vllm_gpu_memory_utilization or 0.6)]
    else:
        args += ["--train.async_enable", "--train.colocate_actor_ref"]
        if config.partial_rollout:
            args += ["--train.partial_rollout_enable"]
        if config.vllm_gpu_memory_utilization is not None:
            args += ["--vllm.gpu_memory_utilization", str(config.vllm_gpu_memory_utilization)]
    if config.device == "cpu":  # not nccl: OpenRLHF then broadcasts over its sync group (gloo, bridged), not CUDA IPC
        args += ["--vllm.sync_backend", "gloo"]
    args += list(config.extra_args)
    if not flash_attn_installed() and (calls := needs_flash_attn(args)):
        raise LaunchError(f"{', '.join(calls)} needs flash-attn, which is not installed here: {INSTALL_HINT}")

    env = {"AGENT_RECIPE": _recipe_source(config.recipe)}  # agent_func.RECIPE_ENV
    env["AGENT_TRAJECTORY_LOG"] = str(run_dir / "trajectories" / "rollouts.jsonl")  # agent_func.TRAJECTORY_LOG_ENV
    if config.device == "cpu":
        env[DEVICE_ENV] = "cpu"
        env[CHECKS_ENV] = str(run_dir / CHECKS_FILE)
    if config.engine_timeout_s:
        env["AGENT_ENGINE_TIMEOUT_S"] = str(config.engine_timeout_s)
    if not config.mask_overlong:
        env[MASK_OVERLONG_ENV] = "0"
    if config.ray_address:
        runtime_env: dict[str, object] = {"env_vars": env}
        if config.working_dir:
            runtime_env["working_dir"] = str(Path(config.working_dir).resolve())
        command = [
            "ray", "job", "submit", "--address", config.ray_address,
            "--runtime-env-json", json.dumps(runtime_env, sort_keys=True),
            "--", config.python, "-m", TRAIN_MODULE, *args,
        ]  # fmt: skip
    else:
        env = {**env, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
        command = [sys.executable, "-m", TRAIN_MODULE, *args]
    return LaunchPlan(
        train_args=args,
        command=command,
        env=env,
        run_dir=str(run_dir),
        dataset=str(dataset),
        eval_dataset=None if eval_dataset is None else str(eval_dataset),
        source_dataset=None if config.dataset is None else str(Path(config.dataset).resolve()),
        split=config.split,
        eval_split=config.eval_split,
        remote=config.ray_address is not None,
    )


def image_flags(recipe: Recipe) -> list[str]:
    """OpenRLHF's image flags for `recipe`: none for a text-only protocol; the image column and
    `Recipe.max_images` (required, at least 1) for a vision-language one."""
    if not recipe.chat_protocol().accepts_images:
        return []
    if recipe.max_images is None or recipe.max_images < 1:
        raise LaunchError(
            f"recipe {recipe.name!r} shows images: set Recipe.max_images (at least 1), the most images one context "
            "holds; it becomes OpenRLHF's --data.max_images_per_prompt, without which vLLM takes no images"
        )
    return ["--data.image_key", IMAGE_KEY, "--data.max_images_per_prompt", str(recipe.max_images)]


def prepare_data(plan: LaunchPlan, recipe: Recipe) -> int:
    """Write the plan's prompt dataset (and eval dataset): from `source_dataset` when given, else from the
    recipe's dataset split. Returns the number of training rows."""
    if plan.source_dataset is not None:
        rows = prepare_jsonl_dataset(plan.source_dataset, plan.dataset)
    else:
        rows = prepare_recipe_dataset(recipe, plan.dataset, split=plan.split)
    if plan.eval_dataset is not None and plan.eval_split is not None:
        prepare_recipe_dataset(recipe, plan.eval_dataset, split=plan.eval_split)
    return rows


def check_plan(plan: LaunchPlan) -> CheckedArguments:
    """Run OpenRLHF's own parser and checks on the plan's flags; raises `LaunchError` when it rejects them."""
    checked = check_arguments(plan.train_args)
    for warning in checked.warnings:
        logger.warning("openrlhf_warning", message=warning)
    return checked


def format_command(plan: LaunchPlan) -> str:
    """The plan as one shell command line, one flag per line (environment assignments first for a local run)."""
    lines: list[list[str]] = [[]]
    for word in (shlex.quote(w) for w in plan.command):
        if word.startswith("--") and lines[-1]:
            lines.append([word])
        else:
            lines[-1].append(word)
    if not plan.remote:
        lines[0] = [f"{k}={shlex.quote(v)}" for k, v in plan.env.items()] + lines[0]
    return " \\\n  ".join(" ".join(line) for line in lines)


def run_plan(plan: LaunchPlan) -> int:
    """Start the plan's command and wait for it; returns its exit status. A cluster run is submitted with the
    `ray` CLI installed next to this Python, which follows the job's logs until it ends."""
    command = list(plan.command)
    if DEVICE_ENV in plan.env:  # before Ray starts: this Python must have vLLM's CPU build and the pinned OpenRLHF
        try:
            check_cpu_pins()
        except CpuBridgeError as e:
            raise LaunchError(str(e)) from e
    if plan.remote:
        ray = Path(sys.executable).with_name("ray")
        found = str(ray) if ray.is_file() else shutil.which("ray")
        if found is None:
            raise LaunchError("the `ray` command is not installed (it comes with openrlhf's ray[default])")
        command[0] = found
    env = {**os.environ, **({} if plan.remote else plan.env)}
    Path(plan.run_dir).mkdir(parents=True, exist_ok=True)
    if CHECKS_ENV in plan.env:  # a rerun into the same directory starts its checks afresh
        Path(plan.env[CHECKS_ENV]).unlink(missing_ok=True)
    logger.info("openrlhf_starting", remote=plan.remote, run_dir=plan.run_dir)
    return subprocess.call(command, env=env)
