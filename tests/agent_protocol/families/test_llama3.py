"""Llama 3.1 / 3.2 instruct (`agent_protocol.protocols.llama3`): renders against the golden files and the official
Jinja, the `llama3_json` parser, the feedback after a generated turn, and token-in-token-out through a session
with the real Llama 3 tokenizer.

Jinja-side adaptations (`as_vllm_passes`, tests/support/family_checks.py), the two places where the protocol
follows vLLM's chat preprocessing and not the bare template: null content is passed as "" (the bare template
prints "None"), and arguments given as a JSON string are passed as the object they hold (vLLM parses them before
rendering; the bare template would dump the string with its escapes).
"""

from __future__ import annotations

import json
import random
from datetime import date
from typing import Any

import jinja2
import pytest
import tokenizers

from agent_protocol import ChatProtocol, HFTokenizer, MessageError, TokenTranscript, get_protocol
from tests.agent_protocol.golden import FROZEN_TODAY, GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    as_vllm_passes,
    check_parse,
    compare_with_jinja,
    episode_text,
    is_episode,
    render_golden,
)
from tests.support.family_tokenizers import tokenizer_path
from tests.support.hf_jinja import render_official
from tests.support.random_conversations import ConversationMix, choose, conversation, random_tools
from tests.support.tool_shapes import TOOL_SHAPES

TEMPLATES = ("llama3.1_instruct", "llama3.2_instruct")
RENDERS = renders(*TEMPLATES)

#: variant id -> (template stem, protocol name, protocol options, template kwargs)
VARIANTS: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    "llama3.1": ("llama3.1_instruct", "llama3.1", {}, {}),
    "llama3.1__today": ("llama3.1_instruct", "llama3.1", {"today": date(2025, 2, 3)}, {"date_string": "03 Feb 2025"}),
    "llama3.1__tools_in_system": (
        "llama3.1_instruct",
        "llama3.1",
        {"tools_in_user_message": False},
        {"tools_in_user_message": False},
    ),
    "llama3.2": ("llama3.2_instruct", "llama3.2", {"today": FROZEN_TODAY}, {}),  # strftime_now is frozen there
    "llama3.2__tools_in_system": (
        "llama3.2_instruct",
        "llama3.2",
        {"today": FROZEN_TODAY, "tools_in_user_message": False},
        {"tools_in_user_message": False},
    ),
}


def official(variant: str, messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    stem, _, _, kwargs = VARIANTS[variant]
    return render_official(stem, as_vllm_passes(messages), tools=tools, add_generation_prompt=generation, **kwargs)


def protocol_of(variant: str) -> ChatProtocol:
    _, name, options, _ = VARIANTS[variant]
    return get_protocol(name, **options)


# -- golden renders -------------------------------------------------------------------------------------------


def test_every_llama_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not) for each template; parallel_tool_calls is refused by both
    assert len(RENDERS) == 24
    assert sorted(r.id for r in RENDERS if r.refused) == [
        f"{t}__parallel_tool_calls__gen_{g}.ERROR" for t in TEMPLATES for g in ("false", "true")
    ]


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    render = lambda: render_golden(golden)  # noqa: E731
    if golden.refused:
        assert "single tool-calls at once" in golden.text
        with pytest.raises(MessageError, match=r"official Llama 3.x template refuses .*single tool-calls at once"):
            render()
    else:
        assert render() == golden.text
        assert golden.text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")


def test_dates() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert "Today Date: 26 Jul 2024\n" in get_protocol("llama3.1").render_messages(messages)
    assert "Today Date: 01 Sep 2025\n" in get_protocol("llama3.1", today=FROZEN_TODAY).render_messages(messages)
    today = date.today().strftime("%d %b %Y")  # 3.2 without `today`: the current date, as strftime_now gives it
    assert f"Today Date: {today}\n" in get_protocol("llama3.2").render_messages(messages)


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


#: no reasoning (the template has none), and two calls in a turn less often: the template refuses them
LLAMA_MIX = ConversationMix(
    texts=TEXTS, call_count=lambda rng: rng.choice([0, 0, 1, 1, 1, 2]), arguments=choose(ARGUMENTS)
)


