"""gpt-oss (harmony): renders against the golden files and the official Jinja, the harmony parser, the feedback
after each generated turn, and token-in-token-out through a session with the real o200k_harmony tokenizer.

The official template reads the reasoning from a `thinking` field and fails on null content; on the Jinja side
only, `reasoning_content` is renamed to `thinking` (as the golden renders were made) and null content becomes
"" (what our API means by it). Arguments are given to Jinja as objects (the template dumps them with `tojson`).
"""

from __future__ import annotations

import json
import random
from datetime import date
from typing import Any

import jinja2
import pytest

from agent_protocol import HFTokenizer, Message, MessageError, get_protocol
from agent_protocol.protocols.gpt_oss import GptOssProtocol, parse_harmony_turn
from tests.agent_protocol.golden import FROZEN_TODAY, GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import compare_with_jinja, object_arguments, render_golden
from tests.support.family_tokenizers import load_family_tokenizer
from tests.support.hf_jinja import render_official
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "gpt_oss"
GOLDEN = renders(STEM)
START, END, CALL, RETURN = "<|start|>", "<|end|>", "<|call|>", "<|return|>"


def protocol(**options: Any) -> GptOssProtocol:
    built = get_protocol("gpt-oss", **{"today": FROZEN_TODAY, **options})
    assert isinstance(built, GptOssProtocol)
    return built


def jinja_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The adaptation the golden renders used: `thinking` for `reasoning_content`, "" for null content, and
    argument objects (a Message's calls carry them as JSON strings)."""
    out = []
    for message in messages:
        data = dict(message.to_openai() if isinstance(message, Message) else message)
        if "reasoning_content" in data:
            data["thinking"] = data.pop("reasoning_content")
        if data.get("content") is None and data["role"] != "tool":  # a tool's null is rendered: tojson(None)
            data["content"] = ""
        out.append(object_arguments(data))
    return out


def _object(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def official(messages: list[Any], **kwargs: Any) -> str:
    return render_official(STEM, jinja_messages(messages), **kwargs)


# -- 1. golden renders -----------------------------------------------------------------------------------------


def test_every_golden_render_is_present() -> None:
    assert len(GOLDEN) == 12 and not any(g.refused for g in GOLDEN)  # 6 cases x (generation prompt or not)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_golden_render_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    ours = get_protocol(golden.protocol, **golden.options)
    assert render_golden(golden) == golden.text
    if golden.add_generation_prompt:
        assert ours.render_prompt(case["messages"], tools=case["tools"]) == golden.text
        assert golden.text.endswith(ours.generation_prompt)


# -- 2. generated conversations against the official Jinja ----------------------------------------------------

TEXTS = ["", "Hi", "\n", "two\n\nlines", "émoji 🦙 and 中文", '{"json": "looking"}', "  spaces  ", '"quoted"',
         "a <|end|> typed as text", "trailing\n"]  # fmt: skip
CHANNEL_TAG = "<|channel|>final<|message|>"
NAMES = ["lookup", "weather", "now"]
DESCRIBED = [t for t in TOOL_SHAPES if "description" in t["function"]]
TOOL_SETS: list[list[dict[str, Any]] | None] = [None, DESCRIBED, DESCRIBED[:1], DESCRIBED[3:]]


def _call(rng: random.Random, k: int) -> dict[str, Any]:
    arguments: Any = {"q": rng.choice(TEXTS), "n": k, "nested": {"list": [1, 2.5, None, True]}}
    if rng.random() < 0.3:
        arguments = json.dumps(arguments)  # a client's JSON string; the Jinja side gets the object
    return {"id": f"c{k}", "type": "function", "function": {"name": rng.choice(NAMES), "arguments": arguments}}


def _conversation(rng: random.Random, *, refusals: bool) -> list[dict[str, Any]]:
    """A conversation the template renders (`refusals` false) or may refuse. Text stays plain text unless
    refusals are allowed: harmony channel tags in content are refused by the template."""
    texts = [*TEXTS, CHANNEL_TAG] if refusals else TEXTS
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice([*texts, None])})
    called = False
    for _ in range(rng.randint(1, 7)):
        roll = rng.random()
        if roll < 0.3:
            messages.append({"role": "user", "content": rng.choice(texts)})
        elif roll < 0.75:
            message: dict[str, Any] = {"role": "assistant", "content": rng.choice([*texts, None])}
            if rng.random() < 0.6:
                message["reasoning_content"] = rng.choice(texts)
            if rng.random() < 0.5:
                calls = rng.choice([1, 1, 1, 2])
                message["tool_calls"] = [_call(rng, k) for k in range(calls)]
                if not refusals and message.get("reasoning_content") and message["content"]:
                    message["content"] = rng.choice(["", None])  # content and reasoning on a call turn: refused
                messages.append(message)
                called = True
                for k in range(calls if rng.random() < 0.8 else 0):
                    messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(texts)})
            else:
                messages.append(message)
        elif roll < 0.85 and (called or refusals):
            messages.append({"role": "tool", "tool_call_id": "x", "content": rng.choice([*texts, None])})
        else:
            messages.append({"role": "system", "content": rng.choice(texts)})
    if not refusals:  # a tool result after an answer, with no call in between, is refused
        after_call = False
        for message in messages:
            if message["role"] == "assistant":
                after_call = bool(message.get("tool_calls"))
            if message["role"] == "tool" and not after_call:
                message["role"] = "user"
    return messages


