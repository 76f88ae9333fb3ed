"""DeepSeek-V3.2 (`deepseek-v3.2`, option `thinking`): renders against the official encoder's output, the parser
against vLLM's `deepseek_v32` semantics, the feedback pieces against the encoder's full render, and an episode at
the token level.

DeepSeek-V3.2 has no Jinja template; its reference is the Python encoder in its Hugging Face repository
(`encoding/encoding_dsv32.py`). The renders in tests/data/golden/deepseek_v3.2 were made by that encoder (vLLM's
verbatim copy, run outside this repository) and are data here: `renders.json` for the golden cases, and
`generated.json.xz` for 480 generated conversations and 200 episode-shaped ones, each with the encoder's render
or the error it raised. Each
file's `source` says how they were made.
"""

from __future__ import annotations

import json
import lzma
import random
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st

from agent_protocol import HFTokenizer, MessageError, detect_protocol, get_protocol
from agent_protocol.protocols.deepseek_v32 import DeepSeekV32Protocol
from tests.agent_protocol.golden import cases
from tests.support.calculator_episode import QUESTION, run_calculator_episode
from tests.support.family_tokenizers import tokenizer_path
from tests.support.hostile_text import FUZZ, hostile_piece

DATA = Path(__file__).resolve().parents[2] / "data" / "golden" / "deepseek_v3.2"
NAME = "deepseek-v3.2"
EOS = "<｜end▁of▁sentence｜>"
BEGIN, END = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"


@cache
def generated() -> dict[str, Any]:
    return dict(json.loads(lzma.open(DATA / "generated.json.xz").read().decode("utf-8")))


@cache
def golden() -> list[dict[str, Any]]:
    return list(json.loads((DATA / "renders.json").read_text(encoding="utf-8"))["renders"])


def tools_of(entry: dict[str, Any]) -> Any:
    return None if entry["tools"] is None else generated()["tool_sets"][entry["tools"]]


# -- 1. golden cases ----------------------------------------------------------------------------------------


def test_every_golden_render_is_present() -> None:
    assert len(golden()) == 12  # 6 cases x thinking off / on (the generation prompt changes nothing)
    refused = [(g["case"], g["thinking"]) for g in golden() if "error" in g]
    assert refused == [("single_tool_call", True), ("parallel_tool_calls", True)]


#: tools_placement -> the suffix of its fields in the data ("text", "error"; "text_vllm", "error_vllm")
PLACEMENTS = {"first_system": "", "vllm": "_vllm"}


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("entry", golden(), ids=lambda g: f"{g['case']}-thinking_{g['thinking']}")
def test_render_matches_the_encoders_render(entry: dict[str, Any], placement: str) -> None:
    case = cases()[entry["case"]]
    suffix = PLACEMENTS[placement]
    protocol = get_protocol(NAME, thinking=entry["thinking"], tools_placement=placement)
    for generation in (False, True):
        if "error" + suffix in entry:  # a final answer without reasoning after the last user message, thinking on
            with pytest.raises(MessageError, match="neither reasoning_content nor tool calls"):
                protocol.render_messages(case["messages"], tools=case["tools"], add_generation_prompt=generation)
            continue
        rendered = protocol.render_messages(case["messages"], tools=case["tools"], add_generation_prompt=generation)
        assert rendered == entry["text" + suffix]


def test_the_two_placements_differ_only_with_a_leading_system_message() -> None:
    differ = {g["case"] for g in golden() if "text" in g and g["text"] != g["text_vllm"]}
    assert differ == {"single_tool_call", "tools_provided"}  # tools and a system prompt first
    messages, tools = cases()["tools_provided"]["messages"], cases()["tools_provided"]["tools"]
    system = messages[0]["content"]
    official = get_protocol(NAME).render_prompt(messages, tools=tools)
    vllm = get_protocol(NAME, tools_placement="vllm").render_prompt(messages, tools=tools)
    assert official.startswith(f"<｜begin▁of▁sentence｜>{system}\n\n## Tools\n")  # after the system prompt
    assert vllm.startswith("<｜begin▁of▁sentence｜>\n\n## Tools\n") and f"</functions>\n{system}<｜User｜>" in vllm
    with pytest.raises(ValueError, match="tools_placement must be one of first_system, vllm"):
        get_protocol(NAME, tools_placement="user")


