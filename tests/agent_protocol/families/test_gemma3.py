"""Gemma 3 instruction-tuned (`gemma3`, `agent_protocol.protocols.gemma3`): the golden renders, the Python renderer
against the official Jinja on generated conversations with and without tools (its refusals matched), tools, calls
and tool messages rendered as the template renders them with a warning, what the protocol refuses beyond the
template (images, text parts it would trim apart), the plain-content parser, feedback that continues the official render
(the whitespace seam pinned), detection, and token-in-token-out with the official Gemma 3 tokenizer.

The official template (`tests/data/golden/templates/gemma3_it.jinja`, provenance in SOURCES.md) is rendered as
Hugging Face renders it (tests/support/hf_jinja.py) with `bos_token="<bos>"`, and no adaptation: a null content
goes to it as null (it raises "Invalid content type", and so does the protocol).
"""

from __future__ import annotations

import copy
import json
import random
import warnings
from pathlib import Path
from typing import Any

import jinja2
import pytest

from agent_protocol import (
    HFTokenizer,
    MessageError,
    TemplateGapWarning,
    TokenTranscript,
    detect_protocol,
    get_protocol,
)
from agent_protocol.protocols.gemma3 import ToolsDroppedWarning
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    check_feedback,
    compare_with_jinja,
    episode_splits,
    episode_text,
    is_episode,
    official_episode,
    render_golden,
)
from tests.support.family_tokenizers import load_family_tokenizer
from tests.support.hf_jinja import TEMPLATES, official_template, special_tokens
from tests.support.random_conversations import random_tools
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "gemma3_it"
NAME = "gemma3"
EOT = "<end_of_turn>"
RENDERS = renders(STEM)


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    """The official Gemma 3 template, rendered the Hugging Face way (with its `bos_token`)."""
    return official_template(STEM).render(
        messages=messages, tools=tools, add_generation_prompt=generation, **special_tokens(STEM)
    )


# -- the template and the golden renders ------------------------------------------------------------------------


def test_the_template_is_the_official_one() -> None:
    text = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    assert text.startswith("{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}")
    assert "first_user_prefix" in text and "<start_of_image>" in text and "tool" not in text
    assert official([{"role": "system", "content": " S "}, {"role": "user", "content": " hi "}], None, True) == (
        "<bos><start_of_turn>user\n S \n\nhi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_every_golden_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not); the template refuses the three with tool results in them
    assert len(RENDERS) == 12
    assert {r.case for r in RENDERS if r.refused} == {"single_tool_call", "parallel_tool_calls", "multi_turn_reasoning"}
    for golden in RENDERS:
        if golden.refused:
            assert "Conversation roles must alternate" in golden.text


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_golden_render_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    if golden.refused:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TemplateGapWarning)  # the calls and tool results: see below
            with pytest.raises(MessageError, match="alternate"):
                render_golden(golden)
        with pytest.raises(jinja2.TemplateError, match="Conversation roles must alternate"):
            official(case["messages"], case["tools"], golden.add_generation_prompt)
        return
    expected = official(case["messages"], case["tools"], golden.add_generation_prompt)
    assert expected == golden.text
    if case["tools"]:  # tools_provided: the template drops the tool list, and the protocol warns that it does
        assert "get_weather" not in golden.text and "search" not in golden.text
        with pytest.warns(ToolsDroppedWarning):
            assert render_golden(golden) == golden.text
        return
    assert render_golden(golden) == golden.text


# -- generated conversations against the official Jinja -----------------------------------------------------------

TEXTS = [
    "",
    "Hi",
    "  padded  ",
    "\nleading newline",
    "trailing newline\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "\u3000ideographic spaces\u3000",
    "\x0bvertical tab\x0c",
    "<start_of_turn>typed by the user<end_of_turn>",
    "a\tb",
    " ",
]
#: text parts whose trims join to the trim of their join (the protocol refuses the others: see the refusals)
PART_TEXTS = ["Hello", "world", "x", "中文", "🦙"]


