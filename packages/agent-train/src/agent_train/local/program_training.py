"""Train an agent-program recipe (`Recipe.agent`: an async function or a command line) on CPU with the local
trainer's parts: what `uv run apps/train --recipe R` runs on the local backend.

    uv run apps/train --recipe examples/any_agent/recipe.py                       # the smoke preset, ~4 minutes
    uv run apps/train --recipe examples/any_agent/recipe.py -- --preset tiny      # seconds: the wiring only
    result = train_program(recipe, "runs/any-agent", PROGRAM_PRESETS["smoke"], seed=0)

1. the local trainer's warm start (`train_local` with no RL steps): the demo tokenizer and model, SFT on the
   scripted expert's episodes of the config's demo (``warm_start.demo``, the calculator), run through the
   recipe's own session, so the recipe must be that demo's task: its dataset's ``train`` and ``test`` splits,
   an environment whose tools have the program's schemas (the prompts are then the ones the program sends);
2. held-out reward of the program, sampled at the rollout temperature (`eval_problems` problems, `eval_samples`
   each, fixed seeds);
3. RL: each step, `rl_prompts` training problems `rl_group_size` times through `ProgramRollouts` (the program
   against a per-episode endpoint on the `hf` engine that shares the model's weights; a command program through
   the rollouts' one gateway), GRPO advantages per episode, one clipped policy-gradient step (`rl`);
4. held-out reward again, with the same problems and seeds.

The run directory keeps the warm-start run (``warm_start/``) and ``summary.json`` with the figures. The engine is
`LockstepEngine`'s, so a seed gives one run, bit for bit, on one machine. A recipe with no program, or without the
dataset rows the warm start and the evaluation need, is refused before anything loads (`check_program_recipe`,
a `RecipeError` that names what is missing). `main(argv)` is the command line (`apps/train --recipe` passes the
recipe and what follows `--`). This module wires the local trainer's parts; the proxy, the rollouts and the update
are theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import msgspec

from agent_runtime import Recipe, RecipeError, load_recipe
from agent_train.demo.model import DemoModelSpec
from agent_train.local.config import LocalTrainConfig

if TYPE_CHECKING:  # torch and the proxy load when a run starts, after the recipe is checked
    from agent_train.local.program_rollouts import ProgramRollouts
    from agent_train.local.rollout import Rollouts

__all__ = [
    "PROGRAM_PRESETS",
    "ProgramTrainConfig",
    "ProgramTrainResult",
    "check_program_recipe",
    "held_out_reward",
    "main",
    "print_result",
    "train_from_model",
    "train_program",
]


class ProgramTrainConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The warm start (`warm_start`, a local-trainer config whose RL steps are ignored) and the RL run."""

    warm_start: LocalTrainConfig
    rl_steps: int = 10
    rl_prompts: int = 16
    rl_group_size: int = 8
    rl_lr: float = 1e-4
    rl_temperature: float = 1.0
    eval_problems: int = 48
    eval_samples: int = 2
    max_batch_size: int = 128
    #: "program": every rollout is the program through the proxy; "recipe": the recipe's own session instead
    #: (`Rollouts`), the baseline the proxy's run is compared with
    rollouts: Literal["program", "recipe"] = "program"


SMOKE: Final = ProgramTrainConfig(
    warm_start=LocalTrainConfig(
        tokenizer_episodes=600,
        model=DemoModelSpec(),
        sft_episodes=600,
        sft_steps=120,
        eval_size=16,
        sft_eval_every=1000,
        rl_steps=0,
    ),
)

PROGRAM_PRESETS: Final[dict[str, ProgramTrainConfig]] = {
    # the CI-sized run of examples/any_agent: a warm start that leaves the model partly right, then RL
    "smoke": SMOKE,
    # the wiring only (seconds of training): a model that has barely learned, one RL step of four episodes
    "tiny": msgspec.structs.replace(
        SMOKE,
        warm_start=msgspec.structs.replace(
            SMOKE.warm_start, tokenizer_episodes=100, sft_episodes=40, sft_steps=4, sft_batch_size=8, eval_size=2
        ),
        rl_steps=1,
        rl_prompts=2,
        rl_group_size=2,
        eval_problems=2,
        eval_samples=1,
    ),
}


