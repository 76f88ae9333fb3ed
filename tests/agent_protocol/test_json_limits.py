"""`loads_bounded` at its limits: the depth is checked exactly at the bound, whether or not the text's brackets
(some inside strings) could have reached it, and lone surrogates are refused wherever they are."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_protocol.errors import JsonLimitError
from agent_protocol.json_limits import loads_bounded


def nested(depth: int, *, padding: str = "") -> str:
    """`depth` containers, alternating objects and arrays, around a string."""
    text = json.dumps("x" + padding)
    for level in range(depth):
        text = f'{{"k": {text}}}' if level % 2 else f"[{text}]"
    return text


@pytest.mark.parametrize("max_depth", [1, 2, 5, 100])
def test_depth_is_refused_exactly_past_the_bound(max_depth: int) -> None:
    assert loads_bounded(nested(max_depth), max_depth=max_depth) is not None
    with pytest.raises(JsonLimitError, match="nested too deeply"):
        loads_bounded(nested(max_depth + 1), max_depth=max_depth)


def test_brackets_inside_strings_neither_hide_nor_fake_depth() -> None:
    # many brackets in a string: the value is still only two levels deep
    shallow = nested(2, padding="[[[{{{" * 50)
    assert loads_bounded(shallow, max_depth=2) == json.loads(shallow)
    with pytest.raises(JsonLimitError):
        loads_bounded(nested(3, padding="[{" * 50), max_depth=2)


def test_a_lone_surrogate_is_refused_even_in_a_short_flat_value() -> None:
    with pytest.raises(JsonLimitError, match="lone surrogate"):
        loads_bounded('{"a": "\\ud800"}')
    with pytest.raises(JsonLimitError, match="lone surrogate"):
        loads_bounded('{"\\udc00": 1}')
    assert loads_bounded('{"a": "\\ud83d\\ude00"}') == {"a": "😀"}  # a pair is a character


def _reference(text: str) -> tuple[str, str]:
    """What `json.loads` alone makes of `text` (the decoder `loads_bounded` used before msgspec's): the value
    as canonical JSON, or the exception's type."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        return "error", type(e).__name__
    return "value", json.dumps(value, sort_keys=False, allow_nan=True)


def _ours(text: str) -> tuple[str, str]:
    try:
        value = loads_bounded(text, max_depth=10_000)
    except JsonLimitError:
        return "error", "JsonLimitError"
    except json.JSONDecodeError:
        return "error", "JSONDecodeError"
    return "value", json.dumps(value, sort_keys=False, allow_nan=True)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)


@given(_json_values)
@settings(max_examples=500, deadline=None, derandomize=True)
def test_a_value_decodes_as_json_loads_decodes_it(value: object) -> None:
    """msgspec decodes first, json.loads what it refuses (NaN, Infinity): the value is json.loads's either way."""
    text = json.dumps(value, allow_nan=True)
    assert _ours(text) == _reference(text)


@given(st.text(alphabet='{}[]",:0123456789.-+eE tfnrulsaN\\u\n', max_size=30))
@settings(max_examples=3000, deadline=None, derandomize=True)
def test_any_text_is_accepted_or_refused_as_json_loads_does(text: str) -> None:
    """Malformed text, of the characters JSON is made of: refused exactly where json.loads refuses it (as a
    JSONDecodeError, which the parsers turn into their message), and decoded to its value where it accepts it."""
    kind, detail = _reference(text)
    ours = _ours(text)
    if kind == "value":
        assert ours == (kind, detail), text
    else:
        assert ours[0] == "error", text


@pytest.mark.parametrize(
    "text", ['"' + chr(0xD800) + '"', '{"a": "x' + chr(0xDFFF) + '"}', "</arg_key>" + chr(0xD800), "NaN", "[1e999]"]
)
def test_what_msgspec_cannot_take_goes_to_json_loads(text: str) -> None:
    """Raw lone surrogates (msgspec takes its input as UTF-8), NaN and overflowing numbers: the outcome is
    json.loads's, never a msgspec or encoding error."""
    assert _ours(text) == _reference(text)


def test_an_escaped_lone_surrogate_is_still_refused() -> None:
    with pytest.raises(JsonLimitError, match="lone surrogate"):
        loads_bounded('{"a": "\\ud800"}')
