"""GLM-4.5 (`glm-4.5`, option `enable_thinking`): renders, parser, feedback seams and token-in-token-out.

Reference: the official template `tests/data/golden/templates/glm4.5.jinja` (typed in by hand from a GGUF log;
see SOURCES.md) and its golden renders. One adaptation on the Jinja side, the same for every render here: the
template calls `tojson(ensure_ascii=False)`, which Hugging Face's `tojson` accepts (`ensure_ascii` is one of its
parameters) and `tests/support/hf_jinja.py`'s filter does not, so `official` renders the template with a
`tojson` that takes it. Tool-call arguments go to the Jinja side as objects (the template iterates
`arguments.items()`); our side also gets them as JSON strings, which `coerce_messages` decodes.
"""

from __future__ import annotations

import json
import random
from functools import cache
from itertools import pairwise
from typing import Any

import jinja2
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_protocol import MessageError, get_protocol
from agent_protocol.json_limits import check_json_value
from agent_protocol.protocols.glm45 import Glm45Protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.byte_tokenizer import byte_level_tokenizer
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    compare_with_jinja,
    episode_text,
    object_arguments,
    render_golden,
    string_arguments,
)
from tests.support.hf_jinja import TEMPLATES, official_template, special_tokens
from tests.support.random_conversations import ConversationMix, conversation
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "glm4.5"
OBSERVATION, USER, SYSTEM, ENDOFTEXT = "<|observation|>", "<|user|>", "<|system|>", "<|endoftext|>"
VARIANTS: dict[str, dict[str, Any]] = {"thinking": {}, "no_thinking": {"enable_thinking": False}}


