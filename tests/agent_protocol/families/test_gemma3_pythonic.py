"""Gemma 3 with vLLM's pythonic tool template (`gemma3-vllm-pythonic`, agent_protocol.protocols.gemma3_pythonic):
the template's provenance, the golden renders, the Python renderer against the Jinja on generated conversations
with tools, calls and tool results (its refusals matched), vLLM's `pythonic` parser semantics on well-formed and
malformed turns, feedback that continues the template's render with every seam pinned, detection, and
token-in-token-out with the official Gemma 3 tokenizer through `AgentSession`.

The template (`tests/data/golden/templates/gemma3_vllm_pythonic.jinja`) is vLLM's own, not an official Gemma 3
one (provenance in SOURCES.md). It is rendered as Hugging Face renders it (tests/support/hf_jinja.py) with
`bos_token="<bos>"`, call arguments given as objects (as vLLM passes them) and null content as null.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import jinja2
import pytest

from agent_protocol import HFTokenizer, MessageError, TokenTranscript, detect_protocol, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    check_feedback,
    compare_with_jinja,
    episode_splits,
    episode_text,
    is_episode,
    object_arguments,
    official_episode,
    render_golden,
)
from tests.support.family_tokenizers import load_family_tokenizer
from tests.support.hf_jinja import TEMPLATES, official_template, special_tokens
from tests.support.random_conversations import ConversationMix, conversation, random_tools
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "gemma3_vllm_pythonic"
NAME = "gemma3-vllm-pythonic"
EOT = "<end_of_turn>"
RENDERS = renders(STEM)


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    """vLLM's Gemma 3 pythonic tool template, rendered the Hugging Face way (with its `bos_token`)."""
    return official_template(STEM).render(
        messages=messages, tools=tools, add_generation_prompt=generation, **special_tokens(STEM)
    )


# -- the template and the golden renders --------------------------------------------------------------------------


def test_the_template_is_vllms_with_its_recorded_hash() -> None:
    data = (TEMPLATES / f"{STEM}.jinja").read_bytes()
    assert len(data) == 5784 and data.count(b"\r\n") == 122  # CRLF, as the copy read
    assert hashlib.sha256(data).hexdigest() == "f13b988fbd4c082937e342acec34892a8e589690a41e95b0445fcf837e31aefa"
    lf = data.replace(b"\r\n", b"\n")
    assert hashlib.sha256(lf).hexdigest() == "659a5b7f8c93ba6364ddd81b0e0224b3c98987268bfe03f2c8a01a18c1087a15"
    assert jinja2.Environment().from_string(lf.decode()).render(messages=[{"role": "user", "content": "q"}]) == (
        jinja2.Environment().from_string(data.decode()).render(messages=[{"role": "user", "content": "q"}])
    )


def test_every_golden_render_is_present() -> None:
    assert len(RENDERS) == 12 and not any(r.refused for r in RENDERS)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_golden_render_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    messages = [object_arguments(m) for m in case["messages"]]
    assert official(messages, case["tools"], golden.add_generation_prompt) == golden.text
    assert render_golden(golden) == golden.text


# -- generated conversations against the Jinja --------------------------------------------------------------------

TEXTS = [
    "",
    "Hi",
    "  padded  ",
    "\nleading newline",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    '{"temperature": 18}',
    "<start_of_turn>typed<end_of_turn>",
    '[lookup(q="x")]',
    " ",
]


def _arguments(rng: random.Random, *, negative: bool = True) -> dict[str, Any]:
    values: list[Any] = [
        "x",
        'quote " and \\ backslash',
        "中文",
        3,
        -2.5,
        1e20,
        True,
        False,
        None,
        [1, "a"],
        {"k": [None]},
    ]
    if not negative:  # vLLM's parser reads no negative number: a turn with one cannot be generated
        values.remove(-2.5)
    return {f"a{k}": rng.choice(values) for k in range(rng.choice([0, 1, 1, 2, 3]))}


MIX = ConversationMix(texts=TEXTS, call_count=lambda rng: rng.choice([0, 0, 1, 1, 2]), arguments=_arguments)


