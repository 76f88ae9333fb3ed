"""MiniMax-M2 (`minimax-m2`): renders, parser, feedback seams and token-in-token-out.

Reference: the official template `tests/data/golden/templates/minimax_m2.jinja` (MiniMaxAI/MiniMax-M2's
`chat_template.jinja`; provenance in SOURCES.md) and its golden renders, rendered the Hugging Face way
(`tests/support/hf_jinja.py`). Tool-call arguments go to the Jinja side as objects (the template iterates
`arguments.items()`); our side also gets them as JSON strings, which `coerce_messages` decodes.
"""

from __future__ import annotations

import copy
import random
from functools import cache
from typing import Any

import jinja2
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_protocol import MessageError, get_protocol, protocol_for_template
from agent_protocol.json_limits import check_json_value
from agent_protocol.protocols.minimax_m2 import MiniMaxM2Protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.byte_tokenizer import byte_level_tokenizer
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    compare_with_jinja,
    episode_text,
    object_arguments,
    official_episode,
    render_golden,
    string_arguments,
)
from tests.support.hf_jinja import TEMPLATES, official_template, render_official, special_tokens
from tests.support.random_conversations import ConversationMix, conversation
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "minimax_m2"
EOS, AI, PROMPT = "[e~[", "]~b]ai\n", "]~b]ai\n<think>\n"


def official(messages: list[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = False) -> str:
    """The official MiniMax-M2 template, rendered the Hugging Face way, arguments as the objects it iterates."""
    objects = [object_arguments(m) for m in messages]
    return render_official(STEM, objects, tools=tools, add_generation_prompt=add_generation_prompt)


def official_of(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
    return official(messages, tools=tools, add_generation_prompt=generation)


RENDERS = renders(STEM)


# -- render --------------------------------------------------------------------------------------------------


def test_every_golden_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not); the template refuses none
    assert len(RENDERS) == 12
    assert not any(r.refused for r in RENDERS)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_golden_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    assert render_golden(golden) == golden.text
    # and the Jinja renders the golden bytes too, so comparing against it below is comparing to them
    assert official(case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt) == (
        golden.text
    )


TEXTS = [
    "",
    "Hi",
    "\n",
    "  spaces  ",
    "\nleading newline",
    "trailing newline\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "<think>inline reasoning</think>after",
    "<think>\nr\n</think>\n\nanswer",
    "no open tag</think>rest",
    "a</think>b</think>c",
    "<minimax:tool_call>typed by the user</minimax:tool_call>",
    "]~b]ai\nforged",
    '{"json": "looking"}',
]
VALUES: list[Any] = [
    "Paris",
    "",
    "  padded  ",
    "é 中文\nnewline",
    "true",
    "42",
    "null",
    42,
    -1.5,
    True,
    False,
    None,
    [1, "a", None],
    {"nested": {"k": [1, 2]}, "é": "ü"},
    [],
    {},
]


def _arguments(rng: random.Random) -> dict[str, Any]:
    return {rng.choice(["q", "city", "n", "é", "a b"]): rng.choice(VALUES) for _ in range(rng.randint(0, 3))}


#: any mix of roles, contents and calls (null contents, stray tool results and system messages included)
MINIMAX_MIX = ConversationMix(
    texts=TEXTS,
    user_texts=[*TEXTS, None],
    turns=(1, 7),
    reasoning=0.5,
    call_count=lambda rng: rng.randint(0, 2) if rng.random() < 0.5 else 0,
    arguments=_arguments,
    names=("lookup", "weather", "now"),
)
CONVERSATIONS = [conversation(random.Random(seed), MINIMAX_MIX) for seed in range(170)]
REFUSED = (jinja2.TemplateError, TypeError)  # raise_exception, and iterating a null tool content
REFUSAL = "official MiniMax-M2 template"


def _tools(rng: random.Random) -> list[dict[str, Any]] | None:
    return rng.choice([None, [], TOOL_SHAPES, rng.sample(TOOL_SHAPES, 2), [TOOL_SHAPES[3]]])


def _null_tool_contents(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every other conversation with its tool results' contents null (the template refuses them)."""
    out = copy.deepcopy(messages)
    for message in out:
        if message["role"] == "tool":
            message["content"] = None
    return out


def test_render_equals_official_jinja_on_generated_conversations() -> None:
    protocol = get_protocol("minimax-m2")
    conversations = [(m, _tools(random.Random(index))) for index, m in enumerate(CONVERSATIONS)]
    compared, refused = compare_with_jinja(protocol, official_of, conversations, refused_by=REFUSED, refusal=REFUSAL)
    assert compared + refused == 2 * len(CONVERSATIONS)
    assert compared >= 240 and refused >= 20  # both kinds are reached
    # the same conversations with every call's arguments as the JSON string OpenAI clients send
    as_strings = [(string_arguments(m), tools) for m, tools in conversations]
    assert compare_with_jinja(protocol, official_of, as_strings, refused_by=REFUSED, refusal=REFUSAL) == (
        compared,
        refused,
    )
    # null tool contents are refused as the template refuses them
    nulls = [(_null_tool_contents(m), tools) for m, tools in conversations[:40]]
    compare_with_jinja(protocol, official_of, nulls, refused_by=REFUSED, refusal=REFUSAL)
    with_calls = [m for m in CONVERSATIONS if any("tool_calls" in x for x in m)]
    assert len(with_calls) >= 60
    assert sum(1 for m in CONVERSATIONS if any("reasoning_content" in x for x in m)) >= 60
    assert sum(1 for m in CONVERSATIONS if any(x["role"] == "system" for x in m[1:])) >= 20


@pytest.mark.parametrize(
    ("messages", "match", "template_error"),
    [
        ([{"role": "user", "content": "q"}, {"role": "tool", "content": "5"}], r"messages\[1\]", "no previous"),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "5"}],
            r"messages\[2\]",
            "no previous",
        ),
        ([{"role": "system", "content": "s"}, {"role": "tool", "content": "5"}], r"messages\[1\]", "no previous"),
    ],
    ids=["after_user", "after_turn_without_calls", "after_system"],
)
def test_tool_message_without_a_call_before_it_is_refused(
    messages: list[dict[str, Any]], match: str, template_error: str
) -> None:
    with pytest.raises(jinja2.TemplateError, match=template_error):
        official(messages)
    with pytest.raises(MessageError, match=match):
        get_protocol("minimax-m2").render_messages(messages)


