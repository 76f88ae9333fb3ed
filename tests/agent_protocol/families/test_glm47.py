"""GLM-4.7 (`glm-4.7`, options `enable_thinking`, `clear_thinking`): renders, parser, seams, token-in-token-out.

Reference: `tests/data/golden/templates/glm4.7.jinja` (GLM-4.7-Flash's template as llama.cpp ships it; see
SOURCES.md) and its golden renders, made from it. As for GLM-4.5, the Jinja side gets Hugging Face's `tojson`,
which takes `ensure_ascii`, and tool-call arguments as objects (the template iterates their items).
"""

from __future__ import annotations

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
from agent_protocol.protocol_detection import protocol_for_template
from agent_protocol.protocols.glm47 import Glm47Protocol
from tests.agent_protocol.families.test_glm45 import (
    CONVERSATIONS,
    ENDOFTEXT,
    GLM_PIECES,
    OBSERVATION,
    ROLE_TOKENS,
    USER,
    _episode,
    _hf_tojson,
    _role_token_ending,
    _tools,
    glm_byte_tokenizer,
)
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    compare_with_jinja,
    episode_text,
    object_arguments,
    render_golden,
    string_arguments,
)
from tests.support.hf_jinja import TEMPLATES, official_template
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "glm4.7"
SPECIAL_TOKENS = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
VARIANTS: dict[str, dict[str, Any]] = {
    "thinking": {},
    "no_thinking": {"enable_thinking": False},
    "keep_reasoning": {"clear_thinking": False},
}
RENDERS = renders(STEM)


