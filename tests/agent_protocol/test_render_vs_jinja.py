"""The Python renderer against the official Jinja templates on many generated conversations.

The golden renders cover six fixed conversations; these cover the corners: reasoning in content
(`<think>` written inline), empty and null content, several tool turns in a row, tool responses typed by the
user, system messages in the middle, unicode and stray newlines.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from agent_protocol import get_protocol
from tests.support.hf_jinja import QWEN3_FAMILY, render_official

TEXTS = [
    "",
    "Hi",
    "\n",
    "\nleading newline",
    "trailing newline\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "<think>inline reasoning</think>after",
    "<think>\nr\n</think>\n\nanswer",
    "no open tag</think>rest",
    "<tool_response>typed by the user</tool_response>",
    '{"json": "looking"}',
    "  spaces  ",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
    {"type": "function", "function": {"name": "now", "description": "", "parameters": {"type": "object"}}},
]


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        if roll < 0.35:
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
        elif roll < 0.8:
            message: dict[str, Any] = {"role": "assistant", "content": rng.choice([*TEXTS, None])}
            if rng.random() < 0.5:
                message["reasoning_content"] = rng.choice(TEXTS)
            calls = rng.randint(0, 2) if rng.random() < 0.5 else 0
            if calls:
                message["tool_calls"] = [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": {"q": rng.choice(TEXTS), "n": k}},
                    }
                    for k in range(calls)
                ]
            messages.append(message)
            for k in range(calls):
                messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(TEXTS)})
        elif roll < 0.9:
            messages.append({"role": "tool", "tool_call_id": "x", "content": rng.choice(TEXTS)})
        else:
            messages.append({"role": "system", "content": rng.choice(TEXTS)})
    return messages


CONVERSATIONS = [_conversation(random.Random(seed)) for seed in range(150)]


@pytest.mark.parametrize("family", sorted(QWEN3_FAMILY))
def test_python_renderer_equals_official_jinja(family: str) -> None:
    protocol_name, options, template_kwargs = QWEN3_FAMILY[family]
    stem = family.split("__")[0]
    protocol = get_protocol(protocol_name, **options)
    compared = 0
    for index, messages in enumerate(CONVERSATIONS):
        for tools in (None, TOOLS):
            for generation in (False, True):
                expected = render_official(
                    stem, messages, tools=tools, add_generation_prompt=generation, **template_kwargs
                )
                actual = protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                assert actual == expected, f"conversation {index}, tools={tools is not None}, gen={generation}"
                compared += 1
    assert compared == len(CONVERSATIONS) * 4


def test_string_arguments_are_normalized_to_their_json_object() -> None:
    # The template writes string arguments verbatim; we parse them once at the boundary and dump them the way
    # the template dumps objects. For arguments serialized with json.dumps defaults the bytes are the same.
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "1", "function": {"name": "lookup", "arguments": '{"q": "é"}'}}],
        },
    ]
    ours = get_protocol("qwen3").render_messages(messages)
    assert ours == render_official("qwen3", messages)
    compact = [
        messages[0],
        {**messages[1], "tool_calls": [{"function": {"name": "lookup", "arguments": '{"q":1}'}}]},
    ]
    assert '"arguments": {"q": 1}}' in get_protocol("qwen3").render_messages(compact)
