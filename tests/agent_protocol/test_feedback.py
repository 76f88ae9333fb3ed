"""The feedback after a generated turn lays out exactly what the official template renders."""

from __future__ import annotations

from typing import Any

import pytest

from agent_protocol import MessageError, get_protocol
from tests.support.hf_jinja import QWEN3_FAMILY, render_official

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "What is 2+3?"},
    {
        "role": "assistant",
        "content": "Let me compute.",
        "reasoning_content": "use the tool",
        "tool_calls": [{"id": "c0", "function": {"name": "calc", "arguments": {"expr": "2+3"}}}],
    },
]
OBSERVATIONS: list[list[dict[str, Any]]] = [
    [{"role": "tool", "tool_call_id": "c0", "content": "5"}],
    [
        {"role": "tool", "tool_call_id": "c0", "content": "5"},
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok": false}'},
    ],
    [{"role": "user", "content": "And 4+4?"}],
    [{"role": "tool", "tool_call_id": "c0", "content": "5"}, {"role": "user", "content": "thanks"}],
]


@pytest.mark.parametrize("family", sorted(QWEN3_FAMILY))
@pytest.mark.parametrize("observations", OBSERVATIONS, ids=["tool", "two_tools", "user", "tool_then_user"])
def test_feedback_continues_the_official_render(family: str, observations: list[dict[str, Any]]) -> None:
    name, options, kwargs = QWEN3_FAMILY[family]
    protocol = get_protocol(name, **options)
    stem = family.split("__")[0]
    before = render_official(stem, HISTORY, **kwargs)  # ends with "<|im_end|>\n"
    after = render_official(stem, HISTORY + observations, add_generation_prompt=True, **kwargs)
    assert before.endswith("<|im_end|>\n")
    # The model stops right after <|im_end|>; the feedback starts with the template's newline.
    generated_part = before[: -len("\n")]
    feedback = protocol.render_feedback(observations)
    if after.startswith(generated_part):  # the template is append-only here
        assert generated_part + feedback == after
    else:  # only a new user query makes the template drop earlier reasoning; the tail still matches
        assert any(m["role"] == "user" for m in observations)
        assert after.endswith(feedback[1:])


def test_cut_off_turn_is_closed() -> None:
    protocol = get_protocol("qwen3")
    feedback = protocol.render_feedback([{"role": "user", "content": "go on"}], turn_closed=False)
    assert feedback == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


def test_feedback_opens_the_thinking_turn() -> None:
    feedback = get_protocol("qwen3-thinking-2507").render_feedback([{"role": "tool", "content": "5"}])
    assert (
        feedback
        == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


@pytest.mark.parametrize(
    ("messages", "match"),
    [([], "at least one"), ([{"role": "assistant", "content": "x"}], r"messages\[0\].role")],
)
def test_bad_feedback(messages: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(MessageError, match=match):
        get_protocol("qwen3").render_feedback(messages)