@cache
def _template() -> jinja2.Template:
    env = official_template("glm4.5").environment.overlay()
    env.filters = {**env.filters, "tojson": _hf_tojson}
    return env.from_string((TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8"))


def official(
    messages: list[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = False, **kwargs: Any
) -> str:
    """The GLM-4.7 template, rendered the Hugging Face way."""
    return _template().render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **SPECIAL_TOKENS, **kwargs
    )


# -- render --------------------------------------------------------------------------------------------------


def test_every_golden_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not) x 3 (default, enable_thinking=False, clear_thinking=False)
    assert len(RENDERS) == 36 and not any(r.refused for r in RENDERS)
    assert {r.protocol for r in RENDERS} == {"glm-4.7"}


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_golden_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    assert render_golden(golden) == golden.text
    rendered = official(
        case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt, **golden.options
    )
    assert rendered == golden.text


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_render_equals_official_jinja_on_generated_conversations(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.7", **options)

    def official_of(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        return official(
            [object_arguments(m) for m in messages], tools=tools, add_generation_prompt=generation, **options
        )

    conversations = [(m, _tools(random.Random(index))) for index, m in enumerate(CONVERSATIONS)]
    assert compare_with_jinja(protocol, official_of, conversations) == (2 * len(CONVERSATIONS), 0)
    as_strings = [(string_arguments(m), tools) for m, tools in conversations]
    assert compare_with_jinja(protocol, official_of, as_strings) == (2 * len(CONVERSATIONS), 0)
    assert 2 * len(CONVERSATIONS) >= 300
    assert sum(1 for m in CONVERSATIONS if any("tool_calls" in x for x in m)) >= 50


def test_tool_message_with_null_content_is_refused_as_the_template_fails_on_it() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "content": None}]
    with pytest.raises(TypeError):
        official(messages)
    with pytest.raises(MessageError, match=r"messages\[1\]\.content.*official GLM-4\.7 template"):
        get_protocol("glm-4.7").render_messages(messages)


def test_options_registry_and_detection() -> None:
    assert isinstance(get_protocol("glm-4.7"), Glm47Protocol)
    with pytest.raises(TypeError, match="clear_thinking"):
        get_protocol("glm-4.7", preserve_thinking=True)
    assert get_protocol("glm-4.7").generation_prompt == "<|assistant|><think>"
    assert get_protocol("glm-4.7", enable_thinking=False).generation_prompt == "<|assistant|></think>"
    text = {stem: (TEMPLATES / f"{stem}.jinja").read_text(encoding="utf-8") for stem in ("glm4.5", "glm4.6", "glm4.7")}
    assert {stem: protocol_for_template(t) for stem, t in text.items()} == {
        "glm4.5": "glm-4.5",
        "glm4.6": "glm-4.6",
        "glm4.7": "glm-4.7",
    }
    # GLM-5's templates share the switch but test `reasoning_content is defined`: not named GLM-4.7
    glm5_like = text["glm4.7"].replace(
        "ns.last_user_index) and reasoning_content -%}", "ns.last_user_index) and reasoning_content is defined -%}"
    )
    assert protocol_for_template(glm5_like) != "glm-4.7"


# -- parse ---------------------------------------------------------------------------------------------------
# vLLM's `glm47` tool parser (Glm47MoeModelToolParser) and the `glm45` reasoning parser.


def _call_block(name: str, *pairs: tuple[str, str]) -> str:
    return (
        f"<tool_call>{name}"
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
        + "</tool_call>"
    )


def test_parse_reasoning_content_and_calls() -> None:
    # thinking on: the prompt ends with <think>, so the turn starts inside the reasoning
    text = "I should look it up.</think>Let me check." + _call_block("get_weather", ("city", "Paris"), ("days", "3"))
    action = get_protocol("glm-4.7").parse_assistant_text(text + _call_block("now") + OBSERVATION, call_id_prefix="t")
    assert action.reasoning_content == "I should look it up." and action.content == "Let me check."
    assert [(c.id, c.name, c.arguments, c.ok) for c in action.tool_calls] == [
        ("t_0", "get_weather", {"city": "Paris", "days": 3}, True),
        ("t_1", "now", {}, True),
    ]
    # thinking off: the prompt ends with </think>
    action = get_protocol("glm-4.7", enable_thinking=False).parse_assistant_text("The answer is 4." + USER)
    assert (action.content, action.reasoning_content, action.tool_calls) == ("The answer is 4.", None, ())
    for stop in (OBSERVATION, USER, ENDOFTEXT):
        assert get_protocol("glm-4.7").parse_assistant_text("</think>ok" + stop).content == "ok"


def test_parse_follows_vllm_glm47_layout() -> None:
    protocol = get_protocol("glm-4.7")
    # the name ends at the first <arg_key>; a newline after it (GLM-4.5's layout) and whitespace between key
    # and value are allowed, as vLLM's regexes allow them
    for body in (
        "f<arg_key>a</arg_key><arg_value>1</arg_value>",
        " f \n<arg_key>a</arg_key>\n <arg_value>1</arg_value>\n",
    ):
        (call,) = protocol.parse_assistant_text(f"</think><tool_call>{body}</tool_call>").tool_calls
        assert (call.name, call.arguments) == ("f", {"a": 1}), body
    # typed by the episode's tools, as GLM-4.5's parser
    bound = protocol.with_tools([TOOL_SHAPES[0]])
    assert type(bound) is Glm47Protocol and bound.clear_thinking == protocol.clear_thinking
    assert bound.string_params == {"lookup": frozenset({"q"})}  # TOOL_SHAPES[0]: lookup(q: string)
    (call,) = bound.parse_assistant_text("</think>" + _call_block("lookup", ("q", "391"))).tool_calls
    assert call.arguments == {"q": "391"}
    (untyped,) = protocol.parse_assistant_text("</think>" + _call_block("lookup", ("q", "391"))).tool_calls
    assert untyped.arguments == {"q": 391}


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [
        ("<tool_call>f<arg_key>x</arg_key><arg_value>1", "unclosed_tag", "cut off"),
        ("<tool_call><arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", "missing_name", "no function name"),
        ("<tool_call></tool_call>", "missing_name", "no function name"),
        (
            "<tool_call>f<arg_key>x</arg_key>stray<arg_value>1</arg_value></tool_call>",
            "invalid_arguments",
            "no <arg_value>",
        ),
        ("<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value>x=2</tool_call>", "invalid_arguments", "outside the"),
    ],
    ids=["cut_off", "no_name", "empty", "stray_between", "stray_after"],
)
def test_malformed_calls_become_coded_issues(text: str, code: str, words: str) -> None:
    action = get_protocol("glm-4.7").parse_assistant_text("</think>" + text + OBSERVATION)
    (call,) = action.tool_calls
    assert call.error is not None and call.error.code == code and words in call.error.message, call
    assert not action.valid_tool_calls


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(GLM_PIECES) | st.text(max_size=8), max_size=30).map("".join))
def test_parser_never_raises_on_glm_shaped_garbage(text: str) -> None:
    bound = get_protocol("glm-4.7").with_tools([TOOL_SHAPES[0]])
    for protocol in (get_protocol("glm-4.7"), bound):
        action = protocol.parse_turn(text)  # parse_turn, not the catching boundary
        for call in action.tool_calls:
            check_json_value(call.arguments)
            if call.ok:
                msgspec.json.encode(call.arguments)