def _conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    return conversation(rng, LLAMA_MIX), random_tools(rng)


CONVERSATIONS = [_conversation(random.Random(seed)) for seed in range(200)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_renderer_equals_official_jinja(variant: str) -> None:
    compared, refused = compare_with_jinja(
        protocol_of(variant),
        lambda messages, tools, generation: official(variant, messages, tools, generation),
        CONVERSATIONS,
        refused_by=(jinja2.TemplateError,),
        refusal=r"official Llama 3\.x template refuses",
        template_error="single tool-calls|no first user message",
    )
    assert compared >= 150 * 2 and refused > 0, (compared, refused)


def test_generated_conversations_cover_the_corners() -> None:
    """The generated set holds what the template treats specially, so the comparison above exercises it."""
    tools_seen = {json.dumps(t) for _, tools in CONVERSATIONS for t in tools or []}
    assert tools_seen == {json.dumps(t) for t in TOOL_SHAPES}
    assert any(tools == [] for _, tools in CONVERSATIONS)  # "no tools" and "an empty list" render differently
    flat = [m for messages, _ in CONVERSATIONS for m in messages]
    assert any(isinstance(c["function"]["arguments"], str) for m in flat for c in m.get("tool_calls", []))
    assert any(m["role"] == "assistant" and m["content"] is None for m in flat)
    assert any(m["role"] == "system" for messages, _ in CONVERSATIONS for m in messages[1:])


def test_refusals() -> None:
    llama = get_protocol("llama3.1")
    with pytest.raises(MessageError, match="empty conversation"):
        llama.render_messages([])
    with pytest.raises(MessageError, match="no first user message"):
        llama.render_messages([{"role": "system", "content": "s"}], tools=TOOL_SHAPES[:1])
    with pytest.raises(jinja2.TemplateError, match="no first user message"):
        official("llama3.1", [{"role": "system", "content": "s"}], TOOL_SHAPES[:1])
    # with the tools in the system block, no user message is needed
    in_system = get_protocol("llama3.1", tools_in_user_message=False)
    rendered = in_system.render_messages([{"role": "system", "content": "s"}], tools=TOOL_SHAPES[:1])
    assert rendered == official("llama3.1__tools_in_system", [{"role": "system", "content": "s"}], TOOL_SHAPES[:1])
    two_calls = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}],
    }
    with pytest.raises(MessageError, match=r"message.tool_calls: .*refuses an assistant turn with 2 tool calls"):
        llama.render_generation(two_calls)


def test_options_are_checked() -> None:
    with pytest.raises(TypeError, match="takes: today, tools_in_user_message"):
        get_protocol("llama3.2", enable_thinking=True)


# -- the llama3_json parser -----------------------------------------------------------------------------------

CALL = '{"name": "lookup", "parameters": {"q": "Paris"}}'