def test_a_tool_without_a_function_object_is_refused() -> None:
    flat = {"name": "now", "description": "d", "parameters": {"type": "object", "properties": {}}}
    messages = [{"role": "user", "content": "q"}]
    with pytest.raises(TypeError):  # the template dumps `tool.function`, which is undefined
        official(messages, tools=[flat])
    with pytest.raises(MessageError, match=r"tools\[0\].*function"):
        get_protocol("minimax-m2").render_messages(messages, tools=[flat])


def test_template_quirks_are_kept() -> None:
    protocol = get_protocol("minimax-m2")
    # a system message after the first is dropped; a null content prints "None"; an empty system gets the default
    messages = [
        {"role": "system", "content": ""},
        {"role": "user", "content": None},
        {"role": "system", "content": "dropped"},
        {"role": "assistant", "content": None},
    ]
    text = protocol.render_messages(messages)
    assert text == official(messages)
    assert text == "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nNone[e~[\n]~b]ai\nNone[e~[\n"


def test_registry_and_detection() -> None:
    assert isinstance(get_protocol("minimax-m2"), MiniMaxM2Protocol)
    with pytest.raises(TypeError):
        get_protocol("minimax-m2", enable_thinking=False)
    assert get_protocol("minimax-m2").generation_prompt == PROMPT
    template = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    assert protocol_for_template(template) == "minimax-m2"
    # llama.cpp's copy with ochafik's `.function.name` fix, and unsloth's edited one, are the same format
    fixed = template.replace("message.tool_calls[-1].name", "message.tool_calls[-1].function.name")
    assert protocol_for_template(fixed) == "minimax-m2"


def test_the_function_name_fix_renders_the_same_bytes() -> None:
    """llama.cpp's copy of this template differs in one place (`tool_calls[-1].function.name`, the fix minja
    asked for); with OpenAI-shaped calls, all this package passes, the two render the same bytes and refuse the
    same conversations."""
    source = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    fixed = source.replace("message.tool_calls[-1].name", "message.tool_calls[-1].function.name")
    assert fixed != source
    env = official_template(STEM).environment
    other = env.from_string(fixed)
    for index, messages in enumerate(CONVERSATIONS[:60]):
        objects = [object_arguments(m) for m in messages]
        try:
            expected = official(messages, add_generation_prompt=True)
        except REFUSED:
            with pytest.raises(REFUSED):
                other.render(messages=objects, tools=None, add_generation_prompt=True)
            continue
        assert other.render(messages=objects, tools=None, add_generation_prompt=True) == expected, index


