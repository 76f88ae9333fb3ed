"""The Qwen3 templates (hybrid, enable_thinking=False, Instruct-2507, Thinking-2507, and the first one of 2504) render
tool specs in every shape clients send exactly as the official Jinja does: the template dumps the dict it is given
(`tool | tojson`), so a spec without a description, with `strict`, with keys in another order, with a rich schema,
or in the flat (un-nested) form must come out with the client's keys, values and order, never rebuilt."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agent_protocol import ToolSpec, get_protocol
from tests.support.hf_jinja import QWEN3_FAMILY, render_official
from tests.support.tool_shapes import TOOL_SHAPES

#: the flat form some clients send: the function object itself, without {"type": "function", "function": ...}
FLAT = {"name": "flat", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}, "description": "d"}
SHAPES = [*TOOL_SHAPES, FLAT]

#: template stem + variant -> (protocol name, protocol options, template kwargs)
FAMILIES = {
    **QWEN3_FAMILY,
    "qwen3_initial_2504": ("qwen3-2504", {}, {}),
    "qwen3_initial_2504__enable_thinking_false": ("qwen3-2504", {"enable_thinking": False}, {"enable_thinking": False}),
}


def _tool_lists(rng: random.Random) -> list[list[dict[str, Any]]]:
    """Each shape alone, all of them, and shuffled subsets."""
    lists = [[shape] for shape in SHAPES] + [SHAPES]
    for _ in range(20):
        subset = rng.sample(SHAPES, rng.randint(1, len(SHAPES)))
        lists.append(subset)
    return lists


TOOL_LISTS = _tool_lists(random.Random(0))
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Flights to Rome?"}],
    [
        {"role": "user", "content": "Look it up."},
        {
            "role": "assistant",
            "content": "",  # not None: the 2504 template cannot take a null content
            "reasoning_content": "use lookup",
            "tool_calls": [{"id": "c0", "function": {"name": "lookup", "arguments": {"q": "x"}}}],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "found"},
    ],
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_tool_shape_renders_as_the_official_template(family: str) -> None:
    name, options, kwargs = FAMILIES[family]
    stem = family.split("__")[0]
    protocol = get_protocol(name, **options)
    compared = 0
    for tools in TOOL_LISTS:
        for messages in CONVERSATIONS:
            for generation in (False, True):
                expected = render_official(stem, messages, tools=tools, add_generation_prompt=generation, **kwargs)
                assert protocol.render_messages(messages, tools=tools, add_generation_prompt=generation) == expected
                compared += 1
    assert compared == len(TOOL_LISTS) * len(CONVERSATIONS) * 2 >= 150


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_client_dict_is_kept_through_tool_spec(family: str) -> None:
    """A ToolSpec made from the client's dict renders that dict; one built in code renders OpenAI's key order."""
    name, options, kwargs = FAMILIES[family]
    stem = family.split("__")[0]
    protocol = get_protocol(name, **options)
    messages = CONVERSATIONS[0]
    specs = [ToolSpec.from_openai(shape) for shape in SHAPES]
    assert protocol.render_messages(messages, tools=specs) == render_official(stem, messages, tools=SHAPES, **kwargs)
    built = ToolSpec(name="lookup", description="Look something up.", parameters={"type": "object"})
    assert protocol.render_messages(messages, tools=[built]) == render_official(
        stem, messages, tools=[built.to_openai()], **kwargs
    )
    assert '{"type": "function", "function": {"name": "lookup", "description": "Look something up.", "parameters"' in (
        protocol.render_messages(messages, tools=[built])
    )
