"""Qwen3-Coder (`agent_protocol.protocols.qwen3_coder`, XML tool calls): renders against the golden files and the
official Jinja (every tool shape: the template lists tools in its own XML form, field by field), the parser with
vLLM's `qwen3_coder` semantics (`agent_protocol.xml_call_parser`: schema-typed values, structural tags, the golden
XML outputs), the feedback after a generated turn, and token-in-token-out through a session with the real Qwen
tokenizer, with the seam where a re-rendered call changes bytes pinned.

Jinja-side adaptations: `as_vllm_passes` (tests/support/family_checks.py: null content as "", which the bare
template cannot take: it concatenates a user's and prints "None" for a tool's; arguments given as a JSON string as
the object they hold), both as vLLM passes them. The generated conversations are the Qwen families'
(tests/support/qwen_conversations.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer, MessageError, get_protocol
from agent_protocol.protocols.qwen3_coder import Qwen3CoderProtocol
from agent_protocol.xml_call_parser import convert_value
from tests.agent_protocol.golden import GoldenRender, cases, renders, tool_outputs
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
)
from tests.support.hf_jinja import render_official
from tests.support.qwen_conversations import CONVERSATIONS, episodes
from tests.support.tool_shapes import TOOL_SHAPES

RENDERS = renders("qwen3_coder")


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    return render_official("qwen3_coder", as_vllm_passes(messages), tools=tools, add_generation_prompt=generation)


def coder() -> Qwen3CoderProtocol:
    protocol = get_protocol("qwen3-coder")
    assert isinstance(protocol, Qwen3CoderProtocol)
    return protocol


# -- golden renders -------------------------------------------------------------------------------------------


def test_every_render_is_present() -> None:
    assert len(RENDERS) == 12  # 6 cases x 2 (generation prompt or not)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    rendered = coder().render_messages(
        case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt
    )
    assert rendered == golden.text


# -- generated conversations against the official Jinja -------------------------------------------------------


def test_python_renderer_equals_official_jinja() -> None:
    assert compare_with_jinja(coder(), official, CONVERSATIONS) == (400, 0)


def test_generated_conversations_cover_the_template_corners() -> None:
    """What the Coder template treats specially is in the generated set, so the comparison above exercises it."""
    flat = [m for messages, _ in CONVERSATIONS for m in messages]
    arguments = [c["function"]["arguments"] for m in flat for c in m.get("tool_calls", [])]
    values = [v for a in arguments if isinstance(a, dict) for v in a.values()]
    # values written through Jinja's `string` (True, None, 2.5) and as JSON (objects, arrays)
    assert {type(v) for v in values} >= {str, int, float, bool, type(None), dict, list}
    # a tool response with no message before it in the loop: the template opens no user turn for it
    assert any(
        (messages[1:] if messages[0]["role"] == "system" else messages)[0]["role"] == "tool"
        for messages, _ in CONVERSATIONS
    )
    # content next to calls that the template trims, and tools without system message (the default prompt)
    assert any(m.get("tool_calls") and (m["content"] or "").strip() != (m["content"] or "") for m in flat)
    assert any(tools and messages[0]["role"] != "system" for messages, tools in CONVERSATIONS)


def test_tool_listing_renders_every_shape_field_by_field() -> None:
    rendered = coder().render_messages([{"role": "user", "content": "hi"}], tools=TOOL_SHAPES)
    assert rendered == official([{"role": "user", "content": "hi"}], TOOL_SHAPES)
    assert "<name>now</name>\n<parameters>\n</parameters>" in rendered  # no description: no <description> tag
    assert "<name>ping</name>\n<description></description>\n<parameters>\n</parameters>" in rendered
    assert "\n<strict>True</strict>" in rendered and "\n<additionalProperties>False</additionalProperties>" in rendered
    assert '\n<required>["city", "unit"]</required>' in rendered
    assert '\n<$defs>{"filters": ' in rendered


def test_refusals() -> None:
    with pytest.raises(MessageError, match="cannot render an empty conversation"):
        coder().render_messages([])
    with pytest.raises(TypeError, match="takes: none"):
        get_protocol("qwen3-coder", enable_thinking=True)


# -- parsing: vLLM's qwen3_coder semantics --------------------------------------------------------------------

XML = [c for c in tool_outputs() if c["format"] == "qwen3_coder_xml"]
#: the schemas the golden cases were parsed with (vLLM's test: shape string, dimensions object, precision integer)
GOLDEN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate_area",
            "parameters": {
                "type": "object",
                "properties": {
                    "shape": {"type": "string"},
                    "dimensions": {"type": "object"},
                    "precision": {"type": "integer"},
                },
            },
        },
    }
]
#: golden cases of vLLM's *reasoning* parser (Qwen3 thinking models): Qwen3-Coder does not reason, so text before
#: the call is content, `<think>` included; the calls are the same
REASONING_CASES = {"vllm_reasoning_tool_call_without_think_end", "vllm_reasoning_tool_call_with_think_no_end"}


def test_every_xml_case_is_covered() -> None:
    assert len(XML) == 10
    assert {c["id"] for c in XML} >= REASONING_CASES


@pytest.mark.parametrize("case", XML, ids=lambda c: c["id"])
def test_golden_tool_output_parses_as_expected(case: dict[str, Any]) -> None:
    action = coder().with_tools(GOLDEN_TOOLS).parse_assistant_text(case["raw"])
    expected = case["expected"]
    assert action.issues == ()
    assert [{"name": c.name, "arguments": c.arguments} for c in action.tool_calls] == expected["tool_calls"]
    if case["id"] in REASONING_CASES:
        assert action.reasoning_content is None
        assert action.content == case["raw"][: case["raw"].index("<tool_call>")].strip()
    elif "content" in expected:
        assert action.content == (expected["content"] or "")  # vLLM's None is no content
    if "content_contains" in expected:
        assert expected["content_contains"] in action.content


def test_without_schemas_values_stay_strings() -> None:
    """As vLLM without tools in the request: nothing says a value is a number, so none is converted."""
    case = next(c for c in XML if c["id"] == "vllm_q3c_multiline_json_param")
    (call,) = coder().parse_assistant_text(case["raw"]).tool_calls
    assert call.arguments == {"shape": "rectangle", "dimensions": '{"width": 10, \n "height": 20}', "precision": "2"}
    (typed,) = coder().with_tools(GOLDEN_TOOLS).parse_assistant_text(case["raw"]).tool_calls
    assert typed.arguments["precision"] == 2
    assert coder().with_tools(GOLDEN_TOOLS).schemas == {
        "calculate_area": GOLDEN_TOOLS[0]["function"]["parameters"]["properties"]
    }  # type: ignore[index]


@pytest.mark.parametrize(
    ("schema", "raw", "value"),
    [
        ({"type": "string"}, "null", "null"),  # a string keeps its text, "null" included
        ({"type": "string"}, " 42 ", " 42 "),
        (None, "42", "42"),  # no type: a string
        ({"description": "no type"}, "42", "42"),
        ({"type": "integer"}, "42", 42),
        ({"type": "integer"}, "4.2", "4.2"),  # not an integer: the text
        ({"type": "integer"}, "null", None),
        ({"type": "number"}, "2.0", 2),  # a whole number becomes an int, as in vLLM
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "number"}, "1e999", "1e999"),  # vLLM fails the whole turn here (OverflowError); the text
        ({"type": "number"}, "nan", "nan"),
        ({"type": "boolean"}, "True", True),  # the template writes Python's True; read back as true
        ({"type": "boolean"}, "false", False),
        ({"type": "boolean"}, "yes", False),  # vLLM: anything but "true" is false
        ({"type": "object"}, '{"a": 1}', {"a": 1}),
        ({"type": "object"}, "{'a': 1}", {"a": 1}),  # a Python literal
        ({"type": "object"}, "\"{'a': 1}\"", {"a": 1}),  # a JSON string holding one
        ({"type": "object"}, "not json", "not json"),
        ({"type": "array"}, "[1, 2]", [1, 2]),
        ({"type": "array"}, "(1, 2)", [1, 2]),  # a tuple is an array
        ({"type": "array"}, "{1, 2}", "{1, 2}"),  # a set is not JSON: the text
        ({"type": "array"}, "[1, 2j]", "[1, 2j]"),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "None", None),  # nullable: null even for a string
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "7", 7),
        ({"type": ["string", "null"]}, "7", 7),  # vLLM reads a type list as its str(): not "string", so literal
        ({"type": ["string", "null"]}, "hello", "hello"),
        ({"type": "custom"}, "[1]", [1]),  # an unknown type: a Python literal if it is one
    ],
)
def test_values_are_converted_by_the_schema_type(schema: Any, raw: str, value: Any) -> None:
    converted = convert_value(raw, schema)
    assert converted == value and type(converted) is type(value)


def test_typed_round_trip_of_every_generated_turn() -> None:
    """With the schemas of the tools, parsing a rendered turn gives back the turn: the same arguments (values
    of every type) and, rendered again, the same bytes."""
    typed_now = {"type": "function", "function": {**TYPED_LOOKUP["function"], "name": "now"}}
    protocol = coder().with_tools([TYPED_LOOKUP, typed_now])
    turns = 0
    for messages, _ in CONVERSATIONS:
        for message in messages:
            if message["role"] != "assistant":
                continue
            text = protocol.render_generation(message)
            parsed = protocol.assistant_message(text)
            assert protocol.render_generation(parsed) == text
            expected = [json.loads(c["function"]["arguments"]) if isinstance(c["function"]["arguments"], str)
                        else c["function"]["arguments"] for c in message.get("tool_calls", [])]  # fmt: skip
            assert [c.arguments for c in parsed.tool_calls] == expected
            turns += 1
    assert turns >= 150


TYPED_LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {
                "q": {"type": "string"},
                "n": {"type": "integer"},
                "ratio": {"type": "number"},
                "flag": {"type": "boolean"},
                "none": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "nested": {"type": "object"},
                "code": {"type": "string"},
                "list": {"type": "array"},
            },
        },
    },
}


def _call(name: str, **values: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Plain answer.<|im_end|>", "Plain answer.", []),
        ("Cut off, no end token", "Cut off, no end token", []),
        ("I'll look.\n\n" + _call("f", a="1") + "<|im_end|>", "I'll look.", [("f", {"a": "1"})]),
        (_call("f", a="1") + "\n" + _call("g") + "<|im_end|>", "", [("f", {"a": "1"}), ("g", {})]),
        # code holding the format's own tags: only structural tags end a value
        (
            _call("write", code='print("</parameter>")\n</function>\nx = "<parameter=y>"'),
            "",
            [("write", {"code": 'print("</parameter>")\n</function>\nx = "<parameter=y>"'})],
        ),
        (
            '<tool_call>\n<function=f>\n<parameter=a>\n"\n</tool_call>\n</parameter>\n</function>\n</tool_call>',
            "",
            [("f", {"a": '"\n</tool_call>'})],
        ),
        # a multi-line value keeps its inner newlines; one newline is removed at each end
        (_call("f", a="\nline 1\nline 2\n"), "", [("f", {"a": "\nline 1\nline 2\n"})]),
        # </function> left out: </tool_call> closes the call (vLLM reads it too)
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "", [("f", {"a": "1"})]),
        # a <tool_call> block with no function in it is text, as in vLLM
        ("<tool_call>oops</tool_call> then " + _call("f"), "<tool_call>oops</tool_call> then", [("f", {})]),
        # text after the calls is kept (vLLM drops it; the template never renders it again)
        ("Before.\n" + _call("f") + "\nAfter.", "Before.\nAfter.", [("f", {})]),
        # <function=...> in prose, when a real <tool_call> block exists, is text
        ("Use <function=x> to call.\n" + _call("f"), "Use <function=x> to call.", [("f", {})]),
        # the model's <think> is content: Qwen3-Coder does not reason
        ("<think>hmm</think>\n" + _call("f"), "<think>hmm</think>", [("f", {})]),
    ],
    ids=[
        "answer",
        "cut_off_answer",
        "text_then_call",
        "two_calls",
        "literal_tags_in_value",
        "literal_call_close_in_value",
        "multiline_value",
        "no_function_close",
        "call_block_without_function",
        "text_after_calls",
        "function_tag_in_prose",
        "think_is_content",
    ],
)
def test_parse(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    action = coder().parse_assistant_text(text)
    check_parse(action, content, calls)
    assert [c.id for c in action.tool_calls] == [f"call_{k}" for k in range(len(calls))]


@pytest.mark.parametrize(
    ("text", "code", "name", "arguments"),
    [
        ("<tool_call>\n<function=get_wea", "unclosed_tag", "", {}),
        (
            "<tool_call>\n<function=f>\n<parameter=cmd>\nrm -rf /tmp/bui",
            "unclosed_tag",
            "f",
            {"cmd": "rm -rf /tmp/bui"},
        ),
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n", "unclosed_tag", "f", {"a": "1"}),
        ("<tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call>", "missing_name", "", {}),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "missing_name", "", {}),
        ("<tool_call>\n<function=two words>\n</function>\n</tool_call>", "missing_name", "", {}),
        (_call("f", a="\ud800"), "invalid_arguments", "f", {}),
    ],
    ids=[
        "cut_in_name",
        "cut_in_value",
        "cut_before_function_close",
        "template_token",
        "empty_name",
        "space_in_name",
        "lone_surrogate",
    ],
)
def test_malformed_calls_are_coded_issues(text: str, code: str, name: str, arguments: dict[str, Any]) -> None:
    (call,) = coder().parse_assistant_text(text).tool_calls
    assert call.error is not None and call.error.code == code, call
    assert (call.name, call.arguments) == (name, arguments)
    assert call.raw is not None and call.raw.startswith("<tool_call>")


@pytest.mark.parametrize(
    "value", ["[" * 1500 + "]" * 1500, '{"a":' * 150 + "1" + "}" * 150, '{"x": ' + "9" * 5000 + "}"]
)
def test_values_beyond_the_json_limits_are_coded_issues(value: str) -> None:
    """An object value too deep or with a number too long to read. vLLM would crash on the first (RecursionError:
    the whole turn becomes content) and pass the others on; here the call carries the issue."""
    protocol = coder().with_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "object"}}}}}])  # fmt: skip
    (call,) = protocol.parse_assistant_text(_call("f", a=value)).tool_calls
    assert call.error is not None and call.error.code == "invalid_arguments"
    assert "cannot be read" in call.error.message
    (untyped,) = coder().parse_assistant_text(_call("f", a=value)).tool_calls  # no schema: the text, harmless
    assert untyped.ok and untyped.arguments == {"a": value}


def test_with_tools_is_a_copy() -> None:
    shared = coder()
    bound = shared.with_tools(GOLDEN_TOOLS)
    assert shared.schemas == {} and set(bound.schemas) == {"calculate_area"}
    assert get_protocol("qwen3-coder").schemas == {}  # type: ignore[attr-defined]


# -- feedback and episodes ------------------------------------------------------------------------------------


def test_feedback_continues_the_official_render() -> None:
    protocol = coder()
    checked = 0
    for messages, tools in golden_conversations(multi_turn=False) + CONVERSATIONS:
        for turn in episode_splits(messages):
            # append-only: no seam
            assert check_feedback(protocol, official, messages, tools, turn, turn_end="<|im_end|>")
            checked += 1
    assert checked >= 150


def test_episode_text_is_the_official_render() -> None:
    """prompt + each generation + each feedback == the official render, for every golden multi-turn case and
    every generated conversation an episode can produce."""
    protocol = coder()
    for messages, tools in golden_conversations(multi_turn=True) + episodes():
        assert episode_text(protocol, messages, tools) == official_episode(official, messages, tools)


def test_feedback_opens_the_user_turn_the_template_opens() -> None:
    feedback = coder().render_feedback([{"role": "tool", "content": "5"}, {"role": "tool", "content": "6"}])
    assert feedback == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response>\n"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    cut = coder().render_feedback([{"role": "user", "content": "go on"}], turn_closed=False)
    assert cut == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


# -- token in, token out through the session ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    completions = [
        "I'll use the calculator.\n\n" + _call("calculator", expression="17 * 23") + "<|im_end|>",
        "The answer is 391.<|im_end|>",
    ]
    protocol = coder()
    engine, result, specs = run_calculator_episode(protocol, tokenizer, completions)
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    (segment,) = result.trajectory.segments
    rendered = protocol.render_messages(result.trajectory.messages, tools=specs)
    # A turn in the template's own layout: no seam, the ids are the official render's, token for token.
    assert segment.ids == tokenizer.encode(rendered.removesuffix("\n"))
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]


def test_a_reparsed_call_that_renders_otherwise_stays_as_sampled(tokenizer: HFTokenizer) -> None:
    """The seam: a call written otherwise than the template writes it (one newline before the call, not two; a
    boolean `true`, which the template writes `True`; a number `2.50`, which it writes `2.5`) parses to arguments
    that re-render to other bytes. The transcript keeps the ids as sampled; the official render of the episode's
    messages differs exactly there, and nowhere else."""
    env = pytest.importorskip("agent_env")

    def scale(x: float, double: bool) -> str:
        """Scale a number."""
        return str(x * (2 if double else 1))

    tool = env.tool(scale)
    sampled = "Scaling.\n" + _call("scale", x="2.50", double="true") + "<|im_end|>"
    completions = [sampled, "The answer is 5.0.<|im_end|>"]
    protocol = coder()  # the turn core binds the episode's tools (with_tools): the parse types the values
    _, result, specs = run_calculator_episode(protocol, tokenizer, completions, tools=[tool])
    assert [m.content for m in result.trajectory.messages if m.role == "tool"] == ["5.0"]
    turn = next(m for m in result.trajectory.messages if m.tool_calls)
    assert turn.tool_calls[0].arguments == {"x": 2.5, "double": True}

    (segment,) = result.trajectory.segments
    start, end = segment.action_ranges[0]
    assert segment.ids[start:end] == tokenizer.encode(sampled)  # as sampled, id for id
    rendered = protocol.render_messages(result.trajectory.messages, tools=specs).removesuffix("\n")
    re_rendered = protocol.render_generation(turn)
    assert re_rendered == "Scaling.\n\n" + _call("scale", x="2.5", double="True") + "<|im_end|>"
    assert tokenizer.decode(segment.ids) == rendered.replace(re_rendered, sampled)  # the only difference
    # Around the turn the ids are the official render's: the prefix up to the turn, and the rest after it.
    assert segment.ids[:start] == tokenizer.encode(rendered[: rendered.index(re_rendered)])
    assert segment.ids[end:] == tokenizer.encode(rendered[rendered.index(re_rendered) + len(re_rendered) :])
