"""DeepSeek-V3.1 (`deepseek-v3.1`, option `thinking`): renders against the official template, the parser
against vLLM's `deepseek_v31` semantics, the feedback pieces against the official full render.

The official template concatenates tool-call arguments as a string, so on the Jinja side (only) every call's
arguments are serialized with `json.dumps(ensure_ascii=False)`, as the golden renders were made; our side gets
them as an object or as that same string.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st

from agent_protocol import HFTokenizer, MessageError, get_protocol
from agent_protocol.protocols.deepseek_v31 import DeepSeekV31Protocol, ToolsNotRenderedWarning
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import compare_with_jinja, episode_text, render_golden, string_arguments
from tests.support.family_tokenizers import load_family_tokenizer, tokenizer_path
from tests.support.hf_jinja import render_official
from tests.support.hostile_text import FUZZ, hostile_piece
from tests.support.tool_shapes import TOOL_SHAPES

#: tools given to the official template warn that it does not show them (test_deepseek_v31_vllm.py tests that)
pytestmark = pytest.mark.filterwarnings("ignore::agent_protocol.protocols.deepseek_v31.ToolsNotRenderedWarning")

STEM = "deepseek_v3.1"
VARIANTS = {"thinking_false": {"thinking": False}, "thinking_true": {"thinking": True}}
EOS = "<｜end▁of▁sentence｜>"


def official(
    messages: list[dict[str, Any]], *, thinking: bool, add_generation_prompt: bool = False, tools: Any = None
) -> str:
    # the golden renders' adaptation: tool-call arguments as the JSON string the template concatenates
    as_strings = string_arguments(messages, ensure_ascii=False)
    return render_official(
        STEM, as_strings, tools=tools, add_generation_prompt=add_generation_prompt, thinking=thinking
    )


# -- 1. golden renders ------------------------------------------------------------------------------------

GOLDEN = renders(STEM)


def test_every_golden_render_is_present() -> None:
    assert len(GOLDEN) == 24  # 6 cases x 2 (generation prompt or not) x 2 (thinking off / on)
    assert not [g for g in GOLDEN if g.refused]  # the golden cases hold nothing the template refuses


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_render_matches_the_golden_render_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    assert render_golden(golden) == golden.text
    if golden.add_generation_prompt and case["messages"][-1]["role"] == "user":
        assert protocol.render_prompt(case["messages"], tools=case["tools"]) == golden.text
        assert golden.text.endswith(protocol.generation_prompt)


def test_string_arguments_render_as_the_template_renders_them() -> None:
    protocol = get_protocol("deepseek-v3.1")
    as_string: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"function": {"name": "lookup", "arguments": json.dumps({"q": "é 中"}, ensure_ascii=False)}}
            ],
        },
    ]
    assert protocol.render_messages(as_string) == official(as_string, thinking=False)
    # The seam: a string spelled another way is parsed once and dumped canonically; the template would print it
    # verbatim. Both spell the same object.
    compact = copy.deepcopy(as_string)
    compact[1]["tool_calls"][0]["function"]["arguments"] = '{"q":"\\u00e9 中"}'
    assert '<｜tool▁sep｜>{"q": "é 中"}<｜tool▁call▁end｜>' in protocol.render_messages(compact)
    assert '<｜tool▁sep｜>{"q":"\\u00e9 中"}<｜tool▁call▁end｜>' in official(compact, thinking=False)


def test_the_tools_list_is_not_rendered_as_in_the_official_template() -> None:
    messages = [{"role": "user", "content": "hi"}]
    protocol = get_protocol("deepseek-v3.1")
    with pytest.warns(ToolsNotRenderedWarning, match="does not render the tools list"):
        with_tools = protocol.render_messages(messages, tools=TOOL_SHAPES, add_generation_prompt=True)
    expected = official(messages, thinking=False, tools=TOOL_SHAPES, add_generation_prompt=True)
    assert with_tools == protocol.render_prompt(messages) == expected
    with pytest.raises(MessageError, match=r"tools\[0\]"):  # still validated
        protocol.render_messages(messages, tools=[{"function": {"description": "no name"}}])


# -- 2. generated conversations against the official Jinja -------------------------------------------------

TEXTS = [
    "",
    "Hi",
    "\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "<think>inline reasoning</think>after",
    "no open tag</think>rest",
    "a</think>b</think>c",
    "<think>never closed",
    "<｜tool▁output▁begin｜>typed by the user",
    '{"json": "looking"}',
    "  spaces  ",
]
ARGUMENTS = [{}, {"q": "x"}, {"q": "é 中文", "n": 3}, {"nested": {"a": [1, 2.5, None, True]}}, {"s": 'quote " \\'}]


def _call(rng: random.Random, k: int) -> dict[str, Any]:
    arguments: Any = rng.choice(ARGUMENTS)
    if rng.random() < 0.4:  # the client's JSON string, spelled as the template's adaptation spells it
        arguments = json.dumps(arguments, ensure_ascii=False)
    name = rng.choice(["lookup", "weather", "search_flights", "now"])
    return {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    """Any order of roles, system messages anywhere, reasoning, calls, null content now and then."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 7)):
        roll = rng.random()
        if roll < 0.3:
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
        elif roll < 0.75:
            message: dict[str, Any] = {"role": "assistant", "content": rng.choice(TEXTS)}
            if rng.random() < 0.4:
                message["reasoning_content"] = rng.choice(TEXTS)
            calls = rng.randint(1, 3) if rng.random() < 0.45 else 0
            if calls:
                message["tool_calls"] = [_call(rng, k) for k in range(calls)]
                if rng.random() < 0.3:
                    message["content"] = None
            elif rng.random() < 0.03:
                message["content"] = None  # the template fails on it; we refuse it
            messages.append(message)
            for k in range(calls if rng.random() < 0.8 else 0):
                messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(TEXTS)})
        elif roll < 0.9:
            messages.append({"role": "tool", "tool_call_id": "x", "content": rng.choice(TEXTS)})
        else:
            messages.append({"role": "system", "content": rng.choice(TEXTS)})
    return messages


