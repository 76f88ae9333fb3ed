"""The file to pass as OpenRLHF's ``--train.agent_func_path``; users never copy glue code.

    AGENT_RECIPE=recipes/calculator.py python -m agent_train.openrlhf.main \\
        --train.agent_func_path "$(python -c 'import agent_train; print(agent_train.AGENT_FUNC_PATH)')" ...

OpenRLHF imports this file by path in every vLLM rollout actor and constructs `AgentExecutor()` with no
arguments. The recipe comes from the ``AGENT_RECIPE`` environment variable: a recipe file path or a module path
(``package.module`` or ``package.module:attr``), as `load_recipe` accepts. ``AGENT_ENGINE_TIMEOUT_S``, when set,
bounds each generation. `apps/train --backend openrlhf` sets both for local runs and in the Ray job's runtime
environment for cluster runs. ``AGENT_TRAJECTORY_LOG``, when set, is a JSONL file every rollout process appends
each episode's trajectory to (`AgentExecutor`'s `trajectory_log`; on a cluster, a path on each node), what
``uv run apps/serve --trajectories FILE`` shows. The recipe is loaded once per process.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Final

from agent_runtime import Recipe, RecipeError, load_recipe
from agent_train.openrlhf.executor import AgentExecutor as RecipeAgentExecutor

__all__ = ["RECIPE_ENV", "TIMEOUT_ENV", "TRAJECTORY_LOG_ENV", "AgentExecutor", "recipe_from_environment"]

RECIPE_ENV: Final = "AGENT_RECIPE"
TIMEOUT_ENV: Final = "AGENT_ENGINE_TIMEOUT_S"
TRAJECTORY_LOG_ENV: Final = "AGENT_TRAJECTORY_LOG"


@cache
def _load(source: str) -> Recipe:
    return load_recipe(source)


def recipe_from_environment() -> Recipe:
    """The recipe ``AGENT_RECIPE`` names; a `RecipeError` says what to set when it is missing."""
    source = os.environ.get(RECIPE_ENV, "").strip()
    if not source:
        raise RecipeError(
            f"{RECIPE_ENV} is not set: point it at the recipe to train (a .py file or a module path); "
            "`uv run apps/train --backend openrlhf --recipe PATH ...` sets it for you"
        )
    return _load(source)


def _timeout_from_environment() -> float | None:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError as e:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from e
    return value if value > 0 else None


class AgentExecutor(RecipeAgentExecutor):
    """The recipe named by ``AGENT_RECIPE``, as the no-argument executor OpenRLHF constructs."""

    def __init__(self) -> None:
        super().__init__(
            recipe_from_environment(),
            engine_timeout_s=_timeout_from_environment(),
            trajectory_log=os.environ.get(TRAJECTORY_LOG_ENV, "").strip() or None,
        )
