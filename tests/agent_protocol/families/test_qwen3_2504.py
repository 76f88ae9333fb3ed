"""The first Qwen3 template (2025-04, `qwen3-2504`, option `enable_thinking`): the Qwen3 renderer with the one
difference of that template (a null content is read as a string; see `Qwen3Protocol`), checked against the golden
files and the official Jinja, its Hermes parser, the feedback after a generated turn and the seams of the episode
transcript, and token-in-token-out through a session with the real Qwen3 tokenizer.

Jinja-side adaptations: `as_vllm_passes` (tests/support/family_checks.py: null content as "", since the 2504
template fails on None with a TypeError; arguments given as a JSON string as the object they hold), both as vLLM
passes them. The generated conversations are the Qwen families' (tests/support/qwen_conversations.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders, tool_outputs
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    as_vllm_passes,
    check_feedback,
    compare_with_jinja,
    episode_splits,
    episode_text,
    golden_conversations,
    observations_after,
    official_episode,
    render_golden,
)
from tests.support.hf_jinja import render_official
from tests.support.qwen_conversations import CONVERSATIONS, episodes

RENDERS = renders("qwen3_initial_2504")
IM_START = "<|im_start|>"

#: variant -> (protocol options, template kwargs)
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "thinking": ({}, {}),
    "enable_thinking_false": ({"enable_thinking": False}, {"enable_thinking": False}),
}


def official_of(variant: str) -> Any:
    kwargs = VARIANTS[variant][1]

    def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
        return render_official(
            "qwen3_initial_2504", as_vllm_passes(messages), tools=tools, add_generation_prompt=generation, **kwargs
        )

    return official


def protocol_of(variant: str) -> Any:
    return get_protocol("qwen3-2504", **VARIANTS[variant][0])


# -- golden renders -------------------------------------------------------------------------------------------


def test_every_render_is_present() -> None:
    assert len(RENDERS) == 24  # 6 cases x 2 (generation prompt or not) x 2 (enable_thinking default or False)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    assert render_golden(golden) == golden.text


# -- generated conversations against the official Jinja -------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_official_jinja(variant: str) -> None:
    assert compare_with_jinja(protocol_of(variant), official_of(variant), CONVERSATIONS) == (400, 0)


def test_a_null_user_message_is_a_query_in_2504_only() -> None:
    """The one difference from the later Qwen3 template: with null read as "", a user message with null content
    is the last query, so the reasoning of the turns before it is dropped."""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": None},
        {"role": "assistant", "content": "b"},
    ]
    ours = protocol_of("thinking").render_messages(messages)
    assert ours == official_of("thinking")(messages)
    assert "<think>\nr\n</think>" not in ours
    assert "<think>\nr\n</think>" in get_protocol("qwen3").render_messages(messages)
    assert get_protocol("qwen3").render_messages(messages) == render_official("qwen3", messages)


def test_options_are_checked() -> None:
    with pytest.raises(TypeError, match="takes: enable_thinking"):
        get_protocol("qwen3-2504", thinking=True)


# -- parsing: the Qwen3 Hermes parser (vLLM hermes + qwen3 reasoning) -----------------------------------------


@pytest.mark.parametrize("case", [c for c in tool_outputs() if c["format"] == "hermes_json"], ids=lambda c: c["id"])
def test_golden_outputs_parse_as_qwen3(case: dict[str, Any]) -> None:
    """2504 models write what Qwen3 hybrid models write; test_parse.py checks that parser on these outputs."""
    for variant in VARIANTS:
        assert protocol_of(variant).parse_assistant_text(case["raw"]) == get_protocol("qwen3").parse_assistant_text(
            case["raw"]
        )


def test_parse_inverts_render_generation() -> None:
    protocol = protocol_of("thinking")
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "use the tool",
        "tool_calls": [{"id": "call_0", "function": {"name": "lookup", "arguments": {"q": "é"}}}],
    }
    text = protocol.render_generation(message)
    assert text == (
        '<think>\nuse the tool\n</think>\n\nLet me look.\n<tool_call>\n{"name": "lookup", "arguments": {"q": "é"}}'
        "\n</tool_call><|im_end|>"
    )
    parsed = protocol.assistant_message(text)
    assert (parsed.reasoning_content, parsed.content) == ("use the tool", "Let me look.")
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("lookup", {"q": "é"})]


# -- feedback and the transcript's seams ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_feedback_continues_the_official_render(variant: str) -> None:
    """Append-only after every turn, except at the two seams of the Qwen3 templates, where the tail still
    matches: the feedback holds a new user query (the template then drops the reasoning of the turns before
    it), or the turn has no reasoning (rendered last it has an empty <think> block, which it loses once it is
    not last). The transcript keeps the turn as generated at both."""
    protocol, official = protocol_of(variant), official_of(variant)
    checked = seams = 0
    for messages, tools in golden_conversations(multi_turn=False) + CONVERSATIONS:
        for turn in episode_splits(messages):
            if not check_feedback(protocol, official, messages, tools, turn, turn_end="<|im_end|>"):
                new_query = any(m["role"] == "user" for m in observations_after(messages, turn))
                turn_reasons = messages[turn].get("reasoning_content") or "</think>" in (
                    messages[turn]["content"] or ""
                )
                assert new_query or not turn_reasons
                seams += 1
            checked += 1
    assert checked >= 150 and seams > 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_episode_text_differs_from_the_official_render_only_at_the_documented_seams(variant: str) -> None:
    """prompt + generations + feedback == the official render, except where the template re-renders a turn
    otherwise than it was generated: a turn before the last user query loses its reasoning, and a turn without
    reasoning loses the empty <think> block once it is not the last message. There the transcript holds each turn
    exactly as generated, and every byte outside the turns is the official render's."""
    protocol, official = protocol_of(variant), official_of(variant)
    same = seams = 0
    for messages, tools in golden_conversations(multi_turn=True) + episodes():
        text, expected = episode_text(protocol, messages, tools), official_episode(official, messages, tools)
        if text == expected:
            same += 1
        else:
            assert text == as_generated(protocol, expected, messages)
            seams += 1
    assert same > 0 and seams > 0, (same, seams)