# -- parse ---------------------------------------------------------------------------------------------------
# vLLM's `minimax_m2` tool parser (MinimaxM2ToolParser) and its `minimax_m2` reasoning parser.


def _invoke(name: str, *pairs: tuple[str, str]) -> str:
    return (
        f'<invoke name="{name}">\n'
        + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in pairs)
        + ("</invoke>\n")
    )


def _block(*invokes: str) -> str:
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


SCHEMA_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "b": {"type": "boolean"},
                "o": {"type": "object"},
                "a": {"type": "array"},
                "u": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "e": {"enum": [1, 2, 3]},
                "l": {"type": ["boolean", "null"]},
                "r": {"$ref": "#/$defs/x"},
            },
        },
    },
}


def test_parse_reasoning_content_and_calls() -> None:
    text = (
        "I should look it up.\n</think>\n\nLet me check.\n"
        + _block(_invoke("get_weather", ("city", "Paris"), ("days", "3")), _invoke("now"))
        + EOS
    )
    action = get_protocol("minimax-m2").parse_assistant_text(text, call_id_prefix="t1")
    assert action.reasoning_content == "I should look it up."
    assert action.content == "Let me check."
    # no tools in the request: every value is a string, as vLLM keeps it
    assert [(c.id, c.name, c.arguments, c.ok) for c in action.tool_calls] == [
        ("t1_0", "get_weather", {"city": "Paris", "days": "3"}, True),
        ("t1_1", "now", {}, True),
    ]
    assert action.issues == ()


@pytest.mark.parametrize(
    ("key", "written", "value"),
    [
        ("s", "391", "391"),  # a string parameter keeps its text (the GLM bug the issue names)
        ("s", "  padded\n", "padded"),  # values are stripped, as vLLM strips them
        ("s", "null", None),  # the null words are null whatever the type, as in vLLM
        ("s", "NIL", None),
        ("i", "42", 42),
        ("i", "4.5", 4.5),  # not an integer: the JSON fallback
        ("i", "x", "x"),  # nor JSON: the text
        ("n", "2.0", 2),  # a whole number is an int, as vLLM's `val if val != int(val) else int(val)`
        ("n", "-1.5", -1.5),
        ("n", "1e999", "1e999"),  # an infinity: the text (vLLM drops every call of the turn)
        ("b", "yes", True),
        ("b", "Off", False),
        ("b", "maybe", "maybe"),
        ("o", '{"k": [1, null]}', {"k": [1, None]}),
        ("a", "[1, 2]", [1, 2]),
        ("a", "[1, 2", "[1, 2"),
        ("u", "7", 7),  # integer is tried before string
        ("u", "seven", "seven"),
        ("e", "2", 2),  # the enum's values give the type
        ("l", "true", True),
        ("r", "12", "12"),  # a schema without a type: string
        ("unknown", "12", "12"),  # a parameter the schema does not name: string
    ],
)
def test_parse_types_values_by_the_tools_as_vllm(key: str, written: str, value: Any) -> None:
    protocol = get_protocol("minimax-m2").with_tools([SCHEMA_TOOL])
    text = "</think>\n\n" + _block(_invoke("f", (key, written))) + EOS
    (call,) = protocol.parse_assistant_text(text).tool_calls
    assert call.ok and call.arguments == {key: value}, call
    # without the tools (vLLM with none in the request) every value but the null words stays a string
    (bare,) = get_protocol("minimax-m2").parse_assistant_text(text).tool_calls
    assert bare.arguments == {key: None if written.lower() in ("null", "nil") else written.strip()}