def _hf_tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' `tojson` filter, with its `ensure_ascii` parameter."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@cache
def _template() -> jinja2.Template:
    env = official_template(STEM).environment.overlay()
    env.filters = {**env.filters, "tojson": _hf_tojson}  # a new dict: hf_jinja's environment is left as it is
    return env.from_string((TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8"))


def official(
    messages: list[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = False, **kwargs: Any
) -> str:
    """The official GLM-4.5 template, rendered the Hugging Face way (see the module docstring)."""
    return _template().render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **special_tokens(STEM), **kwargs
    )


def _case(golden: GoldenRender) -> dict[str, Any]:
    return dict(cases()[golden.case])


RENDERS = renders(STEM)


# -- render --------------------------------------------------------------------------------------------------


def test_every_golden_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not) x 2 (default, enable_thinking=False); the template refuses none
    assert len(RENDERS) == 24
    assert not any(r.refused for r in RENDERS)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_golden_byte_for_byte(golden: GoldenRender) -> None:
    case = _case(golden)
    assert render_golden(golden) == golden.text
    # and the adapted Jinja renders the golden bytes too, so comparing against it below is comparing to them
    kwargs = {"enable_thinking": False} if golden.options else {}
    assert (
        official(case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt, **kwargs)
        == golden.text
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
    "ends with /nothink",
    "/nothink",
    "<tool_call>typed by the user</tool_call>",
    '{"json": "looking"}',
]
VALUES: list[Any] = [
    "Paris",
    "",
    "  padded  ",
    "é 中文\nnewline",
    "true",
    "42",
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


#: any mix of roles, contents and calls the template takes (null content included, a user's too: it prints "None")
GLM_MIX = ConversationMix(
    texts=TEXTS,
    user_texts=[*TEXTS, None],
    turns=(1, 6),
    reasoning=0.5,
    call_count=lambda rng: rng.randint(0, 2) if rng.random() < 0.5 else 0,
    arguments=_arguments,
    names=("lookup", "weather", "now"),
)
CONVERSATIONS = [conversation(random.Random(seed), GLM_MIX) for seed in range(160)]


def _tools(rng: random.Random) -> list[dict[str, Any]] | None:
    return rng.choice([None, [], TOOL_SHAPES, rng.sample(TOOL_SHAPES, 2), [TOOL_SHAPES[3]]])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_render_equals_official_jinja_on_generated_conversations(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.5", **options)

    def official_of(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        objects = [object_arguments(m) for m in messages]  # the template iterates the arguments' items
        return official(objects, tools=tools, add_generation_prompt=generation, **options)

    conversations = [(m, _tools(random.Random(index))) for index, m in enumerate(CONVERSATIONS)]
    assert compare_with_jinja(protocol, official_of, conversations) == (2 * len(CONVERSATIONS), 0)
    # the same conversations with every call's arguments as the JSON string OpenAI clients send
    as_strings = [(string_arguments(m), tools) for m, tools in conversations]
    assert compare_with_jinja(protocol, official_of, as_strings) == (2 * len(CONVERSATIONS), 0)
    assert 2 * len(CONVERSATIONS) >= 300
    assert sum(1 for m in CONVERSATIONS if any("tool_calls" in x for x in m)) >= 50


def test_tool_message_with_null_content_is_refused_as_the_template_fails_on_it() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "content": None}]
    with pytest.raises(TypeError):  # the template iterates the null content
        official(messages)
    with pytest.raises(MessageError, match=r"messages\[1\]\.content.*official GLM-4.5 template"):
        get_protocol("glm-4.5").render_messages(messages)


def test_options_and_registry() -> None:
    assert isinstance(get_protocol("glm-4.5"), Glm45Protocol)
    with pytest.raises(TypeError, match="enable_thinking"):
        get_protocol("glm-4.5", thinking=True)
    assert get_protocol("glm-4.5").generation_prompt == "<|assistant|>"
    assert get_protocol("glm-4.5", enable_thinking=False).generation_prompt == "<|assistant|>\n<think></think>"


# -- parse ---------------------------------------------------------------------------------------------------
# vLLM's `glm45` tool parser (Glm4MoeModelToolParser) with no tool schemas, and its `glm45` reasoning parser.


def _call_block(name: str, *pairs: tuple[str, str]) -> str:
    return (
        f"<tool_call>{name}\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
        + "</tool_call>"
    )


def test_parse_reasoning_content_and_calls() -> None:
    text = (
        "\n<think>I should look it up.</think>\nLet me check.\n"
        + _call_block("get_weather", ("city", "Paris"), ("days", "3"))
        + "\n"
        + _call_block("now")
        + OBSERVATION
    )
    action = get_protocol("glm-4.5").parse_assistant_text(text, call_id_prefix="t1")
    assert action.reasoning_content == "I should look it up."
    assert action.content == "Let me check."
    assert [(c.id, c.name, c.arguments, c.ok) for c in action.tool_calls] == [
        ("t1_0", "get_weather", {"city": "Paris", "days": 3}, True),
        ("t1_1", "now", {}, True),
    ]
    assert action.issues == ()


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ('{"a": [1, null]}', {"a": [1, None]}),  # JSON first
        ("true", True),
        ("-2.5", -2.5),
        ('"quoted"', "quoted"),
        ("'single'", "single"),  # then a Python literal, as vLLM's _deserialize
        ("True", True),
        ("(1, 'a')", [1, "a"]),  # normalized to what JSON holds, as vLLM's json.dumps of the arguments does
        ("{1, 2}", "{1, 2}"),  # a set has no JSON form: the text (vLLM would fail the whole turn)
        ("hello world", "hello world"),  # else the text itself
        ("  padded\n", "padded"),  # stripped first (vLLM strips values it deserializes)
        ("multi\nline", "multi\nline"),
        ("", ""),
    ],
)
def test_parse_values_like_vllm(written: str, value: Any) -> None:
    text = "\n<think></think>\n" + _call_block("f", ("x", written)) + OBSERVATION
    (call,) = get_protocol("glm-4.5").parse_assistant_text(text).tool_calls
    assert call.ok and call.arguments == {"x": value}


