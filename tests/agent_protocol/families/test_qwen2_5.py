"""Qwen2.5-Instruct (`agent_protocol.protocols.qwen2_5`): renders against the golden files and the official Jinja,
the Hermes parser without reasoning, the feedback after a generated turn, and token-in-token-out through a session
with the real Qwen tokenizer (Qwen3's `tokenizer.json`: Qwen2.5's vocabulary plus the `<think>` tokens, which no
Qwen2.5 text uses, so every id here is Qwen2.5's too).

Jinja-side adaptations (`for_jinja`), the two places where the protocols follow vLLM's chat preprocessing and not
the bare template: null content is passed as "" (the template concatenates it and fails on None), and arguments
given as a JSON string are passed as the object they hold (vLLM parses them before rendering; the bare Qwen2.5
template would dump the string with its escapes).

The generator and the feedback/episode checks here are shared with the other Qwen families' tests.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import ChatProtocol, HFTokenizer, MessageError, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders, tool_outputs
from tests.support.hf_jinja import render_official
from tests.support.tool_shapes import TOOL_SHAPES

RENDERS = renders("qwen2.5_instruct")

TEXTS = [
    "",
    "Hi",
    "\n",
    "  padded  ",
    "\nleading newline",
    "trailing newline\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "<think>inline reasoning</think>after",
    "<tool_response>typed by the user</tool_response>",
    '{"name": "lookup", "arguments": {"q": "x"}}',
    'quotes " and \\ backslash',
    "tab\tand\r\nCRLF",
]
ARGUMENTS: list[Any] = [
    {},
    {"q": "x"},
    {"q": "é 中文", "n": 3, "ratio": 2.5, "flag": True, "none": None, "nested": {"a": [1, 2.5, None, False]}},
    {"code": "print('</parameter>')\nx = 1\n", "list": ["a", {"b": 1}]},
    '{"q": "given as a string"}',
    "{}",
]


def conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A random conversation and tool list: every role, null content, reasoning, calls with every kind of
    argument (some as JSON strings), tool results in a row, system messages in the middle, every tool shape."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(0, 6)):
        roll = rng.random()
        if roll < 0.35:
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
        elif roll < 0.8:
            message: dict[str, Any] = {"role": "assistant", "content": rng.choice([*TEXTS, None])}
            if rng.random() < 0.3:
                message["reasoning_content"] = rng.choice(TEXTS)
            calls = rng.choice([0, 0, 1, 1, 2])
            if calls:
                message["tool_calls"] = [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {"name": rng.choice(["lookup", "now"]), "arguments": rng.choice(ARGUMENTS)},
                    }
                    for k in range(calls)
                ]
            messages.append(message)
            for k in range(calls):
                messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(TEXTS)})
        elif roll < 0.9:
            messages.append({"role": "tool", "tool_call_id": "x", "content": rng.choice(TEXTS)})
        else:
            messages.append({"role": "system", "content": rng.choice(TEXTS)})
    if not messages:  # an empty conversation is refused (see test_refusals)
        messages.append({"role": "user", "content": rng.choice(TEXTS)})
    tools = rng.choice([None, None, [], TOOL_SHAPES, rng.sample(TOOL_SHAPES, 2)])
    return messages, tools


CONVERSATIONS = [conversation(random.Random(seed)) for seed in range(200)]


def for_jinja(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as vLLM hands it to the template (see the module docstring)."""
    out = copy.deepcopy(messages)
    for message in out:
        if message.get("content", "") is None:
            message["content"] = ""
        for call in message.get("tool_calls", []):
            if isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


Official = Callable[[list[dict[str, Any]], Any, bool], str]


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    return render_official("qwen2.5_instruct", for_jinja(messages), tools=tools, add_generation_prompt=generation)


def compare_with_jinja(protocol: ChatProtocol, official: Official) -> int:
    """Render every generated conversation both ways, with and without the generation prompt."""
    compared = 0
    for index, (messages, tools) in enumerate(CONVERSATIONS):
        for generation in (False, True):
            actual = protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
            assert actual == official(messages, tools, generation), f"conversation {index}, gen={generation}"
            compared += 1
    return compared


