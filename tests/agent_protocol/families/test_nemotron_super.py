"""NVIDIA Llama-3.3-Nemotron-Super-49B-v1.5 (`nemotron-super-v1.5`, option `enable_thinking`): golden renders, the
Python renderer against the official Jinja on generated conversations (its refusals matched), the
`llama_nemotron_json` parser, the feedback seams, and token-in-token-out through a session at the token level with
the Llama 3.1 tokenizer (the vocabulary the model is built on; its own tokenizer.json is not in a registry here).

The official template (`tests/data/golden/templates/nemotron_super_v1_5.jinja`, provenance in SOURCES.md) is
rendered as Hugging Face renders it (tests/support/hf_jinja.py), with no adaptation: tool-call arguments go to it as
objects (the template dumps them with `tojson`; a JSON string it would paste as written, and the protocol, like every
family here, decodes it once at the boundary, as vLLM's chat preprocessing does).
"""

from __future__ import annotations

import hashlib
import random
from functools import cache
from typing import Any

import jinja2
import pytest

from agent_protocol import HFTokenizer, MessageError, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import episode_text, is_episode, render_golden
from tests.support.family_tokenizers import load_family_tokenizer
from tests.support.hf_jinja import TEMPLATES, official_template
from tests.support.random_conversations import ConversationMix, conversation, random_tools

STEM = "nemotron_super_v1_5"
NAME = "nemotron-super-v1.5"
EOT = "<|eot_id|>"
HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"
RENDERS = renders(STEM)
VARIANTS: dict[str, dict[str, Any]] = {"thinking": {}, "no_thinking": {"enable_thinking": False}}


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    return official_template(STEM).render(messages=messages, tools=tools, add_generation_prompt=generation)


# -- template and golden renders ----------------------------------------------------------------------------------


def test_the_template_is_the_llama_cpp_copy() -> None:
    data = (TEMPLATES / f"{STEM}.jinja").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "1b13a386b158bb4033ad9960032530554c47a92d1735c7dfce715efcabf30e5c"
    assert len(data) == 3246 and data.startswith(b'{% set bos = "<|begin_of_text|>" %}')


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
    "/think",
    "both /think and /no_think",
    "<think>inline</think>\n\nafter",
    "a</think>b</think>  c",
    "<TOOLCALL>typed</TOOLCALL>",
    '{"json": [1, 2]}',
]
VALUES: list[Any] = ["Paris", "", "é 中文\nnewline", 42, -1.5, True, None, [1, "a"], {"k": {"n": [1]}}, {}]


def _arguments(rng: random.Random) -> dict[str, Any]:
    return {rng.choice(["q", "city", "n", "é"]): rng.choice(VALUES) for _ in range(rng.randint(0, 3))}


MIX = ConversationMix(
    texts=TEXTS,
    user_texts=[*TEXTS, None],
    turns=(0, 7),
    reasoning=0.4,
    call_count=lambda rng: rng.randint(0, 3) if rng.random() < 0.5 else 0,
    arguments=_arguments,
    names=("lookup", "weather", "now"),
)


def _conversation(seed: int) -> list[dict[str, Any]]:
    """A conversation of `MIX`; in two of three, the system messages after the first left out and null contents
    made empty (the protocol refuses them, so those conversations would compare nothing)."""
    messages = conversation(random.Random(seed), MIX)
    if seed % 3:
        messages = [m for k, m in enumerate(messages) if k == 0 or m["role"] != "system"]
        messages = [{**m, "content": m["content"] if m["content"] is not None else ""} for m in messages]
    return messages


CONVERSATIONS = [(_conversation(seed), random_tools(random.Random(seed))) for seed in range(200)]


def _switch(messages: list[dict[str, Any]]) -> bool:
    """The mode the template reads: the first system message's switch, `/no_think` first; on without one."""
    first = messages[0]
    return not (first["role"] == "system" and isinstance(first["content"], str) and "/no_think" in first["content"])


