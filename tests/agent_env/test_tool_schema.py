"""The JSON-schema subset check used for hand-written and MCP schemas."""

from __future__ import annotations

from typing import Any

import pytest

from agent_env.errors import ArgumentError
from agent_env.schema import check_arguments

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number"},
        "mode": {"enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "inner": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
    },
    "required": ["name"],
    "additionalProperties": False,
}


def test_valid_arguments_pass() -> None:
    check_arguments(
        {"name": "n", "count": 3, "ratio": 2, "mode": "a", "tags": ["t"], "maybe": None, "inner": {"x": True}},
        SCHEMA,
    )
    check_arguments({"name": "n", "count": 2.0}, SCHEMA)  # 2.0 is an integer in JSON


@pytest.mark.parametrize(
    ("arguments", "field", "fragment"),
    [
        ({}, "name", "missing required field"),
        ({"name": 1}, "name", "expected string, got integer"),
        ({"name": "n", "count": 0}, "count", ">= 1"),
        ({"name": "n", "count": 11}, "count", "<= 10"),
        ({"name": "n", "count": True}, "count", "expected integer, got boolean"),
        ({"name": "n", "mode": "c"}, "mode", "must be one of"),
        ({"name": "n", "tags": ["ok", 3]}, "tags[1]", "expected string"),
        ({"name": "n", "maybe": "x"}, "maybe", "expected integer"),
        ({"name": "n", "inner": {}}, "inner.x", "missing required field"),
        ({"name": "n", "extra": 1}, "extra", "unknown field"),
    ],
)
def test_each_problem_names_its_field(arguments: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        check_arguments(arguments, SCHEMA)
    assert caught.value.field == field
    assert fragment in caught.value.problem


def test_unknown_keywords_are_not_enforced() -> None:
    check_arguments({"a": "x"}, {"type": "object", "properties": {"a": {"type": "string", "pattern": "^z"}}})