def test_parse_follows_vllm_on_layout() -> None:
    protocol = get_protocol("glm-4.5")
    # whitespace between key and value, padded keys and names, a repeated key (the last wins)
    pairs = "<arg_key> a </arg_key>  \n <arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>"
    body = f"<tool_call>  f  \n{pairs}</tool_call>"
    (call,) = protocol.parse_assistant_text(body).tool_calls
    assert (call.name, call.arguments) == ("f", {"a": 2})
    # content is the text before the first call; text between and after calls is dropped, as vLLM does
    action = protocol.parse_assistant_text("lead\n" + _call_block("f") + " between " + _call_block("g") + " after")
    assert action.content == "lead" and [c.name for c in action.tool_calls] == ["f", "g"]
    # a <tool_call> inside the reasoning is reasoning
    action = protocol.parse_assistant_text("\n<think>maybe " + _call_block("f") + "</think>\nno call" + USER)
    assert action.tool_calls == () and action.content == "no call" and action.reasoning_content.startswith("maybe")
    # with enable_thinking=False the turn starts after the prompt's empty reasoning block
    action = get_protocol("glm-4.5", enable_thinking=False).parse_assistant_text("\nThe answer is 4." + USER)
    assert (action.content, action.reasoning_content, action.tool_calls) == ("The answer is 4.", None, ())
    for stop in (OBSERVATION, USER, ENDOFTEXT):  # one stop token at the end is not content
        assert protocol.parse_assistant_text("\n<think></think>\nok" + stop).content == "ok"


KEY, VALUE = "<arg_key>x</arg_key>", "<arg_value>{}</arg_value>"
DEEP, SURROGATE = "[" * 150 + "]" * 150, '"\\ud800"'


@pytest.mark.parametrize(
    ("text", "code", "name", "words"),
    [
        (f"<tool_call>f\n{KEY}\n<arg_value>1", "unclosed_tag", "f", "cut off"),
        ("<tool_call>now</tool_call>", "invalid_arguments", "", "own line"),
        (f"<tool_call>\n{KEY}{VALUE.format(1)}</tool_call>", "missing_name", "", "no function name"),
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "invalid_arguments", "", "outside the"),
        ("<tool_call>f\nx=1\n</tool_call>", "invalid_arguments", "f", "outside the"),
        (f"<tool_call>f\n{KEY}\n</tool_call>", "invalid_arguments", "f", "no <arg_value>"),
        (f"<tool_call>f\n{KEY}<arg_value>1</tool_call>", "invalid_arguments", "f", "never closed"),
        (f"<tool_call>f\n<arg_key>x{VALUE.format(1)}</tool_call>", "invalid_arguments", "f", "never closed"),
        (f"<tool_call>f\n{KEY}{VALUE.format(DEEP)}</tool_call>", "invalid_arguments", "f", "too deeply"),
        (f"<tool_call>f\n{KEY}{VALUE.format(SURROGATE)}</tool_call>", "invalid_arguments", "f", "surrogate"),
    ],
    ids=["cut_off", "no_name_line", "empty_name", "hermes_json", "stray_text", "key_without_value",
         "unclosed_value", "unclosed_key", "too_deep", "lone_surrogate"],
)  # fmt: skip
def test_malformed_calls_become_coded_issues(text: str, code: str, name: str, words: str) -> None:
    action = get_protocol("glm-4.5").parse_assistant_text("\n<think></think>\n" + text + OBSERVATION)
    (call,) = action.tool_calls
    assert call.error is not None and call.error.code == code, call
    assert call.name == name and words in call.error.message
    assert call.raw is not None and not action.valid_tool_calls


def test_unclosed_reasoning_is_an_issue() -> None:
    action = get_protocol("glm-4.5").parse_assistant_text("\n<think>still thinking " + _call_block("f"))
    assert action.error is not None and action.error.code == "missing_think_end"
    assert action.tool_calls == () and action.reasoning_content is not None


