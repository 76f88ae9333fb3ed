"""NVIDIA Nemotron Nano v2 (`nemotron-nano-v2`, option `enable_thinking`): golden renders, the Python renderer
against the official Jinja on generated conversations (its refusals matched), the `nemotron_json` parser, the
feedback seams, and token-in-token-out through a session at the text level (no Nemotron tokenizer in a registry).

The official template (`tests/data/golden/templates/nemotron_nano_v2.jinja`, provenance in SOURCES.md) is rendered
as Hugging Face renders it (tests/support/hf_jinja.py), with no adaptation: tool-call arguments go to it as objects
(the template dumps them with `tojson`; a JSON string it would paste as written, and the protocol, like every family
here, decodes it once at the boundary).
"""

from __future__ import annotations

import random
import re
from functools import cache
from typing import Any

import jinja2
import pytest

from agent_protocol import HFTokenizer, MessageError, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.byte_tokenizer import byte_level_tokenizer
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import episode_text, is_episode, render_golden
from tests.support.hf_jinja import TEMPLATES, official_template
from tests.support.random_conversations import ConversationMix, conversation, random_tools

STEM = "nemotron_nano_v2"
NAME = "nemotron-nano-v2"
END = "<SPECIAL_12>"
RENDERS = renders(STEM)
VARIANTS: dict[str, dict[str, Any]] = {"thinking": {}, "no_thinking": {"enable_thinking": False}}


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    return official_template(STEM).render(messages=messages, tools=tools, add_generation_prompt=generation)


# -- template and golden renders ----------------------------------------------------------------------------------


def test_the_template_is_the_llama_cpp_copy() -> None:
    text = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    assert len(text) == 5506 and text.startswith("{%- set ns = namespace(enable_thinking=true) -%}")
    assert text.count("'\n<SPECIAL_12>\n\n'") == 4  # the later revision: the last turn's calls end the same way


def test_every_golden_render_is_present() -> None:
    assert len(RENDERS) == 12 and not any(r.refused for r in RENDERS)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_golden_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    assert official(case["messages"], case["tools"], golden.add_generation_prompt) == golden.text
    assert render_golden(golden) == golden.text


# -- generated conversations against the official Jinja -----------------------------------------------------------

TEXTS = [
    "",
    "Hi",
    "  padded  ",
    "\nleading newline",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "please /think hard",
    "answer now /no_think",
    "/no_think",
    "<think>inline</think>\n\nafter",
    "a</think>b</think>c",
    "<TOOLCALL>typed</TOOLCALL>",
    '{"json": [1, 2]}',
]
VALUES: list[Any] = ["Paris", "", "é 中文\nnewline", 42, -1.5, True, None, [1, "a"], {"k": {"n": [1]}}, {}]


def _arguments(rng: random.Random) -> dict[str, Any]:
    return {rng.choice(["q", "city", "n", "é"]): rng.choice(VALUES) for _ in range(rng.randint(0, 3))}


MIX = ConversationMix(
    texts=TEXTS,
    user_texts=[*TEXTS, None],
    turns=(1, 7),
    reasoning=0.4,
    call_count=lambda rng: rng.randint(0, 3) if rng.random() < 0.5 else 0,
    arguments=_arguments,
    names=("lookup", "weather", "now"),
)


def _conversation(seed: int) -> list[dict[str, Any]]:
    """A conversation of `MIX`; in two of three, the system messages after the first left out (the template drops
    them and the protocol refuses them, so those conversations would compare nothing)."""
    messages = conversation(random.Random(seed), MIX)
    if seed % 3:
        messages = [m for k, m in enumerate(messages) if k == 0 or m["role"] != "system"]
    return messages


CONVERSATIONS = [(_conversation(seed), random_tools(random.Random(seed))) for seed in range(300)]


