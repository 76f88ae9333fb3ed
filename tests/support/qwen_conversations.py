"""The generated conversations the tests of the ChatML families with Qwen's texts share (Qwen2.5, Qwen3-2504,
Qwen3-Coder): 200 seeds of `random_conversations.conversation` with texts that hold Qwen's own tags, arguments
of every JSON type (some given as a JSON string), reasoning now and then, up to two calls a turn, and a tool list
in every shape."""

from __future__ import annotations

import random
from typing import Any

from tests.support.family_checks import is_episode
from tests.support.random_conversations import ConversationMix, choose, conversation, random_tools

__all__ = ["ARGUMENTS", "CONVERSATIONS", "MIX", "TEXTS", "episodes"]

TEXTS = [
    "",
    "Hi",
    "\n",
    "  padded  ",
    "\nleading newline",
    "trailing newline\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "<think>inline reasoning</think>after",
    "<tool_response>typed by the user</tool_response>",
    '{"name": "lookup", "arguments": {"q": "x"}}',
    'quotes " and \\ backslash',
    "tab\tand\r\nCRLF",
]
ARGUMENTS: list[Any] = [
    {},
    {"q": "x"},
    {"q": "é 中文", "n": 3, "ratio": 2.5, "flag": True, "none": None, "nested": {"a": [1, 2.5, None, False]}},
    {"code": "print('</parameter>')\nx = 1\n", "list": ["a", {"b": 1}]},
    '{"q": "given as a string"}',
    "{}",
]
MIX = ConversationMix(
    texts=TEXTS, reasoning=0.3, call_count=lambda rng: rng.choice([0, 0, 1, 1, 2]), arguments=choose(ARGUMENTS)
)


def _conversation(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    rng = random.Random(seed)
    return conversation(rng, MIX), random_tools(rng)


#: (messages, tools) for seeds 0-199
CONVERSATIONS = [_conversation(seed) for seed in range(200)]


def episodes() -> list[tuple[list[dict[str, Any]], Any]]:
    """The generated conversations an episode can produce: a prompt first, then turns separated by feedback."""
    return [(m, t) for m, t in CONVERSATIONS if any(x["role"] == "assistant" for x in m) and is_episode(m)]