def _episode_message(rng: random.Random, *, reasoning: bool) -> dict[str, Any]:
    """An assistant message as a parse gives it back: stripped text, values whose text reads back as itself."""
    canonical = [v for v in VALUES if not ((isinstance(v, str) and v != v.strip()) or v in ("true", "42"))]
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", "Sure.", "é 中文\ntwo lines"])}
    if reasoning:
        message["reasoning_content"] = rng.choice(["", "think", "step 1\nstep 2"])
    calls = rng.choice([0, 0, 1, 2])
    if calls:
        message["tool_calls"] = [
            {
                "id": f"c{k}",
                "function": {
                    "name": rng.choice(["lookup", "weather"]),
                    "arguments": {key: rng.choice(canonical) for key in rng.sample(["q", "n", "é"], rng.randint(0, 3))},
                },
            }
            for k in range(calls)
        ]
    return message


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parse_of_a_generation_renders_back_the_same(variant: str) -> None:
    protocol = get_protocol("glm-4.5", **VARIANTS[variant])
    history = [{"role": "user", "content": "q"}]
    for seed in range(150):
        message = _episode_message(random.Random(seed), reasoning=variant == "thinking")
        parsed = protocol.assistant_message(protocol.render_generation(message))
        assert all(call.ok for call in parsed.tool_calls), seed
        assert protocol.render_messages([*history, parsed]) == protocol.render_messages([*history, message]), seed


GLM_PIECES = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>",
              "</think>", OBSERVATION, USER, ENDOFTEXT, "\n", " ", "f", "[" * 200, "9" * 5000, '"\\ud800"', "{1, 2}",
              "(" * 300, "'x'", "1e999", "NaN", "\x00"]  # fmt: skip


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(GLM_PIECES) | st.text(max_size=8), max_size=30).map("".join))
def test_parser_never_raises_on_glm_shaped_garbage(text: str) -> None:
    # the shared fuzz test (test_parse_fuzz.py) mixes Qwen tags; this one mixes GLM's
    action = get_protocol("glm-4.5").parse_turn(text)  # parse_turn, not the catching boundary
    for call in action.tool_calls:
        check_json_value(call.arguments)
        if call.ok:
            msgspec.json.encode(call.arguments)


# -- generation and feedback ---------------------------------------------------------------------------------
# GLM has no end-of-turn token: a turn ends on the role token the model writes for what comes next, which is
# also where the template's next message starts. The feedback leaves that token out when it is the one it opens
# with; otherwise (the seams) the sampled token stays and the feedback writes the one it needs after it.

ROLE_TOKENS = {"user": USER, "tool": OBSERVATION, "system": SYSTEM}


def transcript_text(protocol: Any, messages: list[dict[str, Any]], tools: Any) -> str:
    """What an episode's transcript holds: the first prompt, each assistant turn as generated (up to and
    including the role token it ended on) and each feedback, told which token the turn ended on."""
    return episode_text(protocol, messages, tools, ended_by=_role_token_ending)


def _role_token_ending(generated: str) -> str:
    return next(t for t in (OBSERVATION, USER) if generated.endswith(t))


def expected_transcript(messages: list[dict[str, Any]], tools: Any, options: dict[str, Any]) -> str:
    """The official render of `messages`, plus the role token each assistant turn sampled where it is not the
    token the next message opens with (kept before it), and the last turn's token when the conversation ends
    on an assistant turn (the render of a finished conversation stops before it)."""
    full = official(messages, tools=tools, add_generation_prompt=messages[-1]["role"] != "assistant", **options)
    out, cursor = "", 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        sampled = OBSERVATION if message.get("tool_calls") else USER
        before = official(messages[: index + 1], tools=tools, **options)
        assert full.startswith(before), "the template is append-only for these conversations"
        if index + 1 == len(messages):
            out, cursor = out + full[cursor:] + sampled, len(full)
        elif ROLE_TOKENS[messages[index + 1]["role"]] != sampled:
            out, cursor = out + full[cursor : len(before)] + sampled, len(before)
    return out + full[cursor:]


def without_reasoning(messages: list[dict[str, Any]], *, before: int) -> list[dict[str, Any]]:
    """`messages` with the reasoning of assistant turns before index `before` removed."""
    return [
        {k: v for k, v in m.items() if k != "reasoning_content"} if m["role"] == "assistant" and i < before else m
        for i, m in enumerate(messages)
    ]