CONVERSATIONS = [_conversation(random.Random(seed), refusals=False) for seed in range(160)]


def test_generated_conversations_render_as_the_official_jinja() -> None:
    compared = compare_with_jinja(
        protocol(),
        lambda messages, tools, generation: official(messages, tools=tools, add_generation_prompt=generation),
        [(messages, tools) for messages in CONVERSATIONS for tools in TOOL_SETS],
    )
    assert compared == (160 * len(TOOL_SETS) * 2, 0)


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_reasoning_effort_is_the_template_kwarg(effort: str) -> None:
    ours = protocol(reasoning_effort=effort)
    for messages in CONVERSATIONS[:150]:
        expected = official(messages, tools=DESCRIBED, add_generation_prompt=True, reasoning_effort=effort)
        assert ours.render_messages(messages, tools=DESCRIBED, add_generation_prompt=True) == expected


def test_conversations_the_template_refuses_raise_message_error() -> None:
    ours = protocol()
    refused = rendered = 0
    for seed in range(300):
        messages = _conversation(random.Random(10_000 + seed), refusals=True)
        tools = [TOOL_SETS[1], TOOL_SHAPES][seed % 2]  # TOOL_SHAPES holds a tool without a description
        try:
            expected = official(messages, tools=tools, add_generation_prompt=seed % 3 == 0)
        except (jinja2.TemplateError, TypeError):
            with pytest.raises(MessageError, match="official gpt-oss template"):
                ours.render_messages(messages, tools=tools, add_generation_prompt=seed % 3 == 0)
            refused += 1
            continue
        assert ours.render_messages(messages, tools=tools, add_generation_prompt=seed % 3 == 0) == expected
        rendered += 1
    assert refused >= 150 and rendered >= 50, (refused, rendered)


@pytest.mark.parametrize(
    ("messages", "tools", "match"),
    [
        ([], None, "empty"),
        ([{"role": "user", "content": "q"}], [{"type": "function", "function": {"name": "f"}}], "description"),
        ([{"role": "user", "content": "q"}, {"role": "tool", "content": "5"}], None, "no assistant tool call"),
        ([{"role": "assistant", "content": "x<|channel|>analysis<|message|>y"}], None, "channel tags"),
        ([{"role": "assistant", "content": "a", "reasoning_content": "<|channel|>final<|message|>"}], None, "tags"),
        (
            [
                {
                    "role": "assistant",
                    "content": "c",
                    "reasoning_content": "r",
                    "tool_calls": [_call(random.Random(), 0)],
                }
            ],
            None,
            "both content",
        ),
    ],
    ids=["empty", "no_description", "tool_first", "tag_in_content", "tag_in_reasoning", "content_and_reasoning"],
)
def test_each_refusal_is_the_templates(messages: list[dict[str, Any]], tools: Any, match: str) -> None:
    with pytest.raises((jinja2.TemplateError, TypeError)):
        official(messages, tools=tools)
    with pytest.raises(MessageError, match=match):
        protocol().render_messages(messages, tools=tools)


