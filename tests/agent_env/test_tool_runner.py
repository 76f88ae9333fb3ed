"""Every failure class becomes an observation; calls run concurrently and come back in call order."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import msgspec
import pytest

from agent_env.errors import ToolDefinitionError, ToolError
from agent_env.observation import Observation
from agent_env.tool import ToolContext, tool
from agent_env.tool_runner import ToolRunner, render_result, truncate
from agent_protocol.types import ParseIssue, ToolCall

release = threading.Event()


@pytest.fixture(autouse=True)
def _release_hung_threads() -> Iterator[None]:
    release.clear()
    yield
    release.set()  # let the abandoned sync thread of the hanging-tool test finish


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@tool
def explode(message: str) -> str:
    """Raise."""
    raise KeyError(message)


@tool
def refuse(reason: str) -> str:
    """Fail on purpose."""
    raise ToolError(f"refused: {reason}", hint="Ask for something else.")


@tool(timeout_s=0.2)
async def sleepy(seconds: float) -> str:
    """Sleep asynchronously."""
    await asyncio.sleep(seconds)
    return "awake"


@tool(timeout_s=0.3)
def hang() -> str:
    """Block a thread until the test ends."""
    release.wait(30)
    return "released"


@tool(max_output_chars=50)
def chatty(n: int) -> str:
    """Talk a lot."""
    return "x" * n


class Point(msgspec.Struct):
    x: int
    y: int


class Opaque:
    def __str__(self) -> str:
        return "<opaque thing>"


class Broken:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@tool
def structured(kind: str) -> Any:
    """Return a non-string."""
    values: dict[str, Any] = {
        "dict": {"a": [1, 2], "b": None},
        "struct": Point(x=1, y=2),
        "number": 42,
        "none": None,
        "fraction": Fraction(1, 3),
        "decimal": Decimal("0.10"),
        "bytes": b"raw",
        "opaque": [Opaque()],
        "broken": Broken(),
    }
    return values[kind]


@tool
async def nap(who: str, seconds: float) -> str:
    """Sleep, then say who slept."""
    await asyncio.sleep(seconds)
    return who


RUNNER = ToolRunner([add, explode, refuse, sleepy, hang, chatty, structured, nap], max_calls_per_step=4)


def run(*calls: ToolCall) -> list[Observation]:
    return asyncio.run(RUNNER.run(calls, ToolContext(episode_id="test")))


def call(name: str, call_id: str = "c1", **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def error_of(observation: Observation) -> dict[str, Any]:
    body = json.loads(observation.content)
    assert body["ok"] is False and isinstance(body["hint"], str)
    error: dict[str, Any] = body["error"]
    return error


def test_success_is_plain_text() -> None:
    [observation] = run(call("add", a=2, b=3))
    assert observation.ok and observation.code is None
    assert observation.content == "5"
    assert observation.tool_call_id == "c1" and observation.name == "add"


def test_unknown_tool_lists_tools_and_suggests_the_closest() -> None:
    [observation] = run(call("ad", a=1, b=2))
    assert not observation.ok and observation.code == "unknown_tool"
    assert "'ad'" in error_of(observation)["message"]
    hint = json.loads(observation.content)["hint"]
    assert "Did you mean 'add'?" in hint and "explode" in hint


def test_invalid_arguments_name_the_field() -> None:
    [observation] = run(call("add", a=1, b="two"))
    assert observation.code == "invalid_arguments"
    assert error_of(observation)["message"] == "argument `b`: Expected `int`, got `str`"
    assert "a (integer, required)" in json.loads(observation.content)["hint"]
    [missing] = run(call("add", a=1))
    assert error_of(missing)["message"] == "argument `b`: missing required field"


def test_a_tool_that_raised_reports_type_and_message() -> None:
    [observation] = run(call("explode", message="boom"))
    assert observation.code == "tool_error"
    assert error_of(observation)["message"] == "KeyError: 'boom'"


def test_tool_error_shows_its_own_message_and_hint() -> None:
    [observation] = run(call("refuse", reason="no"))
    assert observation.code == "tool_error"
    assert error_of(observation)["message"] == "refused: no"
    assert json.loads(observation.content)["hint"] == "Ask for something else."


def test_slow_async_tool_times_out() -> None:
    [observation] = run(call("sleepy", seconds=5))
    assert observation.code == "timeout"
    assert "did not finish within 0.2 s" in error_of(observation)["message"]
    [fast] = run(call("sleepy", seconds=0))
    assert fast.ok and fast.content == "awake"


def test_a_hanging_sync_tool_cannot_hang_the_episode() -> None:
    started = time.monotonic()
    [observation, after] = run(call("hang"), call("add", "c2", a=1, b=1))
    assert time.monotonic() - started < 3
    assert observation.code == "timeout"
    assert after.ok and after.content == "2"


def test_many_hanging_sync_tools_do_not_starve_later_work() -> None:
    # More hung calls than the default thread pool has workers on a small machine.
    calls = [call("hang", f"h{i}") for i in range(4)]
    runner = ToolRunner([hang, add], max_calls_per_step=16)
    started = time.monotonic()
    for _ in range(3):
        observations = asyncio.run(runner.run(calls))
        assert [o.code for o in observations] == ["timeout"] * 4
    [later] = asyncio.run(runner.run([call("add", a=2, b=2)]))
    assert later.content == "4"
    assert time.monotonic() - started < 6


def test_long_output_is_truncated_with_a_marker() -> None:
    [observation] = run(call("chatty", n=500))
    assert observation.ok and observation.code == "output_truncated"
    assert observation.content.startswith("x" * 50 + "\n[output truncated")
    assert "first 50 of 500 characters" in observation.content
    [short] = run(call("chatty", n=10))
    assert short.code is None and short.content == "x" * 10


def test_runner_default_output_limit_applies() -> None:
    runner = ToolRunner([structured], max_output_chars=5)
    [observation] = asyncio.run(runner.run([call("structured", kind="dict")]))
    assert observation.code == "output_truncated" and observation.content.startswith('{"a":')


def test_parse_errors_pass_through_without_running_anything() -> None:
    broken = ToolCall(id="c9", name="add", error=ParseIssue(code="invalid_json", message="bad JSON"))
    [observation] = run(broken)
    assert observation.code == "invalid_json" and observation.tool_call_id == "c9"
    assert error_of(observation) == {"code": "invalid_json", "message": "bad JSON"}


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("dict", '{"a":[1,2],"b":null}'),
        ("struct", '{"x":1,"y":2}'),
        ("number", "42"),
        ("none", "(no output)"),
        ("fraction", '"1/3"'),
        ("decimal", '"0.10"'),
        ("bytes", "raw"),
        ("opaque", '["<opaque thing>"]'),
    ],
)
def test_non_string_results_are_serialized(kind: str, text: str) -> None:
    [observation] = run(call("structured", kind=kind))
    assert observation.ok and observation.content == text


def test_an_unserializable_result_is_a_tool_error() -> None:
    [observation] = run(call("structured", kind="broken"))
    assert observation.code == "tool_error"
    assert "could not be serialized" in error_of(observation)["message"]


def test_parallel_calls_run_concurrently_and_come_back_in_call_order() -> None:
    calls = [call("nap", "c1", who="slow", seconds=0.4), call("nap", "c2", who="fast", seconds=0.0)]
    calls.append(call("nap", "c3", who="mid", seconds=0.2))
    started = time.monotonic()
    observations = run(*calls)
    elapsed = time.monotonic() - started
    assert [o.content for o in observations] == ["slow", "fast", "mid"]
    assert [o.tool_call_id for o in observations] == ["c1", "c2", "c3"]
    assert elapsed < 0.55  # sequential would take 0.6 s


def test_calls_past_the_limit_are_refused() -> None:
    observations = run(*[call("add", f"c{i}", a=i, b=0) for i in range(6)])
    assert [o.code for o in observations] == [None] * 4 + ["too_many_calls"] * 2
    assert [o.content for o in observations[:4]] == ["0", "1", "2", "3"]


def test_mixed_turn_answers_every_call_in_order() -> None:
    observations = run(
        call("add", "a", a=1, b=1),
        ToolCall(id="b", name="x", error=ParseIssue(code="unclosed_tag", message="cut off")),
        call("nope", "c"),
        call("explode", "d", message="m"),
    )
    assert [o.tool_call_id for o in observations] == ["a", "b", "c", "d"]
    assert [o.code for o in observations] == [None, "unclosed_tag", "unknown_tool", "tool_error"]


def test_runner_rejects_bad_configuration() -> None:
    with pytest.raises(ToolDefinitionError, match="two tools are named 'add'"):
        ToolRunner([add, add])
    with pytest.raises(ValueError, match="positive"):
        ToolRunner([add], default_timeout_s=0)


def test_helpers() -> None:
    assert truncate("abcdef", 3) == ("abc\n[output truncated: showing the first 3 of 6 characters]", True)
    assert truncate("abc", 3) == ("abc", False)
    assert render_result("text") == "text"
    assert render_result([1, "a"]) == '[1,"a"]'