def as_generated(protocol: Any, rendered: str, messages: list[dict[str, Any]]) -> str:
    """`rendered` (an official render) with each assistant block replaced by the turn as the model generates it
    after the generation prompt."""
    generated = [protocol.render_generation(m) for m in messages if m["role"] == "assistant"]
    opener = protocol.generation_prompt.removeprefix(IM_START)
    blocks = rendered.split(IM_START)
    out = blocks[0]
    for block in blocks[1:]:
        if block.startswith("assistant\n") and generated:  # a generated turn, not the final generation prompt
            block = opener + generated.pop(0) + "\n"
        out += IM_START + block
    return out.removesuffix("\n") if messages[-1]["role"] == "assistant" else out


def test_golden_seams_are_the_ones_of_qwen3() -> None:
    """The golden multi-turn cases whose transcript is not the official render are those of the Qwen3 hybrid
    template (tests/agent_protocol/test_transcript_tito.py), for the same reasons."""
    not_append_only = set()
    for variant in VARIANTS:
        protocol, official = protocol_of(variant), official_of(variant)
        for case in cases().values():
            messages, tools = case["messages"], case["tools"]
            has_turns = any(m["role"] == "assistant" for m in messages)
            if has_turns and episode_text(protocol, messages, tools) != official_episode(official, messages, tools):
                not_append_only.add((variant, case["name"]))
    assert not_append_only == {
        (variant, name)
        for variant in VARIANTS
        for name in ("multi_turn_reasoning", "plain_chat", "single_tool_call", "parallel_tool_calls")
    }


# -- token in, token out through the session ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    payload = json.dumps({"name": "calculator", "arguments": {"expression": "17 * 23"}})
    completions = [
        f"<think>\nI should use the calculator.\n</think>\n\n<tool_call>\n{payload}\n</tool_call><|im_end|>",
        "<think>\nThe tool answered.\n</think>\n\nThe answer is 391.<|im_end|>",
    ]
    protocol = get_protocol("qwen3-2504")
    engine, result, specs = run_calculator_episode(protocol, tokenizer, completions)
    assert result.final_answer == "The answer is 391."
    (segment,) = result.trajectory.segments
    rendered = protocol.render_messages(result.trajectory.messages, tools=specs)
    # Every turn reasons and follows the one user query: the template is append-only, so there is no seam.
    assert segment.ids == tokenizer.encode(rendered.removesuffix("\n"))
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