def _schema(rng: random.Random, depth: int = 0) -> Any:
    """A JSON schema fragment of the shapes clients send, odd ones included."""
    kinds = ["string", "number", "integer", "boolean", "null", "enum", "list_type", "any", "bare"]
    if depth < 3:
        kinds += ["array", "array", "object", "object", "oneOf", "anyOf"]
    kind = rng.choice(kinds)
    schema: dict[str, Any]
    if kind == "array":
        schema = {"type": "array"}
        if rng.random() < 0.8:
            schema["items"] = _schema(rng, depth + 1)
    elif kind == "object":
        schema = {"type": "object"}
        if rng.random() < 0.8:
            schema["properties"] = {f"p{i}": _schema(rng, depth + 1) for i in range(rng.randint(0, 3))}
            if rng.random() < 0.5:
                schema["required"] = rng.sample(sorted(schema["properties"]), k=len(schema["properties"]) // 2)
    elif kind == "oneOf" or kind == "anyOf":
        schema = {kind: [_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    elif kind == "enum":
        schema = {"type": "string", "enum": rng.sample(["a", "b", "c d", "é"], k=rng.randint(1, 3))}
    elif kind == "list_type":
        schema = {"type": rng.sample(["string", "number", "null", "integer"], k=rng.randint(1, 3))}
    elif kind == "any":
        schema = {"$ref": "#/$defs/x"}
    elif kind == "bare":
        schema = {}
    else:
        schema = {"type": kind}
    if rng.random() < 0.3:
        schema["description"] = rng.choice(["A field.", "", "unicode é 中文", "multi\nline"])
    if rng.random() < 0.2:
        schema["nullable"] = rng.random() < 0.7
    if rng.random() < 0.25:  # a default: strings where the template concatenates them (enum, oneOf)
        textual = "enum" in schema or "oneOf" in schema
        schema["default"] = rng.choice(["x", "é"]) if textual else rng.choice([1, "x", None, [1], {"a": True}])
    return schema


def test_tool_schemas_render_as_the_official_jinja() -> None:
    ours = protocol()
    messages = [{"role": "user", "content": "q"}]
    for seed in range(300):
        rng = random.Random(seed)
        parameters = {"type": "object", "properties": {f"a{i}": _schema(rng) for i in range(rng.randint(0, 4))}}
        if rng.random() < 0.6:
            parameters["required"] = [name for name in parameters["properties"] if rng.random() < 0.5]
        tool = {"type": "function", "function": {"name": f"t{seed}", "description": "d", "parameters": parameters}}
        expected = official(messages, tools=[tool])
        assert ours.render_messages(messages, tools=[tool]) == expected, json.dumps(tool)


def test_date_is_fixed_per_instance_and_defaults_to_today() -> None:
    assert "Current date: 2024-02-29\n" in protocol(today=date(2024, 2, 29)).render_prompt(
        [{"role": "user", "content": "q"}]
    )
    today = get_protocol("gpt-oss")
    assert isinstance(today, GptOssProtocol) and today.today == date.today()
    with pytest.raises(ValueError, match="reasoning_effort"):
        get_protocol("gpt-oss", reasoning_effort="max")
    with pytest.raises(TypeError, match="enable_thinking"):
        get_protocol("gpt-oss", enable_thinking=False)


# -- 3. the harmony parser ----------------------------------------------------------------------------------

ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"


@pytest.mark.parametrize(
    "text",
    [
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        '<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{"city":"Paris"}<|call|>',
        ANALYSIS + ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        ANALYSIS + '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    ],
    ids=["template_form", "channel_form", "constrain_glued", "with_analysis", "complete_json_cut_before_call"],
)
def test_a_call_in_every_header_form(text: str) -> None:
    action = parse_harmony_turn(text, call_id_prefix="c")
    assert action.error is None
    (call,) = action.tool_calls
    assert (call.id, call.name, call.arguments, call.ok) == ("c_0", "get_weather", {"city": "Paris"}, True)
    assert action.content == ""
    assert action.reasoning_content == ("Need the weather." if text.startswith(ANALYSIS) else None)


def test_reasoning_preamble_and_answer() -> None:
    text = (
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
        "<|end|><|start|>assistant<|channel|>final<|message|>It is 18 °C.<|return|>"
    )
    action = parse_harmony_turn(text)
    assert (action.content, action.reasoning_content, action.tool_calls, action.error) == (
        "It is 18 °C.",
        "think\nChecking.",
        (),
        None,
    )
    assert (
        parse_harmony_turn("<|channel|>final<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b").content
        == "b"
    )


@pytest.mark.parametrize(
    ("text", "code", "where"),
    [
        ('<|channel|>commentary to=functions.f json<|message|>{"a": 1<|call|>', "invalid_json", "call"),
        ('<|channel|>commentary to=functions.f json<|message|>{"a": 1', "unclosed_tag", "call"),
        ("<|channel|>commentary to=functions.f json<|message|>[1, 2]<|call|>", "invalid_arguments", "call"),
        ("<|channel|>commentary to=functions.f <|constrain|>text<|message|>hi<|call|>", "invalid_arguments", "call"),
        ("<|channel|>commentary to=functions.f json<|message|>" + "[" * 2000 + "<|call|>", "invalid_json", "call"),
        ("<|channel|>commentary to=functions. json<|message|>{}<|call|>", "missing_name", "call"),
        ("<|channel|>final<|return|>", "unclosed_tag", "turn"),
        ("<|channel|>fin", "unclosed_tag", "turn"),
        ("<|channel|>analysis<|message|>I was thinking and", "missing_think_end", "turn"),
        ("<|channel|>musing<|message|>hmm<|end|>", "malformed_turn", "turn"),
        ("<|channel|><|message|>hmm<|end|>", "malformed_turn", "turn"),
        ("<|channel|>final one two three<|message|>x<|return|>", "malformed_turn", "turn"),
        ("<|channel|>analysis<|message|>a<|end|>stray text", "malformed_turn", "turn"),
        ("<|channel|>analysis<|message|>a<|end|><|start|>user<|message|>hi<|end|>", "malformed_turn", "turn"),
        ("<|channel|>analysis to=python<|message|>print(1)<|call|>", "malformed_turn", "turn"),
    ],
    ids=[
        "bad_json",
        "cut_in_call",
        "array_arguments",
        "text_content_type",
        "too_deep",
        "no_function_name",
        "no_message_tag",
        "cut_in_header",
        "cut_in_analysis",
        "unknown_channel",
        "empty_channel",
        "header_junk",
        "text_outside",
        "user_role",
        "builtin_recipient",
    ],
)
def test_malformed_output_becomes_a_coded_issue(text: str, code: str, where: str) -> None:
    action = get_protocol("gpt-oss").parse_assistant_text(text)
    if where == "call":
        (call,) = action.tool_calls
        assert call.error is not None and call.error.code == code and not call.ok
        assert call.raw is not None
    else:
        assert action.error is not None and action.error.code == code
    assert action.issues[0].code == code


def test_a_cut_off_answer_is_content_without_an_issue() -> None:
    action = parse_harmony_turn("<|channel|>final<|message|>The answer is 39")
    assert (action.content, action.error) == ("The answer is 39", None)
    assert parse_harmony_turn("") == parse_harmony_turn("<|channel|>final<|message|><|return|>")


@pytest.mark.parametrize("index", range(60))
def test_parse_inverts_render_generation(index: int) -> None:
    ours = protocol()
    messages = [m for m in CONVERSATIONS[index] if m["role"] == "assistant"] or [{"role": "assistant", "content": "x"}]
    for message in messages:
        if END in json.dumps(message):  # "<|end|>" typed in text is the token itself once tokenized: not a round trip
            continue
        action = ours.parse_turn(ours.render_generation(message))
        assert action.error is None
        calls = message.get("tool_calls", [])[:1]  # harmony writes one call per turn
        assert [(c.name, c.arguments) for c in action.tool_calls] == [
            (c["function"]["name"], _object(c["function"]["arguments"])) for c in calls
        ]
        if calls:
            analysis = message.get("content") or message.get("reasoning_content") or None
            assert (action.reasoning_content, action.content) == (analysis, "")
        else:
            assert (action.reasoning_content, action.content) == (
                message.get("reasoning_content"),
                message["content"] or "",
            )


@pytest.mark.parametrize(
    "arguments",
    [
        "[" * 1500 + "]" * 1500,  # RecursionError in json.loads before json_limits
        '{"x": ' + "9" * 5000 + "}",  # ValueError: int too long
        '{"x": "\\ud800"}',  # a lone surrogate
        '{"a":' * 150 + "1" + "}" * 150,  # decodes; too deep
    ],
    ids=["deep_brackets", "huge_int", "lone_surrogate", "deep_but_decodable"],
)
def test_known_killers_in_harmony_calls_become_coded_issues(arguments: str) -> None:
    # The shared fuzz test's killers are written as Hermes <tool_call> blocks; these are the same bodies where a
    # harmony turn carries them, as the arguments of a call.
    text = f"<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{arguments}<|call|>"
    (call,) = get_protocol("gpt-oss").parse_assistant_text(text).tool_calls
    assert call.error is not None and call.error.code == "invalid_json" and "cannot be read" in call.error.message


# -- 4. feedback after each generated turn, and the seams --------------------------------------------------

ANALYSIS_HEAD = "<|channel|>analysis<|message|>"


def episode(ours: GptOssProtocol, messages: list[Any], tools: Any) -> tuple[str, list[tuple[str, str]]]:
    """An episode's text pieces for `messages`: the first prompt, then each generated turn with the feedback
    after it ("" after the last turn when the conversation ends with it)."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    prompt = ours.render_prompt(messages[: turns[0]], tools=tools)
    pieces = []
    for position, index in enumerate(turns):
        end = turns[position + 1] if position + 1 < len(turns) else len(messages)
        feedback = ours.render_feedback(messages[index + 1 : end]) if end > index + 1 else ""
        pieces.append((ours.render_generation(messages[index]), feedback))
    return prompt, pieces


def history_form(generated: str, *, drop_analysis: bool, answer_in_history: bool) -> str:
    """The seams, written out: what the template writes for a generated turn once it is history. It drops the
    turn's analysis (`drop_analysis`) and ends an answer that is not a training render's last with `<|end|>`."""
    if drop_analysis and generated.startswith(ANALYSIS_HEAD):
        generated = generated.split(END + START + "assistant", 1)[1]
    if answer_in_history:
        assert generated.endswith(RETURN)
        generated = generated.removesuffix(RETURN) + END
    return generated


def history_pieces(messages: list[Any], pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    assistants = [m for m in messages if m["role"] == "assistant"]
    out = []
    for k, ((generated, feedback), message) in enumerate(zip(pieces, assistants, strict=True)):
        later_answer = any(not m.get("tool_calls") for m in assistants[k + 1 :])
        is_answer = not message.get("tool_calls")
        last = message is messages[-1]
        out.append(
            (
                history_form(
                    generated,
                    drop_analysis=later_answer if not is_answer else not last,
                    answer_in_history=is_answer and not last,
                ),
                feedback,
            )
        )
    return out


def _episode_messages(rng: random.Random) -> list[dict[str, Any]]:
    """A conversation an episode can have: a prompt, then generated turns each followed by tool results (named
    after the call, as the environment names them) and/or a user message; harmony's one call per turn."""
    texts = [t for t in TEXTS if t]
    messages: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(texts)}] if rng.random() < 0.5 else []
    messages.append({"role": "user", "content": rng.choice(texts)})
    for turn in range(rng.randint(1, 5)):
        message: dict[str, Any] = {"role": "assistant", "content": rng.choice(texts)}
        if rng.random() < 0.7:
            message["reasoning_content"] = rng.choice(texts)
        if rng.random() < 0.55:
            call = _call(rng, turn)
            message.update(content=rng.choice(["", None]), tool_calls=[call])
            messages.append(message)
            messages.append({"role": "tool", "name": call["function"]["name"], "content": rng.choice(texts)})
            if rng.random() < 0.2:
                messages.append({"role": "user", "content": rng.choice(texts)})
        else:
            messages.append(message)
            messages.append({"role": "user", "content": rng.choice(texts)})
    if rng.random() < 0.5:  # the episode ends with a generated turn
        while messages[-1]["role"] != "assistant":
            messages.pop()
    return messages


EPISODES = [_episode_messages(random.Random(seed)) for seed in range(200)]
GOLDEN_EPISODES = [c["name"] for c in cases().values() if any(m["role"] == "assistant" for m in c["messages"])]


@pytest.mark.parametrize("source", ["golden", "generated"])
def test_prompt_generations_and_feedback_are_the_official_render_but_at_the_seams(source: str) -> None:
    ours = protocol()
    conversations = (
        [(cases()[name]["messages"], cases()[name]["tools"]) for name in GOLDEN_EPISODES]
        if source == "golden"
        else [(m, DESCRIBED if i % 2 else None) for i, m in enumerate(EPISODES)]
    )
    append_only = 0
    for messages, tools in conversations:
        prompt, pieces = episode(ours, messages, tools)
        expected = official(messages, tools=tools, add_generation_prompt=messages[-1]["role"] != "assistant")
        assert prompt + "".join(g + f for g, f in history_pieces(messages, pieces)) == expected
        append_only += prompt + "".join(g + f for g, f in pieces) == expected
    assert 0 < append_only < len(conversations)  # both kinds are exercised


def test_golden_cases_are_append_only_except_where_pinned() -> None:
    # Which golden episodes are not append-only, and why: plain_chat's first answer ends with the sampled
    # <|return|> where history has <|end|>; multi_turn_reasoning's also, and both of its earlier turns lose their
    # analysis once a later final answer exists. The call turns of the others have no analysis.
    ours = protocol()
    differ = set()
    for name in GOLDEN_EPISODES:
        messages, tools = cases()[name]["messages"], cases()[name]["tools"]
        prompt, pieces = episode(ours, messages, tools)
        expected = official(messages, tools=tools, add_generation_prompt=messages[-1]["role"] != "assistant")
        if prompt + "".join(g + f for g, f in pieces) != expected:
            differ.add(name)
    assert differ == {"plain_chat", "multi_turn_reasoning"}


def test_parallel_calls_keep_the_templates_first_call() -> None:
    # Harmony stops generating at <|call|>: one call per turn. The template renders only the first call of a
    # message and names every result after it; render_generation writes what the template writes.
    case = cases()["parallel_tool_calls"]
    generated = protocol().render_generation(case["messages"][1])
    assert generated.count(CALL) == 1 and generated.endswith('{"city": "Paris"}' + CALL)


def test_feedback_closes_a_cut_off_turn_and_never_writes_a_system_message() -> None:
    ours = protocol()
    user = [{"role": "user", "content": "go on"}]
    assert ours.render_feedback(user) == "<|start|>user<|message|>go on<|end|><|start|>assistant"
    assert ours.render_feedback(user, turn_closed=False) == END + ours.render_feedback(user)
    assert ours.render_feedback(user, ended_by=RETURN) == ours.render_feedback(user, ended_by=CALL)
    # A final answer cut off by the length limit and closed here is what history holds: append-only.
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "partial"}, *user]
    cut = ours.render_prompt(messages[:1]) + "<|channel|>final<|message|>partial"
    assert cut + ours.render_feedback(user, turn_closed=False) == official(messages, add_generation_prompt=True)
    with pytest.raises(MessageError, match="no system message"):
        ours.render_feedback([{"role": "system", "content": "s"}])
    with pytest.raises(MessageError, match="at least one"):
        ours.render_feedback([])