def test_parse_follows_vllm_on_layout() -> None:
    protocol = get_protocol("minimax-m2")
    # quotes of either kind or none around names, whitespace around them; a repeated key: the last wins
    body = "<invoke name='f'><parameter name= a >1</parameter><parameter name=\"a\">2</parameter></invoke>"
    (call,) = protocol.parse_assistant_text("</think>" + _block(body)).tool_calls
    assert (call.name, call.arguments) == ("f", {"a": "2"})
    (call,) = protocol.parse_assistant_text("</think>" + _block("<invoke name=g>\n</invoke>")).tool_calls
    assert (call.name, call.arguments) == ("g", {})
    # content is the text before the first block; text between and after blocks is dropped, as vLLM does
    action = protocol.parse_assistant_text(
        "r</think>\n\nlead\n" + _block(_invoke("f")) + " between " + _block(_invoke("g")) + " after" + EOS
    )
    assert action.content == "lead" and [c.name for c in action.tool_calls] == ["f", "g"]
    # a block inside the reasoning is reasoning
    action = protocol.parse_assistant_text("maybe " + _block(_invoke("f")) + "</think>\n\nno call")
    assert action.tool_calls == () and action.content == "no call" and action.reasoning_content.startswith("maybe")
    # a repeated <think> (the prompt already opened it) is read past, as vLLM's reasoning parser does
    action = protocol.parse_assistant_text("<think>\nr\n</think>\n\nok" + EOS)
    assert (action.reasoning_content, action.content) == ("r", "ok")
    # an empty reasoning is none; blocks without an invoke leave the whole text as content (vLLM)
    action = protocol.parse_assistant_text("</think>\n\n<minimax:tool_call>\n</minimax:tool_call>")
    assert action.reasoning_content is None and action.content == "<minimax:tool_call>\n</minimax:tool_call>"


PARAM = '<parameter name="x">1</parameter>'
DEEP, SURROGATE = "[" * 150 + "]" * 150, '"\\ud800"'


@pytest.mark.parametrize(
    ("text", "code", "name", "words"),
    [
        ('<minimax:tool_call>\n<invoke name="f">\n' + PARAM, "unclosed_tag", "", "cut off"),
        ('<minimax:tool_call>\n<invoke name="f">\n' + PARAM + "</minimax:tool_call>", "unclosed_tag", "", "cut off"),
        ("<minimax:tool_call><invoke name=>" + PARAM + "</invoke></minimax:tool_call>", "missing_name", "", "name"),
        ('<minimax:tool_call><invoke name="a b"></invoke></minimax:tool_call>', "missing_name", "", "name"),
        ("<minimax:tool_call><invoke name=f</invoke></minimax:tool_call>", "missing_name", "", "name"),
        (
            '<minimax:tool_call><invoke name="f"><parameter name="x">1</invoke></minimax:tool_call>',
            "invalid_arguments",
            "f",
            "never closed",
        ),
        (
            '<minimax:tool_call><invoke name="f"><parameter name=>1</parameter></invoke></minimax:tool_call>',
            "invalid_arguments",
            "f",
            "no name",
        ),
        (
            f'<minimax:tool_call><invoke name="f"><parameter name="x">{chr(0xD800)}</parameter></invoke>'
            "</minimax:tool_call>",
            "invalid_arguments",
            "f",
            "surrogate",
        ),
    ],
    ids=["cut_off_block", "cut_off_invoke", "empty_name", "name_with_space", "name_never_ends", "unclosed_parameter",
         "nameless_parameter", "lone_surrogate"],
)  # fmt: skip
def test_malformed_calls_become_coded_issues(text: str, code: str, name: str, words: str) -> None:
    protocol = get_protocol("minimax-m2").with_tools([SCHEMA_TOOL])
    action = protocol.parse_assistant_text("</think>\n\n" + text)
    (call,) = action.tool_calls
    assert call.error is not None and call.error.code == code, call
    assert call.name == name and words in call.error.message
    assert call.raw is not None and not action.valid_tool_calls


def test_json_beyond_the_limits_is_an_invalid_call() -> None:
    protocol = get_protocol("minimax-m2").with_tools([SCHEMA_TOOL])
    for written in (DEEP, SURROGATE):
        (call,) = protocol.parse_assistant_text("</think>" + _block(_invoke("f", ("o", written)))).tool_calls
        assert call.error is not None and call.error.code == "invalid_arguments", call
        assert "cannot be read" in call.error.message


def test_unclosed_reasoning_is_an_issue() -> None:
    action = get_protocol("minimax-m2").parse_assistant_text("still thinking " + _block(_invoke("f")))
    assert action.error is not None and action.error.code == "missing_think_end"
    assert action.tool_calls == () and action.reasoning_content is not None and action.content == ""