def _alternating(rng: random.Random) -> list[dict[str, Any]]:
    """An episode-shaped conversation the template takes: user, then model turns answering, calls with their
    results, now and then a system turn where a model turn stands."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": rng.choice(TEXTS)})
        for _ in range(rng.randint(0, 2)):
            calls = [
                {
                    "id": f"c{k}",
                    "type": "function",
                    "function": {"name": rng.choice(["lookup", "now"]), "arguments": _arguments(rng)},
                }
                for k in range(rng.randint(1, 2))
            ]
            messages.append(
                {"role": "assistant", "content": rng.choice(["", "", " ", "Let me look."]), "tool_calls": calls}
            )
            messages.extend({"role": "tool", "tool_call_id": c["id"], "content": rng.choice(TEXTS)} for c in calls)
        if rng.random() < 0.85:
            messages.append({"role": rng.choice(["assistant"] * 9 + ["system"]), "content": rng.choice(TEXTS)})
    return messages


def _drawn(seed: int) -> tuple[list[dict[str, Any]], Any]:
    rng = random.Random(seed)
    messages = conversation(rng, MIX) if seed % 2 else _alternating(rng)
    return messages, random_tools(rng)


#: odd seeds: any roles in any order (the template refuses many); even seeds: episode-shaped conversations
CONVERSATIONS = [_drawn(seed) for seed in range(200)]


def test_python_renderer_equals_the_jinja() -> None:
    compared, refused = compare_with_jinja(
        get_protocol(NAME),
        official,
        CONVERSATIONS,
        refused_by=(jinja2.TemplateError,),
        refusal="alternate|Invalid content type",
        template_error="Conversation roles must alternate|Invalid content type",
    )
    assert compared + refused == 400
    assert compared >= 200 and refused >= 40, (compared, refused)


def test_generated_conversations_reach_every_shape() -> None:
    rendered = []
    for messages, tools in CONVERSATIONS:
        try:
            official(messages, tools)
        except jinja2.TemplateError:
            continue
        rendered.append((messages, tools))
    flat = [m for ms, _ in rendered for m in ms]
    assert sum(len(m.get("tool_calls", [])) > 1 for m in flat) >= 15
    assert sum(m["role"] == "tool" for m in flat) >= 60
    assert sum(tools is not None and tools != [] for _, tools in rendered) >= 40
    assert sum(tools == [] for _, tools in rendered) >= 10
    assert {s["function"]["name"] if "function" in s else s["name"] for s in TOOL_SHAPES} <= {
        s["function"]["name"] if "function" in s else s["name"] for _, tools in rendered for s in tools or []
    }


def test_empty_conversation_is_refused_as_the_template_fails_on_it() -> None:
    with pytest.raises(jinja2.TemplateError):
        official([], None, True)
    with pytest.raises(MessageError, match="empty conversation"):
        get_protocol(NAME).render_messages([])


def test_history_writes_no_comma_between_arguments() -> None:
    """The template's `{% set first = false %}` is scoped to one loop iteration: `, ` is never written."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": "x", "c": True}}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call, call]}]
    assert '[f(a=1b="x"c=true), f(a=1b="x"c=true)]' in official(messages)
    assert get_protocol(NAME).render_messages(messages) == official(messages)


def test_an_empty_call_list_is_a_call_turn_and_null_calls_are_refused() -> None:
    protocol = get_protocol(NAME)
    result = {"role": "tool", "tool_call_id": "c", "content": "r"}
    for messages in (
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": " a ", "tool_calls": []}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": []}, result],
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": []},
            {"role": "assistant", "content": "b"},
        ],
    ):
        for tools in (None, TOOL_SHAPES[:1]):
            expected = official(messages, tools, True)
            assert "<start_of_turn>model\n[]" in expected
            assert protocol.render_messages(messages, tools=tools, add_generation_prompt=True) == expected
    # `[]` is not counted in the alternation: a user message right after it is refused, as the template refuses it
    after = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "user", "content": "u"},
    ]
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        official(after)
    with pytest.raises(MessageError, match="alternate"):
        protocol.render_messages(after)
    null = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": None}]
    with pytest.raises(TypeError):  # the template iterates None
        official(null)
    with pytest.raises(MessageError, match="null") as info:
        protocol.render_messages(null)
    assert info.value.location == "messages[1].tool_calls"
    assert protocol.render_messages(null[:1]) == official(null[:1])  # and the next render forgets the empty list


