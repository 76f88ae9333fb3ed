"""Kimi K2 (`kimi-k2`: Kimi-K2-Instruct as released; `kimi-k2-thinking`): renders against the official templates,
the parser against vLLM's `kimi_k2` tool and reasoning parsers, the episode pieces against the official render of
the whole conversation, and token-in-token-out through `AgentSession`.

References: tests/data/golden/templates/kimi_k2_instruct.jinja and kimi_k2_thinking.jinja (SOURCES.md), rendered
with `tests/support/hf_jinja.py` (Hugging Face's conventions). One adaptation on the Jinja side: a call's
arguments go to it as an object, or as the JSON string `json.dumps(ensure_ascii=False)` writes (the template
prints a string as it is; our side parses it and dumps it in that spelling). Reasoning is never given to the
Jinja side as an explicit null (the Thinking template would print `None`; a `Message` cannot tell a null from a
missing field), nor a tool call id (the templates print a missing id as nothing, our messages give every call one).
"""

from __future__ import annotations

import copy
import json
import random
import re
import warnings
from functools import cache
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_protocol import MessageError, get_protocol
from agent_protocol.json_limits import check_json_value
from agent_protocol.protocol_detection import protocol_for_template
from agent_protocol.protocols.kimi_k2 import CallsNotRenderedWarning, KimiK2Protocol, KimiK2ThinkingProtocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.byte_tokenizer import byte_level_tokenizer
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import compare_with_jinja, episode_text, render_golden
from tests.support.hf_jinja import TEMPLATES, official_template
from tests.support.hostile_text import FUZZ, hostile_piece
from tests.support.random_conversations import ConversationMix, conversation
from tests.support.tool_shapes import TOOL_SHAPES

#: kimi-k2 warns once per protocol object when calls go to its template (test_instruct_warns_that_calls_vanish)
pytestmark = pytest.mark.filterwarnings("ignore::agent_protocol.protocols.kimi_k2.CallsNotRenderedWarning")

