"""Property-based fuzzing: no string makes a registered protocol's parser raise, and none makes
`coerce_messages` raise anything but `MessageError`.

The text mixes what degenerate RL generations are made of: every family's tags and call frames (taken from each
protocol's own `render_generation` of a tool call, so a new family is fuzzed in its own format and in every other
one's), JSON fragments, deep nesting,
huge numbers, surrogate escapes and raw surrogates, NUL bytes, and megabyte strings. CI runs a bounded number
of examples per test (`AGENT_FUZZ_EXAMPLES`, default 200); the large run documented in docs/RELIABILITY.md
sets it higher:

    AGENT_FUZZ_EXAMPLES=20000 uv run pytest tests/agent_protocol/test_parse_fuzz.py -q
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_protocol import Action, MessageError, Qwen3Protocol, coerce_messages, get_protocol, list_protocols
from agent_protocol.json_limits import MAX_JSON_DEPTH, check_json_value
from tests.support.hostile_text import BASE_TAGS, FUZZ, hostile_piece

PROTOCOLS = list_protocols()
_SLOT = "SLOT"
_SPECIAL = re.compile(r"<\|[^|>]*\|>|<｜[^｜]*｜>|\[/?[A-Z_]+\]|</?[a-z_]+>|<[a-z_]+=")


@cache
def call_frame(name: str) -> tuple[str, str, bool]:
    """`name`'s generated tool-call turn split around its arguments: (before, after, json). With `json` the
    arguments are one JSON object in the text; otherwise (XML families) each is a parameter, and the split is
    around the value of parameter `x`."""
    call = {"id": "abcdefghi", "function": {"name": "calculator", "arguments": {"x": _SLOT}}}
    try:
        text = get_protocol(name).render_generation({"role": "assistant", "content": "", "tool_calls": [call]})
    except MessageError:  # a family with no tool format (gemma3): its frame is a plain turn around the slot
        text = get_protocol(name).render_generation({"role": "assistant", "content": _SLOT})
    for arguments in ('{"x": "SLOT"}', '{"x":"SLOT"}'):
        if arguments in text:
            before, after = text.split(arguments, 1)
            return before, after, True
    before, after = text.split(_SLOT, 1)
    return before, after, False


def _tags() -> list[str]:
    found = set(BASE_TAGS)
    for name in PROTOCOLS:
        protocol = get_protocol(name)
        before, after, _ = call_frame(name)
        found |= {*protocol.stop_texts, *_SPECIAL.findall(before + after), protocol.generation_prompt}
    return sorted(t for t in found if t)


TAGS = _tags()
FRAMES = sorted({call_frame(name) for name in PROTOCOLS})


@st.composite
def hostile_call(draw: st.DrawFn) -> str:
    """A `<tool_call>` block (closed or cut off) whose body is made of hostile pieces: most parsing happens
    only inside one, so the fuzzer should not have to find the tags by chance."""
    body = "".join(draw(st.lists(hostile_piece(TAGS), min_size=1, max_size=4)))
    where = draw(st.sampled_from(["name", "arguments", "body"]))
    if where == "name":
        body = '{"name": ' + body + ', "arguments": {}}'
    elif where == "arguments":
        body = '{"name": "calculator", "arguments": ' + body + "}"
    close = draw(st.sampled_from(["\n</tool_call>", "</tool_call>", ""]))
    return f"<tool_call>\n{body}{close}"


@st.composite
def hostile_framed_call(draw: st.DrawFn) -> str:
    """Some family's own call frame with hostile arguments, closed or cut off anywhere after them."""
    before, after, _ = draw(st.sampled_from(FRAMES))
    body = "".join(draw(st.lists(hostile_piece(TAGS), min_size=1, max_size=4)))
    return before + body + after[: draw(st.integers(0, len(after)))]


hostile_text = st.lists(hostile_piece(TAGS) | hostile_call() | hostile_framed_call(), min_size=1, max_size=8).map(
    "".join
)


def _check_action(action: Action) -> None:
    assert isinstance(action, Action)
    for call in action.tool_calls:
        assert isinstance(call.arguments, dict)
        check_json_value(call.arguments, max_depth=MAX_JSON_DEPTH)  # nothing downstream can choke on it
        if call.ok:
            msgspec.json.encode(call.arguments)  # tools, trajectories and the wire can encode what was parsed


def test_every_registered_protocol_is_fuzzed() -> None:
    assert len(PROTOCOLS) >= 13, PROTOCOLS  # every family; each new one is fuzzed as it registers
    assert len(FRAMES) >= 8  # the call formats differ: Hermes JSON, XML parameters, harmony, Llama, DeepSeek, ...


@pytest.mark.parametrize("name", PROTOCOLS)
@FUZZ
@given(text=hostile_text, call_id_prefix=st.sampled_from(["call", "call_7", ""]))
def test_parser_never_raises(name: str, text: str, call_id_prefix: str) -> None:
    protocol = get_protocol(name)
    _check_action(protocol.parse_assistant_text(text, call_id_prefix=call_id_prefix))