def _switched_off(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `/no_think` in the system prompt (added if there is none), as a thinking-off episode."""
    out = [dict(m) for m in messages]
    if out[0]["role"] == "system" and isinstance(out[0]["content"], str):
        out[0]["content"] += " /no_think"
    elif out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": "/no_think"})
    return out


#: variant -> its conversations: the thinking-off ones carry the switch the template reads
VARIANT_CONVERSATIONS = {
    "thinking": CONVERSATIONS,
    "no_thinking": [(_switched_off(m), tools) for m, tools in CONVERSATIONS],
}


def _switch(messages: list[dict[str, Any]]) -> bool:
    thinking = True
    for m in messages:
        if m["role"] in ("user", "system") and isinstance(m["content"], str):
            if "/think" in m["content"]:
                thinking = True
            elif "/no_think" in m["content"]:
                thinking = False
    return thinking


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_official_jinja(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol(NAME, **options)
    equal = template_refused = mode_refused = dropped_refused = 0
    for index, (messages, tools) in enumerate(VARIANT_CONVERSATIONS[variant]):
        for generation in (False, True):
            try:
                expected = official(messages, tools, generation)
            except (jinja2.TemplateError, TypeError):  # `'/think' in None`, a lone system message
                with pytest.raises(
                    MessageError,
                    match=r"null|system message alone|drops a system message|would print None|enable_thinking",
                ):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                template_refused += 1
                continue
            if any(m["role"] == "system" for m in messages[1:]) or any(
                m["role"] == "tool" and m["content"] is None for m in messages
            ):
                with pytest.raises(MessageError, match=r"drops a system message|would print None"):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                dropped_refused += 1
                continue
            if _switch(messages) != protocol.enable_thinking:  # type: ignore[attr-defined]
                with pytest.raises(MessageError, match=r"use get_protocol\('nemotron-nano-v2', enable_thinking="):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                mode_refused += 1
                continue
            actual = protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
            assert actual == expected, (index, generation)
            equal += 1
    assert equal + template_refused + mode_refused + dropped_refused == 600
    assert equal >= 300 and template_refused >= 10 and mode_refused >= 10 and dropped_refused >= 10, (
        equal,
        template_refused,
        mode_refused,
        dropped_refused,
    )


def test_string_arguments_are_decoded_and_dumped_as_objects() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    as_object = [
        messages[0],
        {**messages[1], "tool_calls": [{**call, "function": {"name": "f", "arguments": {"a": 1}}}]},
    ]
    rendered = get_protocol(NAME).render_messages([*messages, {"role": "user", "content": "x"}])
    assert rendered == official([*as_object, {"role": "user", "content": "x"}])
    assert '"arguments": {"a": 1}' in rendered


def test_list_content_is_refused() -> None:
    with pytest.raises(MessageError, match="takes string content"):
        get_protocol(NAME).render_messages([{"role": "user", "content": [{"type": "text", "text": "q"}]}])


# -- parsing: nemotron_json + deepseek_r1 -------------------------------------------------------------------------


def test_parse_calls_content_and_reasoning() -> None:
    protocol = get_protocol(NAME)
    text = (
        'Let me look.</think>Checking.\n\n<TOOLCALL>[{"name": "weather", "arguments": {"city": "Paris"}}, '
        '{"name": "now", "arguments": "{}"}]</TOOLCALL>\n<SPECIAL_12>'
    )
    action = protocol.parse_assistant_text(text)
    assert action.reasoning_content == "Let me look." and action.content == "Checking." and action.issues == ()
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("weather", {"city": "Paris"}), ("now", {})]
    off = get_protocol(NAME, enable_thinking=False).parse_assistant_text("Plain answer.\n<SPECIAL_12>")
    assert off.content == "Plain answer." and off.reasoning_content is None


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('</think><TOOLCALL>[{"name": "a", "arguments": {}', "unclosed_tag"),
        ("</think><TOOLCALL>[{oops}]</TOOLCALL>", "invalid_json"),
        ('</think><TOOLCALL>[{"arguments": {}}]</TOOLCALL>', "missing_name"),
        ('</think><TOOLCALL>[{"name": "a", "arguments": [1]}]</TOOLCALL>', "invalid_arguments"),
        ("</think><TOOLCALL>[]</TOOLCALL>", "missing_name"),
    ],
)
def test_malformed_calls_become_coded_issues(text: str, code: str) -> None:
    action = get_protocol(NAME).parse_assistant_text(text)
    assert [c.error.code for c in action.tool_calls if c.error] == [code]


def test_brackets_are_added_as_the_plugin_adds_them() -> None:
    action = get_protocol(NAME).parse_assistant_text(
        '</think><TOOLCALL>{"name": "a", "arguments": {"x": 1}}</TOOLCALL>'
    )
    assert [(c.name, c.arguments, c.ok) for c in action.tool_calls] == [("a", {"x": 1}, True)]


def test_unclosed_reasoning_is_an_issue() -> None:
    action = get_protocol(NAME).parse_assistant_text("still thinking")
    assert action.error is not None and action.error.code == "missing_think_end"
    assert action.reasoning_content == "still thinking" and action.content == ""


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parse_of_a_generation_renders_back_the_same(variant: str) -> None:
    protocol = get_protocol(NAME, **VARIANTS[variant])
    checked = 0
    for messages, _ in CONVERSATIONS:
        for message in messages:
            if message["role"] != "assistant" or any(
                t in (message["content"] or "") for t in ("<TOOLCALL>", "</think>")
            ):
                continue
            if not protocol.enable_thinking:  # type: ignore[attr-defined]
                message = {k: v for k, v in message.items() if k != "reasoning_content"}
            elif "</think>" in message.get("reasoning_content", ""):
                continue
            generated = protocol.render_generation(message)
            parsed = protocol.assistant_message(generated)
            assert protocol.render_generation(parsed) == generated
            assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
                (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
            ]
            checked += 1
    assert checked >= 100


# -- feedback and episodes ----------------------------------------------------------------------------------------

_THINK_BLOCK = re.compile(r"<think>\n\n.*?</think>", re.DOTALL)


def without_generated_think(text: str, *, thinking: bool, prompt: str) -> str:
    """The transcript's text with each generated turn's think part taken out (the final prompt's opener kept):
    the official render has none in history."""
    body = text.removesuffix(prompt)
    body = _THINK_BLOCK.sub("", body) if thinking else body.replace("<think></think>", "")
    return body + prompt


def _episode(rng: random.Random, thinking: bool) -> list[dict[str, Any]]:
    """An episode: a prompt, then generated turns (stripped contents, no `</think>` in them), each followed by
    tool results or a user message, ending on feedback."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append(
            {"role": "system", "content": rng.choice(["Be brief.", "", "rules /think" if thinking else "x"])}
        )
    first = rng.choice(["Hi", "  what?  ", "go"])
    messages.append({"role": "user", "content": first if thinking else first + " /no_think"})
    for _ in range(rng.randint(1, 4)):
        calls = rng.choice([0, 0, 1, 2])
        turn: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", "Sure.", "two\n\nlines"])}
        if thinking:
            turn["reasoning_content"] = rng.choice(["", "step 1\nstep 2", "hmm"])
        if calls:
            turn["tool_calls"] = [
                {"id": f"c{k}", "type": "function", "function": {"name": "lookup", "arguments": _arguments(rng)}}
                for k in range(calls)
            ]
        messages.append(turn)
        if calls:
            messages.extend(
                {"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(["42", "", "x y"])}
                for k in range(calls)
            )
        else:
            messages.append({"role": "user", "content": rng.choice(["more", "ok /no_think" if not thinking else "ok"])})
    return messages


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompt_generations_and_feedback_are_the_official_render_but_for_think_parts(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol(NAME, **options)
    thinking = not options
    for seed in range(150):
        rng = random.Random(seed)
        messages, tools = _episode(rng, thinking), random_tools(rng)
        assert is_episode(messages)
        text = episode_text(protocol, messages, tools)
        expected = official(messages, tools, True)
        assert text != expected  # every generated turn carries a think part the history has not
        assert without_generated_think(text, thinking=thinking, prompt=protocol.generation_prompt) == expected, seed


def test_feedback_seams() -> None:
    """The two seams, pinned: a generated turn's think part (`<think>\\n\\n` + reasoning + `</think>` with
    thinking on, `<think></think>` off) is in the transcript only, and its content is stripped in history."""
    protocol = get_protocol(NAME)
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": " 391 ", "reasoning_content": "r"},
        {"role": "user", "content": "thanks"},
    ]
    text = protocol.render_prompt(messages[:1]) + protocol.render_generation(messages[1])
    text += protocol.render_feedback(messages[2:])
    assert "<SPECIAL_11>Assistant\n<think>\n\nr</think> 391 \n<SPECIAL_12>\n\n" in text
    assert text.replace("<think>\n\nr</think> 391 ", "391", 1) == official(messages, None, True)
    off = get_protocol(NAME, enable_thinking=False)
    plain = [
        {"role": "user", "content": "q /no_think"},
        {"role": "assistant", "content": "391"},
        {"role": "user", "content": "thanks"},
    ]
    text = off.render_prompt(plain[:1]) + off.render_generation(plain[1]) + off.render_feedback(plain[2:])
    assert text.replace("<think></think>391", "391", 1) == official(plain, None, True)


def test_feedback_refuses_a_switch_against_the_mode() -> None:
    with pytest.raises(MessageError, match=r"enable_thinking=False\)"):
        get_protocol(NAME).render_feedback([{"role": "user", "content": "quick /no_think"}])
    with pytest.raises(MessageError, match="drops the others"):
        get_protocol(NAME).render_feedback([{"role": "system", "content": "s"}])
    closed = get_protocol(NAME).render_feedback([{"role": "tool", "content": "1"}], turn_closed=False)
    tool_turn = "<SPECIAL_11>User\n<TOOL_RESPONSE>[1]</TOOL_RESPONSE>\n\n"
    assert closed == f"\n<SPECIAL_12>\n\n{tool_turn}<SPECIAL_11>Assistant\n<think>\n\n"


def test_a_conversation_ending_on_a_turn_renders_as_the_template() -> None:
    """The template renders a final assistant turn otherwise than in history: a `<think>` opener before its content
    and its calls in a turn of their own (so a finished episode's render is not its transcript)."""
    case = cases()["single_tool_call"]
    messages = [*case["messages"][:3]]
    assert get_protocol(NAME).render_messages(messages, tools=case["tools"]) == official(messages, case["tools"])
    assert official(messages, case["tools"]).endswith(
        '<SPECIAL_11>Assistant\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]'
        "</TOOLCALL>\n<SPECIAL_12>\n\n"
    )


# -- token in, token out through the session (text level) ---------------------------------------------------------

CONTROL_TOKENS = ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOLCALL>", "</TOOLCALL>", "<TOOL_RESPONSE>",
                  "</TOOL_RESPONSE>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>", "<think>", "</think>"]  # fmt: skip


@cache
def nemotron_byte_tokenizer() -> HFTokenizer:
    return byte_level_tokenizer(CONTROL_TOKENS, source="nemotron-byte-level (test)")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_session_is_token_in_token_out(variant: str) -> None:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    options = VARIANTS[variant]
    thinking = not options
    head = "I should use the calculator.</think>" if thinking else ""
    first = head + '<TOOLCALL>[{"name": "calculator", "arguments": {"expression": "17 * 23"}}]</TOOLCALL>\n' + END
    second = ("The tool answered.</think>" if thinking else "") + "The answer is 391.\n" + END
    protocol = get_protocol(NAME, **options)
    tokenizer = nemotron_byte_tokenizer()
    system = "Use the tools." + ("" if thinking else " /no_think")
    episode = run_calculator_episode(protocol, tokenizer, [first, second], rewards="none", system_prompt=system)
    result = episode.result
    assert result.final_answer == "The answer is 391."
    (segment,) = result.trajectory.segments
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    assert episode.engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    messages = [m.to_openai() for m in result.trajectory.messages]
    tools = [CalculatorTool().spec.to_openai()]
    # up to the second turn: the official render with the generation prompt, but for the first turn's think part
    before_second = tokenizer.decode(segment.ids[: segment.action_ranges[1][0]])
    expected = official(messages[:-1], tools, True)
    assert without_generated_think(before_second, thinking=thinking, prompt=protocol.generation_prompt) == expected
    assert segment.ids == tokenizer.encode(before_second + second)