def _episode(rng: random.Random, *, thinking: bool) -> list[dict[str, Any]]:
    """A conversation an episode can have: every assistant turn is generated. Some turns are followed by what
    the model did not announce (tool results after `<|user|>`, a user after `<|observation|>`, a system message)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(TEXTS)}] if rng.random() < 0.4 else []
    messages.append({"role": "user", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 4)):
        message = _episode_message(rng, reasoning=False)
        messages.append(message)
        calls = len(message.get("tool_calls", []))
        roll = rng.random()
        if calls and roll < 0.85:
            messages.extend(
                {"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(TEXTS)} for k in range(calls)
            )
            if rng.random() < 0.2:
                messages.append({"role": "user", "content": rng.choice(TEXTS)})
        elif roll < 0.8:
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
        elif roll < 0.9:
            messages.append({"role": "tool", "tool_call_id": "x", "content": rng.choice(TEXTS)})
        else:
            messages.extend([{"role": "system", "content": "be brief"}, {"role": "user", "content": "go on"}])
    if rng.random() < 0.5:  # the episode ends on a generated turn
        messages.append(_episode_message(rng, reasoning=False))
    if thinking:  # reasoning where the template keeps it: the turns after the last user message
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        for message in messages[last_user + 1 :]:
            if message["role"] == "assistant" and rng.random() < 0.7:
                message["reasoning_content"] = rng.choice(["think", "step 1\nstep 2", "  padded  "])
    return messages


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompt_generations_and_feedback_concatenate_to_the_official_render(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.5", **options)
    seams = 0
    for seed in range(200):
        rng = random.Random(seed)
        messages = _episode(rng, thinking=not options)
        tools = _tools(rng)
        expected = expected_transcript(messages, tools, options)
        assert transcript_text(protocol, messages, tools) == expected, seed
        seams += sum(
            m["role"] == "assistant" and ROLE_TOKENS[n["role"]] != (OBSERVATION if m.get("tool_calls") else USER)
            for m, n in pairwise(messages)
        )
    assert seams >= 20  # the generator does reach the seams


def _episode_golden() -> list[GoldenRender]:
    """The golden multi-turn cases, one render each: with a generation prompt unless they end on a turn."""
    chosen = []
    for golden in RENDERS:
        messages = _case(golden)["messages"]
        has_turns = any(m["role"] == "assistant" for m in messages)
        if has_turns and golden.add_generation_prompt != (messages[-1]["role"] == "assistant"):
            chosen.append(golden)
    return chosen


@pytest.mark.parametrize("golden", _episode_golden(), ids=lambda g: g.id)
def test_golden_cases_through_feedback(golden: GoldenRender) -> None:
    case = _case(golden)
    protocol = get_protocol(golden.protocol, **golden.options)
    messages = case["messages"]
    # reasoning the model could not have written (thinking off) or the template drops (before the last user
    # message) is left out here; test_reasoning_seams pins those two seams
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    plain = without_reasoning(messages, before=len(messages) if golden.options else last_user)
    expected = expected_transcript(plain, case["tools"], golden.options)
    assert transcript_text(protocol, plain, case["tools"]) == expected
    ends_on_turn = messages[-1]["role"] == "assistant"
    if plain == messages:  # the golden bytes themselves, where nothing was left out
        assert expected == golden.text + (USER if ends_on_turn else "")


def test_reasoning_seams() -> None:
    case = cases()["multi_turn_reasoning"]
    messages, tools = case["messages"], case["tools"]
    first_reasoning = messages[1]["reasoning_content"]
    assert messages[1]["role"] == "assistant" and first_reasoning
    # Thinking on: a new user message makes the template render earlier turns with an empty <think></think>;
    # the transcript keeps the reasoning the model generated. That is the only difference.
    official_text = official(messages, tools=tools) + USER
    kept = transcript_text(get_protocol("glm-4.5"), messages, tools)
    assert official_text.count("<think></think>") == 1
    assert kept == official_text.replace("<think></think>", f"<think>{first_reasoning}</think>")
    # Thinking off: the model writes no reasoning after the prompt's empty block, so a message's reasoning is
    # not generated; the template shows it for the turns after the last user message.
    off = get_protocol("glm-4.5", enable_thinking=False)
    assert (
        off.render_generation({"role": "assistant", "content": "ok", "reasoning_content": "hidden"}) == "\nok<|user|>"
    )
    shown = official(messages, tools=tools, enable_thinking=False)
    assert "<think>The tool says 18 degrees and sunny.</think>" in shown
    no_reasoning = without_reasoning(messages, before=len(messages))
    assert transcript_text(off, messages, tools) == official(no_reasoning, tools=tools, enable_thinking=False) + USER


def test_role_token_seams() -> None:
    protocol = get_protocol("glm-4.5")
    tool = [{"role": "tool", "content": "5"}]
    user = [{"role": "user", "content": "and?"}]
    tail = "\n<tool_response>\n5\n</tool_response><|assistant|>"
    # the usual closings: the token the model wrote is not written again
    assert protocol.render_feedback(tool, ended_by=OBSERVATION) == tail
    assert protocol.render_feedback(user, ended_by=USER) == "\nand?<|assistant|>"
    assert protocol.render_feedback(tool) == tail  # ended_by unknown: the usual closing
    # seams: the model wrote another token than the one the feedback opens with; it stays, the right one follows
    assert protocol.render_feedback(tool, ended_by=USER) == OBSERVATION + tail
    assert protocol.render_feedback(tool, ended_by=ENDOFTEXT) == OBSERVATION + tail
    assert protocol.render_feedback(user, ended_by=OBSERVATION) == "<|user|>\nand?<|assistant|>"
    system = [{"role": "system", "content": "s"}, *user]
    assert protocol.render_feedback(system) == "<|system|>\ns<|user|>\nand?<|assistant|>"  # never a stop token


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize(
    "observations",
    [[{"role": "tool", "content": "5"}], [{"role": "user", "content": "go on"}], [{"role": "system", "content": "s"}]],
    ids=["tool", "user", "system"],
)
def test_cut_off_turn_gets_the_whole_opening(variant: str, observations: list[dict[str, Any]]) -> None:
    # The turn was cut by the length limit, so no role token was sampled: the feedback is exactly what the
    # template renders after that (cut) turn.
    options = VARIANTS[variant]
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a long answer that was cu"}]
    feedback = get_protocol("glm-4.5", **options).render_feedback(observations, turn_closed=False)
    before = official(history, **options)
    after = official(history + observations, add_generation_prompt=True, **options)
    assert after == before + feedback


@pytest.mark.parametrize(
    ("messages", "match"),
    [([], "at least one"), ([{"role": "assistant", "content": "x"}], r"messages\[0\].role")],
)
def test_bad_feedback(messages: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(MessageError, match=match):
        get_protocol("glm-4.5").render_feedback(messages)


# -- token-in-token-out through the session ------------------------------------------------------------------
# No GLM tokenizer is in the repository, so this is text-level: a byte-level tokenizer with no merges (every
# byte one id) plus GLM's special tokens as added tokens. Its ids round-trip text exactly and encode(a + b) ==
# encode(a) + encode(b) away from the special tokens, so "the ids equal the encoded official render" is "the
# text equals the official render" (GLM's real BPE merges would only change how the same text is cut).

GLM_SPECIAL_TOKENS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                      "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                      "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]  # fmt: skip


@cache
def glm_byte_tokenizer() -> Any:
    return byte_level_tokenizer(GLM_SPECIAL_TOKENS, source="glm-byte-level (test)")


def test_byte_tokenizer_round_trips_text() -> None:
    tokenizer = glm_byte_tokenizer()
    text = get_protocol("glm-4.5").render_messages(cases()["multi_turn_reasoning"]["messages"], tools=TOOL_SHAPES)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    # every control token is one id, as in GLM's real vocabulary, and every other byte its own
    for token in GLM_SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        assert token_id is not None and token_id >= 256 and tokenizer.encode(token) == [token_id]
    assert ids.count(tokenizer.token_to_id(USER)) == text.count(USER)
    assert ids.count(tokenizer.token_to_id(OBSERVATION)) == text.count(OBSERVATION)
    assert len(ids) == len(text.encode()) - sum(text.count(t) * (len(t.encode()) - 1) for t in GLM_SPECIAL_TOKENS)
    for token in GLM_SPECIAL_TOKENS:
        assert tokenizer.encode(token) == [tokenizer.token_to_id(token)]


def calculator_call(expression: str, reasoning: str = "I should use the calculator.", ends: str = OBSERVATION) -> str:
    return (
        f"\n<think>{reasoning}</think>\n<tool_call>calculator\n<arg_key>expression</arg_key>\n"
        f"<arg_value>{expression}</arg_value>\n</tool_call>{ends}"
    )


def final_answer(text: str, reasoning: str = "The tool answered.") -> str:
    return f"\n<think>{reasoning}</think>\n{text}{USER}"


def _run_episode(script: list[str], **options: Any) -> tuple[Any, Any]:
    protocol = get_protocol("glm-4.5", **options)
    episode = run_calculator_episode(protocol, glm_byte_tokenizer(), script, rewards="none")
    return episode.result, episode.engine


def _official_of(trajectory: Any, **options: Any) -> str:
    """The official Jinja render of the episode's messages (arguments as objects, as the template needs)."""
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    messages = [object_arguments(message.to_openai()) for message in trajectory.messages]
    return official(messages, tools=[CalculatorTool().spec.to_openai()], **options)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_session_is_token_in_token_out(variant: str) -> None:
    options = VARIANTS[variant]
    thinking = not options
    first = calculator_call("17 * 23") if thinking else calculator_call("17 * 23").split("</think>", 1)[1]
    second = final_answer("The answer is 391.") if thinking else final_answer("The answer is 391.").split("</think>")[1]
    result, engine = _run_episode([first, second], **options)
    tokenizer = glm_byte_tokenizer()
    assert result.final_answer == "The answer is 391."
    trajectory = result.trajectory
    (segment,) = trajectory.segments
    assert [m.role for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[1].tool_calls[0].arguments == {"expression": "17 * 23"}
    # The ids are the official render of the conversation, plus the one seam at the end: the last turn's
    # `<|user|>` was sampled (it ended the turn), and the render of a finished conversation stops before it.
    official_text = _official_of(trajectory, **options)
    assert segment.ids == tokenizer.encode(official_text + USER)
    # Each turn's ids are exactly the sampled ids, its role token included; the feedback does not repeat it.
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    assert tokenizer.decode(segment.ids).count(OBSERVATION) == 1
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)