# -- 5. token-in-token-out through the session, real o200k_harmony tokenizer -----------------------------------

THINK_CALL = ANALYSIS_HEAD + "I should use the calculator." + END + START + "assistant"
TEMPLATE_CALL = ' to=functions.calculator<|channel|>commentary json<|message|>{"expression": "17 * 23"}<|call|>'
CHANNEL_CALL = (
    '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expression": "17 * 23"}<|call|>'
)
ANSWER = ANALYSIS_HEAD + "The tool answered." + END + START + "assistant<|channel|>final<|message|>It is 391." + RETURN


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    return load_family_tokenizer("gpt_oss")


def run_episode(tokenizer: HFTokenizer, script: list[str], **kwargs: Any) -> Any:
    """One episode through the session; `kwargs` go to AgentSession, `max_new_tokens` to the runtime too."""
    return run_calculator_episode(
        protocol(),
        tokenizer,
        script,
        logprob=-0.5,
        sampling_max_new_tokens=kwargs.get("max_new_tokens", 1024),
        **kwargs,
    )


def test_stop_tokens_are_call_and_return(tokenizer: HFTokenizer) -> None:
    ours = protocol()
    assert [tokenizer.token_to_id(t) for t in ours.stop_texts] == [200002, 200012]
    assert sorted(tokenizer.token_to_id(t) for t in ours.turn_end_texts) == [200002, 200012]


