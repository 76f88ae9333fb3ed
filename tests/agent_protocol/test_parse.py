"""Parsing generated assistant turns: the golden Hermes/Qwen JSON outputs, malformed output, round trips."""

from __future__ import annotations

from typing import Any

import pytest

from agent_protocol import Action, get_protocol
from tests.agent_protocol.golden import tool_outputs

HERMES = [case for case in tool_outputs() if case["format"] == "hermes_json"]

# Where this project deliberately differs from the parser a golden case follows: case id -> why, and what we
# produce instead (checked below, so the reason stays true).
DIFFERENT: dict[str, str] = {
    "vllm_hermes_arguments_bare_string": "arguments must be a JSON object (OpenAI function calling); a bare "
    "string becomes an invalid_arguments error the environment can explain, instead of a call no tool accepts",
    "llamacpp_partial_name": "we parse finished turns, not stream prefixes: the unfinished call is an "
    "unclosed_tag error, and the newline the template puts before <tool_call> is not content",
    "llamacpp_function_eq_tag": "only <tool_call> blocks are calls; variants the Qwen3 template never renders stay "
    "content, so RL never rewards a format the transcript cannot reproduce",
    "llamacpp_function_name_attr": "as llamacpp_function_eq_tag",
    "llamacpp_tool_tag": "as llamacpp_function_eq_tag",
    "llamacpp_json_fence": "as llamacpp_function_eq_tag",
    "llamacpp_bare_json": "as llamacpp_function_eq_tag",
    "llamacpp_text_then_bare_json": "as llamacpp_function_eq_tag",
}


def _calls(action: Action) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": c.arguments} for c in action.valid_tool_calls]


def test_every_hermes_case_is_covered() -> None:
    assert len(HERMES) == 30
    assert set(DIFFERENT) <= {case["id"] for case in HERMES}


@pytest.mark.parametrize("case", [c for c in HERMES if c["id"] not in DIFFERENT], ids=lambda c: c["id"])
def test_golden_tool_output_parses_as_expected(case: dict[str, Any]) -> None:
    # Qwen3 hybrid: reasoning is opened by the model itself; forced-open text ("I'm thinking</think>") is
    # recognized by its closing tag alone.
    action = get_protocol("qwen3").parse_assistant_text(case["raw"])
    expected = case["expected"]
    assert _calls(action) == expected["tool_calls"]
    if "content" in case["asserted"]:
        assert action.content == (expected["content"] or "")
    if "reasoning_content" in case["asserted"]:
        assert (action.reasoning_content or "") == expected["reasoning_content"]
    for flag in ("tools_called", "has_tool_call"):
        if flag in case["asserted"]:
            assert bool(action.valid_tool_calls) is expected[flag]
    if "unclosed_think" in case["categories"]:
        assert action.error is not None and action.error.code == "missing_think_end"
    elif "invalid_json" in case["categories"] or "no_newline_after_tag" in case["categories"]:
        # vLLM and SGLang drop a broken block silently; we keep it as an errored call so it can be answered.
        assert any(c.error is not None for c in action.tool_calls)


@pytest.mark.parametrize("case_id", sorted(DIFFERENT))
def test_deliberate_differences_hold(case_id: str) -> None:
    case = next(c for c in HERMES if c["id"] == case_id)
    action = get_protocol("qwen3").parse_assistant_text(case["raw"])
    if case_id == "vllm_hermes_arguments_bare_string":
        (call,) = action.tool_calls
        assert call.error is not None and call.error.code == "invalid_arguments"
        assert call.name == "do_thing"
    elif case_id == "llamacpp_partial_name":
        (call,) = action.tool_calls
        assert call.error is not None and call.error.code == "unclosed_tag"
        assert action.content == "Let's call something"
    else:
        assert action.tool_calls == ()
        assert action.content == case["raw"]


def test_tool_call_inside_think_is_reasoning() -> None:
    text = '<think>maybe <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call></think>\n\nNo call needed.'
    action = get_protocol("qwen3").parse_assistant_text(text)
    assert action.tool_calls == ()
    assert action.content == "No call needed."
    assert action.reasoning_content is not None and "<tool_call>" in action.reasoning_content


