"""NVIDIA Nemotron 3 Nano (`nemotron-3-nano`, options `enable_thinking`, `truncate_history_thinking`): golden
renders, the Python renderer against the official Jinja on generated conversations, the `qwen3_coder` parser behind
`nano_v3` reasoning, feedback and its seams, and token-in-token-out through a session at the text level.

The official template (`tests/data/golden/templates/nemotron3_nano.jinja`, provenance in SOURCES.md) is rendered as
Hugging Face renders it (tests/support/hf_jinja.py); tool-call arguments go to it as objects (it iterates them).
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import pytest

from agent_protocol import HFTokenizer, MessageError, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.byte_tokenizer import byte_level_tokenizer
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    check_feedback,
    episode_splits,
    episode_text,
    is_episode,
    object_arguments,
    render_golden,
)
from tests.support.hf_jinja import TEMPLATES, official_template
from tests.support.random_conversations import ConversationMix, conversation, random_tools

STEM = "nemotron3_nano"
NAME = "nemotron-3-nano"
RENDERS = renders(STEM)
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no_thinking": {"enable_thinking": False},
    "keep_history": {"truncate_history_thinking": False},
    "no_thinking_keep_history": {"enable_thinking": False, "truncate_history_thinking": False},
}


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False, **options: Any) -> str:
    return official_template(STEM).render(messages=messages, tools=tools, add_generation_prompt=generation, **options)


def test_the_template_is_the_llama_cpp_file() -> None:
    """llama.cpp's `models/templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja`, stored there with CRLF line ends
    (git-lfs oid 650b9d30...); here with LF, which Jinja renders alike (it normalizes newlines)."""
    import hashlib

    text = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    crlf = text.replace("\n", "\r\n").encode()
    assert hashlib.sha256(crlf).hexdigest() == "650b9d301337fd103f9014f6f6ae89b46660ae92e4421d95bd3157115e5b02ce"
    assert len(crlf) == 10708


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
    "<think>inline</think>\n\nafter",
    "a</think>b</think>c",
    "<think>never closed",
    "<tool_call>typed</tool_call>",
    '{"json": [1, 2]}',
]
VALUES: list[Any] = [
    "Paris",
    "",
    "  padded  ",
    "é 中文\nnewline",
    42,
    -1.5,
    True,
    None,
    [1, "a"],
    {"k": {"n": [1]}},
    {},
]


def _arguments(rng: random.Random) -> dict[str, Any]:
    return {rng.choice(["q", "city", "n", "é"]): rng.choice(VALUES) for _ in range(rng.randint(0, 3))}


MIX = ConversationMix(
    texts=TEXTS,
    user_texts=[*TEXTS, None],
    turns=(1, 7),
    reasoning=0.5,
    call_count=lambda rng: rng.randint(0, 2) if rng.random() < 0.5 else 0,
    arguments=_arguments,
    names=("lookup", "weather", "now"),
)
CONVERSATIONS = [(conversation(random.Random(seed), MIX), random_tools(random.Random(seed))) for seed in range(160)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_official_jinja(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol(NAME, **options)
    equal = refused = 0
    for index, (messages, tools) in enumerate(CONVERSATIONS):
        for generation in (False, True):
            expected = official(messages, tools, generation, **options)
            if any(m["content"] is None and m["role"] in ("user", "tool") for m in messages):
                assert "None" in expected  # the template prints it; the protocol refuses
                with pytest.raises(MessageError, match="prints None"):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                refused += 1
                continue
            assert protocol.render_messages(messages, tools=tools, add_generation_prompt=generation) == expected, (
                index,
                generation,
            )
            equal += 1
    assert equal + refused == 320 and equal >= 200, (equal, refused)


def test_refusals() -> None:
    protocol = get_protocol(NAME)
    with pytest.raises(MessageError, match="empty conversation"):
        protocol.render_messages([])
    with pytest.raises(MessageError, match="fails on it"):
        protocol.render_messages([{"role": "system", "content": None}, {"role": "user", "content": "q"}])
    with pytest.raises(TypeError):
        official([{"role": "system", "content": None}, {"role": "user", "content": "q"}])
    with pytest.raises(MessageError, match="list of parts"):
        protocol.render_messages([{"role": "user", "content": [{"type": "text", "text": "q"}]}])


# -- parsing ------------------------------------------------------------------------------------------------------


def test_parse_reasoning_content_and_calls() -> None:
    protocol = get_protocol(NAME)
    text = (
        "I should look.\n</think>\nLooking.\n<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>\n<|im_end|>"
    )
    action = protocol.parse_assistant_text(text)
    assert action.reasoning_content == "I should look." and action.content == "Looking." and action.issues == ()
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("weather", {"city": "Paris"})]
    off = get_protocol(NAME, enable_thinking=False).parse_assistant_text("Plain.<|im_end|>")
    assert off.content == "Plain." and off.reasoning_content is None
    unclosed = protocol.parse_assistant_text("still thinking")
    assert unclosed.error is not None and unclosed.error.code == "missing_think_end"


def test_values_are_typed_by_the_tools_schemas() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}]
    text = "</think>\n<tool_call>\n<function=f>\n<parameter=n>\n391\n</parameter>\n</function>\n</tool_call>\n"
    assert get_protocol(NAME).parse_assistant_text(text).tool_calls[0].arguments == {"n": "391"}
    typed = get_protocol(NAME).with_tools(tools)
    assert typed.parse_assistant_text(text).tool_calls[0].arguments == {"n": 391}


@pytest.mark.parametrize("variant", ["default", "no_thinking"])
def test_parse_of_a_generation_renders_back_the_same(variant: str) -> None:
    protocol = get_protocol(NAME, **VARIANTS[variant])
    checked = 0
    for messages, _ in CONVERSATIONS:
        for message in messages:
            if message["role"] != "assistant" or any(
                t in (message["content"] or "") for t in ("<tool_call>", "think>")
            ):
                continue
            if (message["content"] or "") != (message["content"] or "").strip():
                continue  # the parser trims the content before calls, as vLLM's qwen3_coder does
            message = {k: v for k, v in message.items() if k != "reasoning_content"}
            if protocol.enable_thinking:  # type: ignore[attr-defined]
                message["reasoning_content"] = "step 1\nstep 2"
            generated = protocol.render_generation(message)
            parsed = protocol.assistant_message(generated)
            assert protocol.render_generation(parsed) == generated
            checked += 1
    assert checked >= 60


# -- feedback and episodes ----------------------------------------------------------------------------------------


def _episode(rng: random.Random, thinking: bool) -> list[dict[str, Any]]:
    """One user query, then turns with trimmed contents and reasoning (thinking on), tool results after calls."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(["Be brief.", ""])})
    messages.append({"role": "user", "content": rng.choice(["Hi", "  what?  ", "go"])})
    for _ in range(rng.randint(1, 4)):
        calls = rng.choice([0, 1, 1, 2])
        turn: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", "Sure.", "two\n\nlines"])}
        if thinking:
            turn["reasoning_content"] = rng.choice(["hmm", "step 1\nstep 2"])
        if calls:
            turn["tool_calls"] = [
                {"id": f"c{k}", "type": "function", "function": {"name": "lookup", "arguments": _arguments(rng)}}
                for k in range(calls)
            ]
            messages.append(turn)
            messages.extend(
                {"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(["42", "", " x "])}
                for k in range(calls)
            )
        else:
            messages.append(turn)
            break
    return messages


@pytest.mark.parametrize("variant", ["default", "no_thinking"])
def test_one_query_episodes_are_append_only(variant: str) -> None:
    """Within one user query (tool results are tool messages) the template keeps every turn as generated: the
    transcript is the official render."""
    options = VARIANTS[variant]
    protocol = get_protocol(NAME, **options)
    for seed in range(150):
        rng = random.Random(seed)
        messages, tools = _episode(rng, thinking=not options), random_tools(rng)
        assert is_episode(messages)
        expected = official(messages, tools, messages[-1]["role"] != "assistant", **options)
        if messages[-1]["role"] == "assistant":
            expected = expected.removesuffix("\n")
        assert episode_text(protocol, messages, tools) == expected, seed
        for turn in episode_splits(messages):
            assert check_feedback(
                protocol, lambda m, t, g: official(m, t, g, **options), messages, tools, turn, turn_end="<|im_end|>"
            )


def test_seams() -> None:
    """A new user message drops the reasoning of the turns before it (truncate_history_thinking), and a turn with
    empty reasoning is `\\n</think>\\n` generated where the template writes `<think></think>`."""
    protocol = get_protocol(NAME)
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "391", "reasoning_content": "17 * 23"},
        {"role": "user", "content": "thanks"},
    ]
    text = protocol.render_prompt(messages[:1]) + protocol.render_generation(messages[1])
    text += protocol.render_feedback(messages[2:])
    assert "<think>\n17 * 23\n</think>\n391<|im_end|>" in text
    assert text.replace("<think>\n17 * 23\n</think>\n391", "<think></think>\n391") == official(messages, None, True)
    kept = get_protocol(NAME, truncate_history_thinking=False)
    text = kept.render_prompt(messages[:1]) + kept.render_generation(messages[1]) + kept.render_feedback(messages[2:])
    assert text == official(messages, None, True, truncate_history_thinking=False)  # no seam with history kept
    empty = [messages[0], {"role": "assistant", "content": "391", "reasoning_content": ""}]
    generated = protocol.render_prompt(empty[:1]) + protocol.render_generation(empty[1])
    assert generated.endswith("<think>\n\n</think>\n391<|im_end|>")
    assert official(empty).endswith("<think></think>391<|im_end|>\n")


