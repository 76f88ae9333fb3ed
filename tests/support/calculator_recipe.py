"""The recipe the server tests serve: ``recipes/calculator.py`` exactly as a user writes and `apps/serve` loads it
(`load_recipe` on the file), with the fields a test changes laid over it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Final

from agent_runtime.recipe import Recipe, load_recipe

__all__ = ["CALCULATOR_RECIPE_FILE", "calculator_recipe"]

CALCULATOR_RECIPE_FILE: Final = Path(__file__).resolve().parents[2] / "recipes" / "calculator.py"


def calculator_recipe(**changes: Any) -> Recipe:
    """``recipes/calculator.py``'s recipe, with `changes` (any `Recipe` field) applied."""
    return dataclasses.replace(load_recipe(CALCULATOR_RECIPE_FILE), **changes)