def _switched_off(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `/no_think` in the system prompt (added if there is none), as a thinking-off episode."""
    out = [dict(m) for m in messages]
    if out[0]["role"] == "system" and isinstance(out[0]["content"], str):
        out[0]["content"] += " /no_think"
    elif out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": "/no_think"})
    return out


VARIANT_CONVERSATIONS = {
    "thinking": CONVERSATIONS,
    "no_thinking": [(_switched_off(m), tools) for m, tools in CONVERSATIONS],
}


def _dropped(messages: list[dict[str, Any]]) -> bool:
    """What the protocol refuses though the template renders it: a later system message (dropped), a null user or
    tool content (printed as None)."""
    return any(m["role"] == "system" for m in messages[1:]) or any(
        m["role"] in ("user", "tool") and m["content"] is None for m in messages
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_official_jinja(variant: str) -> None:
    protocol = get_protocol(NAME, **VARIANTS[variant])
    equal = template_refused = mode_refused = dropped_refused = 0
    for index, (messages, tools) in enumerate(VARIANT_CONVERSATIONS[variant]):
        for generation in (False, True):
            try:
                expected = official(messages, tools, generation)
            except (jinja2.TemplateError, TypeError):  # `'</think>' in None`, `'/no_think' in None`
                with pytest.raises(MessageError, match=r"null; the official Nemotron Super template fails|drops a sys"):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                template_refused += 1
                continue
            if _dropped(messages):
                with pytest.raises(MessageError, match=r"drops a system message|would print None"):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                dropped_refused += 1
                continue
            if _switch(messages) != protocol.enable_thinking:  # type: ignore[attr-defined]
                with pytest.raises(MessageError, match=r"enable_thinking"):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                mode_refused += 1
                continue
            actual = protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
            assert actual == expected, (index, generation)
            equal += 1
    assert equal + template_refused + mode_refused + dropped_refused == 400
    least_mode = 10 if protocol.enable_thinking else 0  # type: ignore[attr-defined]  # off: every one says /no_think
    assert equal >= 200 and template_refused >= 10 and mode_refused >= least_mode and dropped_refused >= 10, (
        equal,
        template_refused,
        mode_refused,
        dropped_refused,
    )


def test_the_template_reads_the_switch_only_in_the_first_system_message() -> None:
    """`/no_think` wins over `/think` and only it is cut out; a switch in a user message is text."""
    off = get_protocol(NAME, enable_thinking=False)
    both = [{"role": "system", "content": " a /think b /no_think "}, {"role": "user", "content": "q /no_think"}]
    assert off.render_messages(both, add_generation_prompt=True) == official(both, None, True)
    assert "a /think b\n\n" in official(both) and "q /no_think" in official(both)
    assert official(both, None, True).endswith(HEADER + EMPTY_THINK)
    with pytest.raises(MessageError, match=r"enable_thinking=False\)"):
        get_protocol(NAME).render_messages(both)
    user_only = [{"role": "user", "content": "q /no_think"}]
    assert official(user_only, None, True).endswith(HEADER)  # thinking stays on
    with pytest.raises(MessageError, match="write /no_think in the system prompt"):
        off.render_messages(user_only)


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


def test_list_content_and_an_empty_conversation_are_refused() -> None:
    with pytest.raises(MessageError, match="takes string content"):
        get_protocol(NAME).render_messages([{"role": "user", "content": [{"type": "text", "text": "q"}]}])
    with pytest.raises(MessageError, match="renders no empty one"):
        get_protocol(NAME).render_messages([])
    with pytest.raises(jinja2.UndefinedError):
        official([])


# -- parsing: llama_nemotron_json + deepseek_r1 -------------------------------------------------------------------


def test_parse_calls_content_and_reasoning() -> None:
    protocol = get_protocol(NAME)
    text = (
        '<think>\nLet me look.\n</think>\n\nChecking.<TOOLCALL>[{"name": "weather", "arguments": {"city": "Paris"}}, '
        '{"name": "now", "arguments": "{}"}]</TOOLCALL><|eot_id|>'
    )
    action = protocol.parse_assistant_text(text)
    assert action.reasoning_content == "\nLet me look.\n" and action.content == "\n\nChecking."
    assert action.issues == ()
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("weather", {"city": "Paris"}), ("now", {})]
    off = get_protocol(NAME, enable_thinking=False).parse_assistant_text("Plain answer.<|eot_id|>")
    assert off.content == "Plain answer." and off.reasoning_content is None


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('</think><TOOLCALL>[{"name": "a", "arguments": {}', "unclosed_tag"),
        ("</think><TOOLCALL>[{oops}]</TOOLCALL>", "invalid_json"),
        ('</think><TOOLCALL>[{"name": "a", "arguments": {}}</TOOLCALL>', "invalid_json"),  # the plugin fails too
        ('</think><TOOLCALL>[{"arguments": {}}]</TOOLCALL>', "missing_name"),
        ('</think><TOOLCALL>[{"name": "a"}]</TOOLCALL>', "invalid_arguments"),  # the plugin skips it
        ('</think><TOOLCALL>[{"name": "a", "arguments": [1]}]</TOOLCALL>', "invalid_arguments"),
        ("</think><TOOLCALL>[]</TOOLCALL>", "missing_name"),
    ],
)
def test_malformed_calls_become_coded_issues(text: str, code: str) -> None:
    action = get_protocol(NAME).parse_assistant_text(text)
    assert [c.error.code for c in action.tool_calls if c.error] == [code]


def test_an_opening_bracket_is_added_as_the_plugin_adds_it() -> None:
    action = get_protocol(NAME).parse_assistant_text(
        '</think><TOOLCALL>{"name": "a", "arguments": {"x": 1}}]</TOOLCALL>'
    )
    assert [(c.name, c.arguments, c.ok) for c in action.tool_calls] == [("a", {"x": 1}, True)]


def test_unclosed_reasoning_is_an_issue() -> None:
    action = get_protocol(NAME).parse_assistant_text("<think>still thinking")
    assert action.error is not None and action.error.code == "missing_think_end"
    assert action.reasoning_content == "still thinking" and action.content == ""


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parse_of_a_generation_renders_back_the_same(variant: str) -> None:
    protocol = get_protocol(NAME, **VARIANTS[variant])
    checked = 0
    for messages, _ in CONVERSATIONS:
        for message in messages:
            if message["role"] != "assistant" or any(
                t in (message["content"] or "") for t in ("<TOOLCALL>", "<think>", "</think>")
            ):
                continue
            if not protocol.enable_thinking:  # type: ignore[attr-defined]
                message = {k: v for k, v in message.items() if k != "reasoning_content"}
            elif any(t in message.get("reasoning_content", "") for t in ("<think>", "</think>")):
                continue
            generated = protocol.render_generation(message)
            parsed = protocol.assistant_message(generated)
            assert protocol.render_generation(parsed) == generated
            assert (parsed.content or "") == (message["content"] or "")
            assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
                (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
            ]
            checked += 1
    assert checked >= 100


# -- feedback and episodes ----------------------------------------------------------------------------------------


def _episode(rng: random.Random, thinking: bool) -> list[dict[str, Any]]:
    """An episode: a prompt, then generated turns (no `<think>` / `</think>` in them), each followed by tool results
    or a user message, ending on feedback."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5 or not thinking:
        system = rng.choice(["Be brief.", "", " rules /think "])
        messages.append({"role": "system", "content": system if thinking else "/no_think " + system})
    messages.append({"role": "user", "content": rng.choice(["Hi", "  what?  ", "go /no_think"])})
    for _ in range(rng.randint(1, 4)):
        calls = rng.choice([0, 0, 1, 2])
        turn: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", "Sure.", " two\n\nlines "])}
        if thinking:
            turn["reasoning_content"] = rng.choice(["", "\nstep 1\nstep 2\n", "hmm"])
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
            messages.append({"role": "user", "content": rng.choice(["more", " ok "])})
    return messages


def without_seams(text: str, messages: list[dict[str, Any]], *, thinking: bool, prompt: str) -> str:
    """The transcript's text with each generated turn's seam taken out (the final prompt kept whole): with thinking
    on the `<think>reasoning</think>` the model wrote, with it off the prompt's empty think block before it."""
    body = text.removesuffix(prompt)
    for message in messages:
        if message["role"] != "assistant":
            continue
        seam = "<think>" + message.get("reasoning_content", "") + "</think>" if thinking else EMPTY_THINK
        assert HEADER + seam in body
        body = body.replace(HEADER + seam, HEADER, 1)
    return body + prompt


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
        assert without_seams(text, messages, thinking=thinking, prompt=protocol.generation_prompt) == expected, seed


def test_feedback_seams() -> None:
    """The seams, pinned: with thinking on, a generated turn's `<think>reasoning</think>` is in the transcript only
    (the template keeps an assistant turn's text after its last `</think>`, and reasoning_content never); with it
    off, the generation prompt's `<think>\\n\\n</think>\\n\\n` is in the transcript only. Content is not trimmed."""
    protocol = get_protocol(NAME)
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "\n\n391 ", "reasoning_content": "\nr\n"},
        {"role": "user", "content": "thanks"},
    ]
    text = protocol.render_prompt(messages[:1]) + protocol.render_generation(messages[1])
    text += protocol.render_feedback(messages[2:])
    assert HEADER + "<think>\nr\n</think>\n\n391 <|eot_id|><|start_header_id|>user" in text
    assert text.replace("<think>\nr\n</think>", "", 1) == official(messages, None, True)
    # a client that sends the turn back whole (reasoning in content) gets the same history: after `</think>`, stripped
    whole = [messages[0], {"role": "assistant", "content": "<think>\nr\n</think>\n\n391 "}, messages[2]]
    assert official(whole, None, True) == official(
        [messages[0], {"role": "assistant", "content": "391 "}, messages[2]], None, True
    )
    off = get_protocol(NAME, enable_thinking=False)
    plain = [
        {"role": "system", "content": "/no_think"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "391"},
        {"role": "user", "content": "thanks"},
    ]
    text = off.render_prompt(plain[:2]) + off.render_generation(plain[2]) + off.render_feedback(plain[3:])
    assert text.replace(EMPTY_THINK + "391", "391", 1) == official(plain, None, True)


