"""Train the plain OpenAI-client agent of `agent.py` on CPU, against the demo model, with every RL rollout the
program itself running against the proxy.

    uv run python -m examples.any_agent.train --run-dir runs/any_agent          # about four minutes on two cores
    uv run apps/train --recipe examples/any_agent/recipe.py                      # the same run, from the app

The run is `agent_train.local.program_training`'s (warm start from the demo's SFT, held-out reward of the program
before and after, RL through `ProgramRollouts`, ``summary.json``), on the smoke preset (`SMOKE`); this script
picks the agent (`recipe.make_recipe`: the plain loop, the Agents SDK agent, or the loop as a process per episode)
and keeps the example's names (`AnyAgentConfig`, `AnyAgentResult`, `train_any_agent`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec

from agent_train.local.program_training import (
    PROGRAM_PRESETS,
    ProgramTrainConfig,
    ProgramTrainResult,
    print_result,
    train_from_model,
    train_program,
)
from examples.any_agent.recipe import make_recipe

__all__ = ["SMOKE", "AnyAgentConfig", "AnyAgentResult", "main", "train_any_agent", "train_from_model"]

AnyAgentConfig = ProgramTrainConfig
AnyAgentResult = ProgramTrainResult
SMOKE = PROGRAM_PRESETS["smoke"]
"""The CI-sized run: a warm start that leaves the model partly right, then RL through the proxy."""


def train_any_agent(
    run_dir: str | Path,
    config: AnyAgentConfig = SMOKE,
    *,
    seed: int = 0,
    agent: Literal["loop", "sdk", "sdk-responses", "subprocess"] = "loop",
) -> AnyAgentResult:
    """The run (`program_training.train_program`) of the agent `agent`: the plain loop (`agent.py`), the same
    agent on the OpenAI Agents SDK (`sdk_agent.py`: its Chat Completions model, or ``sdk-responses``, its default
    Responses model), or the plain loop as a process per episode (`subprocess_agent.py`, through the gateway);
    blocking. Returns the figures (also in ``run_dir/summary.json``)."""
    return train_program(make_recipe(agent), run_dir, config, seed=seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="runs/any_agent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rollouts", choices=["program", "recipe"], default="program")
    parser.add_argument(
        "--agent",
        choices=["loop", "sdk", "sdk-responses", "subprocess"],
        default="loop",
        help="the plain loop; the OpenAI Agents SDK agent on Chat Completions (sdk) or on its default Responses "
        "API (sdk-responses); or the plain loop as a subprocess per episode",
    )
    args = parser.parse_args(argv)
    config = msgspec.structs.replace(SMOKE, rollouts=args.rollouts)
    result = train_any_agent(args.run_dir, config, seed=args.seed, agent=args.agent)
    print_result(result, args.run_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
