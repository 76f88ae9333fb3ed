"""The Mistral family (`mistral-v0.3`, `mistral-small-3.2`) against the official templates: golden renders,
generated conversations vs the Jinja, the parser (vLLM `mistral` semantics), feedback and token-in-token-out.

Token level without a Mistral tokenizer: no official Mistral `tokenizer.json` is in tests/data (Mistral's
reference tokenization is mistral-common). The TITO tests use tests/support/byte_tokenizer.py: byte-level BPE
with the 256 byte symbols and no merges, plus Mistral's control tokens as special tokens. Every text encodes and
decodes back exactly, and `encode(a + b) == encode(a) + encode(b)` whenever the cut is not inside a control
token, so a transcript that equals the official render *as text* also equals its tokens, and any seam shows up.
`mistral-v0.3` is also checked id for id with Mistral's real v3 tokenizer: test_mistral_tokens.py.

Seams pinned here (see the module docstring of agent_protocol.protocols.mistral):
- `[AVAILABLE_TOOLS]` stays before the first user message in the transcript; the official render of the whole
  conversation writes it before the last user message;
- v0.3 writes the system message into the last message only when it is a user message: the transcript has it in
  the first `[INST]` (where the prompt had it), the official render of the finished conversation has none;
- a call written without an id (or unlike the template) stays as sampled; the official render writes it again,
  with the id the parser gave it.
"""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_protocol import Action, ChatProtocol, HFTokenizer, MessageError, get_protocol, protocol_options
from agent_protocol.json_limits import check_json_value
from agent_protocol.protocols.mistral import mistral_call_id
from tests.agent_protocol.golden import FROZEN_TODAY, GoldenRender, cases, renders
from tests.support.byte_tokenizer import byte_level_tokenizer
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import compare_with_jinja, object_arguments, render_golden
from tests.support.hf_jinja import render_official
from tests.support.hostile_text import FUZZ, hostile_piece
from tests.support.tool_shapes import TOOL_SHAPES

STEMS = {"mistral-v0.3": "mistral_v0.3", "mistral-small-3.2": "mistral_small_3.2"}
NAMES = sorted(STEMS)
GOLDEN = renders(*STEMS.values())
CONTROL_TOKENS = ["<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                  "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CONTENT]", "[SYSTEM_PROMPT]",
                  "[/SYSTEM_PROMPT]", "[CALL_ID]", "[ARGS]", "[IMG]"]  # fmt: skip


def protocol(name: str) -> ChatProtocol:
    return get_protocol(name, today=FROZEN_TODAY) if name == "mistral-small-3.2" else get_protocol(name)


