"""The built-in tools, one module each: `think`, `calculator`, `local_search`, `python`, the image tools (`crop`,
`plot_chart`) and the MCP bridge.

`local_search` (bm25s, numpy, scipy), the image tools (Pillow, matplotlib: the `agent-env[vision]` extra) and the
MCP bridge (the `mcp` SDK) are imported on first use, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent_env.tools.calculator import CalculatorError, CalculatorTool, calculator
from agent_env.tools.python import PythonTool
from agent_env.tools.think import think

if TYPE_CHECKING:
    from agent_env.tools.image_tools import ChartTool, CropTool, crop, plot_chart
    from agent_env.tools.local_search import Document, LocalSearchTool, SearchHit, SearchIndex
    from agent_env.tools.mcp_bridge import MCPBridge, MCPTool

__all__ = [
    "CalculatorError",
    "CalculatorTool",
    "ChartTool",
    "CropTool",
    "Document",
    "LocalSearchTool",
    "MCPBridge",
    "MCPTool",
    "PythonTool",
    "SearchHit",
    "SearchIndex",
    "calculator",
    "crop",
    "plot_chart",
    "think",
]

_LAZY = {
    "ChartTool": "agent_env.tools.image_tools",
    "CropTool": "agent_env.tools.image_tools",
    "crop": "agent_env.tools.image_tools",
    "plot_chart": "agent_env.tools.image_tools",
    "Document": "agent_env.tools.local_search",
    "LocalSearchTool": "agent_env.tools.local_search",
    "SearchHit": "agent_env.tools.local_search",
    "SearchIndex": "agent_env.tools.local_search",
    "MCPBridge": "agent_env.tools.mcp_bridge",
    "MCPTool": "agent_env.tools.mcp_bridge",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