# -- parsing: vLLM's pythonic parser --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('[lookup(q="x")]', [("lookup", {"q": "x"})]),
        ("[now()]", [("now", {})]),
        (
            "[f(a=1, b='s', c=True, d=None, e=[1, 2.5], g={'k': {1: 'v'}}), now()]\n",
            [
                ("f", {"a": 1, "b": "s", "c": True, "d": None, "e": [1, 2.5], "g": {"k": {"1": "v"}}}),
                ("now", {}),
            ],
        ),
        ('[lookup(q="中文 \\n \\u00e9")]', [("lookup", {"q": "中文 \n é"})]),
    ],
)
def test_parse_reads_call_lists(text: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    action = get_protocol(NAME).parse_assistant_text(text + EOT)
    assert action.issues == () and action.content == ""
    assert [(c.name, c.arguments) for c in action.tool_calls] == calls
    assert [c.id for c in action.tool_calls] == [f"call_{k}" for k in range(len(calls))]


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 391.",
        "",
        " [f(a=1)]",
        "[1, 2]",
        "[f(1)] is not a call list",
        "[ f(a=1)]",
        "Here: [f(a=1)]",
        "[f.g(a=1)]",
        "[Note(s): none]",
    ],
)
def test_parse_plain_content(text: str) -> None:
    action = get_protocol(NAME).parse_assistant_text(text + EOT)
    assert action.content == text and action.tool_calls == () and action.issues == ()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('[f(a=1b="x")]', "malformed_turn"),  # the template's own history spelling of two arguments
        ("[f(a=true)]", "invalid_arguments"),  # JSON's true is a name in Python
        ("[f(a=-1)]", "invalid_arguments"),  # a unary minus is not a literal to vLLM
        ("[f(a=g(1))]", "invalid_arguments"),
        ("[f(a=1), 2]", "malformed_turn"),
        ("[f(a=1)] and text", "malformed_turn"),
        ("[f(a=1)]\n[g()]", "malformed_turn"),
        ("[f(a=1, **{'b': 2})]", "invalid_arguments"),
        ("[f(a=b'x')]", "invalid_arguments"),
        ("[f(a={x: 1})]", "invalid_arguments"),
        ("[f(a=1), g.h()]", "missing_name"),
        ("[f(a=(" * 300 + ")" * 300, "malformed_turn"),
        ("[f(a=1" + "0" * 5000 + ")]", "malformed_turn"),
        ('[f(a="\\ud800")]', "invalid_arguments"),  # a lone surrogate is not text
    ],
)
def test_parse_keeps_an_unreadable_call_list_as_a_broken_call(text: str, code: str) -> None:
    action = get_protocol(NAME).parse_assistant_text(text + EOT)
    assert action.content == "" and len(action.tool_calls) == 1
    (call,) = action.tool_calls
    assert call.error is not None and call.error.code == code and call.name == text[1 : text.index("(")]
    assert "Python list of calls" in call.error.message


def test_a_call_list_cut_off_is_unclosed() -> None:
    action = get_protocol(NAME).parse_assistant_text('[lookup(q="x')
    assert action.tool_calls[0].error is not None and action.tool_calls[0].error.code == "unclosed_tag"
    complete = get_protocol(NAME).parse_assistant_text('[lookup(q="x")]')  # cut right before <end_of_turn>
    assert complete.issues == () and complete.tool_calls[0].arguments == {"q": "x"}


def test_parse_never_evaluates() -> None:
    action = get_protocol(NAME).parse_assistant_text("[f(a=__import__('os').system('false'))]" + EOT)
    assert action.tool_calls[0].error is not None and action.tool_calls[0].error.code == "invalid_arguments"