@pytest.mark.parametrize("name", ["llama3.1", "llama3.2"])
@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "It is 18 °C.", "tool_calls": []},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_0", "function": {"name": "f", "arguments": {}}}],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_0", "function": {"name": "lookup", "arguments": {"q": "é", "n": [1, {"a": None}]}}}
            ],
        },
    ],
    ids=["answer", "call_without_arguments", "call"],
)
def test_parse_inverts_render_generation(name: str, message: dict[str, Any]) -> None:
    protocol = get_protocol(name)
    text = protocol.render_generation(message)
    assert text.endswith("<|eot_id|>")
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
        ("Plain answer.<|eot_id|>", "Plain answer.", []),
        ("Plain answer, cut off", "Plain answer, cut off", []),
        (CALL + "<|eot_id|>", "", [("lookup", {"q": "Paris"})]),
        # Llama 3.1 with `Environment: ipython` may open a call with <|python_tag|> and end it with <|eom_id|>
        ("<|python_tag|>" + CALL + "<|eom_id|>", "", [("lookup", {"q": "Paris"})]),
        # vLLM reads "arguments" too, and prefers it when both are there
        ('{"name": "f", "arguments": {"a": 1}, "parameters": {"b": 2}}', "", [("f", {"a": 1})]),
        # several calls, "; "-separated as vLLM's parser expects (the template refuses to render them again)
        (CALL + '; {"name": "now", "parameters": {}}<|eot_id|>', "", [("lookup", {"q": "Paris"}), ("now", {})]),
        # text around a call is kept as content (vLLM drops it; the template drops it on re-render)
        ("Let me look.\n" + CALL + "<|eot_id|>", "Let me look.", [("lookup", {"q": "Paris"})]),
        # a string holding the object is decoded once
        ('{"name": "f", "parameters": "{\\"a\\": 1}"}', "", [("f", {"a": 1})]),
        # JSON and braces in prose are content, as in vLLM: no "name", or not JSON at all
        ('Here is JSON: {"a": 1}<|eot_id|>', 'Here is JSON: {"a": 1}', []),
        ("A set {1, 2} and " + CALL, "A set {1, 2} and " + CALL, []),  # vLLM gives up at the first bad brace
        ('{"a": 1}', '{"a": 1}', []),
    ],
    ids=[
        "answer",
        "answer_cut_off",
        "call",
        "python_tag_eom",
        "arguments_key",
        "two_calls",
        "text_then_call",
        "string_parameters",
        "json_in_prose",
        "brace_in_prose",
        "object_without_name",
    ],
)
def test_parse(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    action = get_protocol("llama3.1").parse_assistant_text(text)
    check_parse(action, content, calls)
    assert [c.id for c in action.tool_calls] == [f"call_{k}" for k in range(len(calls))]


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        ('{"name": "lookup", "parameters": {"q": "Paris"}<|eot_id|>', "invalid_json", "not valid JSON"),
        ('{"name": "lookup", "parameters": {"q": "Par', "unclosed_tag", "cut off"),
        ('<|python_tag|>{"nam": "lookup"}<|eom_id|>', "missing_name", 'no "name"'),
        ('{"name": "", "parameters": {}}', "missing_name", 'no "name"'),
        ('{"name": 7, "parameters": {}}', "missing_name", 'no "name"'),
        ('{"name": "now"}<|eot_id|>', "invalid_arguments", 'no "parameters"'),
        ('{"name": "f", "parameters": [1]}', "invalid_arguments", "must be a JSON object, not list"),
        ('{"name": "f", "parameters": "not json"}', "invalid_arguments", "must be a JSON object, not str"),
        ('{"name": "f", "parameters": {"x": ' + "9" * 5000 + "}}", "invalid_json", "cannot be read"),
        ('{"name": "f", "parameters": ' + "[" * 1500 + "]" * 1500 + "}", "invalid_json", "cannot be read"),
        ('{"name": "f", "parameters": ' + '{"a":' * 150 + "1" + "}" * 151, "invalid_json", "cannot be read"),
        ('{"name": "f", "parameters": {"x": "\\ud800"}}', "invalid_json", "cannot be read"),
        ('{"name": "f", "parameters": "' + "[" * 2000 + '"}', "invalid_arguments", "cannot be read"),
    ],
    ids=[
        "bad_json",
        "cut_off",
        "python_tag_no_name",
        "empty_name",
        "name_not_string",
        "no_parameters",
        "parameters_array",
        "parameters_string",
        "huge_int",
        "deep_brackets",
        "deep_but_decodable",
        "lone_surrogate",
        "deep_parameters_string",
    ],
)
def test_malformed_calls_are_coded_issues(text: str, code: str, message: str) -> None:
    action = get_protocol("llama3.2").parse_assistant_text(text)
    (call,) = action.tool_calls
    assert call.error is not None and call.error.code == code and message in call.error.message, call
    assert call.raw is not None and call.raw.startswith("{")


def test_a_good_call_before_a_broken_one_is_kept() -> None:
    action = get_protocol("llama3.1").parse_assistant_text(CALL + '; {"name": "now", "parameters": {<|eot_id|>')
    good, broken = action.tool_calls
    assert good.ok and good.name == "lookup"
    assert broken.error is not None and broken.error.code == "invalid_json"


# -- feedback: prompt + generations + feedback == the official render -----------------------------------------


def _golden_episode(golden: GoldenRender) -> bool:
    """The golden render an episode of the case ends on: with the generation prompt iff the case ends on a user or
    tool message."""
    return golden.add_generation_prompt == (cases()[golden.case]["messages"][-1]["role"] != "assistant")