class ProgramTrainResult(msgspec.Struct, frozen=True, kw_only=True):
    """Held-out sampled reward before and after RL, the training reward of each RL step, and the seconds spent."""

    before: float
    after: float
    step_rewards: list[float]
    segments_per_episode: float
    elapsed_s: float


def check_program_recipe(recipe: Recipe, config: ProgramTrainConfig) -> None:
    """Refuse, naming what is missing, a recipe this run cannot train: one with no agent program, or without the
    dataset rows the warm start (``train``) and the held-out evaluations (``test``) need."""
    if recipe.agent is None:
        raise RecipeError(
            f"recipe {recipe.name!r} names no agent program (Recipe.agent): the local backend's --recipe trains "
            "agent programs (AgentProgram(fn) or AgentProgram.command([...])); train a session recipe with "
            "--backend openrlhf"
        )
    if recipe.dataset is None:
        raise RecipeError(
            f"recipe {recipe.name!r} defines no dataset (Recipe.dataset): the warm start needs its 'train' split "
            "and the held-out evaluation its 'test' split"
        )
    needs = {
        "train": config.rl_prompts if config.rl_steps else 1,
        "test": max(config.warm_start.eval_size, config.eval_problems, 1),
    }
    for split, least in needs.items():
        rows = 0
        for _ in recipe.rows(split):
            rows += 1
            if rows >= least:
                break
        if rows < least:
            raise RecipeError(
                f"recipe {recipe.name!r}: its dataset's {split!r} split has {rows} rows; this run needs at least "
                f"{least} ({'rl_prompts' if split == 'train' else 'eval_size / eval_problems'})"
            )


async def held_out_reward(
    rollouts: ProgramRollouts | Rollouts, rows: Sequence[dict[str, object]], samples: int, temperature: float
) -> float:
    """Mean reward of the program on `rows`, `samples` episodes each at `temperature`, with fixed seeds."""
    records = await rollouts.collect(rows, group_size=samples, temperature=temperature, seed=7)
    episodes = {r.episode: r.reward for r in records}
    return sum(episodes.values()) / max(1, len(episodes))


async def train_from_model(
    config: ProgramTrainConfig, recipe: Recipe, model_dir: Path, seed: int
) -> ProgramTrainResult:
    """Steps 2-4 of the module docstring on a model directory that is already warm (or a test's tiny model)."""
    import torch
    from tokenizers import Tokenizer

    from agent_protocol import HFTokenizer
    from agent_runtime.engines import HFEngine
    from agent_train.demo.model import load_demo_model
    from agent_train.local.lockstep import LockstepEngine
    from agent_train.local.program_rollouts import ProgramRollouts
    from agent_train.local.rl import episode_advantages, rl_update, trained_records
    from agent_train.local.rollout import RolloutRecord, Rollouts

    started = time.perf_counter()
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = load_demo_model(model_dir)
    engine = LockstepEngine(  # the episodes' turns batched in episode order: a seed gives one run (issue 39)
        HFEngine(
            model,
            HFTokenizer(raw, source="demo"),
            context_length=recipe.max_context_tokens,
            max_batch_size=config.max_batch_size,
            batch_wait_s=0.05,
        )
    )
    rng = random.Random(seed)
    torch.manual_seed(seed)
    if config.rollouts == "program":
        rollouts: ProgramRollouts | Rollouts = ProgramRollouts(recipe, engine)
    else:
        rollouts = Rollouts(dataclasses.replace(recipe, agent=None), engine)
    train_rows, held_out = list(recipe.rows("train")), list(recipe.rows("test"))[: config.eval_problems]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.rl_lr, betas=(0.9, 0.95))
    pad_id = int(raw.token_to_id("<|endoftext|>"))
    try:
        before = await held_out_reward(rollouts, held_out, config.eval_samples, config.rl_temperature)
        step_rewards: list[float] = []
        segments = episodes = 0
        for step in range(config.rl_steps):
            records: list[RolloutRecord] = await rollouts.collect(
                rng.sample(train_rows, config.rl_prompts),
                group_size=config.rl_group_size,
                temperature=config.rl_temperature,
                seed=seed * 1_000_003 + step,
            )
            trained, advantages = trained_records(records, episode_advantages(records, "grpo"))
            rl_update(model, optimizer, trained, advantages, pad_id=pad_id, rng=rng)
            rewards = {r.episode: r.reward for r in records}
            step_rewards.append(sum(rewards.values()) / max(1, len(rewards)))
            segments, episodes = segments + len(records), episodes + len(rewards)
        after = await held_out_reward(rollouts, held_out, config.eval_samples, config.rl_temperature)
    finally:
        if isinstance(rollouts, ProgramRollouts):
            await rollouts.aclose()  # a command program's gateway
        await engine.close()
    return ProgramTrainResult(
        before=before,
        after=after,
        step_rewards=step_rewards,
        segments_per_episode=segments / max(1, episodes),
        elapsed_s=time.perf_counter() - started,
    )


