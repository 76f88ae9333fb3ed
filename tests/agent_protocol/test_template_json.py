"""`tojson_kept`: the text of `tojson`, kept by content. The same text for the golden cases' tool specs and for
values where msgspec's encoding and `json.dumps` part ways (NaN, None, infinities, int keys, tuples, unicode); a
second call takes the kept text; a schema edited in place renders as it is now; the kept texts are bounded."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from agent_protocol import template_json
from agent_protocol.template_json import KEPT_TEXTS, tojson, tojson_kept
from tests.agent_protocol.golden import GOLDEN


def golden_tools() -> list[dict[str, Any]]:
    cases = json.loads((GOLDEN / "cases.json").read_text())
    return [tool for case in cases for tool in case.get("tools") or []]


@pytest.fixture(autouse=True)
def nothing_kept() -> None:
    template_json._kept.clear()


def test_the_golden_tool_specs_give_tojsons_text_first_and_when_kept() -> None:
    tools = golden_tools()
    assert tools, "the golden cases list tools"
    for tool in tools:
        assert tojson_kept(tool) == tojson(tool)
        assert tojson_kept(copy.deepcopy(tool)) == tojson(tool)  # an equal value made anew: the kept text
    assert len(template_json._kept) == len({tojson(tool) for tool in tools})


def test_an_indented_dump_is_kept_apart_from_a_flat_one() -> None:
    tools = golden_tools()
    for tool in tools:
        assert tojson_kept(tool, indent=4) == tojson(tool, indent=4)
        assert tojson_kept(tool) == tojson(tool)
        assert tojson_kept(copy.deepcopy(tool), indent=4) == tojson(tool, indent=4)


def test_a_second_call_takes_the_kept_text() -> None:
    spec = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    first = tojson_kept(spec)
    assert tojson_kept(copy.deepcopy(spec)) is first, "the text was dumped again instead of kept"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"default": None}, {"default": math.nan}),  # both `null` to msgspec; `null` and `NaN` to tojson
        ({"default": None}, {"default": math.inf}),
        ({"default": -math.inf}, {"default": None}),
        ({"x": 1}, {"x": 1.0}),
        ({"x": 1}, {"x": True}),
        ({"x": "é"}, {"x": "\\u00e9"}),
    ],
)
def test_values_that_dump_differently_never_share_a_text(one: dict[str, Any], other: dict[str, Any]) -> None:
    for first, second in ((one, other), (other, one)):
        template_json._kept.clear()
        assert tojson_kept(first) == tojson(first)
        assert tojson_kept(second) == tojson(second)
        assert tojson(first) != tojson(second)


def test_values_msgspec_writes_alike_that_dump_alike_are_fine() -> None:
    assert tojson_kept({1: (1, 2)}) == tojson({1: (1, 2)}) == '{"1": [1, 2]}'
    assert tojson_kept({"1": [1, 2]}) == '{"1": [1, 2]}'


def test_a_schema_edited_in_place_renders_as_it_is_now() -> None:
    spec = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}
    before = tojson_kept(spec)
    spec["function"]["parameters"]["properties"]["query"] = {"type": "string"}
    assert tojson_kept(spec) == tojson(spec) != before


def test_a_value_neither_can_write_raises_as_tojson_does() -> None:
    with pytest.raises(TypeError):
        tojson_kept({"x": object()})
    with pytest.raises(TypeError):  # msgspec writes bytes (base64); json.dumps, what the template runs, does not
        tojson_kept({"x": b"raw"})


def test_the_kept_texts_are_bounded() -> None:
    for index in range(KEPT_TEXTS + 10):
        assert tojson_kept({"index": index}) == tojson({"index": index})
    assert len(template_json._kept) <= KEPT_TEXTS
