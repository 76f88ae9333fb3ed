"""`recipe_for_model(model_dir)`: the recipe of a model that comes without one, derived from its directory.

    recipe = recipe_for_model("path/to/Qwen3-4B-Instruct-2507")
    recipe.protocol             # "qwen3-instruct-2507", from the directory's chat template
    recipe.max_context_tokens   # config.json's max_position_embeddings

- the chat protocol is the registered one whose format the directory's chat template is
  (`agent_protocol.detect_protocol`; a family none is registered for raises `RecipeError` naming them);
- the context is ``config.json``'s ``max_position_embeddings`` (a multimodal config's ``text_config``'s), unless
  `context_length` is given; a config that names none raises `RecipeError`, as nothing would bound the episode;
- a turn's limit is ``generation_config.json``'s ``max_new_tokens`` when it sets one, else `DEFAULT_MAX_NEW_TOKENS`,
  in both cases at most half the context so a prompt still fits; its sampling fields (``do_sample``,
  ``temperature``, ``top_p``, ``top_k``) become the recipe's sampling, as `transformers` would sample;
- the environment has no tools unless `tools` are given (a client in tools mode sends its own), no rewards and no
  system prompt: the model's template decides what an empty system turn is.

This module reads a model directory's JSON files; it loads no weights and knows nothing about HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from agent_env import FunctionCallEnvironment, ToolBase
from agent_protocol import ProtocolDetectionError, detect_protocol
from agent_runtime.engines.base import SamplingParams
from agent_runtime.recipe import Recipe, RecipeError

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DEFAULT_MAX_STEPS", "recipe_for_model"]

DEFAULT_MAX_NEW_TOKENS: Final = 8192
"""A turn's token limit when ``generation_config.json`` sets none: room for a reasoning model's thinking and an
answer, far below the context of any current chat model (and capped at half of a smaller one)."""

DEFAULT_MAX_STEPS: Final = 16
"""Model turns in an agent-mode episode when the recipe is derived (only tool calls make more than one)."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecipeError(f"{path} cannot be read: {e}") from e
    if not isinstance(data, dict):
        raise RecipeError(f"{path} is not a JSON object")
    return data


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _context_length(root: Path, config: dict[str, Any]) -> int:
    text_config = config.get("text_config")
    for source in (config, text_config if isinstance(text_config, dict) else {}):
        found = _positive_int(source.get("max_position_embeddings"))
        if found is not None:
            return found
    raise RecipeError(
        f"{root / 'config.json'} names no max_position_embeddings: pass the model's context length "
        "(--context-length) or a recipe (--recipe)"
    )


def _sampling(generation: dict[str, Any], max_new_tokens: int) -> SamplingParams:
    fields: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if generation.get("do_sample") is False:
        fields["temperature"] = 0.0  # transformers decodes greedily whatever the temperature says
    elif isinstance(generation.get("temperature"), (int, float)):
        fields["temperature"] = float(generation["temperature"])
    if isinstance(generation.get("top_p"), (int, float)):
        fields["top_p"] = float(generation["top_p"])
    if isinstance(generation.get("top_k"), int):
        fields["top_k"] = int(generation["top_k"])
    try:
        return SamplingParams(**fields)
    except ValueError as e:
        raise RecipeError(f"generation_config.json: {e}") from e


def recipe_for_model(
    model_dir: str | Path,
    *,
    context_length: int | None = None,
    tools: Sequence[ToolBase] = (),
    max_steps: int = DEFAULT_MAX_STEPS,
    name: str | None = None,
) -> Recipe:
    """The generic recipe of the model in `model_dir` (see the module docstring). Raises `RecipeError` naming the
    file and the field when the directory cannot say what the recipe needs."""
    root = Path(model_dir)
    if not root.is_dir():
        raise RecipeError(f"model directory {root} does not exist")
    try:
        protocol = detect_protocol(root)
    except ProtocolDetectionError as e:
        raise RecipeError(f"{e}; write a recipe naming one (--recipe)") from e
    if context_length is not None and context_length < 2:
        raise RecipeError(f"context_length must be at least 2, got {context_length}")
    context = context_length or _context_length(root, _read_json(root / "config.json"))
    generation = _read_json(root / "generation_config.json")
    max_new_tokens = min(_positive_int(generation.get("max_new_tokens")) or DEFAULT_MAX_NEW_TOKENS, context // 2)
    shared_tools = list(tools)  # tools are read-only; every episode's environment shares them
    return Recipe(
        name=name or root.resolve().name,
        protocol=protocol,
        environment=lambda: FunctionCallEnvironment(tools=shared_tools, max_steps=max_steps),
        max_new_tokens=max_new_tokens,
        max_context_tokens=context,
        sampling=_sampling(generation, max_new_tokens),
        metadata={"derived_from": str(root), "tools": [tool.name for tool in shared_tools]},
    )