def test_parse_inverts_render_generation() -> None:
    protocol = get_protocol(NAME)
    rng = random.Random(7)
    turns: list[dict[str, Any]] = [{"role": "assistant", "content": t} for t in TEXTS if not t.startswith("[")]
    for _ in range(200):
        calls = [
            {
                "id": f"call_{k}",
                "type": "function",
                "function": {"name": rng.choice(["lookup", "now"]), "arguments": _arguments(rng, negative=False)},
            }
            for k in range(rng.randint(1, 3))
        ]
        turns.append({"role": "assistant", "content": "", "tool_calls": calls})
    for turn in turns:
        generated = protocol.render_generation(turn)
        message = protocol.assistant_message(generated)
        assert protocol.render_generation(message) == generated
        assert [(c.name, c.arguments) for c in message.tool_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in turn.get("tool_calls", [])
        ]
        assert protocol.parse_assistant_text(generated).issues == ()


def test_render_generation_refuses_what_the_parser_could_not_read_back() -> None:
    protocol = get_protocol(NAME)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    with pytest.raises(MessageError, match="the call list alone"):
        protocol.render_generation({"role": "assistant", "content": "Looking.", "tool_calls": [call]})
    for arguments in ({"not-an-identifier": 1}, {"class": 1}, {"a": float("nan")}, {"a": -1}, {"a": [{"b": -0.5}]}):
        bad = {**call, "function": {"name": "f", "arguments": arguments}}
        with pytest.raises(MessageError):
            protocol.render_generation({"role": "assistant", "content": "", "tool_calls": [bad]})
    # no reasoning: dropped, as the template drops it in history
    assert protocol.render_generation({"role": "assistant", "content": "a", "reasoning_content": "r"}) == "a" + EOT


# -- feedback, episodes and seams ---------------------------------------------------------------------------------


def _episodes() -> list[tuple[list[dict[str, Any]], Any]]:
    out = []
    for messages, tools in CONVERSATIONS:
        try:
            official(messages, tools)
        except jinja2.TemplateError:
            continue
        if is_episode(messages) and all(
            bool(messages[t].get("tool_calls")) == (messages[t + 1]["role"] == "tool") for t in episode_splits(messages)
        ):  # tool results follow calls, and only calls (render_feedback reads a call turn from them)
            out.append((messages, tools))
    return out


def _plain(arguments: dict[str, Any]) -> bool:
    """Arguments whose generated spelling is the template's: at most one, no boolean or null anywhere."""
    return (
        len(arguments) <= 1
        and "true" not in json.dumps(arguments)
        and "false" not in json.dumps(arguments)
        and ("null" not in json.dumps(arguments))
    )


def _seamless(message: dict[str, Any]) -> bool:
    content = message["content"] or ""
    calls = message.get("tool_calls", [])
    return (
        "-2.5" not in json.dumps(calls)
        and content == content.strip()
        and (not calls or (content == "" and all(_plain(c["function"]["arguments"]) for c in calls)))
    )


def test_feedback_continues_the_render_every_turn() -> None:
    protocol = get_protocol(NAME)
    checked = after_calls = 0
    for messages, tools in _episodes():
        for turn in episode_splits(messages):
            if messages[turn].get("tool_calls") and messages[turn]["content"]:
                continue  # a turn with calls and content cannot be generated (see render_generation)
            assert check_feedback(protocol, official, messages, tools, turn, turn_end=EOT)  # append-only
            checked += 1
            after_calls += bool(messages[turn].get("tool_calls"))
    assert checked >= 100 and after_calls >= 50, (checked, after_calls)


def test_episode_text_is_the_render_where_no_seam_is_crossed() -> None:
    protocol = get_protocol(NAME)
    equal = seams = 0
    for messages, tools in _episodes():
        turns = [m for m in messages if m["role"] == "assistant"]
        if any(m.get("tool_calls") and m["content"] for m in turns) or "-2.5" in json.dumps(turns):
            continue  # turns that cannot be generated: calls with content, a negative number (vLLM reads none)
        text = episode_text(protocol, messages, tools)
        if all(_seamless(m) for m in turns):
            assert text == official_episode(official, messages, tools)
            equal += 1
        else:
            seams += text != official_episode(official, messages, tools)
    assert equal >= 30 and seams >= 10, (equal, seams)