def episode_splits(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the assistant turns an episode could have generated: each follows a non-assistant message and
    is followed by at least one (tool results or a user message: the feedback)."""
    return [
        i
        for i, m in enumerate(messages)
        if m["role"] == "assistant"
        and i > 0
        and messages[i - 1]["role"] != "assistant"
        and i + 1 < len(messages)
        and messages[i + 1]["role"] != "assistant"
    ]


def observations_after(messages: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    end = next((j for j in range(turn + 1, len(messages)) if messages[j]["role"] == "assistant"), len(messages))
    return messages[turn + 1 : end]


def check_feedback(
    protocol: ChatProtocol, official: Official, messages: list[dict[str, Any]], tools: Any, turn: int
) -> bool:
    """The feedback after the assistant turn `turn` continues the official render of the conversation up to it;
    returns whether the template is append-only there (False only where the family documents a seam)."""
    observations = observations_after(messages, turn)
    before = official(messages[: turn + 1], tools, False)
    after = official(messages[: turn + 1] + observations, tools, True)
    assert before.endswith("<|im_end|>\n")
    generated_part = before.removesuffix("\n")  # the model stops right after <|im_end|>
    feedback = protocol.render_feedback(observations)
    if after.startswith(generated_part):
        assert generated_part + feedback == after
        return True
    assert after.endswith(feedback.removeprefix("\n"))
    return False


def episode_text(protocol: ChatProtocol, messages: list[dict[str, Any]], tools: Any) -> str:
    """What an episode's transcript holds as text: the first prompt, each turn as generated, each feedback."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    text = protocol.render_prompt(messages[: turns[0]], tools=tools)
    for position, index in enumerate(turns):
        text += protocol.render_generation(messages[index])
        end = turns[position + 1] if position + 1 < len(turns) else len(messages)
        if end > index + 1:
            text += protocol.render_feedback(messages[index + 1 : end])
    return text


def official_episode(official: Official, messages: list[dict[str, Any]], tools: Any) -> str:
    """The official render an episode's transcript is compared with: ending on a generated turn (no newline
    after its end token) or on the next generation prompt."""
    if messages[-1]["role"] == "assistant":
        return official(messages, tools, False).removesuffix("\n")
    return official(messages, tools, True)


def episodes() -> list[tuple[list[dict[str, Any]], Any]]:
    """The generated conversations an episode can produce: a prompt first, then turns separated by feedback."""
    out = []
    for messages, tools in CONVERSATIONS:
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if turns and turns[0] > 0 and all(b > a + 1 for a, b in itertools.pairwise(turns)):
            out.append((messages, tools))
    return out


# -- golden renders -------------------------------------------------------------------------------------------


def test_every_render_is_present() -> None:
    assert len(RENDERS) == 12  # 6 cases x 2 (generation prompt or not)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    rendered = protocol.render_messages(
        case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt
    )
    assert rendered == golden.text


def test_default_system_prompt() -> None:
    rendered = get_protocol("qwen2.5").render_messages([{"role": "user", "content": "hi"}])
    assert rendered.startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    )


# -- generated conversations against the official Jinja -------------------------------------------------------


def test_python_renderer_equals_official_jinja() -> None:
    assert compare_with_jinja(get_protocol("qwen2.5"), official) == 400


def test_generated_conversations_cover_the_corners() -> None:
    tools_seen = {json.dumps(t) for _, tools in CONVERSATIONS for t in tools or []}
    assert tools_seen == {json.dumps(t) for t in TOOL_SHAPES}
    assert any(tools == [] for _, tools in CONVERSATIONS)
    flat = [m for messages, _ in CONVERSATIONS for m in messages]
    assert any(isinstance(c["function"]["arguments"], str) for m in flat for c in m.get("tool_calls", []))
    assert any(m["role"] == "assistant" and m["content"] is None for m in flat)
    assert any(m["role"] == "assistant" and "reasoning_content" in m for m in flat)
    assert any(m["role"] == "system" for messages, _ in CONVERSATIONS for m in messages[1:])
    assert len(episodes()) >= 50


def test_refusals() -> None:
    with pytest.raises(MessageError, match="cannot render an empty conversation"):
        get_protocol("qwen2.5").render_messages([])
    with pytest.raises(TypeError, match="takes: none"):
        get_protocol("qwen2.5", enable_thinking=False)