def official(name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    return render_official(STEMS[name], messages, tools=tools)


# -- render: golden and generated -------------------------------------------------------------------------


def test_every_mistral_render_is_present() -> None:
    assert len(GOLDEN) == 24  # 6 cases x 2 (generation prompt or not) x 2 templates; neither refuses a case
    assert protocol_options("mistral-small-3.2") == ["today"] and protocol_options("mistral-v0.3") == []


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_golden_render_is_byte_exact(golden: GoldenRender) -> None:
    chat = get_protocol(golden.protocol, **golden.options)
    render = lambda: render_golden(golden)  # noqa: E731
    if golden.refused:
        with pytest.raises(MessageError):
            render()
    else:
        assert render() == golden.text
        assert chat.generation_prompt == ""  # neither template has one: the model writes right after [/INST]


TEXTS = ["", "Hi", "\n", "  spaces  ", "two\n\nlines", "émoji 🦙 and 中文", '{"json": "looking"}',
         'a "quote" and a \\ backslash', "[INST] typed by the user[/INST]", "</s> inside", "trailing\n"]  # fmt: skip
IDS = ["Xq3tB7mZ1", "Kp9wR2vN4", "a1b2c3d4e", "000000000"]


def _calls(rng: random.Random) -> list[dict[str, Any]]:
    calls = []
    for k in range(rng.randint(1, 2)):
        call_id = IDS[k] if rng.random() < 0.97 else rng.choice(["short", "call_0", "ten_chars_"])
        arguments = {"q": rng.choice(TEXTS), "n": k, "deep": {"list": [1, 2.5, None, True]}}
        calls.append({"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": arguments}})
    return calls


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    """Mostly what the templates accept (user/assistant alternation, tool rounds, a system message first),
    sometimes what they refuse (a broken alternation, a system message later, a bad call id, null content)."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": rng.choice(TEXTS)})
        if rng.random() < 0.15:
            break  # the conversation ends with the user's message
        while rng.random() < 0.45:  # tool rounds
            calls = _calls(rng)
            messages.append(
                {"role": "assistant", "content": rng.choice(["", "Let me look.", None]), "tool_calls": calls}
            )
            for call in calls:
                content = rng.choice([*TEXTS, '{"temperature": 18}'])
                messages.append({"role": "tool", "tool_call_id": call["id"], "name": "lookup", "content": content})
        content = rng.choice(TEXTS) if rng.random() < 0.97 else None
        messages.append({"role": "assistant", "content": content})
    roll = rng.random()
    if roll < 0.05:
        messages.append({"role": "user", "content": "two user messages in a row"})
        messages.append({"role": "user", "content": "are refused"})
    elif roll < 0.1:
        messages.insert(rng.randint(1, len(messages)), {"role": "system", "content": "a later system message"})
    return messages


CONVERSATIONS = [_conversation(random.Random(seed)) for seed in range(240)]


def _tools(rng: random.Random) -> list[dict[str, Any]] | None:
    return None if rng.random() < 0.3 else rng.sample(TOOL_SHAPES, rng.randint(1, len(TOOL_SHAPES)))


@pytest.mark.parametrize("name", NAMES)
def test_python_renderer_equals_official_jinja(name: str) -> None:
    rng = random.Random(7)
    rendered, refused = compare_with_jinja(
        protocol(name),
        lambda messages, tools, generation: render_official(
            STEMS[name], messages, tools=tools, add_generation_prompt=generation
        ),
        [(messages, _tools(rng)) for messages in CONVERSATIONS],
        refused_by=(Exception,),  # raise_exception, or a null the template cannot print
    )
    assert rendered >= 2 * 150 and refused >= 10, (rendered, refused)


@pytest.mark.parametrize("name", NAMES)
def test_refusals_name_the_message_and_the_template(name: str) -> None:
    chat = protocol(name)
    user_after_tools = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": IDS[0], "function": {"name": "f", "arguments": {}}}],
        },
        {"role": "tool", "tool_call_id": IDS[0], "content": "1"},
        {"role": "user", "content": "a user message right after tool results"},
    ]
    with pytest.raises(Exception, match="alternate"):
        official(name, user_after_tools)
    with pytest.raises(MessageError, match=r"messages\[3\].role: the official Mistral template refuses"):
        chat.render_messages(user_after_tools)
    if name == "mistral-v0.3":  # a later system message passes the alternation check, then the template refuses it
        later_system = [user_after_tools[0], {"role": "system", "content": "new rules"}]
        with pytest.raises(Exception, match="Only user and assistant roles"):
            official(name, later_system)
        with pytest.raises(MessageError, match=r"messages\[1\].role: .* system message after the first"):
            chat.render_messages(later_system)
    bad_id = [user_after_tools[0], {**user_after_tools[1], "tool_calls": [{"function": {"name": "f"}}]}]
    with pytest.raises(MessageError, match=r"tool_calls\[0\].id: .* 9 characters"):
        chat.render_messages(bad_id)


@pytest.mark.parametrize("name", NAMES)
def test_deliberate_render_differences(name: str) -> None:
    chat, messages = protocol(name), [{"role": "user", "content": "q"}]
    # An empty tool list: the template prints an empty block, we print none (as mistral-common does).
    assert "[AVAILABLE_TOOLS]" in official(name, messages, tools=[])
    assert chat.render_messages(messages, tools=[]) == official(name, messages)
    # `tool_calls: []` is no call; v0.3's template would open a "[TOOL_CALLS] [" it never closes.
    answered = [*messages, {"role": "assistant", "content": "a", "tool_calls": []}]
    assert chat.render_messages(answered) == official(name, [*messages, {"role": "assistant", "content": "a"}])


# -- parsing ----------------------------------------------------------------------------------------------


def _parsed(action: Action) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": c.arguments} for c in action.valid_tool_calls]


V3_WELL_FORMED = [  # (text, content, calls): the pre-v11 cases of vLLM's mistral parser, written anew
    ('[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]', "", [("add", {"a": 3.5, "b": 4})]),
    ('[TOOL_CALLS] [{"arguments": {"city": "Paris"}, "name": "weather"}]</s>', "", [("weather", {"city": "Paris"})]),
    ('[TOOL_CALLS] [{"arguments": {"name": "Ann"}, "name": "age"}]', "", [("age", {"name": "Ann"})]),
    ('[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1]}}]', "",
     [("a", {}), ("b", {"x": [1]})]),
    ('Sure.[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}]', "Sure.", [("add", {"a": 1})]),
    ('[TOOL_CALLS] [{"name": "w", "arguments": {"c": "D"}}]\nextra trailing data', "", [("w", {"c": "D"})]),
    ('[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1}}] trail', "", [("add", {"a": 1})]),
    ('[TOOL_CALLS] [{"name": "s", "arguments": "{\\"k\\": 2}"}]', "", [("s", {"k": 2})]),
    (" It is 18 °C.</s>", "It is 18 °C.", []),
]  # fmt: skip
V11_WELL_FORMED = [
    ('[TOOL_CALLS]add_this[ARGS]{"a": 3.5, "b": 4}</s>', "", [("add_this", {"a": 3.5, "b": 4})]),
    ('[TOOL_CALLS]add[CALL_ID]Xq3tB7mZ1[ARGS]{"a": 1}</s>', "", [("add", {"a": 1})]),
    ('[TOOL_CALLS]add{"a": 3.5, "b": 4}', "", [("add", {"a": 3.5, "b": 4})]),  # control tokens decoded away
    ('[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]mul[ARGS]{"a": 3, "b": 6}</s>', "", [("add", {"a": 1}),
                                                                                 ("mul", {"a": 3, "b": 6})]),
    ('bla[TOOL_CALLS]add[ARGS]{"a": 1}', "bla", [("add", {"a": 1})]),
    ('hi{hi[TOOL_CALLS]bash{"command": "print(\\"x\\")\\nre.compile(r\'{}\')"}', "hi{hi",
     [("bash", {"command": "print(\"x\")\nre.compile(r'{}')"})]),
    ("Paris: 18 °C.</s>", "Paris: 18 °C.", []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls"), V3_WELL_FORMED)
def test_v3_parses_like_vllm(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    action = protocol("mistral-v0.3").parse_assistant_text(text)
    assert action.issues == () and action.reasoning_content is None
    assert action.content == content and _parsed(action) == [{"name": n, "arguments": a} for n, a in calls]


@pytest.mark.parametrize(("text", "content", "calls"), V11_WELL_FORMED)
def test_small_3_2_parses_like_vllm(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    action = protocol("mistral-small-3.2").parse_assistant_text(text)
    assert action.issues == () and action.reasoning_content is None
    assert action.content == content and _parsed(action) == [{"name": n, "arguments": a} for n, a in calls]


MALFORMED = [  # (protocol, text, codes of the calls, in order)
    ("mistral-v0.3", "[TOOL_CALLS] not json at all</s>", ["invalid_json"]),
    ("mistral-v0.3", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": ', ["unclosed_tag"]),
    ("mistral-v0.3", '[TOOL_CALLS] {"name": "add", "arguments": {}}</s>', ["invalid_json"]),
    ("mistral-v0.3", '[TOOL_CALLS] [{"arguments": {}}, 3, {"name": "f", "arguments": [1]}]</s>',
     ["missing_name", "invalid_json", "invalid_arguments"]),
    ("mistral-small-3.2", '[TOOL_CALLS]add[ARGS]{"a": 1</s>', ["invalid_json"]),
    ("mistral-small-3.2", '[TOOL_CALLS]add[ARGS]{"a": 1', ["unclosed_tag"]),
    ("mistral-small-3.2", "[TOOL_CALLS]toolname_no_args</s>", ["invalid_arguments"]),
    ("mistral-small-3.2", "[TOOL_CALLS]cut_off_in_the_na", ["unclosed_tag"]),
    ("mistral-small-3.2", '[TOOL_CALLS]no_args[TOOL_CALLS]f[ARGS]{"a": 1', ["invalid_arguments", "unclosed_tag"]),
    ("mistral-small-3.2", '[TOOL_CALLS][ARGS]{"a": 1}[TOOL_CALLS]f[ARGS][1, 2]</s>',
     ["missing_name", "invalid_arguments"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "codes"), MALFORMED)
def test_malformed_calls_become_coded_issues(name: str, text: str, codes: list[str]) -> None:
    # vLLM drops these (or returns arguments that are not JSON); we keep an errored call the environment answers.
    action = protocol(name).parse_assistant_text(text)
    assert [c.error.code if c.error else None for c in action.tool_calls] == codes
    assert all(len(c.id) == 9 and c.id.isalnum() for c in action.tool_calls)


KILLERS = ["[" * 1500 + "]" * 1500, '{"x": ' + "9" * 5000 + "}", '"' + "[" * 2000 + '"', '{"x": "\\ud800"}',
           '{"a":' * 150 + "1" + "}" * 150]  # fmt: skip


@pytest.mark.parametrize("arguments", KILLERS, ids=["deep", "huge_int", "deep_string", "surrogate", "too_deep"])
@pytest.mark.parametrize("name", NAMES)
def test_known_killers_become_coded_issues(name: str, arguments: str) -> None:
    # The shared fuzz test's killers, written in each Mistral format.
    if name == "mistral-v0.3":
        text = f'[TOOL_CALLS] [{{"name": "calculator", "arguments": {arguments}}}]</s>'
    else:
        text = f"[TOOL_CALLS]calculator[ARGS]{arguments}</s>"
    (call,) = protocol(name).parse_assistant_text(text).tool_calls
    assert call.error is not None and call.error.code in ("invalid_json", "invalid_arguments")
    assert "cannot be read" in call.error.message or arguments.startswith("[" * 1500)


MISTRAL_PIECES = ["[TOOL_CALLS]", "[TOOL_CALLS] [", "[CALL_ID]", "[ARGS]", "</s>", "calculator", '"id": "Xq3tB7mZ1"',
                  '{"name": "calculator", "arguments": {"x": 1}}', "[{", "}]"]  # fmt: skip
mistral_text = st.lists(st.sampled_from(MISTRAL_PIECES) | hostile_piece(), min_size=1, max_size=10).map("".join)


@FUZZ
@given(text=mistral_text, name=st.sampled_from(NAMES), prefix=st.sampled_from(["call_1", "", "\ud800"]))
def test_parser_never_raises_on_its_own_tags(text: str, name: str, prefix: str) -> None:
    # the shared fuzz test (test_parse_fuzz.py) mixes Qwen tags; this one mixes Mistral's, parser unguarded
    action = protocol(name).parse_turn(text, call_id_prefix=prefix)
    for call in action.tool_calls:
        check_json_value(call.arguments)
        assert len(call.id) == 9 and call.id.isascii() and call.id.isalnum()
        assert call.error is None or call.error.code in (
            "invalid_json",
            "invalid_arguments",
            "missing_name",
            "unclosed_tag",
        )
    assert len({call.id for call in action.tool_calls}) == len(action.tool_calls)


@pytest.mark.parametrize("name", NAMES)
def test_call_ids_are_valid_deterministic_and_the_models_own_when_valid(name: str) -> None:
    if name == "mistral-v0.3":
        text = ('[TOOL_CALLS] [{"name": "a", "arguments": {}, "id": "Xq3tB7mZ1"}, {"name": "b", "arguments": {}, '
                '"id": "Xq3tB7mZ1"}, {"name": "c", "arguments": {}, "id": "bad"}]</s>')  # fmt: skip
    else:
        text = "[TOOL_CALLS]a[CALL_ID]Xq3tB7mZ1[ARGS]{}[TOOL_CALLS]b[CALL_ID]Xq3tB7mZ1[ARGS]{}[TOOL_CALLS]c[ARGS]{}</s>"
    chat = protocol(name)
    ids = [c.id for c in chat.parse_assistant_text(text, call_id_prefix="call_3").tool_calls]
    # kept; a duplicate and a missing/invalid id are derived from the prefix and the call's position
    assert ids == ["Xq3tB7mZ1", mistral_call_id("call_3", 1), mistral_call_id("call_3", 2)]
    assert all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids)
    assert ids == [c.id for c in chat.parse_assistant_text(text, call_id_prefix="call_3").tool_calls]
    assert mistral_call_id("call_3", 1) != mistral_call_id("call_4", 1) != mistral_call_id("call_4", 2)


GENERATED = [
    {"role": "assistant", "content": "It is 18 °C and sunny."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "Xq3tB7mZ1", "function": {"name": "weather", "arguments": {"city": "Paris", "n": [1, 2.5]}}},
        {"id": "Kp9wR2vN4", "function": {"name": "search", "arguments": {"q": 'é "quoted"'}}}]},
]  # fmt: skip


@pytest.mark.parametrize("message", GENERATED, ids=["answer", "calls"])
@pytest.mark.parametrize("name", NAMES)
def test_parse_inverts_render_generation(name: str, message: dict[str, Any]) -> None:
    chat = protocol(name)
    text = chat.render_generation(message)
    assert text.endswith("</s>")
    parsed = chat.parse_assistant_text(text).to_message()
    assert parsed.content == message["content"] and parsed.reasoning_content is None
    assert [(c.id, c.name, c.arguments) for c in parsed.tool_calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
    ]
    assert chat.render_generation(parsed) == text


# -- feedback: prompt + generations + feedback == the official render, up to the pinned seams ---------------


def transcript(
    chat: ChatProtocol, name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> str:
    """What an episode's token stream holds as text: the official prompt up to the first assistant turn, then
    each assistant turn as generated and what follows it as feedback."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = official(name, messages[:first], tools)
    assert chat.render_prompt(messages[:first], tools=tools) == prompt
    text, i = prompt, first
    while i < len(messages):
        j = next((k for k in range(i + 1, len(messages)) if messages[k]["role"] == "assistant"), len(messages))
        text += chat.render_generation(messages[i])
        if j > i + 1:
            text += chat.render_feedback(messages[i + 1 : j])
        i = j
    return text