def train_program(
    recipe: Recipe, run_dir: str | Path, config: ProgramTrainConfig = SMOKE, *, seed: int = 0
) -> ProgramTrainResult:
    """The run of the module docstring; blocking. Returns the figures (also in ``run_dir/summary.json``)."""
    from agent_train.local.trainer import train_local

    check_program_recipe(recipe, config)
    run_dir = Path(run_dir)
    warm_start = msgspec.structs.replace(config.warm_start, seed=seed, rl_steps=0)
    started = time.perf_counter()
    warm = train_local(warm_start, run_dir / "warm_start", recipe=recipe, progress=False)
    result = asyncio.run(train_from_model(config, recipe, warm.model_dir, seed))
    result = msgspec.structs.replace(result, elapsed_s=time.perf_counter() - started)
    (run_dir / "summary.json").write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    return result


def print_result(result: ProgramTrainResult, run_dir: str | Path) -> None:
    """The run's figures, as the command line prints them."""
    print(f"held-out reward before RL {result.before:.3f}, after {result.after:.3f}")
    print("training reward per RL step: " + " ".join(f"{r:.2f}" for r in result.step_rewards))
    print(f"{result.elapsed_s:.0f} s in all; summary in {run_dir}/summary.json")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apps/train --recipe RECIPE --",
        description="Train an agent-program recipe on this machine's CPUs: warm start (SFT on the demo expert's "
        "episodes), held-out reward of the program, RL through the program's own rollouts, held-out reward again.",
    )
    parser.add_argument("--recipe", required=True, help="recipe file (.py) or module path whose agent is a program")
    parser.add_argument("--run-dir", help="warm_start/ and summary.json (default: runs/<recipe name>)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--preset",
        choices=list(PROGRAM_PRESETS),
        default="smoke",
        help="smoke (default): the CI-sized run of examples/any_agent; tiny: the wiring only, in seconds",
    )
    parser.add_argument(
        "--rollouts",
        choices=["program", "recipe"],
        default="program",
        help="program (default): RL and evaluation through the program; recipe: the recipe's own session (baseline)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: trains, prints the figures, returns 0; a recipe it cannot train raises `RecipeError`."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    recipe = load_recipe(args.recipe)
    config = msgspec.structs.replace(PROGRAM_PRESETS[args.preset], rollouts=args.rollouts)
    check_program_recipe(recipe, config)  # before torch loads
    run_dir = args.run_dir or f"runs/{recipe.name}"
    result = train_program(recipe, run_dir, config, seed=args.seed)
    print_result(result, run_dir)
    return 0
