"""Llama 4 Scout / Maverick instruct (`agent_protocol.protocols.llama4`): renders against the golden files and the
official Jinja, the `llama4_json` (= `llama3_json`) parser, the feedback after a generated turn and its seams, and
token-in-token-out (golden episodes and a session) at the token level with Llama 4's tokenizer, built from Meta's
tiktoken ranks in PyPI's llama-models and checked against Meta's own tokenizer's ids.

Jinja-side adaptations (`as_vllm_passes`, tests/support/family_checks.py), where the protocol follows vLLM's chat
preprocessing and not the bare template: null content is passed as "" (the bare template prints "None", or fails
iterating it), and arguments given as a JSON string are passed as the object they hold.
"""

from __future__ import annotations

import json
import random
import warnings
from functools import cache
from typing import Any

import jinja2
import pytest

from agent_protocol import ChatProtocol, HFTokenizer, MessageError, TokenTranscript, get_protocol
from agent_protocol.protocols.llama4 import ToolsNotShownWarning
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    as_vllm_passes,
    check_parse,
    compare_with_jinja,
    episode_text,
    is_episode,
    render_golden,
)
from tests.support.family_tokenizers import DATA, load_family_tokenizer
from tests.support.hf_jinja import render_official
from tests.support.random_conversations import ConversationMix, choose, conversation, random_tools
from tests.support.tool_shapes import TOOL_SHAPES

RENDERS = renders("llama4")

#: variant id -> (protocol options, template kwargs)
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "llama4": ({}, {}),
    "llama4__tools_in_system": ({"tools_in_user_message": False}, {"tools_in_user_message": False}),
}


def official(variant: str, messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    _, kwargs = VARIANTS[variant]
    return render_official("llama4", as_vllm_passes(messages), tools=tools, add_generation_prompt=generation, **kwargs)


def protocol_of(variant: str) -> ChatProtocol:
    return get_protocol("llama4", **VARIANTS[variant][0])


# -- golden renders -------------------------------------------------------------------------------------------


def test_every_llama4_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not); the template takes parallel calls, so nothing is refused
    assert len(RENDERS) == 12
    assert not [r for r in RENDERS if r.refused]


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    assert render_golden(golden) == golden.text
    assert golden.text.startswith("<|begin_of_text|><|header_start|>")
    # and the golden file is what the template renders today
    case = cases()[golden.case]
    assert official("llama4", case["messages"], case["tools"], golden.add_generation_prompt) == golden.text


def test_no_date_is_printed() -> None:
    """The template sets `date_string` (from `strftime_now`) and never prints it: no `today` option."""
    text = get_protocol("llama4").render_messages(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    )
    system, user = "<|header_start|>system<|header_end|>\n\n", "<|header_start|>user<|header_end|>\n\n"
    assert text == f"<|begin_of_text|>{system}s<|eot|>{user}u<|eot|>"
    with pytest.raises(TypeError, match="takes: tools_in_user_message"):
        get_protocol("llama4", today=None)


# -- generated conversations against the official Jinja -------------------------------------------------------

TEXTS = [
    "",
    "Hi",
    "\n",
    "  padded  ",
    "\nleading newline",
    "trailing newline\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    '{"name": "lookup", "parameters": {"q": "x"}}',
    'quotes " and \\ backslash',
    "tab\tand\r\nCRLF",
]
ARGUMENTS: list[Any] = [
    {},
    {"q": "x"},
    {"q": "é 中文", "n": 3, "nested": {"a": [1, 2.5, None, True]}},
    '{"q": "given as a string"}',
    "{}",
]

#: no reasoning (the template has none); up to three calls in a turn (the template takes any number)
LLAMA4_MIX = ConversationMix(
    texts=TEXTS, call_count=lambda rng: rng.choice([0, 0, 1, 1, 2, 3]), arguments=choose(ARGUMENTS)
)


def _conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    return conversation(rng, LLAMA4_MIX), random_tools(rng)