def seamed_official(name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The official render of the whole conversation with the pinned seams applied: what the model saw."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    if name == "mistral-v0.3" and system is not None:
        # v0.3 writes the system message only into a last user message: the prompt did, into the first [INST].
        text = official(name, messages[1:], tools).replace("[INST] ", f"[INST] {system}\n\n", 1)
    else:
        text = official(name, messages, tools)
    if tools:  # the tools block stays where the prompt put it: before the first user message
        start, end = text.index("[AVAILABLE_TOOLS]"), text.index("[/AVAILABLE_TOOLS]") + len("[/AVAILABLE_TOOLS]")
        block, text = text[start:end], text[:start] + text[end:]
        at = text.index("[INST]", text.find("[/SYSTEM_PROMPT]") + 1)
        text = text[:at] + block + text[at:]
    return text


def _episode(rng: random.Random) -> list[dict[str, Any]]:
    """A conversation an agent episode can have: the template accepts it; user messages are distinct."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.5 else []
    for exchange in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": f"{rng.choice(TEXTS)} #{exchange}"})
        for _ in range(rng.randint(0, 2)):
            calls = _calls(random.Random(rng.random()))
            for call in calls:
                call["id"] = IDS[calls.index(call)]
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            messages.extend({"role": "tool", "tool_call_id": c["id"], "content": rng.choice(TEXTS)} for c in calls)
        messages.append({"role": "assistant", "content": rng.choice(TEXTS).strip() or "ok"})
    return messages


EPISODES = [_episode(random.Random(seed)) for seed in range(150)]
MULTI_TURN_CASES = ["plain_chat", "single_tool_call", "parallel_tool_calls", "multi_turn_reasoning"]


def _check_feedback(name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
    chat = protocol(name)
    text = transcript(chat, name, messages, tools)
    assert text == seamed_official(name, messages, tools)
    users = sum(m["role"] == "user" for m in messages)
    seam = (name == "mistral-v0.3" and messages[0]["role"] == "system") or (bool(tools) and users > 1)
    # Where no seam applies the transcript is exactly the official render; where one does it really differs.
    assert (text != official(name, messages, tools)) is seam


@pytest.mark.parametrize("case", MULTI_TURN_CASES)
@pytest.mark.parametrize("name", NAMES)
def test_feedback_continues_the_golden_conversations(name: str, case: str) -> None:
    _check_feedback(name, cases()[case]["messages"], cases()[case]["tools"])


@pytest.mark.parametrize("name", NAMES)
def test_feedback_continues_generated_episodes(name: str) -> None:
    rng = random.Random(11)
    for messages in EPISODES:
        _check_feedback(name, messages, _tools(rng))


@pytest.mark.parametrize("name", NAMES)
def test_feedback_closes_a_cut_off_turn_and_refuses_what_it_cannot_carry(name: str) -> None:
    chat = protocol(name)
    tool = {"role": "tool", "tool_call_id": IDS[0], "content": "5"}
    assert chat.render_feedback([tool], turn_closed=False) == "</s>" + chat.render_feedback([tool])
    with pytest.raises(MessageError, match="at least one"):
        chat.render_feedback([])
    with pytest.raises(MessageError, match=r"messages\[0\].role"):
        chat.render_feedback([{"role": "assistant", "content": "x"}])
    with pytest.raises(MessageError, match="9 characters"):
        chat.render_feedback([{**tool, "tool_call_id": "call_0"}])


def test_v3_refuses_a_later_system_message_small_3_2_renders_it() -> None:
    later = [{"role": "system", "content": "new rules"}]
    with pytest.raises(MessageError, match="system message after the first"):
        protocol("mistral-v0.3").render_feedback(later)
    assert protocol("mistral-small-3.2").render_feedback(later) == "[SYSTEM_PROMPT]new rules[/SYSTEM_PROMPT]"


def test_small_3_2_prints_the_date_it_was_given() -> None:
    prompt = get_protocol("mistral-small-3.2", today=FROZEN_TODAY).render_prompt([{"role": "user", "content": "q"}])
    assert "The current date is 2025-09-01." in prompt


# -- token-in-token-out through the session ---------------------------------------------------------------


@cache
def tiny_mistral_tokenizer() -> HFTokenizer:
    """Byte-level BPE without merges (every byte one token) plus Mistral's control tokens: round-trips any text."""
    return byte_level_tokenizer(CONTROL_TOKENS, source="tiny-mistral")


def test_tiny_tokenizer_round_trips_and_keeps_control_tokens_whole() -> None:
    tokenizer = tiny_mistral_tokenizer()
    text = official(
        "mistral-small-3.2", cases()["multi_turn_reasoning"]["messages"], cases()["tools_provided"]["tools"]
    )
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert all(tokenizer.token_to_id(t) is not None and ids.count(tokenizer.token_to_id(t)) == text.count(t)  # type: ignore[arg-type]
               for t in ("[TOOL_CALLS]", "[INST]", "</s>", "[CALL_ID]", "[ARGS]"))  # fmt: skip


def _call(name: str, call_id: str | None) -> str:
    if name == "mistral-v0.3":
        payload: dict[str, Any] = {"name": "calculator", "arguments": {"expression": "17 * 23"}}
        return f"[TOOL_CALLS] {json.dumps([payload | ({'id': call_id} if call_id else {})])}</s>"
    marker = f"[CALL_ID]{call_id}" if call_id else ""
    return f'[TOOL_CALLS]calculator{marker}[ARGS]{{"expression": "17 * 23"}}</s>'


def _answer(name: str) -> str:
    return (" " if name == "mistral-v0.3" else "") + "The answer is 391.</s>"


@pytest.mark.parametrize("writes_id", [True, False], ids=["model_writes_id", "no_id"])
@pytest.mark.parametrize("system_prompt", [None, "You are a calculator."], ids=["no_system", "system"])
@pytest.mark.parametrize("name", NAMES)
def test_session_is_token_in_token_out(name: str, system_prompt: str | None, writes_id: bool) -> None:
    tokenizer = tiny_mistral_tokenizer()
    chat = protocol(name)  # small 3.2 with the date the official Jinja here prints (frozen)
    completions = [_call(name, "Ab3dE5gH7" if writes_id else None), _answer(name)]
    engine, result, specs = run_calculator_episode(
        name if name == "mistral-v0.3" else chat,  # by name; small 3.2 with the frozen date
        tokenizer,
        completions,
        rewards="none",
        max_steps=4,
        system_prompt=system_prompt,
    )
    assert result.final_answer == "The answer is 391."
    trajectory = result.trajectory
    (segment,) = trajectory.segments
    messages = [object_arguments(m.to_openai()) for m in trajectory.messages]  # the template reads objects
    tools = [spec.to_openai() for spec in specs]
    call_id = trajectory.messages[-3].tool_calls[0].id
    assert call_id == ("Ab3dE5gH7" if writes_id else mistral_call_id("call_1", 0))
    assert trajectory.messages[-2].tool_call_id == call_id

    expected = seamed_official(name, messages, tools)
    if not writes_id:  # seam: the call stays as sampled; the official render writes it again, with its id
        rendered_call = chat.render_generation(trajectory.messages[-3])
        assert rendered_call in expected and rendered_call != completions[0]
        expected = expected.replace(rendered_call, completions[0], 1)
    assert tokenizer.decode(segment.ids) == expected
    assert segment.ids == tokenizer.encode(expected)
    # The prompt of turn 2 is the transcript so far; the generated ids are exactly the sampled ones.
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
    exact = system_prompt is None or name == "mistral-small-3.2"
    assert (tokenizer.decode(segment.ids) == official(name, messages, tools)) is (exact and writes_id)