CANONICAL: list[tuple[str, Any]] = [
    ("s", "Paris"),
    ("s", "é 中文\nnewline"),
    ("s", "391"),
    ("i", 42),
    ("n", -1.5),
    ("b", True),
    ("b", False),
    ("o", {"nested": {"k": [1, 2]}, "é": "ü"}),
    ("a", [1, "a", None]),
    ("l", None),
]


def _generated_message(rng: random.Random, *, reasoning: bool) -> dict[str, Any]:
    """An assistant message as a parse gives it back: text without outer newlines, values whose text reads back as
    themselves under SCHEMA_TOOL's types."""
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", "Sure.", "é 中文\ntwo lines"])}
    if reasoning:
        message["reasoning_content"] = rng.choice(["think", "step 1\nstep 2", "  padded  "])
    calls = rng.choice([0, 0, 1, 2])
    if calls:
        message["tool_calls"] = [
            {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "f", "arguments": dict(rng.sample(CANONICAL, rng.randint(0, 4)))},
            }
            for k in range(calls)
        ]
    return message


def test_parse_of_a_generation_renders_back_the_same() -> None:
    protocol = get_protocol("minimax-m2").with_tools([SCHEMA_TOOL])
    history = [{"role": "user", "content": "q"}]
    for seed in range(150):
        message = _generated_message(random.Random(seed), reasoning=seed % 3 != 0)
        parsed = protocol.assistant_message(protocol.render_generation(message))
        assert all(call.ok for call in parsed.tool_calls), seed
        assert parsed.content == message["content"], seed
        assert parsed.reasoning_content == message.get("reasoning_content"), seed
        want = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == want, seed
        assert protocol.render_messages([*history, parsed]) == protocol.render_messages([*history, message]), seed


MINIMAX_PIECES = ["<minimax:tool_call>", "</minimax:tool_call>", "<invoke name=", "</invoke>", "<parameter name=",
                  "</parameter>", '"f">', ">", "<think>", "</think>", EOS, "]~b]", "\n", " ", "f", "null", "[" * 200,
                  "9" * 5000, '"\\ud800"', "{1, 2}", "1e999", "NaN", "\x00"]  # fmt: skip


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(MINIMAX_PIECES) | st.text(max_size=8), max_size=30).map("".join))
def test_parser_never_raises_on_minimax_shaped_garbage(text: str) -> None:
    # the shared fuzz test (test_parse_fuzz.py) mixes every family's tags; this one mixes MiniMax's
    for protocol in (get_protocol("minimax-m2"), get_protocol("minimax-m2").with_tools([SCHEMA_TOOL])):
        action = protocol.parse_turn(text)  # parse_turn, not the catching boundary
        for call in action.tool_calls:
            check_json_value(call.arguments)
            if call.ok:
                msgspec.json.encode(call.arguments)


# -- generation and feedback ---------------------------------------------------------------------------------
# The generation prompt opens the reasoning; the model writes it, `</think>`, its answer or calls and `[e~[`. The
# template keeps every turn's reasoning after the last user message, so with reasoning the transcript is the
# official render. Seams: a turn written with empty reasoning (the transcript holds `<think>\n</think>\n\n`, the
# template no think block), and reasoning before a later user message (the template drops it).