CONVERSATIONS = [_conversation(random.Random(seed)) for seed in range(200)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_official_jinja(variant: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ToolsNotShownWarning)
        compared, refused = compare_with_jinja(
            protocol_of(variant),
            lambda messages, tools, generation: official(variant, messages, tools, generation),
            CONVERSATIONS,
            refused_by=(jinja2.TemplateError,),
            refusal=r"official Llama 4 template refuses",
            template_error="no first user message",
        )
    assert compared >= 150 * 2, (compared, refused)


def test_generated_conversations_cover_the_corners() -> None:
    """The generated set holds what the template treats specially, so the comparison above exercises it."""
    tools_seen = {json.dumps(t) for _, tools in CONVERSATIONS for t in tools or []}
    assert tools_seen == {json.dumps(t) for t in TOOL_SHAPES}
    assert any(tools == [] for _, tools in CONVERSATIONS)  # "no tools" and "an empty list" render differently
    flat = [m for messages, _ in CONVERSATIONS for m in messages]
    assert any(isinstance(c["function"]["arguments"], str) for m in flat for c in m.get("tool_calls", []))
    assert any(len(m.get("tool_calls", [])) == 3 for m in flat)
    assert any(m["role"] == "assistant" and m["content"] is None for m in flat)
    assert any(m["role"] == "system" for messages, _ in CONVERSATIONS for m in messages[1:])
    # the tools' message takes the first message after the system one whatever its role
    firsts = {next((m["role"] for m in ms if m["role"] != "system"), None) for ms, tools in CONVERSATIONS if tools}
    assert {"assistant", "tool", "user"} <= firsts


def test_refusals_and_the_tools_warning() -> None:
    llama = get_protocol("llama4")
    with pytest.raises(MessageError, match="empty conversation"):
        llama.render_messages([])
    with pytest.raises(jinja2.UndefinedError):
        official("llama4", [])
    with pytest.raises(MessageError, match="no first user message"):
        llama.render_messages([{"role": "system", "content": "s"}], tools=TOOL_SHAPES[:1])
    with pytest.raises(jinja2.TemplateError, match="no first user message"):
        official("llama4", [{"role": "system", "content": "s"}], TOOL_SHAPES[:1])
    # tools in the system block need a system message: without one the template shows them nowhere, and says
    # nothing; the protocol renders the same bytes and warns, once per protocol object
    in_system = get_protocol("llama4", tools_in_user_message=False)
    user = [{"role": "user", "content": "u"}]
    with pytest.warns(ToolsNotShownWarning, match="never shown the tools"):
        rendered = in_system.render_messages(user, tools=TOOL_SHAPES)
    assert (
        rendered
        == official("llama4__tools_in_system", user, TOOL_SHAPES)
        == "<|begin_of_text|>" + official("llama4", user).removeprefix("<|begin_of_text|>")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        in_system.render_messages(user, tools=TOOL_SHAPES)  # once only
        get_protocol("llama4", tools_in_user_message=False).render_messages(user, tools=[])  # an empty list: no


def _parts(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text[:2]}, {"type": "text", "text": text[2:]}]


def _joined(content: Any) -> Any:
    return "".join(p["text"] for p in content) if isinstance(content, list) else content


def test_lists_of_text_parts_render_joined_where_the_template_joins_them() -> None:
    """Content as a list of text parts: the template writes the parts' text in a user, assistant or later system
    message (as the protocol does, joined), and the protocol refuses the three places where it does not."""
    llama = get_protocol("llama4")
    joined = [
        {"role": "system", "content": [{"type": "text", "text": " one part "}]},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": _parts("an answer")},
        {"role": "system", "content": _parts("later rules")},
        {"role": "user", "content": _parts("more\n")},
    ]
    for generation in (False, True):
        assert llama.render_messages(joined, add_generation_prompt=generation) == official(
            "llama4", joined, None, generation
        )
    calls = [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": {}}}]
    with_call = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": _parts("look"), "tool_calls": calls},
    ]
    assert llama.render_messages(with_call) == official("llama4", with_call)
    refused = [
        ([{"role": "system", "content": _parts("rules")}, {"role": "user", "content": "u"}], None, "first part"),
        ([{"role": "user", "content": _parts("carrier")}], TOOL_SHAPES, "Python list"),
        ([{"role": "user", "content": "u"}, {"role": "tool", "content": _parts("result")}], None, "as JSON"),
    ]
    for messages, tools, match in refused:
        with pytest.raises(MessageError, match=match):
            llama.render_messages(messages, tools=tools)
        # the template renders something other than the joined text there
        strings = [{**m, "content": _joined(m["content"])} for m in messages]
        assert official("llama4", messages, tools) != official("llama4", strings, tools)
    with pytest.raises(MessageError, match="as JSON"):
        llama.render_feedback([{"role": "tool", "content": _parts("result")}])
    # a list is fine where the template joins it: the tools' message when the tools go to the system block
    in_system = get_protocol("llama4", tools_in_user_message=False)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": _parts("carrier")}]
    assert in_system.render_messages(messages, tools=TOOL_SHAPES) == official(
        "llama4__tools_in_system", messages, TOOL_SHAPES
    )


def test_an_assistant_message_with_an_empty_call_list_renders_nothing() -> None:
    """`"tool_calls": []` (some clients send it with every answer): the template writes nothing for the message,
    unless it is the one that carries the tools, whose content it writes there."""
    llama = get_protocol("llama4")
    empty = {"role": "assistant", "content": "an answer", "tool_calls": []}
    for messages, tools in [
        ([{"role": "user", "content": "u"}, empty, {"role": "user", "content": "v"}], None),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, empty], TOOL_SHAPES),
        ([{"role": "system", "content": "s"}, empty, {"role": "user", "content": "u"}], TOOL_SHAPES),
        ([empty, {"role": "user", "content": "u"}], None),
    ]:
        for generation in (False, True):
            expected = official("llama4", messages, tools, generation)
            assert llama.render_messages(messages, tools=tools, add_generation_prompt=generation) == expected
    assert "an answer" not in official("llama4", [{"role": "user", "content": "u"}, empty])
    first = [empty, {"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    with pytest.raises(MessageError, match="empty tool_calls list before a system message"):
        llama.render_messages(first)


# -- the llama4_json parser -----------------------------------------------------------------------------------

CALL = '{"name": "lookup", "parameters": {"q": "Paris"}}'
NOW = '{"name": "now", "parameters": {}}'
BLOCK = "<|python_start|><|python_end|>"


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "It is 18 °C.\n", "tool_calls": []},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_0", "function": {"name": "f", "arguments": {}}}],
        },
        {
            "role": "assistant",
            "content": "Let me look {it} up.",
            "tool_calls": [
                {"id": "call_0", "function": {"name": "lookup", "arguments": {"q": "é", "n": [1, {"a": None}]}}},
                {"id": "call_1", "function": {"name": "now", "arguments": {}}},
            ],
        },
    ],
    ids=["answer", "call_without_arguments", "content_and_two_calls"],
)
def test_parse_inverts_render_generation(message: dict[str, Any]) -> None:
    protocol = get_protocol("llama4")
    text = protocol.render_generation(message)
    assert text.endswith("<|eot|>")
    parsed = protocol.assistant_message(text)
    expected = {**message, "tool_calls": [{**c, "type": "function"} for c in message["tool_calls"]]}
    for call in expected["tool_calls"]:
        call["function"] = {
            **call["function"],
            "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
        }
    assert parsed.to_openai() == {k: v for k, v in expected.items() if v != []}


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Plain answer.<|eot|>", "Plain answer.", []),
        ("  Untrimmed answer \n<|eot|>", "  Untrimmed answer \n", []),
        ("Plain answer, cut off", "Plain answer, cut off", []),
        (BLOCK + CALL + "<|eot|>", "", [("lookup", {"q": "Paris"})]),
        (
            "<|python_start|>I will look.<|python_end|>" + CALL + NOW + "<|eom|>",
            "I will look.",
            [("lookup", {"q": "Paris"}), ("now", {})],
        ),
        # what the block holds is content, JSON or not
        ("<|python_start|>" + NOW + "<|python_end|>" + CALL, NOW, [("lookup", {"q": "Paris"})]),
        # a call without the block, as Llama 3 writes it, is read the same
        (CALL + "<|eot|>", "", [("lookup", {"q": "Paris"})]),
        # vLLM reads "arguments" too, and prefers it when both are there
        (BLOCK + '{"name": "f", "arguments": {"a": 1}, "parameters": {"b": 2}}', "", [("f", {"a": 1})]),
        # text after the calls is kept as content, after the block's
        ("<|python_start|>a<|python_end|>" + CALL + " done<|eot|>", "a\ndone", [("lookup", {"q": "Paris"})]),
        # a block with no call after it is not a call turn: the whole text is content
        ("<|python_start|>print(1)<|python_end|><|eot|>", "<|python_start|>print(1)<|python_end|>", []),
        ('Here is JSON: {"a": 1}<|eot|>', 'Here is JSON: {"a": 1}', []),
    ],
    ids=[
        "answer",
        "untrimmed",
        "answer_cut_off",
        "call",
        "content_two_calls_eom",
        "json_in_block",
        "call_without_block",
        "arguments_key",
        "text_after_calls",
        "block_without_call",
        "json_in_prose",
    ],
)
def test_parse(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    action = get_protocol("llama4").parse_assistant_text(text)
    check_parse(action, content, calls)
    assert [c.id for c in action.tool_calls] == [f"call_{k}" for k in range(len(calls))]


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        (BLOCK + '{"name": "lookup", "parameters": {"q": "Paris"}<|eot|>', "invalid_json", "not valid JSON"),
        (BLOCK + '{"name": "lookup", "parameters": {"q": "Par', "unclosed_tag", "cut off"),
        ('{"name": "lookup", "parameters": {"q": "Par', "unclosed_tag", "cut off"),
        (BLOCK + '{"name": "", "parameters": {}}', "missing_name", 'no "name"'),
        (BLOCK + '{"name": "now"}<|eot|>', "invalid_arguments", 'no "parameters"'),
        (BLOCK + '{"name": "f", "parameters": [1]}', "invalid_arguments", "must be a JSON object, not list"),
        (BLOCK + '{"name": "f", "parameters": {"x": ' + "9" * 5000 + "}}", "invalid_json", "cannot be read"),
    ],
    ids=["bad_json", "cut_off", "cut_off_without_block", "empty_name", "no_parameters", "parameters_array", "huge_int"],
)
def test_malformed_calls_are_coded_issues(text: str, code: str, message: str) -> None:
    action = get_protocol("llama4").parse_assistant_text(text)
    (call,) = action.tool_calls
    assert call.error is not None and call.error.code == code and message in call.error.message, call
    assert call.raw is not None and call.raw.startswith("{")