@pytest.mark.parametrize("call", [TEMPLATE_CALL, CHANNEL_CALL], ids=["template_header", "channel_header"])
def test_session_is_token_in_token_out(tokenizer: HFTokenizer, call: str) -> None:
    engine, result, specs = run_episode(tokenizer, [THINK_CALL + call, ANSWER])
    assert result.final_answer == "It is 391." and result.stop_reason == "final_answer"
    trajectory = result.trajectory
    (segment,) = trajectory.segments
    ids, (first, second) = segment.ids, segment.action_ranges
    # Every generated turn is its ids as sampled; the engine's second prompt is the transcript, nothing re-rendered.
    assert ids[slice(*first)] == tokenizer.encode(THINK_CALL + call)
    assert ids[slice(*second)] == tokenizer.encode(ANSWER)
    assert engine.calls[1] == ids[: second[0]]
    assert [m.content for m in trajectory.messages if m.role == "tool"] == ["391"]
    # The official render of the episode's messages, tokenized, is the transcript but at the pinned seams:
    # (1) the call turn's analysis, which the template drops once a later final answer exists, and (2) for a
    # model that writes the recipient in the channel part, the call header, which history writes the template's
    # way. The ids of what history holds in their place are the tokenization of the template's text.
    rendered = official(trajectory.messages, tools=[spec.to_openai() for spec in specs])
    assert rendered.endswith(ANSWER)  # a training render keeps the last answer's analysis and <|return|>
    head, rest = tokenizer.encode(THINK_CALL), ids[first[0] : first[1]]
    assert rest[: len(head)] == head and rest[len(head) :] == tokenizer.encode(call)
    history = ids[: first[0]] + tokenizer.encode(TEMPLATE_CALL) + ids[first[1] :]
    assert history == tokenizer.encode(rendered)


def test_a_turn_cut_off_by_the_length_limit_is_closed_with_end(tokenizer: HFTokenizer) -> None:
    long_call = ANALYSIS_HEAD + "let me think " * 40 + END + START + "assistant" + TEMPLATE_CALL
    _, result, _ = run_episode(tokenizer, [long_call, TEMPLATE_CALL, ANSWER], max_new_tokens=20)
    segment = result.trajectory.segments[0]
    first_end = segment.action_ranges[0][1]
    assert first_end - segment.action_ranges[0][0] == 20
    assert segment.ids[first_end] == tokenizer.token_to_id(END)
    assert result.trajectory.errors[0].code == "missing_think_end"