def test_session_seam_when_the_model_announces_the_wrong_role() -> None:
    # The model calls a tool but ends the turn with <|user|>: that token was sampled and stays; the feedback
    # writes the <|observation|> the tool results need after it. The official render has only the latter.
    wrong = calculator_call("17 * 23", ends=USER)
    result, _ = _run_episode([wrong, final_answer("391")])
    tokenizer = glm_byte_tokenizer()
    (segment,) = result.trajectory.segments
    official_text = _official_of(result.trajectory)
    seam = "</tool_call><|observation|>"
    assert official_text.count(seam) == 1
    expected = official_text.replace(seam, "</tool_call><|user|><|observation|>") + USER
    assert segment.ids == tokenizer.encode(expected)


@pytest.mark.parametrize("where", ["value", "key"])
def test_a_lone_surrogate_in_an_argument_is_an_invalid_call_not_an_argument(where: str) -> None:
    """Found by the large fuzz run (AGENT_FUZZ_EXAMPLES=5000): a value kept as text (or a key) holding a lone
    surrogate came out as an argument no tokenizer or log can take. It is refused like any unreadable call."""
    bad = chr(0xD800)
    key, value = (bad, "1") if where == "key" else ("x", bad)
    text = f"<tool_call>calculator\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"
    [call] = get_protocol("glm-4.5").parse_assistant_text(text).tool_calls
    assert call.error is not None and call.error.code == "invalid_arguments"
    assert "lone surrogate" in call.error.message and call.arguments == {}