@pytest.mark.parametrize(
    ("protocol", "text"),
    [
        ("qwen3", "<think>I keep thinking and run out of tokens"),
        ("qwen3-thinking-2507", 'still thinking <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'),
    ],
)
def test_unclosed_reasoning_is_an_error_and_never_a_call(protocol: str, text: str) -> None:
    action = get_protocol(protocol).parse_assistant_text(text)
    assert action.error is not None and action.error.code == "missing_think_end"
    assert action.tool_calls == ()
    assert action.content == ""
    assert action.reasoning_content is not None and action.reasoning_content.startswith(("I keep", "still"))
    assert "</think>" in action.error.message


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("{not json}", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ('{"arguments": {"x": 1}}', "missing_name"),
        ('{"name": "", "arguments": {}}', "missing_name"),
        ('{"name": 3, "arguments": {}}', "missing_name"),
        ('{"name": "f", "arguments": [1]}', "invalid_arguments"),
        ('{"name": "f", "arguments": "not json"}', "invalid_arguments"),
    ],
)
def test_malformed_calls_carry_a_coded_error_and_keep_valid_siblings(body: str, code: str) -> None:
    text = f'<tool_call>\n{body}\n</tool_call>\n<tool_call>\n{{"name": "ok", "arguments": {{"a": 1}}}}\n</tool_call>'
    action = get_protocol("qwen3-instruct-2507").parse_assistant_text(text)
    broken, good = action.tool_calls
    assert broken.error is not None and broken.error.code == code and broken.error.message
    assert broken.raw is not None and broken.raw.strip() == body
    assert good.ok and good.name == "ok" and good.arguments == {"a": 1}
    assert [c.id for c in action.tool_calls] == ["call_0", "call_1"]
    assert action.issues == (broken.error,)


def test_cut_off_call_is_unclosed_tag() -> None:
    action = get_protocol("qwen3").parse_assistant_text('Checking.\n<tool_call>\n{"name": "f", "argum')
    (call,) = action.tool_calls
    assert call.error is not None and call.error.code == "unclosed_tag"
    assert action.content == "Checking."


def test_trailing_end_of_turn_token_is_ignored() -> None:
    action = get_protocol("qwen3-instruct-2507").parse_assistant_text("Done.<|im_end|>")
    assert action == Action(content="Done.")


def test_call_id_prefix_names_calls() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    action = get_protocol("qwen3").parse_assistant_text(text, call_id_prefix="turn3")
    assert action.tool_calls[0].id == "turn3_0"


ROUND_TRIP_MESSAGES: list[dict[str, Any]] = [
    {"role": "assistant", "content": "Plain answer."},
    {"role": "assistant", "content": "Two\n\nparagraphs\n", "reasoning_content": "think\nhard"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"x": "é"}}}],
    },
    {
        "role": "assistant",
        "content": "Let me look.\n",
        "reasoning_content": "",
        "tool_calls": [
            {"function": {"name": "f", "arguments": {"x": 1}}},
            {"function": {"name": "g", "arguments": {"nested": {"a": [1, 2]}}}},
        ],
    },
]


@pytest.mark.parametrize("name", ["qwen3", "qwen3-instruct-2507", "qwen3-thinking-2507"])
@pytest.mark.parametrize("message", ROUND_TRIP_MESSAGES, ids=range(len(ROUND_TRIP_MESSAGES)))
def test_parse_inverts_render_generation(name: str, message: dict[str, Any]) -> None:
    protocol = get_protocol(name)
    action = protocol.parse_assistant_text(protocol.render_generation(message))
    assert action.error is None
    assert action.content == message["content"]
    assert _calls(action) == [c["function"] for c in message.get("tool_calls", [])]
    if name != "qwen3-instruct-2507":
        assert action.reasoning_content == message.get("reasoning_content", "")
    # and rendering the parsed turn gives the same text back
    assert protocol.render_generation(action.to_message()) == protocol.render_generation(message)