# -- feedback: prompt + generations + feedback == the official render -----------------------------------------


def _golden_episode(golden: GoldenRender) -> bool:
    return golden.add_generation_prompt == (cases()[golden.case]["messages"][-1]["role"] != "assistant")


EPISODES = [g for g in RENDERS if _golden_episode(g)]


def test_every_golden_episode_is_checked() -> None:
    assert len(EPISODES) == 6


@pytest.mark.parametrize("golden", EPISODES, ids=lambda g: g.id)
def test_feedback_continues_the_golden_render(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    assert is_episode(case["messages"])
    assert episode_text(get_protocol("llama4"), case["messages"], case["tools"]) == golden.text


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_feedback_continues_the_official_render(variant: str) -> None:
    protocol = protocol_of(variant)
    compared = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ToolsNotShownWarning)
        for seed in range(400):
            messages, tools = _conversation(random.Random(seed))
            if not is_episode(messages):
                continue
            try:
                text = episode_text(protocol, messages, tools)
            except MessageError:  # refused by the template (checked in test_python_renderer_equals_official_jinja)
                continue
            assert text == official(variant, messages, tools, messages[-1]["role"] != "assistant"), seed
            compared += 1
    assert compared >= 150, compared


def test_cut_off_turn_is_closed() -> None:
    llama = get_protocol("llama4")
    feedback = llama.render_feedback([{"role": "tool", "content": "5"}], turn_closed=False)
    assert (
        feedback
        == '<|eot|><|header_start|>ipython<|header_end|>\n\n"5"<|eot|><|header_start|>assistant<|header_end|>\n\n'
    )
    observation = [{"role": "user", "content": "more"}]
    assert llama.render_feedback(observation, ended_by="<|eom|>") == llama.render_feedback(observation)
    assert llama.turn_end_texts == ("<|eot|>", "<|eom|>")
    assert llama.stop_texts == ("<|eot|>", "<|eom|>", "<|end_of_text|>")