def test_the_seams() -> None:
    """What the model generates and what history re-renders differ in three places: the `, ` between arguments
    (history drops it), booleans and nulls (history writes JSON's), and outer whitespace (history trims it)."""
    protocol = get_protocol(NAME)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": True, "c": None}}}
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}
    assert protocol.render_generation(turn) == "[f(a=1, b=True, c=None)]" + EOT
    assert "[f(a=1b=truec=null)]" + EOT in official([{"role": "user", "content": "q"}, turn])
    assert protocol.render_generation({"role": "assistant", "content": " 391\n"}) == " 391\n" + EOT
    assert "<start_of_turn>model\n391<end_of_turn>" in official(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": " 391\n"}]
    )


def test_feedback_after_calls_is_tool_results_and_after_an_answer_a_user_turn() -> None:
    protocol = get_protocol(NAME)
    result = {"role": "tool", "tool_call_id": "c", "content": " 391 "}
    assert protocol.render_feedback([result, result]) == (
        "\n" + "<start_of_turn>user\n<tool_response>\n391</tool_response><end_of_turn>\n" * 2 + "<start_of_turn>model\n"
    )
    user = {"role": "user", "content": "thanks"}
    assert protocol.render_feedback([user], turn_closed=False).startswith(EOT + "\n<start_of_turn>user\nthanks")
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}
    history = [user, {"role": "assistant", "content": "", "tool_calls": [call]}, result, user]
    with pytest.raises(jinja2.TemplateError, match="alternate"):  # a user message right after tool results
        official(history)
    with pytest.raises(MessageError, match="alternate"):
        protocol.render_messages(history)
    with pytest.raises(MessageError, match="the model answers them: a user message cannot follow"):
        protocol.render_feedback([result, user])
    with pytest.raises(MessageError, match="alternate"):
        protocol.render_feedback([{"role": "system", "content": "s"}])


# -- detection --------------------------------------------------------------------------------------------------


def test_the_template_is_detected_and_told_from_gemma3(tmp_path: Path) -> None:
    template = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert detect_protocol(tmp_path) == NAME
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": (TEMPLATES / "gemma3_it.jinja").read_text(encoding="utf-8")})
    )
    assert detect_protocol(tmp_path) == "gemma3"


# -- token in, token out with the official Gemma 3 tokenizer ------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    return load_family_tokenizer("gemma3")


def test_generated_episodes_are_token_in_token_out(tokenizer: HFTokenizer) -> None:
    protocol = get_protocol(NAME)
    compared = 0
    for messages, tools in _episodes():
        turns = [m for m in messages if m["role"] == "assistant"]
        if not turns or not all(_seamless(m) for m in turns):
            continue
        expected = tokenizer.encode(official_episode(official, messages, tools))
        assert tokenizer.encode(episode_text(protocol, messages, tools)) == expected
        # piece by piece, as a session lays them down: no token merges across a seam of the pieces
        indices = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        transcript = TokenTranscript()
        transcript.append_prompt(tokenizer.encode(protocol.render_prompt(messages[: indices[0]], tools=tools)))
        for position, index in enumerate(indices):
            transcript.append_action(tokenizer.encode(protocol.render_generation(messages[index])))
            end = indices[position + 1] if position + 1 < len(indices) else len(messages)
            if end > index + 1:
                transcript.append_observation(tokenizer.encode(protocol.render_feedback(messages[index + 1 : end])))
        assert transcript.ids == expected
        compared += 1
    assert compared >= 15, compared


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # agent-protocol alone: skipped

    completions = ['[calculator(expression="17 * 23")]<end_of_turn>', "The answer is 391.<end_of_turn>"]
    episode = run_calculator_episode(NAME, tokenizer, completions, rewards="result")
    result = episode.result
    assert result.final_answer == "The answer is 391." and result.reward == 1.0
    (segment,) = result.trajectory.segments
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    messages = [object_arguments(m.to_openai()) for m in result.trajectory.messages]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"expression": "17 * 23"}
    expected = official(copy.deepcopy(messages), [CalculatorTool().spec.to_openai()]).removesuffix("\n")
    assert segment.ids == tokenizer.encode(expected)  # one argument, no seam: the template's render, id for id
    assert "<tool_response>\n391</tool_response>" in expected and segment.ids.count(2) == 1  # one <bos>