# -- 2. generated conversations against the encoder --------------------------------------------------------


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("thinking", [False, True], ids=["chat", "thinking"])
def test_python_renderer_equals_the_encoder(thinking: bool, placement: str) -> None:
    protocol = get_protocol(NAME, thinking=thinking, tools_placement=placement)
    suffix = PLACEMENTS[placement]
    compared = refused = with_tools = 0
    for entry in generated()["conversations"] + generated()["episodes"]:
        if entry["thinking"] != thinking:
            continue
        for generation in (False, True):
            if "error" + suffix in entry:
                with pytest.raises(MessageError, match=r"DeepSeek-V3\.2 encoder"):
                    protocol.render_messages(entry["messages"], tools=tools_of(entry), add_generation_prompt=generation)
                refused += 1
                continue
            actual = protocol.render_messages(
                entry["messages"], tools=tools_of(entry), add_generation_prompt=generation
            )
            assert actual == entry["text" + suffix], f"seed {entry['seed']}"
            compared += 1
            with_tools += entry["tools"] is not None
    assert compared >= 2 * 150 and refused > 0 and with_tools >= 2 * 90


def test_what_the_encoder_refuses_is_refused_with_the_reason() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    protocol = get_protocol(NAME)
    for messages, match in [
        ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}], "does not follow an assistant"),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
            + [{"role": "tool", "content": "r"}] * 2,
            "more results than calls",
        ),
        ([{"role": "tool", "content": "r"}], "no assistant turn before it"),
    ]:
        with pytest.raises(MessageError, match=match):
            protocol.render_messages(messages)
    flat = {"name": "f", "description": "d", "parameters": {}}
    with pytest.raises(MessageError, match=r"tools\[0\]: has no `function`"):
        protocol.render_messages([{"role": "user", "content": "q"}], tools=[flat])


def test_the_renders_shape() -> None:
    protocol = get_protocol(NAME)
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"s": "x", "n": 2, "e": {}}}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me see.", "tool_calls": [call]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "Done."},
    ]
    assert protocol.render_messages(messages) == (
        "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>Let me see.\n\n<｜DSML｜function_calls>\n"
        '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="s" string="true">x</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="n" string="false">2</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="e" string="false">{}</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n<function_results>\n<result>r</result>\n"
        "</function_results>\n\n</think>Done.<｜end▁of▁sentence｜>"
    )
    # the prompt is always there: a user turn ends with the opener, with or without add_generation_prompt
    thinking = get_protocol(NAME, thinking=True)
    assert (
        thinking.render_messages(messages[:1])
        == thinking.render_prompt(messages[:1])
        == ("<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><think>")
    )
    assert thinking.generation_prompt == "<｜Assistant｜><think>"
    assert repr(thinking) == "DeepSeekV32Protocol(thinking=True, tools_placement='first_system')"


def test_detected_by_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v32"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))  # V3.2 ships no chat template
    assert detect_protocol(tmp_path) == NAME


# -- 3. parsing: vLLM's deepseek_v32 tool parser -----------------------------------------------------------


def _assistant(rng: random.Random, thinking: bool) -> dict[str, Any]:
    texts = ["", "Hi", "two\n\nlines", "émoji 🦙 中文", "  spaces  ", '{"json": 1}']
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice(texts)}
    if thinking:
        message["reasoning_content"] = rng.choice(texts)
    if rng.random() < 0.6:
        arguments = [{}, {"q": "x"}, {"n": 3, "s": "é"}, {"o": {"a": [1, None, True]}}, {"num_str": "391"}]
        message["tool_calls"] = [
            {"id": f"c{k}", "type": "function", "function": {"name": "lookup", "arguments": rng.choice(arguments)}}
            for k in range(rng.randint(1, 3))
        ]
    return message