CONVERSATIONS = [_conversation(random.Random(seed)) for seed in range(160)]
TOOL_CHOICES: list[Any] = [None, TOOL_SHAPES, TOOL_SHAPES[1:3], [TOOL_SHAPES[3]]]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_official_jinja(variant: str) -> None:
    thinking = VARIANTS[variant]["thinking"]
    compared, refused = compare_with_jinja(
        get_protocol("deepseek-v3.1", **VARIANTS[variant]),
        lambda messages, tools, generation: official(
            messages, thinking=thinking, add_generation_prompt=generation, tools=tools
        ),
        [(messages, TOOL_CHOICES[index % len(TOOL_CHOICES)]) for index, messages in enumerate(CONVERSATIONS)],
        refused_by=(TypeError,),  # the template concatenates a null content
        refusal=r"official DeepSeek-V3\.1 template",
    )
    assert compared >= 300 and refused > 0


def test_null_content_is_refused_with_the_reason() -> None:
    protocol = get_protocol("deepseek-v3.1")
    for message in (
        {"role": "assistant", "content": None},
        {"role": "user", "content": None},
        {"role": "tool", "content": None},
        {"role": "system", "content": None},
    ):
        messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}, message]
        with pytest.raises(TypeError):
            official(messages, thinking=False)
        with pytest.raises(MessageError, match=r"messages\[1\]\.content: is null; the official DeepSeek-V3.1"):
            protocol.render_messages(messages)


def test_options() -> None:
    assert repr(get_protocol("deepseek-v3.1")) == "DeepSeekV31Protocol(thinking=False)"
    assert get_protocol("deepseek-v3.1", thinking=True).generation_prompt == "<｜Assistant｜><think>"
    assert get_protocol("deepseek-v3.1").generation_prompt == "<｜Assistant｜></think>"
    with pytest.raises(TypeError, match="takes: thinking"):
        get_protocol("deepseek-v3.1", enable_thinking=True)