# -- the parser typed by the episode's tool schemas (vLLM's `_is_string_type`) ------------------------------

TYPED_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "n": {"type": "integer"},
                "o": {"type": "object"},
                "either": {"type": ["string", "null"]},  # not exactly "string": decoded, as vLLM does
                "untyped": {"description": "no type"},
            },
        },
    },
}


@pytest.mark.parametrize("name", ["glm-4.5", "glm-4.6"])
def test_with_tools_keeps_string_parameters_as_written(name: str) -> None:
    shared = get_protocol(name)
    bound = shared.with_tools([TYPED_TOOL, TOOL_SHAPES[0]])
    assert type(bound) is type(shared) and bound.name == name and shared.string_params == {}
    assert bound.string_params["f"] == frozenset({"s"})
    pairs = [("s", "391"), ("n", "391"), ("o", '{"k": [1]}'), ("either", "7"), ("untyped", "true"), ("extra", "1.5")]
    text = "\n<think></think>\n" + _call_block("f", *pairs) + OBSERVATION
    (call,) = bound.parse_assistant_text(text).tool_calls
    assert call.ok and call.arguments == {
        "s": "391",  # the string parameter stays a string
        "n": 391,
        "o": {"k": [1]},
        "either": 7,
        "untyped": True,
        "extra": 1.5,  # a parameter the schema does not name is decoded
    }
    # without tools (vLLM with no tools in the request) every value is decoded, as before
    (untyped,) = shared.parse_assistant_text(text).tool_calls
    assert untyped.arguments["s"] == 391
    # a string value is the raw text between the tags: not stripped, not decoded (vLLM keeps `value` as is)
    raw = "\n<think></think>\n" + _call_block("f", ("s", ' "quoted"\n'), ("n", " 2 ")) + OBSERVATION
    (call,) = bound.parse_assistant_text(raw).tool_calls
    assert call.arguments == {"s": ' "quoted"\n', "n": 2}
    # another tool of the same episode with a parameter of the same name is not typed by f's schema
    (other,) = bound.parse_assistant_text(_call_block("g", ("s", "391"))).tool_calls
    assert other.arguments == {"s": 391}
    # the name and key are stripped before the schema is looked up, as vLLM strips them
    padded = "<tool_call> f \n<arg_key> s </arg_key><arg_value>01</arg_value></tool_call>"
    (call,) = bound.parse_assistant_text(padded).tool_calls
    assert call.arguments == {"s": "01"}