@pytest.mark.parametrize("thinking", [False, True], ids=["chat", "thinking"])
def test_generated_turns_round_trip(thinking: bool) -> None:
    protocol = get_protocol(NAME, thinking=thinking)
    for seed in range(200):
        message = _assistant(random.Random(seed), thinking)
        text = protocol.render_generation(message)
        action = protocol.parse_assistant_text(text)
        assert action.issues == ()
        assert action.content == message["content"]
        assert action.reasoning_content == (message.get("reasoning_content") if thinking else None)
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert [(c.name, c.arguments) for c in action.tool_calls] == calls
        assert protocol.render_generation(action.to_message()) == text


def test_well_formed_turns() -> None:
    protocol = get_protocol(NAME)
    text = (
        f'Checking.\n\n{BEGIN}\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="location" string="true">杭州</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        f'<｜DSML｜invoke name="now">\n\n</｜DSML｜invoke>\n{END}{EOS}'
    )
    action = protocol.parse_assistant_text(text, call_id_prefix="t")
    assert action.content == "Checking."  # the `\n\n` the encoder writes before the block is not content
    assert [(c.id, c.name, c.arguments) for c in action.tool_calls] == [
        ("t_0", "get_weather", {"location": "杭州", "days": 2}),
        ("t_1", "now", {}),
    ]
    # a string parameter stays a string even when it reads as a number; text after the calls is dropped
    loose = f'{BEGIN}<｜DSML｜invoke name="f"><｜DSML｜parameter name="n" string="true">391</｜DSML｜parameter>'
    action = protocol.parse_assistant_text(loose + f"</｜DSML｜invoke>{END}after{EOS}")
    assert (action.content, action.tool_calls[0].arguments) == ("", {"n": "391"})
    thinking = get_protocol(NAME, thinking=True)
    action = thinking.parse_assistant_text(f"I add.</think>It is 5.{EOS}")
    assert (action.reasoning_content, action.content, action.error) == ("I add.", "It is 5.", None)
    cut = thinking.parse_assistant_text("still thinking")
    assert cut.error is not None and cut.error.code == "missing_think_end" and cut.reasoning_content == "still thinking"


@pytest.mark.parametrize(
    ("body", "code", "name"),
    [
        ('<｜DSML｜invoke name="calc">\n<｜DSML｜parameter name="e" string="true">1+', "unclosed_tag", "calc"),
        ("", "unclosed_tag", ""),  # cut off right after the block opened
        (f"garbage{END}", "invalid_json", ""),  # a block with no call in it
        (f'<｜DSML｜invoke name="">\n</｜DSML｜invoke>{END}', "missing_name", ""),
        (
            f'<｜DSML｜invoke name="calc"><｜DSML｜parameter name="n" string="false">{{oops</｜DSML｜parameter>'
            f"</｜DSML｜invoke>{END}",
            "invalid_json",
            "calc",
        ),
        (
            f'<｜DSML｜invoke name="calc"><｜DSML｜parameter name="n" string="false">{"[" * 5000}</｜DSML｜parameter>'
            f"</｜DSML｜invoke>{END}",
            "invalid_json",
            "calc",
        ),
        (  # a raw lone surrogate in a string value (the parser fuzz found it): no tool or wire could encode it
            f'<｜DSML｜invoke name="calc">\n<｜DSML｜parameter name="x" string="true">\ud800</｜DSML｜parameter>\n'
            f"</｜DSML｜invoke>{END}",
            "invalid_arguments",
            "calc",
        ),
        (
            f'<｜DSML｜invoke name="calc"><｜DSML｜parameter name="\udfff" string="true">1</｜DSML｜parameter>'
            f"</｜DSML｜invoke>{END}",
            "invalid_arguments",
            "calc",
        ),
    ],
)
def test_malformed_calls_are_coded_issues(body: str, code: str, name: str) -> None:
    for thinking in (False, True):
        text = ("r</think>" if thinking else "") + "Before.\n\n" + BEGIN + body
        action = get_protocol(NAME, thinking=thinking).parse_assistant_text(text)
        assert action.content == "Before."
        (call,) = action.tool_calls
        assert call.error is not None and call.error.code == code, call.error
        assert call.name == name and call.raw is not None


