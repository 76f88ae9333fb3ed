"""agent-env: environments, tools and rewards for tool-using agents, where nothing a model or a tool does
crashes an episode.

- Environments: `Environment` (the contract), `FunctionCallEnvironment`, `SingleTurnEnvironment`;
  `step(action)` gives a `StepResult` (observations, done, final answer).
- Tools: `ToolBase`, `@tool` (a tool from a typed function or a msgspec Struct), `ToolRunner`, and the
  built-ins in `agent_env.tools` (`think`, `calculator`, `local_search`, `python`, `MCPBridge`; the image tools
  `crop` and `plot_chart` in `agent_env.tools.image_tools`). A tool shows images by returning `ToolOutput`.
- Failures are `Observation`s with a code from `ObservationCode`.
- Rewards: `ResultRewardStrategy`, `ProcessRewardStrategy`, `RewardPipeline`, and the built-ins in
  `agent_env.rewards`.

Heavy pieces (`LocalSearchTool`/`SearchIndex`: bm25s; `MCPBridge`: the mcp SDK; `MathReward`: math-verify;
`CropTool`/`ChartTool`: Pillow and matplotlib, the extra ``agent-env[vision]``) are imported on first use.
This package imports `agent_protocol` and third-party libraries only.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from agent_env import tools
from agent_env._threads import run_coroutine_in_thread
from agent_env.containment import describe_error, propagates
from agent_env.deadlines import Alarm, deadline
from agent_env.environment import Environment, StepResult, StopReason
from agent_env.environments import FunctionCallEnvironment, SingleTurnEnvironment
from agent_env.errors import (
    AgentEnvError,
    ArgumentError,
    ContainedBaseException,
    EnvironmentStateError,
    MCPBridgeError,
    SearchIndexError,
    ThreadLimitError,
    ToolDefinitionError,
    ToolError,
)
from agent_env.image_decoder import ImageTooLarge, checked_size, decode_image, decode_reference
from agent_env.observation import (
    FAILURE_CODES,
    PARSE_CODES,
    REFUSAL_CODES,
    Observation,
    ObservationCode,
    error_content,
)
from agent_env.reward import (
    EpisodeRecord,
    ProcessRewardStrategy,
    ResultRewardStrategy,
    RewardScore,
    StepRecord,
)
from agent_env.reward_pipeline import RewardBreakdown, RewardPipeline, StepReward
from agent_env.rewards import FormatReward, JudgeGenerate, JudgeReward, MatchingReward, ToolCallReward
from agent_env.tool import FunctionTool, ToolBase, ToolContext, tool
from agent_env.tool_output import ImageLimits, ToolOutput, image_data_url
from agent_env.tool_runner import ToolRunner
from agent_env.tools import CalculatorTool, PythonTool, calculator, think

if TYPE_CHECKING:
    from agent_env.rewards.math import MathReward
    from agent_env.tools.image_tools import ChartTool, CropTool, crop, plot_chart
    from agent_env.tools.local_search import LocalSearchTool, SearchIndex
    from agent_env.tools.mcp_bridge import MCPBridge, MCPTool

__all__ = [
    "FAILURE_CODES",
    "PARSE_CODES",
    "REFUSAL_CODES",
    "AgentEnvError",
    "Alarm",
    "ArgumentError",
    "CalculatorTool",
    "ChartTool",
    "ContainedBaseException",
    "CropTool",
    "Environment",
    "EnvironmentStateError",
    "EpisodeRecord",
    "FormatReward",
    "FunctionCallEnvironment",
    "FunctionTool",
    "ImageLimits",
    "ImageTooLarge",
    "JudgeGenerate",
    "JudgeReward",
    "LocalSearchTool",
    "MCPBridge",
    "MCPBridgeError",
    "MCPTool",
    "MatchingReward",
    "MathReward",
    "Observation",
    "ObservationCode",
    "ProcessRewardStrategy",
    "PythonTool",
    "ResultRewardStrategy",
    "RewardBreakdown",
    "RewardPipeline",
    "RewardScore",
    "SearchIndex",
    "SearchIndexError",
    "SingleTurnEnvironment",
    "StepRecord",
    "StepResult",
    "StepReward",
    "StopReason",
    "ThreadLimitError",
    "ToolBase",
    "ToolCallReward",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolOutput",
    "ToolRunner",
    "__version__",
    "calculator",
    "checked_size",
    "crop",
    "deadline",
    "decode_image",
    "decode_reference",
    "describe_error",
    "error_content",
    "image_data_url",
    "plot_chart",
    "propagates",
    "run_coroutine_in_thread",
    "think",
    "tool",
]

__version__ = _version("agent-env")

_LAZY = {"MathReward": "agent_env.rewards.math"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in tools.__all__:  # the tools imported on first use: `agent_env.tools` knows which, and imports them
        return getattr(tools, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
