"""DeepSeek-V3.1 with vLLM's reworked tool template (`deepseek-v3.1-vllm-tools`, option `thinking`), and the
warning `deepseek-v3.1` gives when tools are passed to the official template, which does not show them.

The reference is vLLM's template (tests/data/golden/templates/deepseek_v3.1_vllm.jinja) rendered the way vLLM
renders it: transformers' Jinja settings, and tool-call arguments as objects (vLLM parses a client's JSON string
before it renders; the template dumps them with `tojson`).
"""

from __future__ import annotations

import copy
import json
import random
import re
import warnings
from typing import Any

import jinja2
import pytest

from agent_protocol import HFTokenizer, MessageError, get_protocol
from agent_protocol.protocols.deepseek_v31 import DeepSeekV31VllmProtocol, ToolsNotRenderedWarning
from tests.agent_protocol.families.test_deepseek_v31 import (
    EPISODES,
    MULTI_TURN,
    _assistant,
    _conversation,
    deepseek_episode_text,
    vllm_reading,
)
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import QUESTION, run_calculator_episode
from tests.support.family_checks import compare_with_jinja, render_golden
from tests.support.family_tokenizers import load_family_tokenizer
from tests.support.hf_jinja import render_official
from tests.support.tool_shapes import PLAIN_TOOLS, TOOL_SHAPES

STEM = "deepseek_v3.1_vllm"
NAME = "deepseek-v3.1-vllm-tools"
VARIANTS = {"thinking_false": {"thinking": False}, "thinking_true": {"thinking": True}}
EOS = "<｜end▁of▁sentence｜>"
ASSISTANT = "<｜Assistant｜>"