# -- token in, token out through the session (text level) ---------------------------------------------------------

CONTROL_TOKENS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>"]  # fmt: skip


@cache
def byte_tokenizer() -> HFTokenizer:
    return byte_level_tokenizer(CONTROL_TOKENS, source="nemotron3-byte-level (test)")


@pytest.mark.parametrize("variant", ["default", "no_thinking"])
def test_session_is_token_in_token_out(variant: str) -> None:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    options = VARIANTS[variant]
    thinking = not options
    call = (
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n17 * 23\n</parameter>\n</function>\n</tool_call>\n"
    )
    first = ("I should use the calculator.\n</think>\n" if thinking else "\n") + call + "<|im_end|>"
    second = ("The tool answered.\n</think>\n" if thinking else "") + "The answer is 391.<|im_end|>"
    tokenizer = byte_tokenizer()
    episode = run_calculator_episode(get_protocol(NAME, **options), tokenizer, [first, second], rewards="none")
    result = episode.result
    assert result.final_answer == "The answer is 391."
    (segment,) = result.trajectory.segments
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    messages = [object_arguments(m.to_openai()) for m in result.trajectory.messages]
    tools = [CalculatorTool().spec.to_openai()]
    # one user query: append-only, so the ids are the official render's (ending on the sampled turn)
    assert segment.ids == tokenizer.encode(official(messages, tools, **options).removesuffix("\n"))