def test_feedback_refuses_a_later_system_message_and_closes_a_cut_turn() -> None:
    with pytest.raises(MessageError, match="drops the others"):
        get_protocol(NAME).render_feedback([{"role": "system", "content": "s"}])
    with pytest.raises(MessageError, match="would print None"):
        get_protocol(NAME).render_feedback([{"role": "tool", "content": None}])
    cut = get_protocol(NAME).render_feedback(
        [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}], turn_closed=False
    )
    assert cut == f"{EOT}<|start_header_id|>tool<|end_header_id|>\n\n<TOOL_RESPONSE>[1, 2]</TOOL_RESPONSE>{EOT}{HEADER}"


# -- token in, token out through the session (Llama 3.1 tokenizer) ------------------------------------------------


@cache
def llama_tokenizer() -> HFTokenizer:
    return load_family_tokenizer("llama3.1")


def test_the_templates_llama_tokens_are_the_tokenizers_added_tokens() -> None:
    """What is checked of the stand-in: the four Llama 3 tokens the template writes are single added tokens with
    Llama 3.1's ids; NVIDIA's `<TOOLCALL>`, `<AVAILABLE_TOOLS>`, `<TOOL_RESPONSE>` and `<think>` are text in it."""
    tokenizer = llama_tokenizer()
    ids = {t: tokenizer.encode(t) for t in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", EOT)}
    assert ids == {
        "<|begin_of_text|>": [128000],
        "<|start_header_id|>": [128006],
        "<|end_header_id|>": [128007],
        EOT: [128009],
    }
    for text in ("<TOOLCALL>", "</TOOLCALL>", "<AVAILABLE_TOOLS>", "<TOOL_RESPONSE>", "<think>", "</think>"):
        encoded = tokenizer.encode(text)
        assert len(encoded) > 1 and all(i < 128000 for i in encoded) and tokenizer.decode(encoded) == text


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_golden_renders_round_trip_through_the_tokenizer(golden: GoldenRender) -> None:
    tokenizer = llama_tokenizer()
    ids = tokenizer.encode(golden.text)
    assert ids[0] == 128000 and tokenizer.decode(ids) == golden.text


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_session_is_token_in_token_out(variant: str) -> None:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    options = VARIANTS[variant]
    thinking = not options
    head = "<think>\nI should use the calculator.\n</think>\n\n" if thinking else ""
    first = head + '<TOOLCALL>[{"name": "calculator", "arguments": {"expression": "17 * 23"}}]</TOOLCALL>' + EOT
    second = ("<think>\nThe tool answered.\n</think>\n\n" if thinking else "") + "The answer is 391." + EOT
    protocol = get_protocol(NAME, **options)
    tokenizer = llama_tokenizer()
    system = "Use the tools." + ("" if thinking else " /no_think")
    episode = run_calculator_episode(protocol, tokenizer, [first, second], rewards="none", system_prompt=system)
    result = episode.result
    assert result.final_answer == "The answer is 391."  # the session strips the final answer
    (segment,) = result.trajectory.segments
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    assert episode.engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    messages = [m.to_openai() for m in result.trajectory.messages]
    tools = [CalculatorTool().spec.to_openai()]
    # up to the second turn: the official render with the generation prompt, but for the first turn's seam
    before_second = tokenizer.decode(segment.ids[: segment.action_ranges[1][0]])
    expected = official(messages[:-1], tools, True)
    seam = "<think>\nI should use the calculator.\n</think>" if thinking else EMPTY_THINK
    assert before_second.replace(HEADER + seam, HEADER, 1) == expected
    # id for id: the prompt and feedback the session wrote are the tokenizer's ids of the official pieces
    assert segment.ids[: segment.action_ranges[0][0]] == tokenizer.encode(official(messages[:2], tools, True))
    assert segment.ids == tokenizer.encode(before_second + second)