PROMPT = [{"role": "user", "content": "Weather in Paris?"}]
RESULT = [{"role": "tool", "content": "18 C"}]
#: seam id -> (what the model generated, whether it closed the turn, what the transcript holds there, what the
#: official render of the parsed conversation holds there)
SEAMS: dict[str, tuple[str, bool, str, str]] = {
    # <|eom|> closes the turn (it is in the model's stop list); history always says <|eot|>
    "eom": (BLOCK + CALL + "<|eom|>", True, CALL + "<|eom|>", CALL + "<|eot|>"),
    # a call written bare, as Llama 3 writes it: the template writes the (empty) python block before every call
    "no_python_block": (CALL + "<|eot|>", True, "\n\n" + CALL, "\n\n" + BLOCK + CALL),
    # text after the calls: the template writes a call turn's content in the block, before the calls
    "text_after_calls": (
        BLOCK + CALL + "Done.<|eot|>",
        True,
        BLOCK + CALL + "Done.",
        "<|python_start|>Done.<|python_end|>" + CALL,
    ),
    # <|end_of_text|> stops the engine but does not close the turn: the feedback closes it with <|eot|>
    "end_of_text": ("It is sunny.<|end_of_text|>", False, "sunny.<|end_of_text|><|eot|>", "sunny.<|eot|>"),
}


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_seams_are_where_we_document_them(seam: str) -> None:
    """Where the transcript keeps what the model sampled and the official render of the same (parsed) conversation
    differs: exactly one place per seam, and nowhere else."""
    generated, closed, held, rendered = SEAMS[seam]
    llama = get_protocol("llama4")
    message = llama.assistant_message(generated).to_openai()
    observation = RESULT if message.get("tool_calls") else [{"role": "user", "content": "thanks"}]
    sampled = llama.render_prompt(PROMPT, tools=TOOL_SHAPES) + generated
    sampled += llama.render_feedback(observation, turn_closed=closed)
    expected = official("llama4", [*PROMPT, message, *observation], TOOL_SHAPES, True)
    assert sampled != expected
    assert sampled.count(held) == 1 and expected.count(rendered) == 1
    assert sampled.replace(held, rendered) == expected


