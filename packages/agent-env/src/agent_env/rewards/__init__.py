"""The built-in reward strategies, one module each, and the answer helpers they share.

`MathReward` (math-verify, sympy) is imported on first use, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent_env.rewards.answer import (
    ExtractMethod,
    extract_answer,
    extract_answer_line,
    extract_answer_tag,
    extract_boxed,
    normalize_answer,
    token_f1,
)
from agent_env.rewards.format import FormatReward
from agent_env.rewards.judge import JudgeGenerate, JudgeReward, parse_judge_score
from agent_env.rewards.matching import MatchingReward, MatchMode
from agent_env.rewards.tool_call import CallCounts, ToolCallReward, count_calls

if TYPE_CHECKING:
    from agent_env.rewards.math import MathReward

__all__ = [
    "CallCounts",
    "ExtractMethod",
    "FormatReward",
    "JudgeGenerate",
    "JudgeReward",
    "MatchMode",
    "MatchingReward",
    "MathReward",
    "ToolCallReward",
    "count_calls",
    "extract_answer",
    "extract_answer_line",
    "extract_answer_tag",
    "extract_boxed",
    "normalize_answer",
    "parse_judge_score",
    "token_f1",
]


def __getattr__(name: str) -> Any:
    if name == "MathReward":
        return importlib.import_module("agent_env.rewards.math").MathReward
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