# -- 3. parsing: vLLM's deepseek_v31 semantics, malformed output as coded issues ----------------------------

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
# vLLM's deepseek_v31 extraction, as its tool parser states it: content before the calls block, each call a
# non-greedy NAME<｜tool▁sep｜>ARGS match; used as the oracle on well-formed turns
VLLM_CALL = re.compile(f"{CALL_BEGIN}(.*?){SEP}(.*?){CALL_END}")


def vllm_reading(text: str, *, thinking: bool) -> tuple[str | None, str, list[tuple[str, Any]]]:
    """(reasoning, content, calls) the way vLLM reads a finished turn with `thinking` as a template kwarg."""
    text = text.removesuffix(EOS)
    reasoning = None
    if thinking:
        text = text.partition("<think>")[2] or text
        reasoning, _, text = text.partition("</think>")
    if CALLS_BEGIN not in text:
        return reasoning, text, []
    calls = [(name, json.loads(arguments)) for name, arguments in VLLM_CALL.findall(text)]
    return reasoning, text[: text.find(CALLS_BEGIN)], calls


def _assistant(rng: random.Random) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice([t for t in TEXTS if "think>" not in t])}
    if rng.random() < 0.6:
        message["reasoning_content"] = rng.choice([t for t in TEXTS if "think>" not in t])
    if rng.random() < 0.6:
        message["tool_calls"] = [_call(rng, k) for k in range(rng.randint(1, 3))]
    return message


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_generated_turns_parse_as_vllm_reads_them_and_round_trip(variant: str) -> None:
    thinking = VARIANTS[variant]["thinking"]
    protocol = get_protocol("deepseek-v3.1", thinking=thinking)
    for seed in range(200):
        message = _assistant(random.Random(seed))
        text = protocol.render_generation(message)
        action = protocol.parse_assistant_text(text)
        reasoning, content, calls = vllm_reading(text, thinking=thinking)
        assert action.issues == ()
        assert (action.reasoning_content, action.content) == (reasoning, content)
        assert [(c.name, c.arguments) for c in action.tool_calls] == calls
        assert protocol.render_generation(action.to_message()) == text  # parse(render(turn)) renders back


def test_well_formed_turns() -> None:
    protocol = get_protocol("deepseek-v3.1")
    text = (
        f'Let me check.{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{"city": "Paris"}}{CALL_END}'
        f"{CALL_BEGIN}now{SEP}{{}}{CALL_END}{CALLS_END}{EOS}"
    )
    action = protocol.parse_assistant_text(text, call_id_prefix="t")
    assert action.content == "Let me check."
    assert action.reasoning_content is None
    assert [(c.id, c.name, c.arguments) for c in action.tool_calls] == [
        ("t_0", "get_weather", {"city": "Paris"}),
        ("t_1", "now", {}),
    ]
    # JSON over several lines is read too (vLLM's regex, without DOTALL, silently drops such a call)
    pretty = f'{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{\n  "a": 1\n}}{CALL_END}{CALLS_END}{EOS}'
    assert protocol.parse_assistant_text(pretty).tool_calls[0].arguments == {"a": 1}
    assert VLLM_CALL.findall(pretty) == []
    # what follows the calls block is dropped, as vLLM drops it; a call tag outside the block is content
    after = f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{}}{CALL_END}{CALLS_END}trailing{EOS}"
    assert protocol.parse_assistant_text(after).content == ""
    stray = f"{CALL_BEGIN}f{SEP}{{}}{CALL_END}{EOS}"
    assert protocol.parse_assistant_text(stray).content == stray.removesuffix(EOS)
    assert protocol.parse_assistant_text(stray).tool_calls == ()
    # thinking off: nothing is reasoning, as vLLM's deepseek_v31 reasoning parser without the kwarg
    assert protocol.parse_assistant_text(f"a</think>b{EOS}").content == "a</think>b"