# -- token-in-token-out with Llama 4's tokenizer ---------------------------------------------------------------

BOS_ID, END_OF_TEXT_ID, HEADER_START_ID, HEADER_END_ID, EOM_ID, EOT_ID = 200000, 200001, 200005, 200006, 200007, 200008
PYTHON_START_ID, PYTHON_END_ID = 200016, 200017


@cache
def tokenizer_of_llama4() -> HFTokenizer:
    return load_family_tokenizer("llama4")


def test_the_tokenizer_is_metas() -> None:
    """The tokenizer.json built from Meta's tiktoken ranks (tests/data/tokenizers/README.md) encodes as Meta's own
    tokenizer (llama-models' `Tokenizer`, its ids kept as data): the golden renders and random texts."""
    tokenizer = tokenizer_of_llama4()
    expected = json.loads((DATA / "llama4.meta_ids.json").read_text(encoding="utf-8"))
    assert len(expected["texts"]) == 57 and "llama-models 0.3.0" in expected["source"]
    for sample in expected["texts"]:
        assert tokenizer.encode(sample["text"]) == sample["ids"]
        assert tokenizer.decode(sample["ids"]) == sample["text"]
    specials = {"<|begin_of_text|>": BOS_ID, "<|end_of_text|>": END_OF_TEXT_ID, "<|header_start|>": HEADER_START_ID,
                "<|header_end|>": HEADER_END_ID, "<|eom|>": EOM_ID, "<|eot|>": EOT_ID,
                "<|python_start|>": PYTHON_START_ID, "<|python_end|>": PYTHON_END_ID}  # fmt: skip
    for text, token_id in specials.items():
        assert tokenizer.token_to_id(text) == token_id and tokenizer.encode(text) == [token_id]
    stops = [tokenizer.token_to_id(t) for t in get_protocol("llama4").stop_texts]
    assert stops == [EOT_ID, EOM_ID, END_OF_TEXT_ID]  # the model's generation_config eos ids