def _content(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.05:
        return None  # the template raises "Invalid content type"
    if roll < 0.2:
        parts = [rng.choice(PART_TEXTS) for _ in range(rng.randint(1, 3))]
        parts[0] = rng.choice(["", " ", "\n"]) + parts[0]
        parts[-1] += rng.choice(["", "  ", "\n"])
        return [{"type": "text", "text": p} for p in parts]
    return rng.choice(TEXTS)


def gemma_conversation(rng: random.Random, *, tools: bool = False) -> list[dict[str, Any]]:
    """Mostly alternating user/assistant turns after an optional system message (a string or one text part), with
    system messages where a model turn would stand, null contents, text-part lists, reasoning the template drops,
    and now and then a role out of turn (which the template refuses). With `tools`, assistant turns carry calls
    (which the template drops), followed by their tool results or not, and tool messages stand where a model turn
    would (a `tool` turn) or out of turn."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        text = rng.choice(TEXTS)
        content: Any = [{"type": "text", "text": text}] if rng.random() < 0.2 else text
        messages.append({"role": "system", "content": content})
    for place in range(rng.randint(0, 7)):
        role = "user" if place % 2 == 0 else "assistant"
        if role == "assistant" and rng.random() < 0.1:
            role = "system"  # the template writes it as a `system` turn
        if rng.random() < 0.05:
            role = rng.choice(["user", "assistant", "system"])  # may break the alternation
        message: dict[str, Any] = {"role": role, "content": _content(rng)}
        if role == "assistant" and rng.random() < 0.2:
            message["reasoning_content"] = rng.choice(TEXTS)
        if tools and role == "assistant" and rng.random() < 0.4:
            message["tool_calls"] = [{**CALL, "id": f"c{k}"} for k in range(rng.randint(1, 2))]
        if tools and role != "user" and rng.random() < 0.2:
            message = {"role": "tool", "tool_call_id": "c0", "content": rng.choice(TEXTS)}
        messages.append(message)
        if tools and message.get("tool_calls") and rng.random() < 0.3:
            messages.append({"role": "tool", "tool_call_id": "c0", "content": rng.choice(TEXTS)})  # out of turn
    return messages or [{"role": "user", "content": rng.choice(TEXTS)}]


CALL = {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}


CONVERSATIONS = [
    (gemma_conversation(random.Random(seed)), random.Random(seed).choice([None, []])) for seed in range(200)
]
#: with tools (the template drops the list), tool calls (dropped) and tool messages (`tool` turns)
TOOL_CONVERSATIONS = [
    (gemma_conversation(rng := random.Random(1000 + seed), tools=True), random_tools(rng)) for seed in range(200)
]


def test_python_renderer_equals_official_jinja() -> None:
    compared, refused = compare_with_jinja(
        get_protocol(NAME),
        official,
        CONVERSATIONS,
        refused_by=(jinja2.TemplateError,),
        refusal="alternate|Invalid content type",
        template_error="Conversation roles must alternate|Invalid content type",
    )
    assert compared + refused == 400
    assert compared >= 250 and refused >= 40, (compared, refused)


@pytest.mark.filterwarnings("ignore::agent_protocol.TemplateGapWarning")  # checked below
def test_python_renderer_equals_official_jinja_with_tools_calls_and_tool_messages() -> None:
    compared, refused = compare_with_jinja(
        get_protocol(NAME),
        official,
        TOOL_CONVERSATIONS,
        refused_by=(jinja2.TemplateError,),
        refusal="alternate|Invalid content type",
        template_error="Conversation roles must alternate|Invalid content type",
    )
    assert compared + refused == 400
    assert compared >= 150 and refused >= 40, (compared, refused)
    rendered = [(ms, tools) for ms, tools in TOOL_CONVERSATIONS if not _refused(ms, tools)]
    with_tools = sum(bool(tools) for _, tools in rendered)
    with_calls = sum(any(m.get("tool_calls") for m in ms) for ms, _ in rendered)
    with_tool_turns = sum(any(m["role"] == "tool" for m in ms) for ms, _ in rendered)
    assert with_tools >= 40 and with_calls >= 20 and with_tool_turns >= 20, (with_tools, with_calls, with_tool_turns)


def _refused(messages: list[dict[str, Any]], tools: Any) -> bool:
    try:
        official(messages, tools)
    except jinja2.TemplateError:
        return True
    return False


def test_generated_conversations_reach_every_shape() -> None:
    flat = [m for messages, _ in CONVERSATIONS for m in messages]
    assert sum(isinstance(m["content"], list) for m in flat) >= 40
    assert sum(m.get("reasoning_content") is not None for m in flat) >= 30
    assert sum(m["role"] == "system" for ms, _ in CONVERSATIONS for m in ms[1:]) >= 15
    assert sum(len(ms) == 1 and ms[0]["role"] == "system" for ms, _ in CONVERSATIONS) >= 3  # renders as "<bos>"


def test_empty_conversation_is_refused_as_the_template_fails_on_it() -> None:
    with pytest.raises(jinja2.TemplateError):
        official([], None, True)
    with pytest.raises(MessageError, match="empty conversation"):
        get_protocol(NAME).render_messages([])


# -- tools: rendered as the template renders them (dropped, or a `tool` turn), with a warning -------------------


def test_tools_are_dropped_as_the_template_drops_them_with_a_warning() -> None:
    messages = [{"role": "user", "content": "q"}]
    assert official(messages, TOOL_SHAPES, True) == official(messages, None, True)  # dropped without a word
    protocol = get_protocol(NAME)
    with pytest.warns(ToolsDroppedWarning, match="no tool format") as caught:
        assert protocol.render_messages(messages, tools=TOOL_SHAPES, add_generation_prompt=True) == official(
            messages, TOOL_SHAPES, True
        )
    assert issubclass(ToolsDroppedWarning, TemplateGapWarning)
    assert caught[0].filename == __file__  # the warning points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per protocol object
        assert protocol.render_prompt(messages, tools=TOOL_SHAPES) == official(messages, TOOL_SHAPES, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no tools, no warning
        assert get_protocol(NAME).render_messages(messages, tools=[]) == official(messages, [], False)


def test_tool_calls_are_dropped_and_tool_messages_are_tool_turns() -> None:
    calls = [{"role": "user", "content": "q"}, {"role": "assistant", "content": " Looking. ", "tool_calls": [CALL]}]
    assert "lookup" not in official(calls)  # the template drops the calls
    with pytest.warns(ToolsDroppedWarning, match="tool calls went to"):
        assert get_protocol(NAME).render_messages(calls) == official(calls)
    # a tool result where a model turn stands renders as a `tool` turn, a role Gemma 3 has not got
    results = [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "c0", "content": " 42 "}]
    assert "<start_of_turn>tool\n42<end_of_turn>" in official(results)
    with pytest.warns(ToolsDroppedWarning, match="a tool message went to"):
        assert get_protocol(NAME).render_messages(results, add_generation_prompt=True) == official(results, None, True)
    # after a call the tool result stands where a user turn must: the template refuses it, and so does the protocol
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        official([*calls, results[1]])
    with pytest.warns(ToolsDroppedWarning), pytest.raises(MessageError, match="alternate"):
        get_protocol(NAME).render_messages([*calls, results[1]])
    with pytest.raises(MessageError, match="a tool result cannot stand there"):
        get_protocol(NAME).render_feedback([results[1]])
    # null content with calls: the template raises "Invalid content type"
    with pytest.raises(jinja2.TemplateError, match="Invalid content type"):
        official([calls[0], {**calls[1], "content": None}])
    with pytest.raises(MessageError, match="Invalid content type"):
        get_protocol(NAME).render_messages([calls[0], {**calls[1], "content": None}])


def test_a_turn_with_calls_cannot_be_generated() -> None:
    with pytest.raises(MessageError, match="renders no tool calls") as info:
        get_protocol(NAME).render_generation({"role": "assistant", "content": "", "tool_calls": [CALL]})
    assert info.value.location == "message.tool_calls"


# -- refusals beyond the template ---------------------------------------------------------------------------------


def test_images_are_refused() -> None:
    image = {"type": "image_url", "image_url": {"url": "file:///tmp/cat.png"}}
    with pytest.raises(MessageError, match="text-only") as info:
        get_protocol(NAME).render_messages([{"role": "user", "content": [image, {"type": "text", "text": "?"}]}])
    assert info.value.location == "messages[0].content[0]"
    with pytest.raises(MessageError, match="type 'image'"):  # the template's own part type
        get_protocol(NAME).render_messages([{"role": "user", "content": [{"type": "image"}]}])


def test_text_parts_the_template_would_trim_apart_are_refused() -> None:
    parts = [{"type": "text", "text": "a "}, {"type": "text", "text": " b"}]
    assert "<start_of_turn>user\nab<end_of_turn>" in official([{"role": "user", "content": parts}])
    with pytest.raises(MessageError, match="trims each text part on its own") as info:
        get_protocol(NAME).render_messages([{"role": "user", "content": parts}])
    assert info.value.location == "messages[0].content"
    with pytest.raises(MessageError, match="trims each text part"):
        get_protocol(NAME).render_feedback([{"role": "user", "content": parts}])
    # a system message: the template keeps its first part alone
    system = [{"role": "system", "content": parts}, {"role": "user", "content": "q"}]
    assert official(system).startswith("<bos><start_of_turn>user\na \n\nq")
    with pytest.raises(MessageError, match="keeps only the first text part"):
        get_protocol(NAME).render_messages(system)


def test_reasoning_is_dropped_as_the_template_drops_it_and_never_generated() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    assert get_protocol(NAME).render_messages(messages) == official(messages) and "r<" not in official(messages)
    with pytest.raises(MessageError, match="generates no reasoning"):
        get_protocol(NAME).render_generation(messages[1])


# -- parsing: plain content ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["The answer is 391.<end_of_turn>", "cut off mid", "", "<end_of_turn>", '<tool_call>\n{"name": "x"}\n</tool_call>'],
)
def test_parse_is_plain_content(text: str) -> None:
    action = get_protocol(NAME).parse_assistant_text(text)
    assert action.content == text.removesuffix(EOT)
    assert action.reasoning_content is None and action.tool_calls == () and action.issues == ()


def test_parse_inverts_render_generation() -> None:
    protocol = get_protocol(NAME)
    for text in [*TEXTS, *PART_TEXTS]:
        generated = protocol.render_generation({"role": "assistant", "content": text})
        assert generated == text + EOT
        assert protocol.assistant_message(generated).content == text
        assert protocol.render_generation(protocol.assistant_message(generated)) == generated


# -- feedback and episodes ----------------------------------------------------------------------------------------


def _episodes() -> list[tuple[list[dict[str, Any]], Any]]:
    """Generated conversations (600 seeds) the template renders and an episode can produce."""
    out = []
    for seed in range(600):
        rng = random.Random(seed)
        messages, tools = gemma_conversation(rng), rng.choice([None, []])
        try:
            official(messages, tools)
        except jinja2.TemplateError:
            continue
        if is_episode(messages) and not any(m.get("reasoning_content") is not None for m in messages):
            out.append((messages, tools))
    return out


def test_feedback_continues_the_official_render_every_turn() -> None:
    protocol = get_protocol(NAME)
    checked = 0
    for messages, tools in _episodes():
        for turn in episode_splits(messages):
            assert check_feedback(protocol, official, messages, tools, turn, turn_end=EOT)  # append-only
            checked += 1
    assert checked >= 80, checked


def _sampled(messages: list[dict[str, Any]], index: int) -> str:
    return get_protocol(NAME).render_generation(messages[index])


def test_episode_text_is_the_official_render_but_for_trimmed_turns() -> None:
    """The transcript's text is the official render, except that a turn generated with outer whitespace stays as
    it was sampled where the template trims it (the one seam)."""
    protocol = get_protocol(NAME)
    compared = seams = 0
    for messages, tools in _episodes():
        turns = [m for m in messages if m["role"] == "assistant"]
        if not turns:
            continue
        texts = [
            "".join(p["text"] for p in m["content"]) if isinstance(m["content"], list) else m["content"] for m in turns
        ]
        trimmed = [{**m, "content": t.strip()} for m, t in zip(turns, texts, strict=True)]
        expected = official_episode(official, messages, tools)
        assert episode_text(protocol, messages, tools) != expected or texts == [t.strip() for t in texts]
        plain = [trimmed.pop(0) if m["role"] == "assistant" else m for m in messages]
        assert episode_text(protocol, plain, tools) == official_episode(official, plain, tools) == expected
        compared += 1
        seams += texts != [t.strip() for t in texts]
    assert compared >= 60 and seams >= 10, (compared, seams)


def test_whitespace_seam() -> None:
    """A generated turn that starts or ends with whitespace is trimmed when the template renders it in history:
    the transcript keeps the sampled text, the official render of the same conversation does not."""
    protocol = get_protocol(NAME)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n391 \n"}]
    follow = [{"role": "user", "content": "thanks"}]
    transcript = (
        protocol.render_prompt(messages[:1])
        + protocol.render_generation(messages[1])
        + protocol.render_feedback(follow)
    )
    rendered = official(messages + follow, None, True)
    assert transcript.replace("\n391 \n", "391") == rendered and transcript != rendered


def test_feedback_alternates_and_closes_a_cut_off_turn() -> None:
    protocol = get_protocol(NAME)
    one = [{"role": "user", "content": " go on "}]
    assert protocol.render_feedback(one) == "\n<start_of_turn>user\ngo on<end_of_turn>\n<start_of_turn>model\n"
    assert protocol.render_feedback(one, turn_closed=False).startswith("<end_of_turn>\n<start_of_turn>user\n")
    three = [*one, {"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, *three]
    assert official(messages[:2]).removesuffix("\n") + protocol.render_feedback(three) == official(messages, None, True)
    for bad in ([*one, *one], [{"role": "system", "content": "s"}]):
        with pytest.raises(MessageError, match="alternate"):
            protocol.render_feedback(bad)


# -- detection ----------------------------------------------------------------------------------------------------


def test_a_model_directory_is_detected(tmp_path: Path) -> None:
    template = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert detect_protocol(tmp_path) == NAME
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    assert detect_protocol(bare) == NAME


# -- token in, token out with the official Gemma 3 tokenizer ------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    return load_family_tokenizer("gemma3")


def test_the_tokenizer_has_gemma3_control_tokens(tokenizer: HFTokenizer) -> None:
    for text, token in (("<bos>", 2), ("<start_of_turn>", 105), (EOT, 106), ("<start_of_image>", 255999)):
        assert tokenizer.encode(text) == [token] and tokenizer.token_to_id(text) == token
    assert tokenizer.encode("<bos>Hi") == [2, tokenizer.encode("Hi")[0]]  # no second <bos> added


@pytest.mark.parametrize(
    "golden",
    [r for r in RENDERS if not r.refused and r.add_generation_prompt and r.case == "plain_chat"],
    ids=lambda g: g.id,
)
def test_golden_episode_is_token_in_token_out(golden: GoldenRender, tokenizer: HFTokenizer) -> None:
    protocol = get_protocol(NAME)
    messages = cases()[golden.case]["messages"]
    transcript = TokenTranscript()
    transcript.append_prompt(tokenizer.encode(protocol.render_prompt(messages[:1])))
    transcript.append_action(tokenizer.encode(protocol.render_generation(messages[1])))
    transcript.append_observation(tokenizer.encode(protocol.render_feedback(messages[2:])))
    assert transcript.ids == tokenizer.encode(golden.text)


def test_generated_episodes_are_token_in_token_out(tokenizer: HFTokenizer) -> None:
    protocol = get_protocol(NAME)
    compared = 0
    for messages, tools in _episodes():
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns or any(
            isinstance(messages[i]["content"], list) or messages[i]["content"] != messages[i]["content"].strip()
            for i in turns
        ):
            continue
        assert tokenizer.encode(episode_text(protocol, messages, tools)) == tokenizer.encode(
            official_episode(official, messages, tools)
        )
        transcript = TokenTranscript()
        transcript.append_prompt(tokenizer.encode(protocol.render_prompt(messages[: turns[0]], tools=tools)))
        for position, index in enumerate(turns):
            transcript.append_action(tokenizer.encode(protocol.render_generation(messages[index])))
            end = turns[position + 1] if position + 1 < len(turns) else len(messages)
            if end > index + 1:
                transcript.append_observation(tokenizer.encode(protocol.render_feedback(messages[index + 1 : end])))
        assert transcript.ids == tokenizer.encode(official_episode(official, messages, tools))
        compared += 1
    assert compared >= 30


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    completions = ["The answer is 391.<end_of_turn>"]
    episode = run_calculator_episode(NAME, tokenizer, completions, tools=[], rewards="none")
    result = episode.result
    assert result.final_answer == "The answer is 391."
    (segment,) = result.trajectory.segments
    messages = [m.to_openai() for m in result.trajectory.messages]
    assert segment.ids == tokenizer.encode(official(copy.deepcopy(messages)).removesuffix("\n"))  # the official render
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    assert segment.ids[0] == 2 and segment.ids.count(2) == 1  # one <bos>


def test_a_session_with_tools_warns_and_renders_the_official_prompt(tokenizer: HFTokenizer) -> None:
    with pytest.warns(ToolsDroppedWarning, match="tools went to"):
        episode = run_calculator_episode(NAME, tokenizer, ["x<end_of_turn>"], rewards="none")
    (segment,) = episode.result.trajectory.segments
    messages = [m.to_openai() for m in episode.result.trajectory.messages]
    assert segment.ids == tokenizer.encode(official(messages).removesuffix("\n"))  # no tool list in it