def test_thinking_turns() -> None:
    protocol = get_protocol("deepseek-v3.1", thinking=True)
    action = protocol.parse_assistant_text(f"I add.</think>It is 5.{EOS}")
    assert (action.reasoning_content, action.content, action.error) == ("I add.", "It is 5.", None)
    # a <think> the model writes again is not reasoning text
    assert protocol.parse_assistant_text(f"<think>r</think>c{EOS}").reasoning_content == "r"
    # cut off inside the reasoning
    cut = protocol.parse_assistant_text("I am still thinking")
    assert cut.error is not None and cut.error.code == "missing_think_end"
    assert cut.reasoning_content == "I am still thinking" and cut.content == ""
    opened = protocol.parse_assistant_text(f"<think>never closed{EOS}")
    assert opened.error is not None and opened.error.code == "missing_think_end"
    # the direct continuation after tool outputs (no prompt opened <think>): a closed turn, or one with a call
    direct = protocol.parse_assistant_text(f"The answer is 391.{EOS}")
    assert (direct.reasoning_content, direct.content, direct.error) == (None, "The answer is 391.", None)
    call = protocol.parse_assistant_text(f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{}}")  # cut off in the call
    assert call.error is None and call.tool_calls[0].error is not None
    assert call.tool_calls[0].error.code == "unclosed_tag"


@pytest.mark.parametrize(
    ("body", "code", "name"),
    [
        (f'{CALL_BEGIN}calc{SEP}{{"expression": "1+1"', "unclosed_tag", "calc"),  # cut off
        (f"{CALL_BEGIN}calc", "unclosed_tag", ""),
        ("", "unclosed_tag", ""),  # cut off right after the block opened
        (f"{CALL_BEGIN}calc{{}}{CALL_END}{CALLS_END}", "invalid_json", ""),  # no separator
        (f"{CALL_BEGIN}{SEP}{{}}{CALL_END}{CALLS_END}", "missing_name", ""),
        (f"{CALL_BEGIN} {SEP}{{}}{CALL_END}{CALLS_END}", "missing_name", ""),
        (f'{CALL_BEGIN}calc{SEP}{{"a": }}{CALL_END}{CALLS_END}', "invalid_json", "calc"),
        (f"{CALL_BEGIN}calc{SEP}{'[' * 5000}{CALL_END}{CALLS_END}", "invalid_json", "calc"),  # too deep
        (f"{CALL_BEGIN}calc{SEP}[1, 2]{CALL_END}{CALLS_END}", "invalid_arguments", "calc"),
        (f'{CALL_BEGIN}calc{SEP}"{{}}"{CALL_END}{CALLS_END}', "invalid_arguments", "calc"),
        (f"garbage{CALLS_END}", "invalid_json", ""),  # a block with no call in it
        (f"function{SEP}calc\n```json\n{{}}\n```{CALL_END}{CALLS_END}", "invalid_json", ""),  # V3's format, no begin
    ],
)
def test_malformed_calls_are_coded_issues(body: str, code: str, name: str) -> None:
    for thinking in (False, True):
        text = ("</think>" if thinking else "") + "Before." + CALLS_BEGIN + body
        action = get_protocol("deepseek-v3.1", thinking=thinking).parse_assistant_text(text)
        assert action.content == "Before."
        (call,) = action.tool_calls
        assert call.error is not None and call.error.code == code, call.error
        assert call.name == name and call.raw is not None


def test_a_broken_call_does_not_hide_the_good_ones() -> None:
    text = (
        f'{CALLS_BEGIN}{CALL_BEGIN}a{SEP}{{"x": 1}}{CALL_END}{CALL_BEGIN}b{SEP}{{oops}}{CALL_END}'
        f"{CALL_BEGIN}c{SEP}{{}}{CALL_END}{CALLS_END}{EOS}"
    )
    action = get_protocol("deepseek-v3.1").parse_assistant_text(text)
    assert [c.name for c in action.valid_tool_calls] == ["a", "c"]
    assert [i.code for i in action.issues] == ["invalid_json"]