HERMES = [
    name for name in PROTOCOLS if call_frame(name)[0].endswith('<tool_call>\n{"name": "calculator", "arguments": ')
]
KILLER_ARGUMENTS = {
    "deep_brackets": "[" * 1500 + "]" * 1500,  # RecursionError in json.loads before json_limits
    "huge_int": '{"x": ' + "9" * 5000 + "}",  # ValueError: int too long to convert
    "deep_arguments_string": json.dumps("[" * 2000),  # a string of hostile JSON where an object belongs
    "lone_surrogate": '{"x": "\\ud800"}',  # a lone surrogate
    "deep_but_decodable": '{"a":' * 150 + "1" + "}" * 150,  # decodes; too deep
}


def test_the_hermes_families_are_found() -> None:
    assert {"qwen3", "qwen3-instruct-2507", "qwen3-thinking-2507", "qwen2.5"} <= set(HERMES)


@pytest.mark.parametrize("name", HERMES)
@pytest.mark.parametrize(
    "body",
    [
        "[" * 1500 + "]" * 1500,  # RecursionError in json.loads before json_limits
        '{"name": "calculator", "arguments": {"x": ' + "9" * 5000 + "}}",  # ValueError: int too long
        '{"name": "calculator", "arguments": ' + json.dumps("[" * 2000) + "}",  # a string of hostile JSON
        '{"name": "calculator", "arguments": {"x": "\\ud800"}}',  # a lone surrogate
        '{"name": "calculator", "arguments": ' + '{"a":' * 150 + "1" + "}" * 150 + "}",  # decodes; too deep
    ],
    ids=list(KILLER_ARGUMENTS),
)
def test_known_killers_become_coded_issues(name: str, body: str) -> None:
    # "</think>" first: Thinking-2507 opens the reasoning in the prompt, so its turns start inside it.
    action = get_protocol(name).parse_assistant_text(f"</think>\n\n<tool_call>\n{body}\n</tool_call>")
    assert len(action.tool_calls) == 1
    error = action.tool_calls[0].error
    assert error is not None and error.code in ("invalid_json", "invalid_arguments"), action
    assert "cannot be read" in error.message


@pytest.mark.parametrize("name", PROTOCOLS)
@pytest.mark.parametrize("killer", list(KILLER_ARGUMENTS))
def test_known_killers_in_each_familys_own_frame(name: str, killer: str) -> None:
    """The same killers as the arguments of a call written in the family's own format. A JSON family reads
    them as a coded issue on the call; an XML family (values are parameter text) keeps them as text, and
    either way nothing parsed is beyond the limits."""
    before, after, is_json = call_frame(name)
    action = get_protocol(name).parse_assistant_text(before + KILLER_ARGUMENTS[killer] + after)
    _check_action(action)
    assert action.error is None or action.error.code != "parse_error", action.error  # no parser bug was hit
    if is_json:
        assert len(action.tool_calls) == 1, action
        error = action.tool_calls[0].error
        assert error is not None and error.code in ("invalid_json", "invalid_arguments"), action


def test_a_parser_that_raises_costs_one_turn_not_the_episode() -> None:
    class Broken(Qwen3Protocol):
        def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
            raise RecursionError("maximum recursion depth exceeded")

    qwen3 = get_protocol("qwen3")
    assert isinstance(qwen3, Qwen3Protocol)
    action = Broken(qwen3.name, qwen3.mode).parse_assistant_text("<tool_call>{}</tool_call>")
    assert action.error is not None and action.error.code == "parse_error"
    assert action.tool_calls == () and action.content == ""


json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=20)  # fmt: skip


@st.composite
def hostile_message(draw: st.DrawFn) -> Any:
    arguments = draw(hostile_text | json_value.map(json.dumps) | json_value)
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    text_part = st.fixed_dictionaries({"type": st.just("text"), "text": hostile_text})
    content = draw(st.none() | hostile_text | st.lists(text_part, max_size=2))
    return draw(st.sampled_from([
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "content": content, "tool_call_id": draw(st.text(max_size=5) | st.integers())},
        {"role": draw(st.sampled_from(["user", "system", "robot"])), "content": content},
        {"role": "assistant", "tool_calls": draw(json_value)},
    ]))  # fmt: skip


@FUZZ
@given(messages=st.lists(hostile_message(), min_size=1, max_size=3))
def test_coerce_messages_raises_only_message_error(messages: list[Any]) -> None:
    try:
        coerced = coerce_messages(messages)
    except MessageError as e:
        assert e.location.startswith("messages[")
        return
    for message in coerced:  # what was accepted is text a tokenizer can take, and arguments within the limits
        (message.content or "").encode("utf-8")
        for call in message.tool_calls:
            check_json_value(call.arguments)
