"""Random chat conversations for the family tests that compare a protocol with its official Jinja template: every
role in any order, system messages in the middle, null content, reasoning, calls with their tool results, stray
tool results. What differs between families because of their template (the texts, how many calls a turn may
hold, whether reasoning is drawn at all, how arguments look) is a knob of `ConversationMix`.

The draws are made in a fixed order, so a seed gives the same conversation for a given mix; the families' tests
pin counts and coverage on those seeds. Families whose conversations have another structure (DeepSeek's refused
null contents, gpt-oss's refusals, Mistral's strict alternation) keep their own generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.support.tool_shapes import TOOL_SHAPES

__all__ = ["ConversationMix", "choose", "conversation", "random_tools"]


def choose(values: Sequence[Any]) -> Callable[[random.Random], Any]:
    """A draw of one of `values`."""
    return lambda rng: rng.choice(values)


@dataclass(frozen=True, kw_only=True)
class ConversationMix:
    """What a family's conversations are made of."""

    #: the texts of user, system, tool and assistant messages (assistant content may also be null)
    texts: Sequence[str]
    #: user contents, where they differ from `texts` (a template that takes a null user content)
    user_texts: Sequence[str | None] | None = None
    #: how many messages to draw after the optional system message: `randint(*turns)`
    turns: tuple[int, int] = (0, 6)
    #: the probability that an assistant message has reasoning; None draws nothing (no reasoning in the family)
    reasoning: float | None = None
    #: how many calls an assistant message holds
    call_count: Callable[[random.Random], int]
    #: the arguments of one call (an object, or a JSON string where the family takes one)
    arguments: Callable[[random.Random], Any]
    names: Sequence[str] = ("lookup", "now")


def conversation(rng: random.Random, mix: ConversationMix) -> list[dict[str, Any]]:
    """A random conversation of `mix`, never empty (an empty conversation is refused by every family)."""
    texts, user_texts = mix.texts, mix.texts if mix.user_texts is None else mix.user_texts
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(texts)})
    for _ in range(rng.randint(*mix.turns)):
        roll = rng.random()
        if roll < 0.35:
            messages.append({"role": "user", "content": rng.choice(user_texts)})
        elif roll < 0.8:
            message: dict[str, Any] = {"role": "assistant", "content": rng.choice([*texts, None])}
            if mix.reasoning is not None and rng.random() < mix.reasoning:
                message["reasoning_content"] = rng.choice(texts)
            calls = mix.call_count(rng)
            if calls:
                message["tool_calls"] = [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {"name": rng.choice(mix.names), "arguments": mix.arguments(rng)},
                    }
                    for k in range(calls)
                ]
            messages.append(message)
            for k in range(calls):
                messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(texts)})
        elif roll < 0.9:
            messages.append({"role": "tool", "tool_call_id": "x", "content": rng.choice(texts)})
        else:
            messages.append({"role": "system", "content": rng.choice(texts)})
    if not messages:
        messages.append({"role": "user", "content": rng.choice(user_texts)})
    return messages


def random_tools(rng: random.Random) -> list[dict[str, Any]] | None:
    """No tools, an empty list (which templates render otherwise than none), every shape, or two of them."""
    return rng.choice([None, None, [], TOOL_SHAPES, rng.sample(TOOL_SHAPES, 2)])