EPISODES = [g for g in RENDERS if not g.refused and _golden_episode(g)]


def test_every_golden_episode_is_checked() -> None:
    assert len(EPISODES) == 10  # 5 renderable cases x 2 templates


@pytest.mark.parametrize("golden", EPISODES, ids=lambda g: g.id)
def test_feedback_continues_the_golden_render(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    assert is_episode(case["messages"])
    assert episode_text(protocol, case["messages"], case["tools"]) == golden.text


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_feedback_continues_the_official_render(variant: str) -> None:
    protocol = protocol_of(variant)
    compared = 0
    for seed in range(600):
        messages, tools = _conversation(random.Random(seed))
        if not is_episode(messages):  # two assistant turns in a row, or no prompt before the first turn
            continue
        try:
            text = episode_text(protocol, messages, tools)
        except MessageError:  # refused by the template (checked in test_python_renderer_equals_official_jinja)
            continue
        assert text == official(variant, messages, tools, messages[-1]["role"] != "assistant"), seed
        compared += 1
    assert compared >= 150, compared


def test_cut_off_turn_is_closed() -> None:
    feedback = get_protocol("llama3.1").render_feedback([{"role": "tool", "content": "5"}], turn_closed=False)
    assert feedback == (
        '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|><|start_header_id|>assistant'
        "<|end_header_id|>\n\n"
    )
    # both closing tokens close the turn already: the feedback is the same after either
    llama = get_protocol("llama3.1")
    observation = [{"role": "user", "content": "more"}]
    assert llama.render_feedback(observation, ended_by="<|eom_id|>") == llama.render_feedback(observation)
    assert llama.turn_end_texts == ("<|eot_id|>", "<|eom_id|>")
    assert llama.stop_texts == ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


@pytest.mark.parametrize(
    ("messages", "match"),
    [([], "at least one"), ([{"role": "assistant", "content": "x"}], r"messages\[0\].role")],
)
def test_bad_feedback(messages: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(MessageError, match=match):
        get_protocol("llama3.2").render_feedback(messages)


PROMPT = [{"role": "user", "content": "Weather in Paris?"}]
RESULT = [{"role": "tool", "content": "18 C"}]
#: seam id -> (what the model generated, whether it closed the turn, what the transcript holds there, what the
#: official render of the parsed conversation holds there)
SEAMS: dict[str, tuple[str, bool, str, str]] = {
    # Llama 3.1 may close a call with <|eom_id|> under "Environment: ipython"; history always says <|eot_id|>
    "eom_id": (CALL + "<|eom_id|>", True, CALL + "<|eom_id|>", CALL + "<|eot_id|>"),
    # ...and open it with <|python_tag|>, which the template never writes for a custom tool
    "python_tag": ("<|python_tag|>" + CALL + "<|eom_id|>", True, "<|python_tag|>" + CALL + "<|eom", CALL + "<|eot"),
    # text next to a call: the template renders a call turn as the JSON alone
    "text_and_call": ("Let me look.\n" + CALL + "<|eot_id|>", True, "Let me look.\n" + CALL, CALL),
    # whitespace around an answer: the template trims content
    "untrimmed": ("  It is sunny. \n<|eot_id|>", True, "\n\n  It is sunny. \n<|eot", "\n\nIt is sunny.<|eot"),
    # <|end_of_text|> stops the engine but does not close the turn: the feedback closes it with <|eot_id|>
    "end_of_text": ("It is sunny.<|end_of_text|>", False, "sunny.<|end_of_text|><|eot_id|>", "sunny.<|eot_id|>"),
}


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_seams_are_where_we_document_them(seam: str) -> None:
    """Where the transcript keeps what the model sampled and the official render of the same (parsed) conversation
    differs: exactly one place per seam, and nowhere else."""
    generated, closed, held, rendered = SEAMS[seam]
    llama = get_protocol("llama3.1")
    message = llama.assistant_message(generated).to_openai()
    observation = RESULT if message.get("tool_calls") else [{"role": "user", "content": "thanks"}]
    sampled = llama.render_prompt(PROMPT, tools=TOOL_SHAPES) + generated
    sampled += llama.render_feedback(observation, turn_closed=closed)
    expected = official("llama3.1", [*PROMPT, message, *observation], TOOL_SHAPES, True)
    assert sampled != expected
    assert sampled.count(held) == 1 and expected.count(rendered) == 1
    assert sampled.replace(held, rendered) == expected


def test_two_calls_in_one_turn_cannot_be_rendered_again() -> None:
    """vLLM's parser reads both calls, and the turn runs both; the official template refuses that history."""
    llama = get_protocol("llama3.1")
    message = llama.assistant_message(CALL + '; {"name": "now", "parameters": {}}<|eot_id|>').to_openai()
    with pytest.raises(MessageError, match="refuses an assistant turn with 2 tool calls"):
        llama.render_messages([*PROMPT, message, *RESULT, *RESULT], tools=TOOL_SHAPES)


# -- token-in-token-out with the real Llama 3 tokenizer -------------------------------------------------------

#: the added tokens whose names differ between the Llama 3.0 tokenizer.json we have (tests/data/tokenizers/README.md)
#: and Llama 3.1's: the BPE vocabulary and every other added token are the same, so renaming these three gives
#: Llama 3.1's tokenizer
LLAMA31_NAMES = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}
BOS_ID, EOT_ID, EOM_ID, END_OF_TEXT_ID, PYTHON_TAG_ID = 128000, 128009, 128008, 128001, 128010


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    spec = json.loads(tokenizer_path("llama3.1").read_text(encoding="utf-8"))
    renamed = 0
    for token in spec["added_tokens"]:
        if token["id"] in LLAMA31_NAMES:
            assert token["content"].startswith("<|reserved_special_token_"), token  # the 3.0 name we replace
            token["content"] = LLAMA31_NAMES[token["id"]]
            renamed += 1
    assert renamed == len(LLAMA31_NAMES)
    return HFTokenizer(tokenizers.Tokenizer.from_str(json.dumps(spec)), source="llama3.1 with Llama 3.1 token names")


def test_the_renamed_tokenizer_has_llama31_special_tokens(tokenizer: HFTokenizer) -> None:
    for text, token in [("<|begin_of_text|>", BOS_ID), ("<|eot_id|>", EOT_ID), ("<|eom_id|>", EOM_ID)]:
        assert tokenizer.encode(text) == [token] and tokenizer.token_to_id(text) == token
    assert tokenizer.encode("<|python_tag|>{") == [PYTHON_TAG_ID, tokenizer.encode("{")[0]]
    stops = {t: tokenizer.token_to_id(t) for t in get_protocol("llama3.1").stop_texts}
    assert stops == {"<|eot_id|>": EOT_ID, "<|eom_id|>": EOM_ID, "<|end_of_text|>": END_OF_TEXT_ID}


@pytest.mark.parametrize("golden", EPISODES, ids=lambda g: g.id)
def test_golden_episodes_are_token_in_token_out(golden: GoldenRender, tokenizer: HFTokenizer) -> None:
    """Each piece tokenized alone (prompt, generated turns, feedback) and appended gives, id for id, the
    tokenization of the official render: every piece starts and ends at a special token, or after the
    header's "\\n\\n", where the pre-tokenizer splits anyway."""
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    transcript = TokenTranscript()
    messages = case["messages"]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    prompt = protocol.render_prompt(messages[: turns[0] if turns else None], tools=case["tools"])
    transcript.append_prompt(tokenizer.encode(prompt))
    for position, index in enumerate(turns):
        transcript.append_action(tokenizer.encode(protocol.render_generation(messages[index])))
        end = turns[position + 1] if position + 1 < len(turns) else len(messages)
        if end > index + 1:
            transcript.append_observation(tokenizer.encode(protocol.render_feedback(messages[index + 1 : end])))
    assert transcript.ids == tokenizer.encode(golden.text)
    assert transcript.ids[0] == BOS_ID


def llama_call(expression: str, *, opener: str = "", closer: str = "<|eot_id|>") -> str:
    return opener + json.dumps({"name": "calculator", "parameters": {"expression": expression}}) + closer


def run_episode(tokenizer: HFTokenizer, protocol: ChatProtocol, script: list[str]) -> Any:
    episode = run_calculator_episode(protocol, tokenizer, script, logprob=-0.5)
    return episode.result, episode.engine


def official_ids(tokenizer: HFTokenizer, protocol: ChatProtocol, variant: str, trajectory: Any) -> list[int]:
    pytest.importorskip("agent_runtime")  # the layers above: the agent-protocol-alone run skips session tests
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    messages = [m.to_openai() for m in trajectory.messages]
    generation = messages[-1]["role"] != "assistant"
    text = official(variant, messages, [CalculatorTool().spec.to_openai()], generation)
    assert protocol.render_messages(trajectory.messages, tools=[CalculatorTool().spec]) == text
    return tokenizer.encode(text)


@pytest.mark.parametrize("variant", ["llama3.1", "llama3.2"])
def test_session_is_token_in_token_out(variant: str, tokenizer: HFTokenizer) -> None:
    protocol = protocol_of(variant)
    script = [llama_call("17 * 23"), "The answer is 391.<|eot_id|>"]
    result, engine = run_episode(tokenizer, protocol, script)
    assert result.final_answer == "The answer is 391." and result.stop_reason == "final_answer"
    trajectory = result.trajectory
    assert [m.content for m in trajectory.messages if m.role == "tool"] == ["391"]
    (segment,) = trajectory.segments
    # The token stream is exactly the official render of the conversation the episode had, id for id.
    assert segment.ids == official_ids(tokenizer, protocol, variant, trajectory)
    # The prompt for turn 2 is the transcript so far; the generated turns are the sampled ids, and only they
    # are trained on.
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(s) for s in script]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)
    feedback = segment.ids[segment.action_ranges[0][1] : segment.action_ranges[1][0]]
    assert tokenizer.decode(feedback) == (
        '<|start_header_id|>ipython<|end_header_id|>\n\n"391"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
    )