@pytest.mark.parametrize("golden", EPISODES, ids=lambda g: g.id)
def test_golden_episodes_are_token_in_token_out(golden: GoldenRender) -> None:
    """Each piece tokenized alone (prompt, generated turns, feedback) and appended gives, id for id, the
    tokenization of the official render: every piece starts at a special token or right after the header's
    "\\n\\n", where the pre-tokenizer splits anyway."""
    tokenizer = tokenizer_of_llama4()
    case = cases()[golden.case]
    protocol = get_protocol("llama4")
    transcript = TokenTranscript()
    messages = case["messages"]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    transcript.append_prompt(
        tokenizer.encode(protocol.render_prompt(messages[: turns[0] if turns else None], tools=case["tools"]))
    )
    for position, index in enumerate(turns):
        transcript.append_action(tokenizer.encode(protocol.render_generation(messages[index])))
        end = turns[position + 1] if position + 1 < len(turns) else len(messages)
        if end > index + 1:
            transcript.append_observation(tokenizer.encode(protocol.render_feedback(messages[index + 1 : end])))
    assert transcript.ids == tokenizer.encode(golden.text)
    assert transcript.ids[0] == BOS_ID


def llama4_call(expression: str, *, content: str = "", closer: str = "<|eot|>") -> str:
    call = json.dumps({"name": "calculator", "parameters": {"expression": expression}})
    return f"<|python_start|>{content}<|python_end|>{call}{closer}"


def _official_ids(tokenizer: HFTokenizer, trajectory: Any) -> list[int]:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    messages = [m.to_openai() for m in trajectory.messages]
    generation = messages[-1]["role"] != "assistant"
    spec = CalculatorTool().spec
    text = official("llama4", messages, [spec.to_openai()], generation)
    assert get_protocol("llama4").render_messages(trajectory.messages, tools=[spec]) == text
    return tokenizer.encode(text)


@pytest.mark.parametrize("content", ["", "I will use the calculator."])
def test_session_is_token_in_token_out(content: str) -> None:
    tokenizer = tokenizer_of_llama4()
    script = [llama4_call("17 * 23", content=content), "The answer is 391.<|eot|>"]
    episode = run_calculator_episode(get_protocol("llama4"), tokenizer, script, logprob=-0.5)
    result, engine = episode.result, episode.engine
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    trajectory = result.trajectory
    assert [m.content for m in trajectory.messages if m.role == "tool"] == ["391"]
    assert trajectory.messages[1].content == content
    (segment,) = trajectory.segments
    # The token stream is exactly the official render of the conversation the episode had, id for id.
    assert segment.ids == _official_ids(tokenizer, trajectory)
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(s) for s in script]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)
    feedback = segment.ids[segment.action_ranges[0][1] : segment.action_ranges[1][0]]
    assert tokenizer.decode(feedback) == (
        '<|header_start|>ipython<|header_end|>\n\n"391"<|eot|><|header_start|>assistant<|header_end|>\n\n'
    )


#: seam id -> (the first generated turn, the text whose ids the transcript holds after the call, the official
#: render's there)
TOKEN_SEAMS = {
    # <|eom|> closes the turn (a turn end: no token added); history writes <|eot|>
    "eom": (llama4_call("17 * 23", closer="<|eom|>"), "<|eom|><|header_start|>", "<|eot|><|header_start|>"),
    # <|end_of_text|> stops the engine but is no turn end: the feedback closes the turn with <|eot|>
    "end_of_text": (llama4_call("17 * 23", closer="<|end_of_text|>"), "<|end_of_text|><|eot|>", "<|eot|>"),
}


@pytest.mark.parametrize("seam", sorted(TOKEN_SEAMS))
def test_session_seams_are_pinned(seam: str) -> None:
    first, held, rendered = TOKEN_SEAMS[seam]
    tokenizer = tokenizer_of_llama4()
    episode = run_calculator_episode(get_protocol("llama4"), tokenizer, [first, "The answer is 391.<|eot|>"])
    result = episode.result
    assert result.final_answer == "The answer is 391." and result.trajectory.errors == []
    (segment,) = result.trajectory.segments
    a, b = segment.action_ranges[0]
    assert segment.ids[a:b] == tokenizer.encode(first)
    expected = _official_ids(tokenizer, result.trajectory)
    # exactly one place differs, and it is the seam: substituting its ids gives the official ids, id for id
    assert _replace_once(segment.ids, tokenizer.encode(held), tokenizer.encode(rendered)) == expected


def _replace_once(ids: list[int], old: list[int], new: list[int]) -> list[int]:
    starts = [i for i in range(len(ids) - len(old) + 1) if ids[i : i + len(old)] == old]
    assert len(starts) == 1, starts
    return ids[: starts[0]] + new + ids[starts[0] + len(old) :]
