"""The MCP bridge against a real MCP server (tests/agent_env/mcp_demo_server.py) started over stdio."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TextIO

import pytest

from agent_env import FunctionCallEnvironment, calculator
from agent_env.errors import MCPBridgeError
from agent_env.tools.mcp_bridge import MCPBridge
from agent_protocol.types import Action, ToolCall

SERVER = Path(__file__).with_name("mcp_demo_server.py")


def bridge(errlog: TextIO, **options: object) -> MCPBridge:
    return MCPBridge(sys.executable, [str(SERVER)], errlog=errlog, **options)  # type: ignore[arg-type]


def call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def test_server_tools_become_environment_tools(tmp_path: Path) -> None:
    async def main() -> None:
        with open(tmp_path / "server.log", "w") as errlog:
            async with bridge(errlog, name_prefix="demo_") as connected:
                names = [t.name for t in connected.tools]
                assert names == ["demo_add", "demo_shout", "demo_fail", "demo_slow"]
                add = connected.tools[0]
                assert add.description == "Add two integers."
                assert add.parameters["required"] == ["a", "b"]
                assert add.parameters["properties"]["a"]["type"] == "integer"

                env = FunctionCallEnvironment(tools=[calculator, *connected.tools], tool_timeout_s=5)
                assert [spec.name for spec in env.tools][:2] == ["calculator", "demo_add"]
                result = await env.step(
                    Action(
                        tool_calls=(
                            call("a", "demo_add", a=2, b=40),
                            call("b", "demo_shout", text="hi"),
                            call("c", "demo_fail", message="no such city"),
                            call("d", "demo_add", a=2),
                            call("e", "calculator", expression="2**10"),
                        )
                    )
                )
                added, shouted, failed, invalid, calculated = result.observations
                assert added.ok and added.content == "42"
                assert shouted.ok and shouted.content == "HI"
                assert failed.code == "tool_error"
                assert json.loads(failed.content)["error"]["message"].endswith("no such city")
                assert invalid.code == "invalid_arguments"
                assert json.loads(invalid.content)["error"]["message"] == "argument `b`: missing required field"
                assert calculated.content == "1024"

    asyncio.run(main())


def test_a_slow_server_call_times_out_and_the_bridge_keeps_working(tmp_path: Path) -> None:
    async def main() -> None:
        with open(tmp_path / "server.log", "w") as errlog:
            async with bridge(errlog) as connected:
                env = FunctionCallEnvironment(tools=connected.tools, tool_timeout_s=0.5)
                for tool in connected.tools:
                    tool.timeout_s = None  # use the environment's 0.5 s
                started = time.monotonic()
                slow = await env.step(Action(tool_calls=(call("a", "slow", seconds=30),)))
                assert slow.observations[0].code == "timeout"
                assert time.monotonic() - started < 5
                fine = await env.step(Action(tool_calls=(call("b", "add", a=1, b=1),)))
                assert fine.observations[0].content == "2"

    asyncio.run(main())


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    async def main() -> None:
        with open(tmp_path / "server.log", "w") as errlog:
            async with MCPBridge(
                sys.executable, ["-c", "import sys; sys.exit(1)"], errlog=errlog, connect_timeout_s=10
            ):
                pass

    with pytest.raises(MCPBridgeError, match="MCP server"):
        asyncio.run(main())
