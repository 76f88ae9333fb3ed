"""The local trainer's command line: what `uv run apps/train` (backend ``local``, the default) runs.

    uv run apps/train                                 # train the demo agent into runs/demo, install it for serve
    uv run apps/train -- --seed 1 --run-dir runs/s1   # options after `--` come here
    uv run apps/train -- --resume                     # continue runs/demo from its last checkpoint
    python -m agent_train.local.cli --preset ci       # the same, without the app

`main(argv)` parses the options, runs `train_local`, prints the three held-out figures and where everything
went, and (unless ``--no-install``) installs the final model as the demo model that `apps/serve` serves when no
model is named (see `agent_train.demo.build`). It configures no logging: the app does, and run as a module the
library's defaults apply. This module knows options and printing; the training is `trainer.py`'s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import msgspec

from agent_runtime.torch_warnings import ignore_pynvml_deprecation
from agent_train.errors import TrainError
from agent_train.local.config import PRESETS, preset

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apps/train --backend local --",
        description="Train the embedded demo agent on this machine: tokenizer, tiny Qwen3 model, SFT on expert "
        "episodes, then RL through the OpenRLHF agent executor with the hf engine.",
    )
    parser.add_argument("--run-dir", default="runs/demo", help="metrics, plot, checkpoints (default: runs/demo)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default", help="default: the full demo run")
    parser.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint when there is one")
    parser.add_argument("--seed", type=int, help="overrides the preset's seed")
    parser.add_argument("--sft-steps", type=int, help="overrides the preset's SFT steps")
    parser.add_argument("--rl-steps", type=int, help="overrides the preset's RL steps")
    parser.add_argument("--eval-size", type=int, help="held-out problems per evaluation (at most 500)")
    parser.add_argument("--kl-coef", type=float, help="KL to the SFT model during RL (0: none)")
    parser.add_argument("--estimator", choices=["grpo", "reinforce_baseline"], help="advantage estimator")
    parser.add_argument(
        "--stop-after", type=int, metavar="STEPS", help="checkpoint and stop after STEPS steps (continue with --resume)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-install", action="store_true", help="do not install the final model as the demo model apps/serve uses"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    config = preset(args.preset)
    overrides = {
        "seed": args.seed,
        "sft_steps": args.sft_steps,
        "rl_steps": args.rl_steps,
        "eval_size": args.eval_size,
        "rl_kl_coef": args.kl_coef,
        "rl_estimator": args.estimator,
    }
    config = msgspec.structs.replace(config, **{k: v for k, v in overrides.items() if v is not None})

    ignore_pynvml_deprecation()
    from agent_train.demo.build import install_demo_model  # torch, transformers and vLLM load from here on
    from agent_train.local.trainer import train_local

    try:
        result = train_local(
            config, args.run_dir, resume=args.resume, progress=not args.no_progress, stop_after=args.stop_after
        )
    except TrainError as e:
        print(f"apps/train: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; {args.run_dir}/checkpoint holds the last checkpoint (if one was written): continue with "
            f"`uv run apps/train -- --resume --run-dir {args.run_dir}` and the same options",
            file=sys.stderr,
        )
        return 130
    figures = result.figures
    if not result.finished:
        print(f"paused after {args.stop_after} steps; continue with --resume --run-dir {result.run_dir}")
        return 0
    print(
        f"held-out success ({result.eval_episodes} problems, greedy): "
        f"before {figures.get('before', 0.0):.1%} | after SFT {figures.get('after_sft', 0.0):.1%} | "
        f"after RL {figures.get('after_rl', 0.0):.1%}   (seed {config.seed}, {result.elapsed_s / 60:.1f} min)"
    )
    print(f"{'model:':<12}{result.model_dir}")
    for name, path in result.files.items():
        print(f"{name + ':':<12}{path}")
    if not args.no_install:
        print(f"installed as the demo model: {install_demo_model(result.model_dir, summary=result.files['summary'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