KILLERS = {  # the shared fuzz test's known killers, in this format (that test writes them as Hermes <tool_call>s)
    "deep_brackets": "[" * 1500 + "]" * 1500,
    "huge_int": '{"x": ' + "9" * 5000 + "}",
    "lone_surrogate": '{"x": "\\ud800"}',
    "deep_but_decodable": '{"a":' * 150 + "1" + "}" * 150,
}


@pytest.mark.parametrize("arguments", KILLERS.values(), ids=list(KILLERS))
def test_known_killers_become_coded_issues(arguments: str) -> None:
    for thinking in (False, True):
        text = f"</think>{CALLS_BEGIN}{CALL_BEGIN}calculator{SEP}{arguments}{CALL_END}{CALLS_END}{EOS}"
        action = get_protocol("deepseek-v3.1", thinking=thinking).parse_assistant_text(text)
        (call,) = action.tool_calls
        assert call.error is not None and call.error.code in ("invalid_json", "invalid_arguments"), action
        assert "cannot be read" in call.error.message


DEEPSEEK_TAGS = [CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP, EOS, "<think>", "</think>", "calculator"]
deepseek_text = st.lists(st.sampled_from(DEEPSEEK_TAGS) | hostile_piece(), min_size=1, max_size=10).map("".join)


@FUZZ
@given(text=deepseek_text, thinking=st.booleans())
def test_parser_never_raises_on_its_own_tags(text: str, thinking: bool) -> None:
    action = get_protocol("deepseek-v3.1", thinking=thinking).parse_turn(text)  # the parser itself, unguarded
    for call in action.tool_calls:
        assert isinstance(call.arguments, dict)
        assert call.error is None or call.error.code in (
            "invalid_json",
            "invalid_arguments",
            "missing_name",
            "unclosed_tag",
        )


# -- 4. feedback: prompt + generated turns + feedback pieces == the official render -------------------------

ASSISTANT = "<｜Assistant｜>"
#: the one seam of the text: with thinking on, a turn after a user message was generated after `<think>` as
#: `{reasoning}</think>...`, and the template renders that turn in history as `</think>...`
THINKING_SEAM = re.compile(f"{ASSISTANT}<think>.*?</think>", re.DOTALL)


def after_tool_output(messages: list[dict[str, Any]], index: int) -> bool:
    """Whether the assistant turn `index` follows tool output, where no prompt opens the turn (and, thinking on,
    the model writes no reasoning)."""
    return messages[index - 1]["role"] == "tool"


def deepseek_episode_text(protocol: DeepSeekV31Protocol, messages: list[dict[str, Any]], tools: Any = None) -> str:
    """The text an episode lays down for `messages`: the first prompt, then each assistant turn as generated (told
    whether it follows tool output) and the feedback that follows it, each rendered on its own."""
    return episode_text(
        protocol,
        messages,
        tools,
        generate=lambda ms, i: protocol.render_generation(ms[i], after_tool_output=after_tool_output(ms, i)),
    )


