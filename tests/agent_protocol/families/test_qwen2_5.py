"""Qwen2.5-Instruct (`agent_protocol.protocols.qwen2_5`): renders against the golden files and the official Jinja,
the Hermes parser without reasoning, the feedback after a generated turn, and token-in-token-out through a session
with the real Qwen tokenizer (Qwen3's `tokenizer.json`: Qwen2.5's vocabulary plus the `<think>` tokens, which no
Qwen2.5 text uses, so every id here is Qwen2.5's too).

Jinja-side adaptations (`for_jinja`), the two places where the protocols follow vLLM's chat preprocessing and not
the bare template: null content is passed as "" (the template concatenates it and fails on None), and arguments
given as a JSON string are passed as the object they hold (vLLM parses them before rendering; the bare Qwen2.5
template would dump the string with its escapes).

The generated conversations (tests/support/qwen_conversations.py) and the feedback/episode checks
(tests/support/family_checks.py) are shared with the other Qwen families' tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer, MessageError, get_protocol
from tests.agent_protocol.golden import GoldenRender, renders, tool_outputs
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    as_vllm_passes,
    check_feedback,
    check_parse,
    compare_with_jinja,
    episode_splits,
    episode_text,
    golden_conversations,
    official_episode,
    render_golden,
)
from tests.support.hf_jinja import render_official
from tests.support.qwen_conversations import CONVERSATIONS, episodes
from tests.support.tool_shapes import TOOL_SHAPES

RENDERS = renders("qwen2.5_instruct")


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    return render_official("qwen2.5_instruct", as_vllm_passes(messages), tools=tools, add_generation_prompt=generation)


# -- golden renders -------------------------------------------------------------------------------------------


def test_every_render_is_present() -> None:
    assert len(RENDERS) == 12  # 6 cases x 2 (generation prompt or not)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    assert render_golden(golden) == golden.text


def test_default_system_prompt() -> None:
    rendered = get_protocol("qwen2.5").render_messages([{"role": "user", "content": "hi"}])
    assert rendered.startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    )


# -- generated conversations against the official Jinja -------------------------------------------------------


def test_python_renderer_equals_official_jinja() -> None:
    assert compare_with_jinja(get_protocol("qwen2.5"), official, CONVERSATIONS) == (400, 0)


def test_generated_conversations_cover_the_corners() -> None:
    tools_seen = {json.dumps(t) for _, tools in CONVERSATIONS for t in tools or []}
    assert tools_seen == {json.dumps(t) for t in TOOL_SHAPES}
    assert any(tools == [] for _, tools in CONVERSATIONS)
    flat = [m for messages, _ in CONVERSATIONS for m in messages]
    assert any(isinstance(c["function"]["arguments"], str) for m in flat for c in m.get("tool_calls", []))
    assert any(m["role"] == "assistant" and m["content"] is None for m in flat)
    assert any(m["role"] == "assistant" and "reasoning_content" in m for m in flat)
    assert any(m["role"] == "system" for messages, _ in CONVERSATIONS for m in messages[1:])
    assert len(episodes()) >= 50


def test_refusals() -> None:
    with pytest.raises(MessageError, match="cannot render an empty conversation"):
        get_protocol("qwen2.5").render_messages([])
    with pytest.raises(TypeError, match="takes: none"):
        get_protocol("qwen2.5", enable_thinking=False)


# -- parsing: vLLM's hermes parser, no reasoning --------------------------------------------------------------


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.parametrize("index", range(len(CONVERSATIONS[:60])))
def test_parse_inverts_render_generation(index: int) -> None:
    protocol = get_protocol("qwen2.5")
    for message in CONVERSATIONS[index][0]:
        if message["role"] != "assistant":
            continue
        generated = protocol.render_generation(message)
        parsed = protocol.assistant_message(generated)
        assert protocol.render_generation(parsed) == generated  # the same turn, down to the byte
        assert parsed.reasoning_content is None  # Qwen2.5 does not reason: reasoning_content is never rendered


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Plain answer.<|im_end|>", "Plain answer.", []),
        ("Cut off, no end token", "Cut off, no end token", []),
        (_call("lookup", {"q": "Paris"}) + "<|im_end|>", "", [("lookup", {"q": "Paris"})]),
        ("Let me look.\n" + _call("lookup", {"q": "é"}) + "<|im_end|>", "Let me look.", [("lookup", {"q": "é"})]),
        (_call("a", {}) + "\n" + _call("b", {"n": 1}) + "<|im_end|>", "", [("a", {}), ("b", {"n": 1})]),
        # no reasoning parser: <think> is content, and a call written inside it is a call (vLLM's hermes parser)
        (
            "<think>hmm</think>\n\n" + _call("lookup", {"q": "x"}),
            "<think>hmm</think>\n",
            [("lookup", {"q": "x"})],
        ),
        ("<think>never closed", "<think>never closed", []),
    ],
    ids=["answer", "cut_off", "call", "text_then_call", "two_calls", "think_is_content", "open_think_is_content"],
)
def test_parse(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    check_parse(get_protocol("qwen2.5").parse_assistant_text(text), content, calls)


HERMES = [c for c in tool_outputs() if c["format"] == "hermes_json"]


@pytest.mark.parametrize("case", HERMES, ids=lambda c: c["id"])
def test_golden_hermes_outputs_read_as_qwen3_reads_them_outside_reasoning(case: dict[str, Any]) -> None:
    """Where Qwen3 finds no reasoning, Qwen2.5 reads the golden outputs exactly as the Qwen3 parser does
    (tests/agent_protocol/test_parse.py checks those against the golden expectations); what Qwen3 reads as
    reasoning, Qwen2.5 keeps as content, think tags included."""
    ours = get_protocol("qwen2.5").parse_assistant_text(case["raw"])
    qwen3 = get_protocol("qwen3").parse_assistant_text(case["raw"])
    assert ours.reasoning_content is None and ours.error is None
    if qwen3.reasoning_content is None:
        assert ours == qwen3
    else:
        assert "think>" in ours.content


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>', "invalid_json"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": ', "unclosed_tag"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "missing_name"),
        ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', "invalid_arguments"),
        ('<tool_call>\n{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}\n</tool_call>", "invalid_json"),
    ],
    ids=["bad_json", "cut_off", "no_name", "arguments_array", "huge_int"],
)
def test_malformed_calls_are_coded_issues(text: str, code: str) -> None:
    (call,) = get_protocol("qwen2.5").parse_assistant_text(text).tool_calls
    assert call.error is not None and call.error.code == code, call


# -- feedback and episodes ------------------------------------------------------------------------------------


def test_feedback_continues_the_official_render() -> None:
    protocol = get_protocol("qwen2.5")
    checked = 0
    for messages, tools in golden_conversations(multi_turn=False) + CONVERSATIONS:
        for turn in episode_splits(messages):
            # append-only: no seam at all
            assert check_feedback(protocol, official, messages, tools, turn, turn_end="<|im_end|>")
            checked += 1
    assert checked >= 150


def test_episode_text_is_the_official_render() -> None:
    """prompt + each generation + each feedback == the official render, for every golden multi-turn case and
    every generated conversation an episode can produce: the template is append-only."""
    protocol = get_protocol("qwen2.5")
    for messages, tools in golden_conversations(multi_turn=True) + episodes():
        assert episode_text(protocol, messages, tools) == official_episode(official, messages, tools)


def test_cut_off_turn_is_closed() -> None:
    feedback = get_protocol("qwen2.5").render_feedback([{"role": "tool", "content": "5"}], turn_closed=False)
    assert (
        feedback
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


# -- token in, token out through the session ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    completions = [
        "I'll use the calculator.\n" + _call("calculator", {"expression": "17 * 23"}) + "<|im_end|>",
        "The answer is 391.<|im_end|>",
    ]
    protocol = get_protocol("qwen2.5")
    engine, result, specs = run_calculator_episode(protocol, tokenizer, completions)
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    (segment,) = result.trajectory.segments
    rendered = protocol.render_messages(result.trajectory.messages, tools=specs)
    # No seam: the ids are, token for token, the official render of the conversation the episode had.
    assert segment.ids == tokenizer.encode(rendered.removesuffix("\n"))
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)