#: seam id -> (the first generated turn, the ids the transcript holds around the call, the ids the official render
#: holds there, as functions of the call's own ids)
TOKEN_SEAMS = {
    # <|python_tag|> ... <|eom_id|>: the turn is closed by <|eom_id|> (a turn end, so no extra token), and the
    # history renders the call bare, closed by <|eot_id|>
    "python_tag_eom": (
        llama_call("17 * 23", opener="<|python_tag|>", closer="<|eom_id|>"),
        lambda call: [PYTHON_TAG_ID, *call, EOM_ID],
        lambda call: [*call, EOT_ID],
    ),
    # <|end_of_text|> stops the engine but is no turn end: the feedback closes the turn with <|eot_id|>
    "end_of_text": (
        llama_call("17 * 23", closer="<|end_of_text|>"),
        lambda call: [*call, END_OF_TEXT_ID, EOT_ID],
        lambda call: [*call, EOT_ID],
    ),
}


@pytest.mark.parametrize("seam", sorted(TOKEN_SEAMS))
def test_session_seams_are_pinned_id_for_id(seam: str, tokenizer: HFTokenizer) -> None:
    first, held, rendered = TOKEN_SEAMS[seam]
    protocol = get_protocol("llama3.1")
    result, _ = run_episode(tokenizer, protocol, [first, "The answer is 391.<|eot_id|>"])
    assert result.final_answer == "The answer is 391." and result.trajectory.errors == []
    (segment,) = result.trajectory.segments
    call = tokenizer.encode(llama_call("17 * 23", closer=""))
    assert segment.ids[segment.action_ranges[0][0] : segment.action_ranges[0][1]] == tokenizer.encode(first)
    expected = official_ids(tokenizer, protocol, "llama3.1", result.trajectory)
    # exactly one place differs, and it is the seam: substituting it gives the official ids, id for id
    assert _replace_once(segment.ids, held(call), rendered(call)) == expected


def _replace_once(ids: list[int], old: list[int], new: list[int]) -> list[int]:
    starts = [i for i in range(len(ids) - len(old) + 1) if ids[i : i + len(old)] == old]
    assert len(starts) == 1, starts
    return ids[: starts[0]] + new + ids[starts[0] + len(old) :]
