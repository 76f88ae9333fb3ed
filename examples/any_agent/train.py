"""Train the plain OpenAI-client agent of `agent.py` on CPU, against the demo model, with every RL rollout the
program itself running against the proxy.

    uv run python -m examples.any_agent.train --run-dir runs/any_agent          # about two minutes on two cores

1. the local trainer's warm start (`train_local` with no RL steps): the demo tokenizer and model, SFT on the
   scripted expert's episodes (which run the recipe's own session: its environment has the program's calculator
   schema, so the prompts are the ones the program will send);
2. held-out reward of the program, sampled at the rollout temperature (`eval_problems` problems, `eval_samples`
   each, fixed seeds);
3. RL: each step, `rl_prompts` training problems `rl_group_size` times through `ProgramRollouts` (the program,
   a real `openai.AsyncOpenAI`, the per-episode endpoint on the `hf` engine that shares the model's weights),
   GRPO advantages per episode, one clipped policy-gradient step (`agent_train.local.rl`);
4. held-out reward again, with the same problems and seeds.

The run directory keeps the trainer's warm-start run (``warm_start/``) and ``summary.json`` with the figures.
This script wires the local trainer's parts; the proxy, the rollouts and the update are theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec
import torch
from tokenizers import Tokenizer

from agent_protocol import HFTokenizer
from agent_runtime import Recipe
from agent_runtime.engines.hf import HFEngine
from agent_train.demo.model import DemoModelSpec, load_demo_model
from agent_train.local.config import LocalTrainConfig
from agent_train.local.lockstep import LockstepEngine
from agent_train.local.program_rollouts import ProgramRollouts
from agent_train.local.rl import episode_advantages, rl_update, trained_records
from agent_train.local.rollout import RolloutRecord, Rollouts
from agent_train.local.trainer import train_local
from examples.any_agent.recipe import make_recipe

__all__ = ["SMOKE", "AnyAgentConfig", "AnyAgentResult", "main", "train_any_agent", "train_from_model"]


class AnyAgentConfig(msgspec.Struct, frozen=True, kw_only=True):
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


SMOKE = AnyAgentConfig(
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
"""The CI-sized run: a warm start that leaves the model partly right, then RL through the proxy."""


class AnyAgentResult(msgspec.Struct, frozen=True, kw_only=True):
    """Held-out sampled reward before and after RL, the training reward of each RL step, and the seconds spent."""

    before: float
    after: float
    step_rewards: list[float]
    segments_per_episode: float
    elapsed_s: float


async def held_out_reward(
    rollouts: ProgramRollouts | Rollouts, rows: Sequence[dict[str, object]], samples: int, temperature: float
) -> float:
    """Mean reward of the program on `rows`, `samples` episodes each at `temperature`, with fixed seeds."""
    records = await rollouts.collect(rows, group_size=samples, temperature=temperature, seed=7)
    episodes = {r.episode: r.reward for r in records}
    return sum(episodes.values()) / max(1, len(episodes))


async def train_from_model(config: AnyAgentConfig, recipe: Recipe, model_dir: Path, seed: int) -> AnyAgentResult:
    """Steps 2-4 of the module docstring on a model directory that is already warm (or a test's tiny model)."""
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
        await engine.close()
    return AnyAgentResult(
        before=before,
        after=after,
        step_rewards=step_rewards,
        segments_per_episode=segments / max(1, episodes),
        elapsed_s=time.perf_counter() - started,
    )


def train_any_agent(
    run_dir: str | Path,
    config: AnyAgentConfig = SMOKE,
    *,
    seed: int = 0,
    agent: Literal["loop", "sdk", "subprocess"] = "loop",
) -> AnyAgentResult:
    """The run of the module docstring; blocking. Returns the figures (also in ``run_dir/summary.json``). `agent`:
    the plain loop (`agent.py`), the same agent on the OpenAI Agents SDK (`sdk_agent.py`), or the plain loop as a
    process per episode (`subprocess_agent.py`, through a gateway)."""
    run_dir = Path(run_dir)
    recipe = make_recipe(agent)
    warm_start = msgspec.structs.replace(config.warm_start, seed=seed, rl_steps=0)
    started = time.perf_counter()
    warm = train_local(warm_start, run_dir / "warm_start", recipe=recipe, progress=False)
    result = asyncio.run(train_from_model(config, recipe, warm.model_dir, seed))
    result = msgspec.structs.replace(result, elapsed_s=time.perf_counter() - started)
    (run_dir / "summary.json").write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="runs/any_agent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rollouts", choices=["program", "recipe"], default="program")
    parser.add_argument(
        "--agent",
        choices=["loop", "sdk", "subprocess"],
        default="loop",
        help="the plain loop, the OpenAI Agents SDK agent, or the plain loop as a subprocess per episode",
    )
    args = parser.parse_args(argv)
    config = msgspec.structs.replace(SMOKE, rollouts=args.rollouts)
    result = train_any_agent(args.run_dir, config, seed=args.seed, agent=args.agent)
    print(f"held-out reward before RL {result.before:.3f}, after {result.after:.3f}")
    print("training reward per RL step: " + " ".join(f"{r:.2f}" for r in result.step_rewards))
    print(f"{result.elapsed_s:.0f} s in all; summary in {args.run_dir}/summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
