"""Recipe: a task that needs more context than the budget holds, finished through context compaction.

    uv run apps/serve --model Qwen/Qwen3-4B --engine vllm --recipe examples/compact/recipe.py
    uv run apps/train --backend openrlhf --recipe examples/compact/recipe.py --pretrain Qwen/Qwen3-4B --dry-run

The task: "Harbour logbook 'north-quay' has 10 pages. Read every page with `read_page` and report the total
number of crates unloaded." Each page is a long stretch of log text (about 400 tokens) with one line that matters,
``Crates unloaded: N``. Ten pages do not fit in `MAX_CONTEXT_TOKENS`, so the session (the recipe's `context`
is a `CompactionPolicy`) asks the model for a summary whenever the next turn would pass `COMPACT_AT_TOKENS`, then
restarts the context from the system prompt, the task and that summary, and the episode goes on. Each context is
one segment of the trajectory; the reward (exact match of the total) is the episode's.

Thinking is off (``enable_thinking=False``) so turns stay short and the pages are what fills the context.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, Final

from agent_env import FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolError, tool
from agent_runtime import CompactionPolicy, Recipe

MAX_CONTEXT_TOKENS: Final = 2048
COMPACT_AT_TOKENS: Final = 1536
MAX_NEW_TOKENS: Final = 256

SYSTEM_PROMPT: Final = (
    "You read harbour logbooks with the `read_page` tool, one page per call, in order. Keep a running total. When "
    "every page is read, reply with one line: `Answer: <total>`."
)
COMPACTION_INSTRUCTION: Final = (
    "Your context is nearly full. Summarize your progress in one line, exactly: `Logbook <name>: pages 1-<last "
    "page read> of <pages> read, crates so far <running total>.` Do not call tools."
)

_WEATHER: Final = ("a steady westerly", "fog until noon", "squalls from the north", "a flat calm", "light rain")
_VESSELS: Final = ("the coaster Merel", "the barge Holm", "the schooner Tess", "the lighter No. 4", "the ferry Aune")
_CARGO: Final = ("barrels of pitch", "sacks of barley", "bales of wool", "casks of salt fish", "coils of rope")


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def crates(logbook: str, page: int) -> int:
    """The crates unloaded on `page` of `logbook` (the one number the task needs from that page)."""
    return random.Random(f"{logbook}:{page}:crates").randint(5, 95)


def page_text(logbook: str, page: int, pages: int) -> str:
    """Page `page` of `logbook`: about 400 tokens of log, deterministic in its arguments."""
    rng = random.Random(f"{logbook}:{page}")
    lines = [f"Logbook {logbook}, page {page} of {pages}."]
    for hour in range(6, 20, 2):
        lines.append(
            f"{hour:02d}:00. Weather: {rng.choice(_WEATHER)}, wind {rng.randint(3, 30)} knots. "
            f"{_capitalized(rng.choice(_VESSELS))} came alongside berth {rng.randint(1, 12)} with "
            f"{rng.randint(2, 60)} {rng.choice(_CARGO)}; {rng.randint(1, 9)} hands ashore, "
            f"tide at {rng.randint(10, 60) / 10} m."
        )
    lines.insert(rng.randint(2, len(lines)), f"Crates unloaded: {crates(logbook, page)}.")
    lines.append(f"Signed, harbourmaster of {logbook}.")
    return "\n".join(lines)


@tool(timeout_s=5)
def read_page(logbook: str, page: int, pages: int) -> str:
    """Read one page of a harbour logbook.

    Args:
        logbook: The logbook's name, e.g. "north-quay".
        page: The page number, from 1.
        pages: How many pages the logbook has (as stated in the task).
    """
    if not 1 <= page <= pages <= 50:
        raise ToolError(f"page {page} is not in 1..{pages}", hint="Pages are numbered from 1; logbooks hold <= 50.")
    return page_text(logbook, page, pages)


def tasks(split: str) -> Iterator[dict[str, Any]]:
    """Rows {"prompt", "answer"} of `split`: logbooks of 8 to 14 pages, the answer their crates' total."""
    sizes = {"train": 512, "test": 32}
    if split not in sizes:
        raise ValueError(f"the compact example has splits {sorted(sizes)}, not {split!r}")
    rng = random.Random(f"compact-{split}")
    for index in range(sizes[split]):
        logbook, pages = f"{split}-quay-{index}", rng.randint(8, 14)
        total = sum(crates(logbook, page) for page in range(1, pages + 1))
        prompt = (
            f"Harbour logbook '{logbook}' has {pages} pages. Read every page with read_page and report the total "
            "number of crates unloaded."
        )
        yield {"prompt": prompt, "answer": str(total)}


recipe = Recipe(
    name="compact-logbook",
    protocol="qwen3",
    protocol_options={"enable_thinking": False},
    environment=lambda: FunctionCallEnvironment(tools=[read_page], max_steps=40),
    rewards=RewardPipeline(result=[MatchingReward(mode="exact", extract="answer_line", name="exact_match")]),
    system_prompt=SYSTEM_PROMPT,
    max_new_tokens=MAX_NEW_TOKENS,
    max_context_tokens=MAX_CONTEXT_TOKENS,
    context=CompactionPolicy(
        compact_at_tokens=COMPACT_AT_TOKENS,
        max_compactions=8,
        summary_max_new_tokens=128,
        instruction_text=COMPACTION_INSTRUCTION,
    ),
    dataset=tasks,
)
