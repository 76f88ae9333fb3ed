"""The MCP bridge: the tools of an MCP server (official `mcp` SDK, stdio transport) as environment tools.

    async with MCPBridge("python", ["my_server.py"]) as bridge:
        env = FunctionCallEnvironment(tools=[calculator, *bridge.tools])

`MCPBridge` starts the server as a subprocess, lists its tools (following pagination) and wraps each in an
`MCPTool`, whose name, description and JSON schema are the server's (optionally with a name prefix to keep
names unique). Arguments are checked against the server's schema before the call (the common JSON Schema
subset, see `schema.py`); the server validates again. A result marked ``isError`` by the server raises
`ToolError`, so the model sees a ``tool_error`` observation with the server's text; a protocol error
(unknown tool, bad request) does too. Text content blocks are joined; structured content is used when there
is no text; images and other binary blocks are described, not inlined.

One bridge (one server process, one session) serves every episode that uses it: calls from concurrent
episodes are concurrent JSON-RPC requests. Whatever state the server keeps is the server's business; a
server with per-episode state needs one bridge per episode.

The bridge must be entered and exited in the same task (the SDK's streams use anyio task groups). This module
knows the MCP client API; it knows nothing about episodes or chat formats.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Final, TextIO

import msgspec
import structlog
from mcp import Client, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

from agent_env.errors import MCPBridgeError, ToolError
from agent_env.tool import ToolBase, ToolContext

__all__ = ["MCPBridge", "MCPTool"]

logger = structlog.get_logger(__name__)

_MAX_PAGES: Final = 100
_encoder: Final = msgspec.json.Encoder()


class MCPTool(ToolBase):
    """One tool of an MCP server, called through its bridge. Its calls run on the caller's event loop
    (``event_loop = "shared"``): the bridge's session and streams belong to the loop that entered it."""

    event_loop = "shared"

    def __init__(
        self,
        bridge: MCPBridge,
        *,
        remote_name: str,
        name: str,
        description: str,
        parameters: dict[str, Any],
        timeout_s: float | None,
    ) -> None:
        self.bridge = bridge
        self.remote_name = remote_name
        self.name = name
        self.description = description
        self.parameters = parameters
        self.timeout_s = timeout_s

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> str:
        return await self.bridge.call_tool(self.remote_name, arguments)


class MCPBridge:
    """A connection to one MCP server over stdio, exposing its tools. Use as an async context manager."""

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name_prefix: str = "",
        connect_timeout_s: float = 30.0,
        call_timeout_s: float = 30.0,
        errlog: TextIO | None = None,
    ) -> None:
        self.parameters = StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env is not None else None, cwd=cwd
        )
        self.name_prefix = name_prefix
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self.errlog = errlog
        self._client: Client | None = None
        self._stack: AsyncExitStack | None = None
        self.tools: list[MCPTool] = []

    async def __aenter__(self) -> MCPBridge:
        if self._stack is not None:
            raise MCPBridgeError("this MCP bridge is already connected")
        stack = AsyncExitStack()
        transport = stdio_client(self.parameters, errlog=self.errlog if self.errlog is not None else sys.stderr)
        client = Client(transport, read_timeout_seconds=self.call_timeout_s, cache=None)
        where = f"MCP server {self.parameters.command} {' '.join(self.parameters.args)}".strip()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await stack.enter_async_context(client)
                listed = await self._list_tools(client)
        except TimeoutError as e:
            await stack.aclose()
            raise MCPBridgeError(f"{where}: no answer within {self.connect_timeout_s:g} s") from e
        except Exception as e:
            await stack.aclose()
            raise MCPBridgeError(f"{where}: cannot connect: {_describe(e)}") from e
        self._client, self._stack = client, stack
        self.tools = [
            MCPTool(
                self,
                remote_name=item.name,
                name=f"{self.name_prefix}{item.name}",
                description=item.description or "",
                parameters=dict(item.input_schema) or {"type": "object", "properties": {}},
                timeout_s=self.call_timeout_s,
            )
            for item in listed
        ]
        logger.info("mcp_bridge_connected", server=where, tools=[t.name for t in self.tools])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    @staticmethod
    async def _list_tools(client: Client) -> list[Any]:
        found: list[Any] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            found.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return found

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Call a tool on the server; return its text, or raise `ToolError` with the server's message."""
        client = self._client
        if client is None:
            raise ToolError("the MCP server is not connected", hint="This tool is unavailable right now.")
        try:
            result = await client.call_tool(name, arguments, read_timeout_seconds=self.call_timeout_s)
        except MCPError as e:
            raise ToolError(f"the MCP server refused the call: {e.message}") from e
        text = _result_text(result)
        if result.is_error:
            raise ToolError(text or f"{name} failed on the MCP server")
        return text


def _result_text(result: CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:
            kind = getattr(block, "type", type(block).__name__)
            mime = getattr(block, "mime_type", None)
            parts.append(f"[{kind} content{f' ({mime})' if mime else ''} not shown]")
    if not any(part.strip() for part in parts) and result.structured_content is not None:
        return _encoder.encode(result.structured_content).decode()
    return "\n".join(parts)


def _describe(error: BaseException) -> str:
    """The first leaf of an exception group (anyio wraps transport errors in task-group groups)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"