def _episode(rng: random.Random) -> list[dict[str, Any]]:
    """A conversation an episode can have: system and user first, then turns, tool results, user follow-ups."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    messages.append({"role": "user", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 5)):
        message: dict[str, Any] = {"role": "assistant", "content": rng.choice(TEXTS)}
        if rng.random() < 0.5:
            message["reasoning_content"] = rng.choice([t for t in TEXTS if "think>" not in t])
        if rng.random() < 0.5:
            message["tool_calls"] = [_call(rng, k) for k in range(rng.randint(1, 3))]
            if rng.random() < 0.3:
                message["content"] = None
        messages.append(message)
        for k in range(len(message.get("tool_calls", []))):
            messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(TEXTS)})
        if not message.get("tool_calls") or rng.random() < 0.2:
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
    if rng.random() < 0.3:
        messages.pop()  # end on the last turn, or on its tool results
    return messages


MULTI_TURN = [c for c in cases().values() if any(m["role"] == "assistant" for m in c["messages"])]
EPISODES = [_episode(random.Random(1000 + seed)) for seed in range(160)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_episode_pieces_are_the_official_render(variant: str) -> None:
    thinking = VARIANTS[variant]["thinking"]
    protocol = get_protocol("deepseek-v3.1", thinking=thinking)
    assert isinstance(protocol, DeepSeekV31Protocol)
    conversations = [(c["messages"], c["tools"]) for c in MULTI_TURN] + [(e, None) for e in EPISODES]
    assert len(MULTI_TURN) == 4
    for index, (messages, tools) in enumerate(conversations):
        text = deepseek_episode_text(protocol, messages, tools)
        expected = official(messages, thinking=thinking, add_generation_prompt=messages[-1]["role"] != "assistant")
        if not thinking:  # append-only: the pieces are the official render, byte for byte
            assert text == expected, f"conversation {index}"
        else:  # each turn after a user message holds `<think>{reasoning}</think>` where history has `</think>`
            assert text != expected
            assert THINKING_SEAM.sub(f"{ASSISTANT}</think>", text) == expected, f"conversation {index}"


def test_feedback_pieces() -> None:
    protocol = get_protocol("deepseek-v3.1")
    tool = {"role": "tool", "content": "5"}
    user = {"role": "user", "content": "And 4+4?"}
    # after tool outputs no prompt opens the next turn: the model continues right after <｜tool▁output▁end｜>
    assert protocol.render_feedback([tool]) == "<｜tool▁output▁begin｜>5<｜tool▁output▁end｜>"
    assert protocol.render_feedback([tool, user]) == (
        "<｜tool▁output▁begin｜>5<｜tool▁output▁end｜><｜User｜>And 4+4?<｜Assistant｜></think>"
    )
    thinking = get_protocol("deepseek-v3.1", thinking=True)
    assert thinking.render_feedback([user]) == "<｜User｜>And 4+4?<｜Assistant｜><think>"
    # a turn cut off by the length limit is closed with the end of sentence (a cut call is not completed)
    assert protocol.render_feedback([user], turn_closed=False) == EOS + "<｜User｜>And 4+4?<｜Assistant｜></think>"
    assert protocol.render_feedback([tool], turn_closed=True, ended_by=EOS) == protocol.render_feedback([tool])


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "at least one"),
        ([{"role": "assistant", "content": "x"}], r"messages\[0\]\.role"),
        ([{"role": "system", "content": "x"}], "at the top of the prompt"),
        ([{"role": "tool", "content": None}], "is null"),
    ],
)
def test_bad_feedback(messages: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(MessageError, match=match):
        get_protocol("deepseek-v3.1").render_feedback(messages)


def test_generation_after_tool_output_has_no_think_close() -> None:
    message = {"role": "assistant", "content": "It is 5.", "reasoning_content": "dropped"}
    thinking = get_protocol("deepseek-v3.1", thinking=True)
    assert isinstance(thinking, DeepSeekV31Protocol)
    assert thinking.render_generation(message) == "dropped</think>It is 5." + EOS
    assert thinking.render_generation(message, after_tool_output=True) == "It is 5." + EOS
    assert get_protocol("deepseek-v3.1").render_generation(message) == "It is 5." + EOS
    with pytest.raises(MessageError, match="only assistant"):
        thinking.render_generation({"role": "user", "content": "x"})


# -- 5. token-in-token-out through the session, with DeepSeek's real tokenizer -----------------------------
#
# tests/data/tokenizers holds DeepSeek-V3's official tokenizer.json. V3.1 uses the same vocabulary and turns two
# placeholder tokens into added tokens: 128798 `<think>` and 128799 `</think>` (V3.1's tokenizer_config). In
# the V3 file they are not tokens: `</think>` is `</`, `think`, `>`, and a word right after it merges with the
# `>` (`>The` is one token) when the text is tokenized in one piece. So:
# - with `V31` (the V3 file plus those two added tokens, as V3.1 declares them) the transcript is token for
#   token the tokenization of the official render, except the thinking text seam of section 4;
# - with the V3 file as published, where a generation starts with a word right after the prompt's think tag,
#   the transcript holds `>` + the word's token(s) (the prompt is tokenized on its own, as an episode does) where
#   the one-piece tokenization holds the merged token: that is the only difference, pinned below.

V31_THINK_TOKENS = {128798: "<think>", 128799: "</think>"}


@pytest.fixture(scope="module")
def v3() -> HFTokenizer:
    return load_family_tokenizer("deepseek_v3")


@pytest.fixture(scope="module")
def v31() -> HFTokenizer:
    data = json.loads(tokenizer_path("deepseek_v3").read_text(encoding="utf-8"))
    for token in data["added_tokens"]:
        if token["id"] in V31_THINK_TOKENS:
            token.update(content=V31_THINK_TOKENS[token["id"]], special=False, normalized=False)
    return HFTokenizer(tokenizers.Tokenizer.from_str(json.dumps(data)), source="deepseek_v3 + V3.1 think tokens")


def test_the_two_tokenizers_differ_only_in_the_think_tags(v3: HFTokenizer, v31: HFTokenizer) -> None:
    assert [v3.token_to_id(t) for t in ("<think>", "</think>")] == [None, None]
    assert v3.encode("</think>The") == [v3.token_to_id("</"), v3.token_to_id("think"), v3.token_to_id(">The")]
    assert v31.encode("<think>r</think>The") == [128798, v31.token_to_id("r"), 128799, v31.token_to_id("The")]
    text = official(cases()["multi_turn_reasoning"]["messages"], thinking=False).replace("</think>", "")
    assert v3.encode(text) == v31.encode(text)  # everything else is the same tokenizer


def tool_call(expression: str) -> str:
    arguments = json.dumps({"expression": expression})
    return f"{CALLS_BEGIN}{CALL_BEGIN}calculator{SEP}{arguments}{CALL_END}{CALLS_END}{EOS}"


def run_episode(tokenizer: HFTokenizer, thinking: bool, script: list[str], **kwargs: Any) -> tuple[Any, Any]:
    """One episode through AgentSession with the real calculator tool and a scripted engine replaying `script`
    (the upper layers are imported there, so the protocol tests above run with agent-protocol alone); with
    thinking off the session gets the protocol by name."""
    protocol: Any = "deepseek-v3.1" if not thinking else get_protocol("deepseek-v3.1", thinking=True)
    stop_ids = [tokenizer.token_to_id(t) for t in get_protocol("deepseek-v3.1", thinking=thinking).stop_texts]
    assert stop_ids == [1]  # `<｜end▁of▁sentence｜>`
    engine, result, _ = run_calculator_episode(protocol, tokenizer, script, rewards="result", **kwargs)
    return result, engine


def official_of(trajectory: Any, *, thinking: bool) -> str:
    return official([m.to_openai() for m in trajectory.messages], thinking=thinking)


def boundary_merged(tokenizer: HFTokenizer, ids: list[int], starts: list[int]) -> list[int]:
    """`ids` with the last prompt token and the first generated token before each turn start tokenized
    together, as a one-piece tokenization of the text does across the seam."""
    out = list(ids)
    for start in sorted(starts, reverse=True):
        out[start - 1 : start + 1] = tokenizer.encode(tokenizer.decode(out[start - 1 : start + 1]))
    return out


SCRIPTS = {
    "tool_then_answer": [tool_call("17 * 23"), f"The answer is 391.{EOS}"],
    "direct_answer": [f"The answer is 391.{EOS}"],
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_session_transcript_is_the_official_render_thinking_off(script: str, v3: HFTokenizer, v31: HFTokenizer) -> None:
    for tokenizer in (v31, v3):
        result, engine = run_episode(tokenizer, False, SCRIPTS[script])
        assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
        (segment,) = result.trajectory.segments
        rendered = official_of(result.trajectory, thinking=False)
        assert tokenizer.decode(segment.ids) == rendered  # text: append-only, byte for byte
        assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(s) for s in SCRIPTS[script]]
        assert engine.calls[-1] == segment.ids[: segment.action_ranges[-1][0]]  # the prompt is the transcript
        starts = [a for a, _ in segment.action_ranges]
        if tokenizer is v31 or script == "tool_then_answer":
            # `<｜tool▁calls▁begin｜>` and `<｜tool▁output▁end｜>` are added tokens: nothing merges across a seam
            assert segment.ids == tokenizer.encode(rendered)
        else:
            # V3's file: the answer starts right after the prompt's `</think>`; one-piece tokenization has `>The`
            assert segment.ids != tokenizer.encode(rendered)
            assert segment.ids[starts[0] - 1 : starts[0] + 1] == tokenizer.encode(">") + tokenizer.encode("The")
            assert boundary_merged(tokenizer, segment.ids, starts) == tokenizer.encode(rendered)


def test_session_transcript_thinking_on(v3: HFTokenizer, v31: HFTokenizer) -> None:
    """Turn 1 is generated after `<think>`; after the tool output the model answers directly (no prompt opens
    that turn), and the parser reads that closed turn as content. The text differs from the official render only
    at the thinking seam (history renders turn 1 as `</think>...`)."""
    reasoning = "The calculator will do it."
    script = [reasoning + "</think>" + tool_call("17 * 23"), f"The answer is 391.{EOS}"]
    for tokenizer in (v31, v3):
        result, _ = run_episode(tokenizer, True, script)
        assert result.final_answer == "The answer is 391." and result.trajectory.errors == []
        (segment,) = result.trajectory.segments
        assert result.trajectory.messages[1].reasoning_content == reasoning
        rendered = official_of(result.trajectory, thinking=True)
        text = tokenizer.decode(segment.ids)
        assert THINKING_SEAM.sub(f"{ASSISTANT}</think>", text) == rendered
        sampled = rendered.replace(f"{ASSISTANT}</think>", f"{ASSISTANT}<think>{reasoning}</think>", 1)
        assert text == sampled
        starts = [a for a, _ in segment.action_ranges]
        if tokenizer is v31:
            assert segment.ids == tokenizer.encode(sampled)
        else:  # V3's file: the reasoning starts right after the prompt's `<think>`; one piece has `>The`
            assert segment.ids[starts[0] - 1 : starts[0] + 1] == tokenizer.encode(">") + tokenizer.encode("The")
            assert segment.ids != tokenizer.encode(sampled)
            assert boundary_merged(tokenizer, segment.ids, starts) == tokenizer.encode(sampled)
        # the second turn follows `<｜tool▁output▁end｜>`, an added token: no seam there with either file
        assert boundary_merged(tokenizer, segment.ids, starts[1:]) == segment.ids


def test_cut_off_turn_is_closed_by_the_feedback(v31: HFTokenizer) -> None:
    """A turn cut by the length limit is closed with `<｜end▁of▁sentence｜>`; the environment answers the unread
    turn, and the model continues after that output."""
    long_call = "let me think " * 40 + "</think>" + tool_call("17 * 23")
    result, _ = run_episode(v31, True, [long_call, tool_call("17 * 23"), f"391{EOS}"], max_new_tokens=20)
    (segment,) = result.trajectory.segments
    first_end = segment.action_ranges[0][1]
    assert first_end - segment.action_ranges[0][0] == 20
    assert segment.ids[first_end] == 1  # `<｜end▁of▁sentence｜>` closes the cut turn, then the feedback follows
    assert result.trajectory.errors[0].code == "missing_think_end"
