"""Recipe: a visual agent that answers questions about a generated picture, zooming in with the `crop` tool.

    uv run apps/serve --model Qwen/Qwen2.5-VL-3B-Instruct --engine vllm --recipe examples/vision/recipe.py
    uv run apps/train --backend openrlhf --recipe examples/vision/recipe.py --pretrain Qwen/Qwen2.5-VL-3B-Instruct \
        --dry-run

Each task is one picture (448x336: coloured shapes and a small seven-segment number in a corner, drawn by
`build_data.py` from a fixed seed) and a question: read the number in a named corner, or count the shapes of a
colour. The number is 12 pixels high, a few vision tokens at the picture's size, so the agent is given
`agent_env.CropTool` (`crop`): a box of the picture, in its own pixels, shown enlarged as a new image in the tool
result. The tool reads the picture from the row's ``images``. The answer goes inside ``<answer>...</answer>``; the
reward is an exact match (after normalization) with the row's `answer`.

The protocol is ``qwen3-vl`` (the Qwen3-VL-Instruct chat template: ChatML, Hermes tool calls, images as
``<|vision_start|><|image_pad|><|vision_end|>``, which Qwen2.5-VL-Instruct writes the same way); each image's pads
are expanded by the model directory's image processor (`preprocessor_config.json`). `MAX_IMAGES` caps the pictures
one context holds: the task's own and up to `MAX_TURNS - 1` crops.

The rows are generated as they are read (no data files); `uv run python -m examples.vision.build_data --out DIR`
writes them as JSONL for inspection.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from agent_env import CropTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_runtime import Recipe, RecipeError

HERE: Final = Path(__file__).resolve().parent
MAX_TURNS: Final = 4
MAX_IMAGES: Final = MAX_TURNS  # the task's picture and one crop per turn but the last (the answer)

SYSTEM_PROMPT: Final = (
    "You answer questions about a picture 448 pixels wide and 336 pixels high. Small details may be too small "
    "to read at the size you see it: call the `crop` tool with a box [left, top, right, bottom] in the picture's "
    "pixels and a zoom factor to see that region enlarged; the corners of the picture are at [0, 0] and "
    "[448, 336]. When you know the answer, reply with it inside <answer> and </answer>, only the number, for "
    "example <answer> 42 </answer>."
)


def _build_data() -> ModuleType:
    """`build_data.py` beside this file, imported by path (the apps load recipes by path, so the repository root
    need not be importable)."""
    if "examples.vision.build_data" in sys.modules:
        return sys.modules["examples.vision.build_data"]
    spec = importlib.util.spec_from_file_location("_vision_build_data", HERE / "build_data.py")
    if spec is None or spec.loader is None:
        raise RecipeError(f"cannot import {HERE / 'build_data.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def rows(split: str) -> Iterator[dict[str, Any]]:
    """The generated rows of `split` (see `build_data.py`)."""
    try:
        yield from _build_data().rows(split)
    except ValueError as e:
        raise RecipeError(str(e)) from e


CROP: Final = CropTool()  # shared by every episode: it keeps nothing of its own, the picture comes from the row


def environment() -> FunctionCallEnvironment:
    return FunctionCallEnvironment(tools=[CROP], max_steps=MAX_TURNS)


recipe = Recipe(
    name="vision-zoom",
    protocol="qwen3-vl",
    environment=environment,
    rewards=RewardPipeline(result=[MatchingReward(mode="normalized", extract="answer_tag", name="exact_match")]),
    system_prompt=SYSTEM_PROMPT,
    max_new_tokens=512,
    max_context_tokens=8192,
    max_images=MAX_IMAGES,
    dataset=rows,
)
