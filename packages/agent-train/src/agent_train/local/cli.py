"""The local trainer's command line: what `uv run apps/train` (backend ``local``, the default) runs.

    uv run apps/train                                 # train the demo agent into runs/demo, install it for serve
    uv run apps/train -- --seed 1 --run-dir runs/s1   # options after `--` come here
    uv run apps/train -- --resume                     # continue runs/demo from its last checkpoint
    uv run apps/train -- --estimator rloo --dynamic-filtering   # another OpenRLHF estimator, DAPO's filter
    uv run apps/train --demo compaction               # the compaction demo, into runs/compaction, and its ablation
    uv run apps/train -- --tensorboard-dir runs/tb    # event files in runs/tb/demo, not runs/demo/tensorboard/demo
    uv run apps/train -- --async 1                    # sample the next batch while this one trains (1 version stale)
    uv run apps/serve --trajectories runs/demo/trajectories   # browse the episodes a run trained on
    python -m agent_train.local.cli --preset ci       # the same, without the app

`main(argv)` parses the options, runs `train_local`, prints the held-out figures and where everything went, and
(unless ``--no-install``) installs the final model as the demo model that `apps/serve` serves when no model is
named (see `agent_train.demo.build`; the compaction demo's is served with ``apps/serve --demo compaction``). For
the compaction demo it also runs the ablation (`agent_train.local.ablation`: RL again from the same SFT model with
summary tokens masked) unless ``--no-ablation``. The metrics also go to TensorBoard event files, in
``TENSORBOARD_DIR/<run name>`` as OpenRLHF's ``--logger.tensorboard_dir`` does (`tensorboard_events_dir`), unless
``--no-tensorboard``; the episodes to trajectory logs in ``RUN_DIR/trajectories`` (what ``uv run apps/serve
--trajectories RUN_DIR/trajectories`` shows), unless ``--no-trajectories``. It configures no logging: the app
does, and run as a module the library's defaults apply.
This module knows options and printing; the training is `trainer.py`'s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from agent_runtime import ignore_pynvml_deprecation
from agent_train.errors import TrainError
from agent_train.local.config import ESTIMATORS, GROUP_ESTIMATORS, PRESETS, check_config
from agent_train.local.demos import DEMOS, get_demo

__all__ = ["build_parser", "main", "tensorboard_events_dir"]

_FIGURES = (
    ("compaction_off", "compaction off"),
    ("before", "before"),
    ("after_sft", "after SFT"),
    ("after_rl", "after RL"),
    ("after_rl_masked", "after RL, summaries masked"),
)


def _estimators_help() -> str:
    width = max(map(len, ESTIMATORS))
    lines = [
        f"  {name:<{width}}  {text}{' (needs more than one sample per prompt)' if name in GROUP_ESTIMATORS else ''}"
        for name, text in ESTIMATORS.items()
    ]
    return (
        "estimators (--estimator, OpenRLHF's names; default grpo):\n"
        + "\n".join(lines)
        + (
            "\n  --dynamic-filtering  DAPO's dynamic filtering: drop groups whose rewards are all equal and sample new "
            "prompts to refill the step"
        )
    )


def tensorboard_events_dir(run_dir: str | Path, tensorboard_dir: str | Path | None) -> Path:
    """Where a run's event files go: ``<tensorboard_dir>/<run name>``, the run name being the run directory's name,
    and `tensorboard_dir` by default ``<run_dir>/tensorboard`` (where `apps/train --backend openrlhf` points
    OpenRLHF's ``--logger.tensorboard_dir``). One ``tensorboard --logdir runs`` then lists every run."""
    run = Path(run_dir).resolve()
    return Path(tensorboard_dir if tensorboard_dir is not None else run / "tensorboard") / run.name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apps/train --backend local --",
        description="Train the embedded demo agent on this machine: tokenizer, tiny Qwen3 model, SFT on expert "
        "episodes, then RL through the OpenRLHF agent executor with the hf engine.",
        epilog=_estimators_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--demo",
        choices=list(DEMOS),
        default="calculator",
        help="which demo agent: "
        + "; ".join(f"{name}: {demo.summary}" for name, demo in DEMOS.items())
        + " (default: calculator)",
    )
    parser.add_argument(
        "--run-dir", help="metrics, plot, checkpoints (default: runs/demo; runs/compaction for --demo compaction)"
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default", help="default: the full demo run")
    parser.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint when there is one")
    parser.add_argument("--seed", type=int, help="overrides the preset's seed")
    parser.add_argument("--sft-steps", type=int, help="overrides the preset's SFT steps")
    parser.add_argument("--rl-steps", type=int, help="overrides the preset's RL steps")
    parser.add_argument("--eval-size", type=int, help="held-out problems per evaluation (at most 500)")
    parser.add_argument("--kl-coef", type=float, help="KL to the SFT model during RL (0: none)")
    parser.add_argument(
        "--estimator", choices=list(ESTIMATORS), help="RL advantage estimator (default: grpo; see below)"
    )
    parser.add_argument(
        "--dynamic-filtering",
        action="store_true",
        default=None,
        help="DAPO's dynamic filtering: train only on groups whose rewards differ, refilled with new prompts",
    )
    parser.add_argument(
        "--filter-rounds",
        type=int,
        help="rollout rounds per RL step at most when dynamic filtering refills (default 3)",
    )
    parser.add_argument(
        "--mask-summaries",
        action="store_true",
        default=None,
        help="compaction: summary turns get loss mask 0 in RL (the ablation; off by default)",
    )
    parser.add_argument(
        "--no-mask-overlong",
        dest="mask_overlong",
        action="store_false",
        default=None,
        help="also train on episodes that ran out of context or steps without answering (left out by default)",
    )
    parser.add_argument(
        "--async",
        dest="rl_async",
        type=int,
        metavar="K",
        help="asynchronous RL: sample the next batches on a second copy of the weights while the current one "
        "trains, batch j by the weights of version max(0, j-K), so at most K versions stale (K >= 1), with "
        "OpenRLHF's token-level IS correction (--is-mode); K = 0 runs that pipeline without overlap, the "
        "synchronous loop's records; default: the synchronous loop (one shared copy). Cannot pause or resume "
        "inside RL",
    )
    parser.add_argument(
        "--is-mode",
        choices=["mask", "clip"],
        help="--async: a token whose IS ratio (training policy / rollout policy) leaves [0.5, 5] is dropped (mask, "
        "ICEPOP: OpenRLHF's default) or its ratio clamped into it (clip, TIS)",
    )
    parser.add_argument(
        "--branch-from",
        metavar="RUN_DIR",
        help="start RL from another run's SFT model and RNG state (its RUN_DIR/rl_start), with this run's RL options "
        "(the other options must be the same): e.g. --async 1 on the very SFT model of a synchronous run",
    )
    parser.add_argument(
        "--no-ablation",
        action="store_true",
        help="compaction demo: skip the ablation run (RL again from the SFT model with summaries masked)",
    )
    parser.add_argument(
        "--stop-after", type=int, metavar="STEPS", help="checkpoint and stop after STEPS steps (continue with --resume)"
    )
    parser.add_argument(
        "--tensorboard-dir",
        metavar="DIR",
        help="write the metrics as TensorBoard event files into DIR/<run name> (the run directory's name), as "
        "OpenRLHF's --logger.tensorboard_dir does; default: RUN_DIR/tensorboard, so `tensorboard --logdir runs` "
        "shows every local and OpenRLHF run",
    )
    parser.add_argument("--no-tensorboard", action="store_true", help="write no TensorBoard event files")
    parser.add_argument(
        "--no-trajectories",
        action="store_true",
        help="write no trajectory logs (by default every RL step's, evaluation's and expert's episodes go to "
        "RUN_DIR/trajectories, as trained: `uv run apps/serve --trajectories RUN_DIR/trajectories` shows them)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-install", action="store_true", help="do not install the final model as the demo model apps/serve uses"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    demo = get_demo(args.demo)
    config = demo.presets[args.preset]
    run_dir = args.run_dir or ("runs/demo" if demo.name == "calculator" else f"runs/{demo.name}")
    overrides = {
        "seed": args.seed,
        "sft_steps": args.sft_steps,
        "rl_steps": args.rl_steps,
        "eval_size": args.eval_size,
        "rl_kl_coef": args.kl_coef,
        "rl_estimator": args.estimator,
        "rl_dynamic_filtering": args.dynamic_filtering,
        "rl_filter_rounds": args.filter_rounds,
        "rl_mask_summaries": args.mask_summaries,
        "rl_mask_overlong": args.mask_overlong,
        "rl_async": args.rl_async,
        "rl_is_mode": args.is_mode,
    }
    config = msgspec.structs.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    try:
        check_config(config)
    except ValueError as e:
        print(f"apps/train: error: {e}", file=sys.stderr)
        return 2
    if args.no_tensorboard and args.tensorboard_dir is not None:
        print("apps/train: error: --tensorboard-dir and --no-tensorboard contradict each other", file=sys.stderr)
        return 2
    events = None if args.no_tensorboard else tensorboard_events_dir(run_dir, args.tensorboard_dir)
    try:
        if events is not None:
            events.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"apps/train: error: --tensorboard-dir: cannot create {events}: {e}", file=sys.stderr)
        return 2

    ignore_pynvml_deprecation()
    from agent_train.demo.build import install_demo_model  # torch, transformers and vLLM load from here on
    from agent_train.local.ablation import run_ablation
    from agent_train.local.trainer import train_local

    try:
        result = train_local(
            config,
            run_dir,
            resume=args.resume,
            progress=not args.no_progress,
            stop_after=args.stop_after,
            branch_from=args.branch_from,
            tensorboard_dir=events,
            trajectories=not args.no_trajectories,
        )
        if result.finished and demo.name == "compaction" and not args.no_ablation and not config.rl_mask_summaries:
            result = run_ablation(result, progress=not args.no_progress)
    except TrainError as e:
        print(f"apps/train: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; {run_dir}/checkpoint holds the last checkpoint (if one was written): continue with "
            f"`uv run apps/train -- --resume --run-dir {run_dir}` and the same options",
            file=sys.stderr,
        )
        return 130
    figures = result.figures
    if not result.finished:
        print(f"paused after {args.stop_after} steps; continue with --resume --run-dir {result.run_dir}")
        return 0
    shown = [(label, figures[key]) for key, label in _FIGURES if key in figures]
    print(
        f"held-out success ({result.eval_episodes} problems, greedy): "
        + " | ".join(f"{label} {value:.1%}" for label, value in shown)
        + f"   (seed {config.seed}, {result.elapsed_s / 60:.1f} min)"
    )
    if result.staleness:
        counts = ", ".join(f"{key}: {value}" for key, value in result.staleness.items() if key != "dropped")
        print(
            f"staleness of the trained episodes (--async {config.rl_async}; versions: episodes, over the RL steps): "
            f"{counts}; dropped as too stale: {result.staleness.get('dropped', 0)}"
        )
    print(f"{'model:':<13}{result.model_dir}")
    for name, path in result.files.items():
        print(f"{name + ':':<13}{path}")
    if not args.no_install:
        installed = install_demo_model(result.model_dir, summary=result.files["summary"], demo=demo.name)
        print(f"installed as the {demo.name} demo model: {installed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