DSML_TAGS = [
    BEGIN,
    END,
    '<｜DSML｜invoke name="f">',
    "</｜DSML｜invoke>",
    '<｜DSML｜parameter name="k" string="false">',
]
DSML_TAGS += ["</｜DSML｜parameter>", EOS, "<think>", "</think>", "\n\n", '"']
dsml_text = st.lists(st.sampled_from(DSML_TAGS) | hostile_piece(), min_size=1, max_size=12).map("".join)


@FUZZ
@given(text=dsml_text, thinking=st.booleans())
def test_parser_never_raises_on_its_own_tags(text: str, thinking: bool) -> None:
    action = get_protocol(NAME, thinking=thinking).parse_turn(text)  # the parser itself, unguarded
    for call in action.tool_calls:
        assert isinstance(call.arguments, dict)
        assert call.error is None or call.error.code in ("invalid_json", "missing_name", "unclosed_tag")


# -- 4. feedback: prompt + generated turns + feedback == the encoder's render --------------------------------


def episode_pieces(protocol: DeepSeekV32Protocol, messages: list[dict[str, Any]], tools: Any) -> list[tuple[str, int]]:
    """The first prompt (up to the first assistant turn), then each assistant turn as generated and the feedback
    after it, each rendered on its own; with each piece, the index of the message after its last one."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    out = [(protocol.render_prompt(messages[:first], tools=tools), first)]
    index = first
    while index < len(messages):
        out.append((protocol.render_generation(messages[index]), index + 1))
        end = index + 1
        while end < len(messages) and messages[end]["role"] != "assistant":
            end += 1
        if end > index + 1:
            out.append((protocol.render_feedback(messages[index + 1 : end]), end))
        index = end
    return out


def episodes() -> list[tuple[bool, list[dict[str, Any]], Any, str]]:
    """The generated conversations an episode can lay down: rendered by the encoder, system and user messages
    first, then turns each answered by as many tool results as it has calls, or by a user message."""
    out = []
    for entry in generated()["conversations"] + generated()["episodes"]:
        messages = entry["messages"]
        if "error" in entry or not any(m["role"] == "assistant" for m in messages):
            continue
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        ok = all(
            m["role"] != "assistant" or messages[i - 1]["role"] != "assistant" for i, m in enumerate(messages)
        ) and all(
            m["role"] != "assistant" or len(m.get("tool_calls") or []) == sum(1 for _ in _following_tools(messages, i))
            for i, m in enumerate(messages)
        )
        if ok and all(m["role"] != "system" for m in messages[first:]):
            out.append((entry["thinking"], messages, tools_of(entry), entry["text"]))
    return out


def _following_tools(messages: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    out = []
    for message in messages[index + 1 :]:
        if message["role"] != "tool":
            break
        out.append(message)
    return out


#: the thinking-mode seam: once a later user message comes, an earlier turn's opener is `</think>` (it was
#: `<think>`), and its reasoning is dropped
OPENED = re.compile(r"(<｜Assistant｜>|</function_results>\n\n)<think>(.*?)</think>", re.DOTALL)


def test_episode_pieces_are_the_encoders_render() -> None:
    checked = {False: 0, True: 0}
    seams = 0
    for thinking, messages, tools, expected in episodes():
        protocol = get_protocol(NAME, thinking=thinking)
        assert isinstance(protocol, DeepSeekV32Protocol)
        pieces = episode_pieces(protocol, messages, tools)
        text = "".join(piece for piece, _ in pieces)
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not thinking or len(users) == 1:  # append-only: the pieces are the render, byte for byte
            assert text == expected
        elif any("think>" in (m.get("reasoning_content") or "") for m in messages):
            continue  # reasoning that writes a think tag itself: the seam below cannot be told from it
        else:
            # every opener in the pieces laid down before the last user message came was `<think>` then
            before = "".join(piece for piece, end in pieces if end <= users[-1])
            history = OPENED.sub(r"\1</think>", before) + text[len(before) :]
            assert history == expected
            seams += text != expected
        checked[thinking] += 1
    assert checked[False] >= 140 and checked[True] >= 120 and seams >= 50


def test_feedback_pieces() -> None:
    chat, thinking = get_protocol(NAME), get_protocol(NAME, thinking=True)
    tools = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "6"}]
    user = {"role": "user", "content": "And 4+4?"}
    block = "\n\n<function_results>\n<result>5</result>\n<result>6</result>\n</function_results>\n\n"
    assert chat.render_feedback(tools) == block + "</think>"
    assert thinking.render_feedback(tools) == block + "<think>"
    assert thinking.render_feedback([*tools, user]) == block + "</think><｜User｜>And 4+4?<｜Assistant｜><think>"
    assert chat.render_feedback([user], turn_closed=False) == EOS + "<｜User｜>And 4+4?<｜Assistant｜></think>"


# -- 5. token-in-token-out through the session ----------------------------------------------------------------
#
# V3.2's tokenizer file is not in a registry here. It is V3.1's vocabulary, in which `<think>` (128798) and
# `</think>` (128799) are added tokens (vLLM's V3.2 tokenizer notes `</think>` as an added token) and DSML is text,
# not a token; V3.1's is DeepSeek-V3's file (tests/data/tokenizers) with those two tokens added.

V31_THINK_TOKENS = {128798: "<think>", 128799: "</think>"}


@pytest.fixture(scope="module")
def v32() -> HFTokenizer:
    data = json.loads(tokenizer_path("deepseek_v3").read_text(encoding="utf-8"))
    for token in data["added_tokens"]:
        if token["id"] in V31_THINK_TOKENS:
            token.update(content=V31_THINK_TOKENS[token["id"]], special=False, normalized=False)
    return HFTokenizer(tokenizers.Tokenizer.from_str(json.dumps(data)), source="deepseek_v3 + V3.1 think tokens")


def tool_call(expression: str) -> str:
    invoke = f'<｜DSML｜invoke name="calculator">\n<｜DSML｜parameter name="expression" string="true">{expression}'
    return f"\n\n{BEGIN}\n{invoke}</｜DSML｜parameter>\n</｜DSML｜invoke>\n{END}{EOS}"


@pytest.mark.parametrize("thinking", [False, True], ids=["chat", "thinking"])
def test_session_transcript_is_the_encoders_render(thinking: bool, v32: HFTokenizer) -> None:
    head = "The calculator will do it.</think>" if thinking else ""
    script = [head + tool_call("17 * 23"), ("It is done.</think>" if thinking else "") + f"The answer is 391.{EOS}"]
    protocol: Any = NAME if not thinking else get_protocol(NAME, thinking=True)
    engine, result, specs = run_calculator_episode(protocol, v32, script, rewards="result")
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    assert result.trajectory.errors == []
    (segment,) = result.trajectory.segments
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [v32.encode(s) for s in script]
    assert engine.calls[-1] == segment.ids[: segment.action_ranges[-1][0]]  # the prompt is the transcript
    tools = [spec.to_openai() for spec in specs]
    rendered = get_protocol(NAME, thinking=thinking).render_messages(
        [m.to_openai() for m in result.trajectory.messages], tools=tools
    )
    assert QUESTION in rendered and '"name": "calculator"' in rendered  # the model is shown its tool
    assert v32.decode(segment.ids) == rendered  # append-only within one user message, in both modes
    # `<｜Assistant｜>`, `</think>`/`<think>` and `<｜end▁of▁sentence｜>` are tokens: nothing merges across a seam
    assert segment.ids == v32.encode(rendered)