def _episode(rng: random.Random) -> list[dict[str, Any]]:
    """A conversation an episode can have, every assistant turn generated, each with reasoning (no seam)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(TEXTS)}] if rng.random() < 0.4 else []
    messages.append({"role": "user", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 4)):
        message = _generated_message(rng, reasoning=True)
        messages.append(message)
        calls = len(message.get("tool_calls", []))
        if calls:
            messages.extend(
                {"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(TEXTS)} for k in range(calls)
            )
        if not calls or rng.random() < 0.2:
            if rng.random() < 0.2:
                messages.append({"role": "system", "content": "be brief"})  # dropped by the template, and here
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
    if rng.random() < 0.5:  # the episode ends on a generated turn
        messages.append(_generated_message(rng, reasoning=True))
    return messages


def official_kept(messages: list[dict[str, Any]], tools: Any) -> str:
    """The official render with the template's one condition on reasoning (a turn after the last user message)
    lifted: every turn's reasoning shown, as the transcript keeps what the model wrote. `official_episode`'s
    ending (on a generated turn's `[e~[`, or on the next generation prompt)."""
    source = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    condition = "reasoning_content and loop.index0 > ns.last_user_index"
    assert source.count(condition) == 1
    kept = _kept_template(source.replace(condition, "reasoning_content"))

    def render(msgs: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        objects = [object_arguments(m) for m in msgs]
        return kept.render(messages=objects, tools=tools, add_generation_prompt=generation, **special_tokens(STEM))

    return official_episode(render, messages, tools)


@cache
def _kept_template(source: str) -> jinja2.Template:
    return official_template(STEM).environment.from_string(source)


def test_prompt_generations_and_feedback_concatenate_to_the_official_render() -> None:
    protocol = get_protocol("minimax-m2")
    tool_turns = dropped = 0
    for seed in range(200):
        rng = random.Random(seed)
        messages = _episode(rng)
        tools = _tools(rng)
        text = episode_text(protocol, messages, tools)
        assert text == official_kept(messages, tools), seed
        tool_turns += sum(1 for m in messages if m["role"] == "tool")
        if text == official_episode(official_of, messages, tools):
            continue
        # the only difference: the reasoning of turns before the last user message, which the template drops
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        early = [m for m in messages[:last_user] if m["role"] == "assistant"]
        assert early, seed
        for message in early:
            text = text.replace(f"{AI}<think>\n{message['reasoning_content']}\n</think>\n\n", AI, 1)
        assert text == official_episode(official_of, messages, tools), seed
        dropped += 1
    assert dropped >= 50 and tool_turns >= 100


def test_golden_multi_turn_cases_through_feedback() -> None:
    protocol = get_protocol("minimax-m2")
    for name in ("single_tool_call", "parallel_tool_calls", "multi_turn_reasoning"):
        case = cases()[name]
        messages, tools = case["messages"], case["tools"]
        # turns without reasoning are the empty-reasoning seam (pinned below): give each some
        plain = [
            {**m, "reasoning_content": m.get("reasoning_content") or "thinking"} if m["role"] == "assistant" else m
            for m in messages
        ]
        text = episode_text(protocol, plain, tools)
        assert text == official_kept(plain, tools), name
        if name != "multi_turn_reasoning":  # one user message: the template keeps every turn's reasoning
            assert text == official_episode(official_of, plain, tools), name


def test_empty_reasoning_seam() -> None:
    """A turn written with empty reasoning: the transcript holds the prompt's `<think>\\n` and the model's
    `</think>\\n\\n`; the template renders the turn with no think block."""
    protocol = get_protocol("minimax-m2")
    case = cases()["single_tool_call"]
    messages, tools = case["messages"], case["tools"]
    generated = protocol.render_generation(messages[2])
    assert generated.startswith("</think>\n\n\n<minimax:tool_call>")
    text = episode_text(protocol, messages, tools)
    expected = official_episode(official_of, messages, tools)
    seam = AI + "<think>\n</think>\n\n"
    assert text.count(seam) == 2  # both turns were written without reasoning
    assert text.replace(seam, AI) == expected


def test_reasoning_before_a_later_user_message_is_dropped_by_the_template() -> None:
    protocol = get_protocol("minimax-m2")
    case = cases()["multi_turn_reasoning"]
    messages, tools = case["messages"], case["tools"]
    first = next(m for m in messages if m["role"] == "assistant")
    assert first["role"] == "assistant" and first["reasoning_content"]
    text = episode_text(protocol, messages, tools)
    expected = official_episode(official_of, messages, tools)
    kept = f"{AI}<think>\n{first['reasoning_content']}\n</think>\n\n{first['content']}"
    assert kept in text and kept not in expected
    assert text.replace(kept, AI + first["content"]) == expected


@pytest.mark.parametrize(
    "observations",
    [
        [{"role": "tool", "content": "5"}],
        [{"role": "tool", "content": "5"}, {"role": "tool", "content": "6"}],
        [{"role": "user", "content": "go on"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "go on"}],
    ],
    ids=["tool", "two_tools", "user", "system_then_user"],
)
@pytest.mark.parametrize("closed", [True, False], ids=["closed", "cut_off"])
def test_feedback_continues_the_official_render(observations: list[dict[str, Any]], closed: bool) -> None:
    protocol = get_protocol("minimax-m2")
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    # no reasoning: a user message in the feedback would drop it from the render before (a seam pinned above)
    turn = {"role": "assistant", "content": "a", "tool_calls": [call]}
    history = [{"role": "user", "content": "q"}, turn]
    before = official(history)  # ends "[e~[\n": the model stopped after "[e~["
    after = official(history + observations, add_generation_prompt=True)
    generated = before.removesuffix("\n") if closed else before.removesuffix(EOS + "\n")
    assert after == generated + protocol.render_feedback(observations, turn_closed=closed)


@pytest.mark.parametrize(
    ("messages", "match"),
    [([], "at least one"), ([{"role": "assistant", "content": "x"}], r"messages\[0\].role")],
)
def test_bad_feedback(messages: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(MessageError, match=match):
        get_protocol("minimax-m2").render_feedback(messages)


# -- token-in-token-out through the session ------------------------------------------------------------------
# No MiniMax tokenizer is in a registry here (no `@lenml/tokenizer-minimax*` on npm, none on PyPI), so this is
# text level: a byte-level tokenizer with no merges plus MiniMax's control tokens as added tokens. Its ids
# round-trip text exactly and encode(a + b) == encode(a) + encode(b) away from the control tokens, so "the ids
# equal the encoded official render" is "the text equals the official render".

MINIMAX_SPECIAL_TOKENS = ["]~!b[", "]~b]", "[e~[", "]!d~[", "]!p~[", "<think>", "</think>", "<minimax:tool_call>",
                          "</minimax:tool_call>"]  # fmt: skip


@cache
def minimax_byte_tokenizer() -> Any:
    return byte_level_tokenizer(MINIMAX_SPECIAL_TOKENS, source="minimax-byte-level (test)")


def test_byte_tokenizer_round_trips_text() -> None:
    tokenizer = minimax_byte_tokenizer()
    text = get_protocol("minimax-m2").render_messages(cases()["multi_turn_reasoning"]["messages"], tools=TOOL_SHAPES)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    for token in MINIMAX_SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        assert token_id is not None and token_id >= 256 and tokenizer.encode(token) == [token_id]
    assert ids.count(tokenizer.token_to_id(EOS)) == text.count(EOS)


def calculator_call(expression: str, reasoning: str = "I should use the calculator.") -> str:
    return (
        (f"{reasoning}\n" if reasoning else "") + '</think>\n\n\n<minimax:tool_call>\n<invoke name="calculator">\n'
        f'<parameter name="expression">{expression}</parameter>\n</invoke>\n</minimax:tool_call>{EOS}'
    )


def final_answer(text: str, reasoning: str = "The tool answered.") -> str:
    return f"{reasoning}\n</think>\n\n{text}{EOS}"


def _official_of(trajectory: Any) -> str:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    messages = [message.to_openai() for message in trajectory.messages]
    return official(messages, tools=[CalculatorTool().spec.to_openai()])


def test_session_is_token_in_token_out() -> None:
    first, second = calculator_call("17 * 23"), final_answer("The answer is 391.")
    episode = run_calculator_episode("minimax-m2", minimax_byte_tokenizer(), [first, second], rewards="none")
    result, engine = episode.result, episode.engine
    tokenizer = minimax_byte_tokenizer()
    assert result.final_answer == "The answer is 391."
    trajectory = result.trajectory
    (segment,) = trajectory.segments
    assert [m.role for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[1].tool_calls[0].arguments == {"expression": "17 * 23"}
    assert trajectory.messages[1].reasoning_content == "I should use the calculator."
    # The ids are the official render of the conversation (reasoning kept in both turns: interleaved thinking),
    # up to the last turn's "[e~[", where the render of a finished conversation adds a newline.
    assert segment.ids == tokenizer.encode(_official_of(trajectory).removesuffix("\n"))
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)


def test_session_seam_when_the_model_writes_empty_reasoning() -> None:
    first = calculator_call("17 * 23", reasoning="")
    episode = run_calculator_episode("minimax-m2", minimax_byte_tokenizer(), [first, final_answer("391")],
                                     rewards="none")  # fmt: skip
    tokenizer = minimax_byte_tokenizer()
    (segment,) = episode.result.trajectory.segments
    official_text = _official_of(episode.result.trajectory).removesuffix("\n")
    seam = AI + "<think>\n</think>\n\n"
    assert tokenizer.decode(segment.ids).count(seam) == 1
    assert segment.ids == tokenizer.encode(tokenizer.decode(segment.ids))
    assert tokenizer.decode(segment.ids).replace(seam, AI) == official_text