def _generated(rng: random.Random, *, reasoning: bool) -> dict[str, Any]:
    from tests.agent_protocol.families.test_glm45 import _episode_message

    return _episode_message(rng, reasoning=reasoning)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parse_of_a_generation_renders_back_the_same(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.7", **options)
    history = [{"role": "user", "content": "q"}]
    for seed in range(150):
        message = _generated(random.Random(seed), reasoning=options.get("enable_thinking", True))
        parsed = protocol.assistant_message(protocol.render_generation(message))
        assert all(call.ok for call in parsed.tool_calls), seed
        assert protocol.render_messages([*history, parsed]) == protocol.render_messages([*history, message]), seed


# -- generation and feedback ---------------------------------------------------------------------------------


def _shown(messages: list[dict[str, Any]], options: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What the transcript holds, as a conversation the template renders exactly: with thinking on, every
    turn's reasoning kept (`clear_thinking=False`) and a turn without reasoning given a blank one (the template
    then writes `<think></think>`, which is what the prompt's `<think>` and the generated `</think>` make)."""
    if options.get("enable_thinking", True) is False:
        return messages, options
    shown = [
        {**m, "reasoning_content": m.get("reasoning_content") or " "} if m["role"] == "assistant" else m
        for m in messages
    ]
    return shown, {**options, "clear_thinking": False}


def expected_transcript(messages: list[dict[str, Any]], tools: Any, options: dict[str, Any]) -> str:
    shown, kwargs = _shown(messages, options)
    full = official(shown, tools=tools, add_generation_prompt=messages[-1]["role"] != "assistant", **kwargs)
    out, cursor = "", 0
    for index, message in enumerate(shown):
        if message["role"] != "assistant":
            continue
        sampled = OBSERVATION if message.get("tool_calls") else USER
        before = official(shown[: index + 1], tools=tools, **kwargs)
        assert full.startswith(before), "append-only once the reasoning is shown"
        if index + 1 == len(messages):
            out, cursor = out + full[cursor:] + sampled, len(full)
        elif ROLE_TOKENS[messages[index + 1]["role"]] != sampled:
            out, cursor = out + full[cursor : len(before)] + sampled, len(before)
    return out + full[cursor:]


def _episode47(rng: random.Random, options: dict[str, Any]) -> list[dict[str, Any]]:
    messages = _episode(rng, thinking=False)
    if options.get("enable_thinking", True):
        for message in messages:
            if message["role"] == "assistant" and rng.random() < 0.6:
                message["reasoning_content"] = rng.choice(["think", "step 1\nstep 2", "  padded  "])
    return messages


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompt_generations_and_feedback_concatenate_to_the_official_render(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.7", **options)
    seams = 0
    for seed in range(200):
        rng = random.Random(seed)
        messages = _episode47(rng, options)
        tools = _tools(rng)
        text = episode_text(protocol, messages, tools, ended_by=_role_token_ending)
        assert text == expected_transcript(messages, tools, options), seed
        seams += sum(
            m["role"] == "assistant" and ROLE_TOKENS[n["role"]] != (OBSERVATION if m.get("tool_calls") else USER)
            for m, n in pairwise(messages)
        )
    assert seams >= 20


def test_reasoning_seams() -> None:
    case = cases()["multi_turn_reasoning"]
    messages, tools = case["messages"], case["tools"]
    first_reasoning = messages[1]["reasoning_content"]
    assert messages[1]["role"] == "assistant" and first_reasoning
    turn = "17 × 23 = 391."
    # A new user message makes the template drop the first turn's reasoning (a lone </think>); the transcript
    # keeps what the model generated. That is the only difference.
    kept = episode_text(get_protocol("glm-4.7"), messages, tools, ended_by=_role_token_ending)
    official_text = official(messages, tools=tools) + USER
    assert official_text.count(f"<|assistant|></think>{turn}") == 1
    assert kept == official_text.replace(f"</think>{turn}", f"<think>{first_reasoning}</think>{turn}")
    # clear_thinking=False: the template keeps it too, and the seam is gone
    keep = get_protocol("glm-4.7", clear_thinking=False)
    kept = episode_text(keep, messages, tools, ended_by=_role_token_ending)
    assert kept == official(messages, tools=tools, clear_thinking=False) + USER
    # A turn without reasoning: after the prompt's <think> the model writes </think> at once, so the transcript
    # holds <think></think> where the template writes the lone </think>, whatever clear_thinking says.
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} if i == 1 else m for i, m in enumerate(messages)]
    for protocol, kwargs in ((get_protocol("glm-4.7"), {}), (keep, {"clear_thinking": False})):
        text = episode_text(protocol, plain, tools, ended_by=_role_token_ending)
        official_text = official(plain, tools=tools, **kwargs) + USER
        assert text == official_text.replace(f"</think>{turn}", f"<think></think>{turn}")
    # thinking off: the model writes no reasoning after the prompt's </think>
    off = get_protocol("glm-4.7", enable_thinking=False)
    assert off.render_generation({"role": "assistant", "content": "ok", "reasoning_content": "hidden"}) == "ok<|user|>"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize(
    "observations",
    [[{"role": "tool", "content": "5"}], [{"role": "user", "content": "go on"}], [{"role": "system", "content": "s"}]],
    ids=["tool", "user", "system"],
)
def test_cut_off_turn_gets_the_whole_opening(variant: str, observations: list[dict[str, Any]]) -> None:
    options = VARIANTS[variant]
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a long answer that was cu"}]
    feedback = get_protocol("glm-4.7", **options).render_feedback(observations, turn_closed=False)
    assert (
        official(history + observations, add_generation_prompt=True, **options)
        == official(history, **options) + feedback
    )


# -- token-in-token-out through the session ------------------------------------------------------------------
# Text level, as for GLM-4.5: no GLM tokenizer is in a registry; test_glm45.py's byte-level tokenizer carries
# GLM's control tokens (the same set for GLM-4.7).


def _call(expression: str) -> str:
    return f"<tool_call>calculator<arg_key>expression</arg_key><arg_value>{expression}</arg_value></tool_call>"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_session_is_token_in_token_out(variant: str) -> None:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # skipped in agent-protocol alone

    options = VARIANTS[variant]
    thinking = options.get("enable_thinking", True)
    first = ("I should use the calculator.</think>" if thinking else "") + _call("17 * 23") + OBSERVATION
    second = ("The tool answered.</think>" if thinking else "") + "The answer is 391." + USER
    episode = run_calculator_episode(
        get_protocol("glm-4.7", **options), glm_byte_tokenizer(), [first, second], rewards="none"
    )
    trajectory = episode.result.trajectory
    assert episode.result.final_answer == "The answer is 391."
    assert trajectory.messages[1].tool_calls[0].arguments == {"expression": "17 * 23"}
    (segment,) = trajectory.segments
    messages = [object_arguments(m.to_openai()) for m in trajectory.messages]
    official_text = official(messages, tools=[CalculatorTool().spec.to_openai()], **options)
    tokenizer = glm_byte_tokenizer()
    # both turns follow the last user message, so their reasoning is shown: the ids are the official render,
    # plus the last turn's sampled <|user|>
    assert segment.ids == tokenizer.encode(official_text + USER)
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    assert episode.engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)
