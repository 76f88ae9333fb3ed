"""Recipe: single-turn math question answering, scored by `MathReward` (the answer goes in ``\\boxed{}``).

    uv run apps/serve --model Qwen/Qwen3-4B --engine vllm --recipe examples/single_turn/recipe.py
    uv run apps/train --backend openrlhf --recipe examples/single_turn/recipe.py --pretrain Qwen/Qwen3-4B --dry-run

Plain RL with a verifiable reward, in the same runtime as the tool-using agents: `SingleTurnEnvironment` offers
no tools and ends the episode after one generation, whose content is the final answer. `MathReward` (math-verify)
extracts the last ``\\boxed{...}`` and checks it against the row's `answer` symbolically, so ``\\frac{19}{12}``,
``19/12`` and ``\\frac{38}{24}`` all score 1.0. The dataset is `data/{train,test}.jsonl` (built by
`build_data.py`): rows ``{"prompt", "answer", "kind"}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from agent_env import MathReward, RewardPipeline, SingleTurnEnvironment
from agent_runtime import Recipe

DATA_DIR: Final = Path(__file__).resolve().parent / "data"

# Qwen's recommended instruction for math, as the system prompt.
SYSTEM_PROMPT: Final = "Please reason step by step, and put your final answer within \\boxed{}."

recipe = Recipe(
    name="single-turn-math",
    protocol="qwen3",
    environment=SingleTurnEnvironment,
    rewards=RewardPipeline(result=[MathReward(timeout_s=10.0)]),
    system_prompt=SYSTEM_PROMPT,
    max_new_tokens=2048,
    max_context_tokens=4096,
    dataset=DATA_DIR,
)