def as_vllm_passes(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM parses a tool call's JSON-string arguments into an object before it renders the template."""
    out = copy.deepcopy(messages)
    for message in out:
        for call in message.get("tool_calls") or []:
            if isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def official(
    messages: list[dict[str, Any]], *, thinking: bool, add_generation_prompt: bool = False, tools: Any = None
) -> str:
    return render_official(
        STEM, as_vllm_passes(messages), tools=tools, add_generation_prompt=add_generation_prompt, thinking=thinking
    )


# -- the warning of the official variant ------------------------------------------------------------------


def test_official_variant_warns_once_when_given_tools() -> None:
    messages = [{"role": "user", "content": "hi"}]
    protocol = get_protocol("deepseek-v3.1")
    with pytest.warns(ToolsNotRenderedWarning, match="deepseek-v3.1-vllm-tools") as record:
        protocol.render_messages(messages, tools=PLAIN_TOOLS)
        protocol.render_prompt(messages, tools=PLAIN_TOOLS)  # the same object: no second warning
    assert len([w for w in record if w.category is ToolsNotRenderedWarning]) == 1
    assert record[0].filename == __file__  # it points at the caller
    with pytest.warns(ToolsNotRenderedWarning):  # a new protocol object warns again
        get_protocol("deepseek-v3.1", thinking=True).render_prompt(messages, tools=PLAIN_TOOLS)


def test_no_warning_without_tools_or_with_the_vllm_variant() -> None:
    messages = [{"role": "user", "content": "hi"}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        get_protocol("deepseek-v3.1").render_prompt(messages)
        get_protocol("deepseek-v3.1").render_prompt(messages, tools=[])  # nothing missing from the prompt
        get_protocol(NAME).render_prompt(messages, tools=PLAIN_TOOLS)
        get_protocol(NAME, thinking=True).render_prompt(messages, tools=PLAIN_TOOLS)


# -- 1. golden renders ------------------------------------------------------------------------------------

GOLDEN = renders(STEM)


def test_every_golden_render_is_present() -> None:
    assert len(GOLDEN) == 24  # 6 cases x 2 (generation prompt or not) x 2 (thinking off / on)
    assert not [g for g in GOLDEN if g.refused]
    assert {g.protocol for g in GOLDEN} == {NAME}


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_render_matches_the_golden_render_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    assert render_golden(golden) == golden.text
    thinking = bool(golden.options.get("thinking"))
    assert golden.text == official(
        case["messages"], thinking=thinking, add_generation_prompt=golden.add_generation_prompt, tools=case["tools"]
    )
    if golden.add_generation_prompt and case["messages"][-1]["role"] == "user":
        assert golden.text.endswith(get_protocol(NAME, **golden.options).generation_prompt)


def test_the_tools_section() -> None:
    text = get_protocol(NAME).render_prompt([{"role": "user", "content": "hi"}], tools=[TOOL_SHAPES[0]])
    assert text.startswith("\n\n<｜begin▁of▁sentence｜>\n\n## Tools\nYou have access to the following tools:\n")
    assert '\n### lookup\nDescription: Look something up.\n\nParameters: {"type": "object",' in text
    assert text.endswith("without separators or spaces\n<｜User｜>hi  <｜Assistant｜>    </think>")
    # `tools=[]` is not `tools=None`: the template prints the section's head and tail with no tool in it
    empty = get_protocol(NAME).render_prompt([{"role": "user", "content": "hi"}], tools=[])
    assert "## Tools" in empty and "###" not in empty
    assert empty == official([{"role": "user", "content": "hi"}], thinking=False, add_generation_prompt=True, tools=[])


@pytest.mark.parametrize(
    ("tool", "match"),
    [
        (TOOL_SHAPES[1], r"tools\[0\]\.function\.description: is missing"),  # no description
        (TOOL_SHAPES[2], r"tools\[0\]\.function\.parameters: is missing"),  # no parameters
        ({"name": "flat", "description": "d", "parameters": {}}, r"tools\[0\]: has no `function`"),
    ],
)
def test_tools_the_template_cannot_print_are_refused(tool: dict[str, Any], match: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises((jinja2.UndefinedError, TypeError)):
        official(messages, thinking=False, tools=[tool])
    with pytest.raises(MessageError, match=match):
        get_protocol(NAME).render_messages(messages, tools=[tool])


# -- 2. generated conversations against vLLM's Jinja --------------------------------------------------------

#: 240 conversations, 160 of them with tools the template prints (`[]` prints the section with none), 40 without
#: tools, and 40 with every shape, two of which it cannot print (refused)
VLLM_CONVERSATIONS = [_conversation(random.Random(seed)) for seed in range(240)]
TOOL_CHOICES: list[Any] = [PLAIN_TOOLS, [TOOL_SHAPES[3], TOOL_SHAPES[4]], [TOOL_SHAPES[0], *TOOL_SHAPES[3:]], [], None]
TOOL_CHOICES.append(TOOL_SHAPES)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_vllms_jinja(variant: str) -> None:
    thinking = VARIANTS[variant]["thinking"]
    compared, refused = compare_with_jinja(
        get_protocol(NAME, **VARIANTS[variant]),
        lambda messages, tools, generation: official(
            messages, thinking=thinking, add_generation_prompt=generation, tools=tools
        ),
        [(messages, TOOL_CHOICES[index % len(TOOL_CHOICES)]) for index, messages in enumerate(VLLM_CONVERSATIONS)],
        refused_by=(TypeError, jinja2.UndefinedError),  # a null content; a tool without description/parameters
        refusal=r"vLLM's DeepSeek-V3\.1 tool template",
    )
    assert compared >= 2 * 150 and refused >= 2 * 40
    with_tools = [
        m
        for i, m in enumerate(VLLM_CONVERSATIONS)
        if i % 6 < 4 and all(x["content"] is not None or x.get("tool_calls") for x in m)
    ]
    assert len(with_tools) >= 150


def test_options() -> None:
    assert repr(get_protocol(NAME)) == "DeepSeekV31VllmProtocol(thinking=False)"
    assert get_protocol(NAME).generation_prompt == "  <｜Assistant｜>    </think>"
    assert get_protocol(NAME, thinking=True).generation_prompt == "  <｜Assistant｜>    <think>"


# -- 3. parsing: the same `deepseek_v31` parser ------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_generated_turns_parse_as_vllm_reads_them_and_round_trip(variant: str) -> None:
    thinking = VARIANTS[variant]["thinking"]
    protocol = get_protocol(NAME, thinking=thinking)
    for seed in range(150):
        text = protocol.render_generation(_assistant(random.Random(seed)))
        action = protocol.parse_assistant_text(text)
        reasoning, content, calls = vllm_reading(text, thinking=thinking)
        assert action.issues == ()
        assert (action.reasoning_content, action.content) == (reasoning, content)
        assert [(c.name, c.arguments) for c in action.tool_calls] == calls
        assert protocol.render_generation(action.to_message()) == text


# -- 4. feedback: the episode's pieces against vLLM's render, with the seams the indentation makes ---------------

#: the seams: vLLM's template writes spaces around the role and think tags, before calls, after tool outputs,
#: and the generation prompt has other spaces than history's turn; these runs of spaces, and no other, are
#: where the episode's text and the render differ
SPACES = re.compile(
    rf" +(?={re.escape(ASSISTANT)}|</think>|<think>|<｜tool▁calls▁end｜>|<｜tool▁call▁begin｜>)"
    rf"|(?<=</think>) +|(?<=<｜tool▁output▁end｜>) +"
)
THINKING_SEAM = re.compile(f"{re.escape(ASSISTANT)}<think>.*?</think>", re.DOTALL)


def without_seams(text: str) -> str:
    return THINKING_SEAM.sub(f"{ASSISTANT}</think>", SPACES.sub("", text))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_episode_pieces_are_vllms_render_but_for_the_spaces(variant: str) -> None:
    thinking = VARIANTS[variant]["thinking"]
    protocol = get_protocol(NAME, thinking=thinking)
    assert isinstance(protocol, DeepSeekV31VllmProtocol)
    conversations = [(c["messages"], c["tools"]) for c in MULTI_TURN] + [(e, PLAIN_TOOLS) for e in EPISODES]
    differ = 0
    for index, (messages, tools) in enumerate(conversations):
        text = deepseek_episode_text(protocol, messages, tools)
        expected = official(messages, thinking=thinking, add_generation_prompt=messages[-1]["role"] != "assistant",
                            tools=tools)  # fmt: skip
        differ += text != expected
        assert without_seams(text) == without_seams(expected), f"conversation {index}"
    assert differ == len(conversations)  # every episode has a turn after a user message: the seam is everywhere


def test_feedback_pieces() -> None:
    protocol = get_protocol(NAME)
    tool = {"role": "tool", "content": "5"}
    user = {"role": "user", "content": "And 4+4?"}
    assert protocol.render_feedback([tool]) == "<｜tool▁output▁begin｜>5<｜tool▁output▁end｜>"
    assert protocol.render_feedback([tool, user]) == (
        "<｜tool▁output▁begin｜>5<｜tool▁output▁end｜><｜User｜>And 4+4?  <｜Assistant｜>    </think>"
    )
    assert (
        protocol.render_feedback([user], turn_closed=False) == EOS + "<｜User｜>And 4+4?  <｜Assistant｜>    </think>"
    )


# -- 5. token-in-token-out through the session, with DeepSeek-V3's tokenizer ----------------------------------


@pytest.fixture(scope="module")
def v3() -> HFTokenizer:
    return load_family_tokenizer("deepseek_v3")


def tool_call(expression: str) -> str:
    arguments = json.dumps({"expression": expression})
    call = f"<｜tool▁call▁begin｜>calculator<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>"
    return f"<｜tool▁calls▁begin｜>{call}<｜tool▁calls▁end｜>{EOS}"


def test_session_transcript_is_vllms_render_but_for_the_spaces(v3: HFTokenizer) -> None:
    script = [tool_call("17 * 23"), f"The answer is 391.{EOS}"]
    engine, result, specs = run_calculator_episode(NAME, v3, script, rewards="result")
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    (segment,) = result.trajectory.segments
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [v3.encode(s) for s in script]
    assert engine.calls[-1] == segment.ids[: segment.action_ranges[-1][0]]  # the prompt is the transcript
    text = v3.decode(segment.ids)
    tools = [spec.to_openai() for spec in specs]
    rendered = official([m.to_openai() for m in result.trajectory.messages], thinking=False, tools=tools)
    assert "### calculator\nDescription: " in text  # the model is shown its tool
    assert text != rendered and without_seams(text) == without_seams(rendered)
    # the places: the prompt's `  <｜Assistant｜>    </think>` where history has `      <｜Assistant｜></think>` and
    # ten spaces before the call, four before `<｜tool▁calls▁end｜>`; six before the answer after the tool output
    history = (
        text.replace(
            f"{QUESTION}  <｜Assistant｜>    </think><｜tool▁calls▁begin｜>",
            f"{QUESTION}      <｜Assistant｜></think>          <｜tool▁calls▁begin｜>",
        )
        .replace(f"<｜tool▁call▁end｜><｜tool▁calls▁end｜>{EOS}", f"<｜tool▁call▁end｜>    <｜tool▁calls▁end｜>{EOS}")
        .replace("<｜tool▁output▁end｜>The answer", "<｜tool▁output▁end｜>      The answer")
    )
    assert history == rendered
