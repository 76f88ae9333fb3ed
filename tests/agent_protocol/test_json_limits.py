"""`loads_bounded` at its limits: the depth is checked exactly at the bound, whether or not the text's brackets
(some inside strings) could have reached it, and lone surrogates are refused wherever they are."""

from __future__ import annotations

import json

import pytest

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