# -- parsing: vLLM's hermes parser, no reasoning --------------------------------------------------------------


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.parametrize("index", range(len(CONVERSATIONS[:60])))
def test_parse_inverts_render_generation(index: int) -> None:
    protocol = get_protocol("qwen2.5")
    for message in CONVERSATIONS[index][0]:
        if message["role"] != "assistant":
            continue
        generated = protocol.render_generation(message)
        parsed = protocol.assistant_message(generated)
        assert protocol.render_generation(parsed) == generated  # the same turn, down to the byte
        assert parsed.reasoning_content is None  # Qwen2.5 does not reason: reasoning_content is never rendered


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Plain answer.<|im_end|>", "Plain answer.", []),
        ("Cut off, no end token", "Cut off, no end token", []),
        (_call("lookup", {"q": "Paris"}) + "<|im_end|>", "", [("lookup", {"q": "Paris"})]),
        ("Let me look.\n" + _call("lookup", {"q": "é"}) + "<|im_end|>", "Let me look.", [("lookup", {"q": "é"})]),
        (_call("a", {}) + "\n" + _call("b", {"n": 1}) + "<|im_end|>", "", [("a", {}), ("b", {"n": 1})]),
        # no reasoning parser: <think> is content, and a call written inside it is a call (vLLM's hermes parser)
        (
            "<think>hmm</think>\n\n" + _call("lookup", {"q": "x"}),
            "<think>hmm</think>\n",
            [("lookup", {"q": "x"})],
        ),
        ("<think>never closed", "<think>never closed", []),
    ],
    ids=["answer", "cut_off", "call", "text_then_call", "two_calls", "think_is_content", "open_think_is_content"],
)
def test_parse(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    action = get_protocol("qwen2.5").parse_assistant_text(text)
    assert action.issues == ()
    assert action.content == content
    assert action.reasoning_content is None
    assert [(c.name, c.arguments) for c in action.tool_calls] == calls


HERMES = [c for c in tool_outputs() if c["format"] == "hermes_json"]


@pytest.mark.parametrize("case", HERMES, ids=lambda c: c["id"])
def test_golden_hermes_outputs_read_as_qwen3_reads_them_outside_reasoning(case: dict[str, Any]) -> None:
    """Where Qwen3 finds no reasoning, Qwen2.5 reads the golden outputs exactly as the Qwen3 parser does
    (tests/agent_protocol/test_parse.py checks those against the golden expectations); what Qwen3 reads as
    reasoning, Qwen2.5 keeps as content, think tags included."""
    ours = get_protocol("qwen2.5").parse_assistant_text(case["raw"])
    qwen3 = get_protocol("qwen3").parse_assistant_text(case["raw"])
    assert ours.reasoning_content is None and ours.error is None
    if qwen3.reasoning_content is None:
        assert ours == qwen3
    else:
        assert "think>" in ours.content


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>', "invalid_json"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": ', "unclosed_tag"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "missing_name"),
        ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', "invalid_arguments"),
        ('<tool_call>\n{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}\n</tool_call>", "invalid_json"),
    ],
    ids=["bad_json", "cut_off", "no_name", "arguments_array", "huge_int"],
)
def test_malformed_calls_are_coded_issues(text: str, code: str) -> None:
    (call,) = get_protocol("qwen2.5").parse_assistant_text(text).tool_calls
    assert call.error is not None and call.error.code == code, call


# -- feedback and episodes ------------------------------------------------------------------------------------


def test_feedback_continues_the_official_render() -> None:
    protocol = get_protocol("qwen2.5")
    checked = 0
    for case in cases().values():
        for turn in episode_splits(case["messages"]):
            assert check_feedback(protocol, official, case["messages"], case["tools"], turn)
            checked += 1
    for messages, tools in CONVERSATIONS:
        for turn in episode_splits(messages):
            assert check_feedback(protocol, official, messages, tools, turn)  # append-only: no seam at all
            checked += 1
    assert checked >= 150


def test_episode_text_is_the_official_render() -> None:
    """prompt + each generation + each feedback == the official render, for every golden multi-turn case and
    every generated conversation an episode can produce: the template is append-only."""
    protocol = get_protocol("qwen2.5")
    golden = [
        (c["messages"], c["tools"]) for c in cases().values() if any(m["role"] == "assistant" for m in c["messages"])
    ]
    for messages, tools in golden + episodes():
        assert episode_text(protocol, messages, tools) == official_episode(official, messages, tools)


def test_cut_off_turn_is_closed() -> None:
    feedback = get_protocol("qwen2.5").render_feedback([{"role": "tool", "content": "5"}], turn_closed=False)
    assert (
        feedback
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


# -- token in, token out through the session ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def run_calculator_episode(
    protocol: ChatProtocol, tokenizer: HFTokenizer, completions: list[str], *, tools: list[Any] | None = None
) -> Any:
    """One episode through AgentSession and AgentRuntime: a scripted engine replays `completions` (stopping on
    the protocol's stop tokens), the real calculator tool (or `tools`) answers. Returns (engine, result, the
    tools' specs). Skipped where only agent-protocol is installed (its isolation run)."""
    runtime = pytest.importorskip("agent_runtime")
    env = pytest.importorskip("agent_env")
    tools = tools if tools is not None else [env.CalculatorTool()]
    stops = [tokenizer.token_to_id(t) for t in protocol.stop_texts]
    engine = runtime.ScriptedEngine(tokenizer, completions, stop_token_ids=[i for i in stops if i is not None])
    session = runtime.AgentSession(
        protocol=protocol,
        environment=lambda: env.FunctionCallEnvironment(tools=tools, max_steps=6),
        rewards=env.RewardPipeline(result=[env.MatchingReward()], process=[env.ToolCallReward()]),
        tokenizer=tokenizer,
    )
    result = asyncio.run(runtime.AgentRuntime(engine, session).run("What is 17 * 23?", task={"answer": "391"}))
    return engine, result, [tool.spec for tool in tools]


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    completions = [
        "I'll use the calculator.\n" + _call("calculator", {"expression": "17 * 23"}) + "<|im_end|>",
        "The answer is 391.<|im_end|>",
    ]
    protocol = get_protocol("qwen2.5")
    engine, result, specs = run_calculator_episode(protocol, tokenizer, completions)
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    (segment,) = result.trajectory.segments
    rendered = protocol.render_messages(result.trajectory.messages, tools=specs)
    # No seam: the ids are, token for token, the official render of the conversation the episode had.
    assert segment.ids == tokenizer.encode(rendered.removesuffix("\n"))
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)