STEMS = {"kimi-k2": "kimi_k2_instruct", "kimi-k2-thinking": "kimi_k2_thinking"}
NAMES = sorted(STEMS)
IM_END, IM_ASSISTANT, IM_MIDDLE = "<|im_end|>", "<|im_assistant|>", "<|im_middle|>"
PROMPT = IM_ASSISTANT + "assistant" + IM_MIDDLE
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def official(name: str, messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    """The official template of protocol `name`, rendered the Hugging Face way."""
    return official_template(STEMS[name]).render(messages=messages, tools=tools, add_generation_prompt=generation)


# -- 1. golden renders ----------------------------------------------------------------------------------------

GOLDEN = renders(*STEMS.values())


def test_every_golden_render_is_present() -> None:
    assert len(GOLDEN) == 24  # 6 cases x 2 (generation prompt or not) x 2 templates; none refused
    assert not [g for g in GOLDEN if g.refused]


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_render_matches_the_golden_render_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    assert render_golden(golden) == golden.text
    # the golden files are the template's own renders: the Jinja renders them again
    assert official(golden.protocol, case["messages"], case["tools"], golden.add_generation_prompt) == golden.text
    if golden.add_generation_prompt:
        assert get_protocol(golden.protocol).render_prompt(case["messages"], tools=case["tools"]) == golden.text


# -- 2. generated conversations against the official Jinja -----------------------------------------------------

TEXTS = [
    "",
    "Hi",
    "\n",
    "  spaces  ",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "<think>inline</think>after",
    "## Return of functions.x:0",
    f"{SECTION_BEGIN}typed by the user",
    '{"json": "looking"}',
]
ARGUMENTS: list[Any] = [{}, {"q": "x"}, {"q": "é 中文", "n": 3}, {"nested": {"a": [1, 2.5, None, True]}}, {"s": '"\\'}]


def _arguments(rng: random.Random) -> Any:
    value = copy.deepcopy(rng.choice(ARGUMENTS))
    return json.dumps(value, ensure_ascii=False) if rng.random() < 0.4 else value


MIX = ConversationMix(
    texts=TEXTS,
    turns=(0, 7),
    reasoning=0.6,
    call_count=lambda rng: rng.randint(1, 3) if rng.random() < 0.45 else 0,
    arguments=_arguments,
    names=("lookup", "get_weather", "now"),
)


def _shaped(rng: random.Random, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every message shape the templates take: Kimi's call ids, names on messages, content as a list of text
    parts, a tool result without a call id."""
    counter = 0
    for message in messages:
        for call in message.get("tool_calls", []):
            call["id"] = f"functions.{call['function']['name']}:{counter}"
            counter += 1
        roll = rng.random()
        if roll < 0.15:
            message["name"] = rng.choice(["calculator", "alice", "é"])
        elif roll < 0.25 and isinstance(message.get("content"), str):
            text = message["content"]
            message["content"] = [{"type": "text", "text": text[:3]}, {"type": "text", "text": text[3:]}]
        elif roll < 0.3 and message["role"] == "tool":
            del message["tool_call_id"]
    return messages


CONVERSATIONS = [_shaped(random.Random(seed), conversation(random.Random(seed), MIX)) for seed in range(170)]
TOOL_CHOICES: list[Any] = [None, TOOL_SHAPES, [], TOOL_SHAPES[1:3], [TOOL_SHAPES[4]]]


@pytest.mark.parametrize("name", NAMES)
def test_python_renderer_equals_official_jinja(name: str) -> None:
    conversations = [(m, TOOL_CHOICES[i % len(TOOL_CHOICES)]) for i, m in enumerate(CONVERSATIONS)]
    compared, refused = compare_with_jinja(
        get_protocol(name),
        lambda messages, tools, generation: official(name, messages, tools, generation),
        conversations,
        refused_by=(TypeError,),  # Kimi-K2-Instruct's template iterates a null content
        refusal="official Kimi-K2-Instruct template",
    )
    if name == "kimi-k2":
        assert compared >= 300 and refused >= 20  # every conversation with a null content refused
    else:
        assert (compared, refused) == (2 * len(CONVERSATIONS), 0)
    assert sum(1 for m in CONVERSATIONS if any(x.get("tool_calls") for x in m)) >= 60
    assert sum(1 for m in CONVERSATIONS if any(x.get("reasoning_content") for x in m)) >= 60


def test_the_shapes_are_drawn() -> None:
    flat = [m for c in CONVERSATIONS for m in c]
    assert sum(isinstance(m.get("content"), list) for m in flat) >= 20
    assert sum("name" in m for m in flat) >= 20
    assert sum(m["role"] == "tool" and "tool_call_id" not in m for m in flat) >= 5
    assert sum(m["role"] == "assistant" and m["content"] is None for m in flat) >= 20


@pytest.mark.parametrize("name", NAMES)
def test_empty_conversation_and_tools(name: str) -> None:
    protocol = get_protocol(name)
    for tools in (None, [], TOOL_SHAPES):
        for generation in (False, True):
            expected = official(name, [], tools, generation)
            assert protocol.render_messages([], tools=tools, add_generation_prompt=generation) == expected


def test_instruct_renders_no_tool_calls_and_refuses_null_content() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "hidden", "tool_calls": [
            {"id": "functions.lookup:0", "function": {"name": "lookup", "arguments": {"q": "x"}}}]},
        {"role": "tool", "tool_call_id": "functions.lookup:0", "name": "lookup", "content": "found"},
    ]  # fmt: skip
    text = get_protocol("kimi-k2").render_messages(messages)
    assert text == official("kimi-k2", messages)
    assert SECTION_BEGIN not in text and "hidden" not in text and "lookup" not in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|>Let me look.<|im_end|>"
                         "<|im_system|>tool<|im_middle|>found<|im_end|>")  # fmt: skip
    messages[1]["content"] = None
    with pytest.raises(TypeError):
        official("kimi-k2", messages)
    with pytest.raises(MessageError, match=r"messages\[1\]\.content: is null; the official Kimi-K2-Instruct"):
        get_protocol("kimi-k2").render_messages(messages)


def test_instruct_warns_that_calls_vanish() -> None:
    protocol = get_protocol("kimi-k2")
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    call = {"id": "functions.now:0", "function": {"name": "now", "arguments": {}}}
    with_call = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        protocol.render_messages(plain, tools=TOOL_SHAPES)  # tools alone: the template lists them
    with pytest.warns(CallsNotRenderedWarning, match="renders no tool calls") as caught:
        protocol.render_messages(with_call)
        protocol.render_messages(with_call)
    assert len(caught) == 1 and caught[0].filename == __file__  # once per protocol object, at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        get_protocol("kimi-k2-thinking").render_messages(with_call)


def test_thinking_keeps_reasoning_only_after_the_last_final_answer() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "reasoning_content": "r2", "tool_calls": [
            {"id": "functions.now:0", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "functions.now:0", "content": "noon"},
    ]  # fmt: skip
    text = get_protocol("kimi-k2-thinking").render_messages(messages)
    assert text == official("kimi-k2-thinking", messages)
    assert "<think></think>a1" in text and "<think>r2</think>" in text and "r1" not in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.now:0\nnoon<|im_end|>" in text
    final = [*messages, {"role": "assistant", "content": "done", "reasoning_content": "r3"}]
    text = get_protocol("kimi-k2-thinking").render_messages(final)
    assert text == official("kimi-k2-thinking", final)
    assert text.count("<think></think>") == 3 and "r2" not in text and "r3" not in text


def test_string_arguments_render_canonically() -> None:
    protocol = get_protocol("kimi-k2-thinking")
    call = {"id": "functions.f:0", "function": {"name": "f", "arguments": json.dumps({"q": "é"}, ensure_ascii=False)}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]}]
    assert protocol.render_messages(messages) == official("kimi-k2-thinking", messages)
    # the seam: a string spelled another way is parsed and dumped; the template prints it as it is
    compact = copy.deepcopy(messages)
    compact[1]["tool_calls"][0]["function"]["arguments"] = '{"q":"\\u00e9"}'
    assert f'{ARG}{{"q": "é"}}{CALL_END}' in protocol.render_messages(compact)
    assert f'{ARG}{{"q":"\\u00e9"}}{CALL_END}' in official("kimi-k2-thinking", compact)


def test_detection_names_each_template_and_not_its_variants() -> None:
    instruct = (TEMPLATES / "kimi_k2_instruct.jinja").read_text(encoding="utf-8")
    thinking = (TEMPLATES / "kimi_k2_thinking.jinja").read_text(encoding="utf-8")
    assert protocol_for_template(instruct) == "kimi-k2"
    assert protocol_for_template(thinking) == "kimi-k2-thinking"
    # llama.cpp's own modified Thinking template numbers calls itself; K2.5's lists tools as TypeScript: neither
    # renders this family's bytes, so neither is named
    modified = thinking.replace("{%- set ns = namespace(", "{%- set tool_response_queue = namespace(ids=[]) -%}\n"
                                "{%- set ns = namespace(", 1)  # fmt: skip
    assert protocol_for_template(modified) is None
    assert protocol_for_template(thinking.replace("{%- if tools -%}", "{%- if tools_ts_str -%}", 1)) is None


def test_registry() -> None:
    assert isinstance(get_protocol("kimi-k2"), KimiK2Protocol)
    assert isinstance(get_protocol("kimi-k2-thinking"), KimiK2ThinkingProtocol)
    for name in NAMES:
        protocol = get_protocol(name)
        assert protocol.generation_prompt == PROMPT
        assert protocol.stop_texts == (IM_END,) and protocol.turn_end_texts == (IM_END,)
        with pytest.raises(TypeError):
            get_protocol(name, thinking=True)


# -- 3. parsing: vLLM's kimi_k2 tool parser and kimi_k2 reasoning parser --------------------------------------

# vLLM's KimiK2ToolParser regex, the oracle on well-formed turns
VLLM_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<id>[^<]+:\d+)\s*<\|tool_call_argument_begin\|>\s*"
    r"(?P<args>(?:(?!<\|tool_call_begin\|>).)*?)\s*<\|tool_call_end\|>",
    re.DOTALL,
)


def vllm_reading(text: str, *, thinking: bool) -> tuple[str | None, str, list[tuple[str, str, Any]]]:
    """(reasoning, content, [(id, name, arguments)]) as vLLM reads a finished turn (content None read as "")."""
    text = text.removesuffix(IM_END)
    reasoning = None
    if thinking:
        start = len("<think>") if text.startswith("<think>") else 0
        end = text.find("</think>")
        if end >= 0:
            reasoning, text = text[start:end], text[end + len("</think>") :]
        elif SECTION_BEGIN in text:
            reasoning, text = text[start : text.find(SECTION_BEGIN)], text[text.find(SECTION_BEGIN) :]
        else:
            return text[start:], "", []
    if SECTION_BEGIN not in text:
        return reasoning, text, []
    calls = [(i, i.split(":")[0].split(".")[-1], json.loads(a)) for i, a in VLLM_CALL.findall(text)]
    return reasoning, text[: text.find(SECTION_BEGIN)], calls


PLAIN = [t for t in TEXTS if "think>" not in t and "<|" not in t]


def _assistant(rng: random.Random, *, thinking: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice(PLAIN)}
    if thinking:
        message["reasoning_content"] = rng.choice(PLAIN)
    if rng.random() < 0.6:
        names = [rng.choice(["lookup", "get_weather", "now"]) for _ in range(rng.randint(1, 3))]
        message["tool_calls"] = [
            {"id": f"functions.{n}:{k}", "type": "function", "function": {"name": n, "arguments": _arguments(rng)}}
            for k, n in enumerate(names)
        ]
    return message


@pytest.mark.parametrize("name", NAMES)
def test_generated_turns_parse_as_vllm_reads_them_and_round_trip(name: str) -> None:
    protocol = get_protocol(name)
    thinking = name == "kimi-k2-thinking"
    for seed in range(200):
        message = _assistant(random.Random(seed), thinking=thinking)
        text = protocol.render_generation(message)
        action = protocol.parse_assistant_text(text, call_id_prefix="unused")
        reasoning, content, calls = vllm_reading(text, thinking=thinking)
        assert action.issues == ()
        assert (action.reasoning_content, action.content) == (reasoning, content)
        assert [(c.id, c.name, c.arguments) for c in action.tool_calls] == calls
        assert [c.id for c in action.tool_calls] == [c["id"] for c in message.get("tool_calls", [])]
        assert protocol.render_generation(action.to_message()) == text  # parse(render(turn)) renders back


def test_well_formed_turns() -> None:
    protocol = get_protocol("kimi-k2")
    text = (
        f'Let me check.{SECTION_BEGIN}{CALL_BEGIN}functions.get_weather:0{ARG}{{"city": "Paris"}}{CALL_END}'
        f"{CALL_BEGIN} get_time:1 {ARG} {{}} {CALL_END}{SECTION_END}{IM_END}"
    )
    action = protocol.parse_assistant_text(text)
    assert action.content == "Let me check." and action.reasoning_content is None
    assert [(c.id, c.name, c.arguments) for c in action.tool_calls] == [
        ("functions.get_weather:0", "get_weather", {"city": "Paris"}),
        ("get_time:1", "get_time", {}),
    ]
    # text after the section is dropped, as vLLM drops it; a turn without a section is all content
    after = f"{SECTION_BEGIN}{CALL_BEGIN}functions.f:0{ARG}{{}}{CALL_END}{SECTION_END}trailing{IM_END}"
    assert protocol.parse_assistant_text(after).content == ""
    stray = f"{CALL_BEGIN}functions.f:0{ARG}{{}}{CALL_END}{IM_END}"
    assert protocol.parse_assistant_text(stray).tool_calls == ()
    assert protocol.parse_assistant_text(stray).content == stray.removesuffix(IM_END)
    # the Instruct model has no reasoning parser: think tags are content
    assert protocol.parse_assistant_text(f"<think>a</think>b{IM_END}").content == "<think>a</think>b"


def test_thinking_turns() -> None:
    protocol = get_protocol("kimi-k2-thinking")
    action = protocol.parse_assistant_text(f"<think>I add.</think>It is 5.{IM_END}")
    assert (action.reasoning_content, action.content, action.error) == ("I add.", "It is 5.", None)
    # no leading <think>: the reasoning still ends at </think> (vLLM consumes the tag only at the start)
    assert protocol.parse_assistant_text(f"r</think>c{IM_END}").reasoning_content == "r"
    assert protocol.parse_assistant_text(" <think>r</think>c").reasoning_content == " <think>r"
    # the call section ends the reasoning when </think> is missing
    call = f"{SECTION_BEGIN}{CALL_BEGIN}functions.now:0{ARG}{{}}{CALL_END}{SECTION_END}{IM_END}"
    action = protocol.parse_assistant_text("<think>just call" + call)
    assert (action.reasoning_content, action.content, action.error) == ("just call", "", None)
    assert [c.name for c in action.valid_tool_calls] == ["now"]
    # never closed, no call: all reasoning (vLLM), with a coded issue
    for text in ("<think>still thinking", f"<think>still thinking{IM_END}"):
        cut = protocol.parse_assistant_text(text)
        assert cut.error is not None and cut.error.code == "missing_think_end"
        assert cut.reasoning_content == "still thinking" and cut.content == ""


@pytest.mark.parametrize(
    ("body", "code", "name"),
    [
        (f'{CALL_BEGIN}functions.calc:0{ARG}{{"expression": "1+1"', "unclosed_tag", "calc"),  # cut off
        (f"{CALL_BEGIN}functions.calc:0", "unclosed_tag", "calc"),
        ("", "unclosed_tag", ""),  # cut off right after the section opened
        (f"{CALL_BEGIN}functions.calc:0{{}}{CALL_END}{SECTION_END}", "invalid_json", ""),  # no argument token
        (f"{CALL_BEGIN}functions.calc{ARG}{{}}{CALL_END}{SECTION_END}", "missing_name", ""),  # no index
        (f"{CALL_BEGIN}{ARG}{{}}{CALL_END}{SECTION_END}", "missing_name", ""),
        (f"{CALL_BEGIN}functions.:0{ARG}{{}}{CALL_END}{SECTION_END}", "missing_name", ""),
        (f'{CALL_BEGIN}functions.calc:0{ARG}{{"a": }}{CALL_END}{SECTION_END}', "invalid_json", "calc"),
        (f"{CALL_BEGIN}functions.calc:0{ARG}{'[' * 5000}{CALL_END}{SECTION_END}", "invalid_json", "calc"),
        (f"{CALL_BEGIN}functions.calc:0{ARG}[1, 2]{CALL_END}{SECTION_END}", "invalid_arguments", "calc"),
        (f'{CALL_BEGIN}functions.calc:0{ARG}"{{}}"{CALL_END}{SECTION_END}', "invalid_arguments", "calc"),
        (f"garbage{SECTION_END}", "invalid_json", ""),  # a section with no call in it
    ],
)
def test_malformed_calls_are_coded_issues(body: str, code: str, name: str) -> None:
    for protocol_name, head in (("kimi-k2", ""), ("kimi-k2-thinking", "<think>r</think>")):
        text = head + "Before." + SECTION_BEGIN + body
        action = get_protocol(protocol_name).parse_assistant_text(text)
        assert action.content == "Before."
        (call,) = action.tool_calls
        assert call.error is not None and call.error.code == code, call.error
        assert call.name == name and call.raw is not None


def test_a_broken_call_does_not_hide_the_good_ones() -> None:
    text = (
        f'{SECTION_BEGIN}{CALL_BEGIN}functions.a:0{ARG}{{"x": 1}}{CALL_END}{CALL_BEGIN}functions.b:1{ARG}{{oops}}'
        f"{CALL_END}{CALL_BEGIN}functions.c:2{ARG}{{}}{CALL_END}{SECTION_END}{IM_END}"
    )
    action = get_protocol("kimi-k2").parse_assistant_text(text)
    assert [c.name for c in action.valid_tool_calls] == ["a", "c"]
    assert [i.code for i in action.issues] == ["invalid_json"]
    assert [c.id for c in action.tool_calls] == ["functions.a:0", "functions.b:1", "functions.c:2"]


KIMI_PIECES = [SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG, CALL_END, IM_END, "<think>", "</think>",
               "functions.calculator:0", ":", ".", "calculator", '{"x": 1}']  # fmt: skip
kimi_text = st.lists(st.sampled_from(KIMI_PIECES) | hostile_piece(), min_size=1, max_size=12).map("".join)


@FUZZ
@given(text=kimi_text, name=st.sampled_from(NAMES))
def test_parser_never_raises_on_its_own_tags(text: str, name: str) -> None:
    action = get_protocol(name).parse_turn(text)  # the parser itself, unguarded
    for call in action.tool_calls:
        check_json_value(call.arguments)
        if call.ok:
            msgspec.json.encode(call.arguments)
        else:
            assert call.error is not None
            assert call.error.code in ("invalid_json", "invalid_arguments", "missing_name", "unclosed_tag")


# -- 4. feedback: prompt + generated turns + feedback pieces == the official render ----------------------------


def _episode(rng: random.Random, *, thinking: bool) -> list[dict[str, Any]]:
    """A conversation an episode can have: system and user first, then generated turns (with their reasoning
    in Thinking), tool results, user follow-ups, a system message now and then; it may end on a turn."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    messages.append({"role": "user", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 4)):
        message = _assistant(rng, thinking=thinking)
        messages.append(message)
        for call in message.get("tool_calls", []):
            result = {"role": "tool", "tool_call_id": call["id"], "content": rng.choice(TEXTS)}
            if rng.random() < 0.5:
                result["name"] = call["function"]["name"]
            messages.append(result)
        if not message.get("tool_calls") or rng.random() < 0.2:
            if rng.random() < 0.1:
                messages.append({"role": "system", "content": "be brief"})
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
    if rng.random() < 0.4:
        messages.append(_assistant(rng, thinking=thinking))  # the episode ends on a generated turn
    return messages


def with_sampled_turns(name: str, rendered: str, messages: list[dict[str, Any]]) -> str:
    """The official render `rendered` of `messages`, with each assistant turn as the model sampled it where the
    template renders it otherwise (the seams): Kimi-K2-Instruct's template drops the call section, which is put
    back before the turn's `<|im_end|>` as the Kimi-K2-Thinking template writes the same calls (the one format
    both models generate); Kimi-K2-Thinking's renders an empty `<think></think>` for every turn up to the last
    final answer, which gets back the turn's reasoning. Nothing else is touched."""
    parts = rendered.split(IM_ASSISTANT)
    turns = [m for m in messages if m["role"] == "assistant"]
    head = "assistant" + IM_MIDDLE
    for k, message in enumerate(turns):
        part = parts[k + 1]
        assert part.startswith(head)
        if name == "kimi-k2":
            if message.get("tool_calls"):
                calls = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": message["tool_calls"]}]
                shown = official("kimi-k2-thinking", calls)
                section = shown[shown.index(SECTION_BEGIN) : shown.rindex(SECTION_END) + len(SECTION_END)]
                end = part.index(IM_END)
                parts[k + 1] = part[:end] + section + part[end:]
        elif message.get("reasoning_content") and part.startswith(head + "<think></think>"):
            parts[k + 1] = head + f"<think>{message['reasoning_content']}</think>" + part[len(head) + 15 :]
    return IM_ASSISTANT.join(parts)


@pytest.mark.parametrize("name", NAMES)
def test_episode_pieces_are_the_official_render_but_for_the_seams(name: str) -> None:
    protocol = get_protocol(name)
    seams = 0
    for seed in range(160):
        rng = random.Random(seed)
        messages = _episode(rng, thinking=name == "kimi-k2-thinking")
        tools = rng.choice([None, TOOL_SHAPES, [TOOL_SHAPES[0]]])
        text = episode_text(protocol, messages, tools)
        rendered = official(name, messages, tools, messages[-1]["role"] != "assistant")
        assert text == with_sampled_turns(name, rendered, messages), seed
        seams += text != rendered
    assert seams >= 80  # most episodes reach a seam: a call (Instruct) or a final answer (Thinking)


def test_thinking_episode_is_append_only_until_a_final_answer() -> None:
    """Within a tool-calling run (no final answer yet) every turn keeps its reasoning in the render too: the
    prompt of each step is the official render, byte for byte."""
    protocol = get_protocol("kimi-k2-thinking")
    for seed in range(100):
        rng = random.Random(seed)
        messages: list[dict[str, Any]] = [{"role": "user", "content": rng.choice(TEXTS)}]
        for _ in range(rng.randint(1, 3)):
            message = _assistant(rng, thinking=True)
            message.setdefault("tool_calls", [{"id": "functions.now:0", "function": {"name": "now", "arguments": {}}}])
            messages.append(message)
            messages.extend({"role": "tool", "tool_call_id": c["id"], "content": "r"} for c in message["tool_calls"])
            assert episode_text(protocol, messages, TOOL_SHAPES) == official(
                "kimi-k2-thinking", messages, TOOL_SHAPES, True
            )


def test_feedback_pieces() -> None:
    protocol = get_protocol("kimi-k2-thinking")
    tool = {"role": "tool", "tool_call_id": "functions.calculator:0", "name": "calculator", "content": "391"}
    assert protocol.render_feedback([tool]) == (
        "<|im_system|>calculator<|im_middle|>## Return of functions.calculator:0\n391<|im_end|>" + PROMPT
    )
    user = {"role": "user", "content": "and?"}
    assert (
        protocol.render_feedback([user], turn_closed=False)
        == IM_END + "<|im_user|>user<|im_middle|>and?" + IM_END + PROMPT
    )
    system = {"role": "system", "content": "s"}  # a system message renders where it is
    assert protocol.render_feedback([system, user]).startswith("<|im_system|>system<|im_middle|>s<|im_end|>")
    instruct = get_protocol("kimi-k2")
    assert instruct.render_feedback([tool]) == "<|im_system|>tool<|im_middle|>391<|im_end|>" + PROMPT
    for bad, match in (([], "at least one"), ([{"role": "assistant", "content": "x"}], r"messages\[0\]\.role")):
        with pytest.raises(MessageError, match=match):
            protocol.render_feedback(bad)
    with pytest.raises(MessageError, match="is null"):
        instruct.render_feedback([{"role": "tool", "content": None}])


# -- 5. token-in-token-out through the session -----------------------------------------------------------------
# No Kimi tokenizer is in a registry this project can use (Kimi ships a tiktoken file with its model), so this is
# text level: a byte-level tokenizer with no merges plus Kimi's control tokens as added tokens. Its ids round-trip
# text exactly and encode(a + b) == encode(a) + encode(b) away from those tokens, so "the ids equal the encoded
# official render" is "the text equals the official render".

KIMI_SPECIAL_TOKENS = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                       "<|im_middle|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                       "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>",
                       "</think>"]  # fmt: skip


@cache
def kimi_byte_tokenizer() -> Any:
    return byte_level_tokenizer(KIMI_SPECIAL_TOKENS, source="kimi-byte-level (test)")


def test_byte_tokenizer_carries_the_control_tokens() -> None:
    tokenizer = kimi_byte_tokenizer()
    golden = next(g for g in GOLDEN if g.template == "kimi_k2_thinking" and g.case == "multi_turn_reasoning")
    ids = tokenizer.encode(golden.text)
    assert tokenizer.decode(ids) == golden.text
    for token in KIMI_SPECIAL_TOKENS:
        assert tokenizer.encode(token) == [tokenizer.token_to_id(token)]


def calculator_call(expression: str, reasoning: str | None = "Use the calculator.") -> str:
    head = "" if reasoning is None else f"<think>{reasoning}</think>"
    arguments = json.dumps({"expression": expression})
    return f"{head}{SECTION_BEGIN}{CALL_BEGIN}functions.calculator:0{ARG}{arguments}{CALL_END}{SECTION_END}{IM_END}"


def _official_of(name: str, trajectory: Any, specs: list[Any]) -> str:
    messages = [m.to_openai() for m in trajectory.messages]
    return official(name, messages, [s.to_openai() for s in specs])


@pytest.mark.parametrize("name", NAMES)
def test_session_is_token_in_token_out(name: str) -> None:
    thinking = name == "kimi-k2-thinking"
    first = calculator_call("17 * 23", reasoning="Use the calculator." if thinking else None)
    second = ("<think>It said 391.</think>" if thinking else "") + f"The answer is 391.{IM_END}"
    tokenizer = kimi_byte_tokenizer()
    engine, result, specs = run_calculator_episode(name, tokenizer, [first, second], rewards="result")
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    trajectory = result.trajectory
    (segment,) = trajectory.segments
    assert [m.role for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[1].tool_calls[0].id == "functions.calculator:0"
    assert trajectory.messages[2].tool_call_id == "functions.calculator:0"
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    assert engine.calls[-1] == segment.ids[: segment.action_ranges[-1][0]]
    rendered = _official_of(name, trajectory, specs)
    if thinking:
        # the seam: the final answer makes the template empty every turn's reasoning; the transcript keeps them
        sampled = rendered.replace("<think></think>", "<think>Use the calculator.</think>", 1)
        sampled = sampled.replace("<think></think>", "<think>It said 391.</think>", 1)
        assert segment.ids == tokenizer.encode(sampled)
    else:
        # the seam: the template renders no tool calls; the transcript holds the sampled section
        section = first.removesuffix(IM_END)
        assert rendered.count(PROMPT + IM_END) == 1
        assert segment.ids == tokenizer.encode(rendered.replace(PROMPT + IM_END, PROMPT + section + IM_END, 1))
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)


def test_session_cut_off_turn_is_closed_by_the_feedback() -> None:
    tokenizer = kimi_byte_tokenizer()
    long_turn = "<think>" + "let me think " * 40
    _, result, _ = run_calculator_episode(
        "kimi-k2-thinking", tokenizer, [long_turn, calculator_call("17 * 23"), f"<think></think>391{IM_END}"],
        rewards="none", max_new_tokens=30,
    )  # fmt: skip
    (segment,) = result.trajectory.segments
    first_end = segment.action_ranges[0][1]
    assert first_end - segment.action_ranges[0][0] == 30
    assert segment.ids[first_end] == tokenizer.token_to_id(IM_END)
    assert result.trajectory.errors[0].code == "missing_think_end"