def test_a_typed_string_round_trips_through_render_and_parse() -> None:
    bound = get_protocol("glm-4.5").with_tools([TYPED_TOOL])
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "function": {"name": "f", "arguments": {"s": "391", "n": 391, "o": {"k": "true"}}}}
    ]}  # fmt: skip
    parsed = bound.assistant_message(bound.render_generation(message))
    assert parsed.tool_calls[0].arguments == {"s": "391", "n": 391, "o": {"k": "true"}}


@pytest.mark.parametrize("name", ["glm-4.5", "glm-4.6"])
def test_session_passes_a_string_parameter_to_the_tool_as_a_string(name: str) -> None:
    """The turn core binds the episode's tools (`with_tools`), so a string parameter written `391` reaches the
    tool as the string "391", not the integer 391 (what the untyped parse gave before)."""
    env = pytest.importorskip("agent_env")

    def echo(text: str, times: int) -> str:
        """Repeat a text."""
        return f"{type(text).__name__} {text!r} x {type(times).__name__} {times!r}"

    call = (
        "\n<think>echo it</think>\n<tool_call>echo\n<arg_key>text</arg_key>\n<arg_value>391</arg_value>\n"
        "<arg_key>times</arg_key>\n<arg_value>2</arg_value>\n</tool_call>" + OBSERVATION
    )
    episode = run_calculator_episode(
        get_protocol(name), glm_byte_tokenizer(), [call, final_answer("391")], tools=[env.tool(echo)], rewards="none"
    )
    messages = episode.result.trajectory.messages
    assert messages[1].tool_calls[0].arguments == {"text": "391", "times": 2}
    assert [m.content for m in messages if m.role == "tool"] == ["str '391' x int 2"]
