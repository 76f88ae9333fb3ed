"""Building tools: schemas from types, validation naming the field, definition errors."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import msgspec
import pytest

from agent_env.errors import ArgumentError, ToolDefinitionError
from agent_env.tool import FunctionTool, ToolBase, ToolContext, tool


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend,
            continued on a second line.

    Returns:
        The sum.
    """
    return a + b


class Query(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    text: Annotated[str, msgspec.Meta(description="What to look for.", min_length=1)]
    limit: Annotated[int, msgspec.Meta(ge=1, le=5)] = 3


@tool(name="find", timeout_s=2.0)
async def find_things(query: Query, context: ToolContext) -> list[str]:
    """Find things."""
    context.state["last"] = query.text
    return [query.text] * query.limit


def test_schema_comes_from_the_signature_and_docstring() -> None:
    spec = add.spec
    assert spec.name == "add"
    assert spec.description == "Add two integers."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "a": {"description": "The first addend.", "type": "integer"},
            "b": {
                "description": "The second addend, continued on a second line.",
                "type": "integer",
                "default": 0,
            },
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    assert spec.to_openai()["function"]["name"] == "add"


def test_a_struct_parameter_is_the_schema_and_context_is_hidden() -> None:
    assert find_things.name == "find" and find_things.timeout_s == 2.0
    parameters = find_things.parameters
    assert set(parameters["properties"]) == {"text", "limit"}
    assert parameters["properties"]["text"]["description"] == "What to look for."
    assert parameters["properties"]["limit"]["maximum"] == 5
    assert "context" not in parameters["properties"]


def test_calling_a_tool_converts_and_injects_context() -> None:
    context = ToolContext(state={})
    arguments = find_things.parse_arguments({"text": "x", "limit": 2})
    assert asyncio.run(find_things.call(arguments, context)) == ["x", "x"]
    assert context.state["last"] == "x"
    assert asyncio.run(add.call(add.parse_arguments({"a": 2, "b": 5}), ToolContext())) == 7


@pytest.mark.parametrize(
    ("arguments", "field", "fragment"),
    [
        ({"a": "x"}, "a", "Expected `int`, got `str`"),
        ({}, "a", "missing required field"),
        ({"a": 1, "c": 2}, "c", "unknown field"),
        ({"a": 1.5}, "a", "Expected `int`, got `float`"),
        ({"a": True}, "a", "got `bool`"),
    ],
)
def test_invalid_arguments_name_the_field(arguments: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        add.parse_arguments(arguments)
    assert caught.value.field == field
    assert fragment in caught.value.problem
    assert f"`{field}`" in str(caught.value)


def test_constraints_and_literals_are_checked() -> None:
    with pytest.raises(ArgumentError) as caught:
        find_things.parse_arguments({"text": "x", "limit": 9})
    assert caught.value.field == "limit" and "<= 5" in caught.value.problem

    @tool
    def pick(mode: Literal["fast", "slow"]) -> str:
        """Pick."""
        return mode

    assert pick.parameters["properties"]["mode"] == {"enum": ["fast", "slow"]}
    with pytest.raises(ArgumentError) as caught:
        pick.parse_arguments({"mode": "medium"})
    assert caught.value.field == "mode"


class Inner(msgspec.Struct):
    year: int


def test_nested_fields_are_named_by_path() -> None:
    @tool
    def search(filters: Inner, text: str) -> str:
        """Search."""
        return text

    with pytest.raises(ArgumentError) as caught:
        search.parse_arguments({"filters": {"year": "1999"}, "text": "x"})
    assert caught.value.field == "filters.year"
    with pytest.raises(ArgumentError) as caught:
        search.parse_arguments({"filters": {}, "text": "x"})
    assert caught.value.field == "filters.year" and caught.value.problem == "missing required field"


def test_lenient_mode_accepts_numeric_strings() -> None:
    @tool(strict=False)
    def double(n: int) -> int:
        """Double."""
        return 2 * n

    assert double.parse_arguments({"n": "4"}).n == 4


def test_definition_errors_are_raised_early() -> None:
    def untyped(a):  # type: ignore[no-untyped-def]
        return a

    def star(*values: int) -> int:
        return sum(values)

    with pytest.raises(ToolDefinitionError, match="needs a type annotation"):
        FunctionTool(untyped)
    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        FunctionTool(star)
    with pytest.raises(ToolDefinitionError, match="must match"):
        FunctionTool(add.fn, name="has spaces")


def test_a_subclass_with_a_hand_written_schema_is_checked_before_the_call() -> None:
    class Echo(ToolBase):
        name = "echo"

        def __init__(self) -> None:
            self.parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

        async def call(self, arguments: dict[str, str], context: ToolContext) -> str:
            return arguments["text"]

    echo = Echo()
    assert echo.spec.parameters["required"] == ["text"]
    with pytest.raises(ArgumentError) as caught:
        echo.parse_arguments({"text": 3})
    assert caught.value.field == "text" and "expected string" in caught.value.problem
    assert asyncio.run(echo.call(echo.parse_arguments({"text": "hi"}), ToolContext())) == "hi"


def test_an_optional_context_parameter_is_injected_too() -> None:
    @tool
    def note(text: str, context: ToolContext | None = None) -> int:
        """Note."""
        assert context is not None
        context.state.setdefault("notes", []).append(text)
        return len(context.state["notes"])

    assert list(note.parameters["properties"]) == ["text"]
    context = ToolContext(state={})
    assert asyncio.run(note.call(note.parse_arguments({"text": "a"}), context)) == 1
    assert context.state["notes"] == ["a"]


def test_a_subclass_naming_an_arguments_type_gets_its_schema_and_instances() -> None:
    class Find(ToolBase):
        name = "find_query"
        arguments_type = Query

        async def call(self, arguments: Query, context: ToolContext) -> str:
            return arguments.text * arguments.limit

    own_schema = {"type": "object", "properties": {"text": {"type": "string"}}}

    class OwnSchema(Find):
        parameters = own_schema

    find = Find()
    assert find.parameters == find_things.parameters
    assert asyncio.run(find.call(find.parse_arguments({"text": "ab", "limit": 2}), ToolContext())) == "abab"
    with pytest.raises(ArgumentError) as caught:
        find.parse_arguments({"text": "x", "limit": "2"})
    assert caught.value.field == "limit"
    assert OwnSchema().parameters is own_schema
    assert isinstance(OwnSchema().parse_arguments({"text": "x"}), Query)
