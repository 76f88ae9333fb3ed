"""Trajectory records survive JSONL, and a bad line names the file and line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment
from agent_protocol import HFTokenizer
from agent_runtime import (
    AgentRuntime,
    AgentSession,
    ScriptedEngine,
    TrajectoryReadError,
    TrajectoryWriter,
    read_trajectories,
)
from tests.agent_runtime.test_session import answer, call


def test_jsonl_round_trip(qwen3_tokenizer_file: Path, tmp_path: Path) -> None:
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    session = AgentSession(protocol="qwen3", environment=FunctionCallEnvironment(tools=[CalculatorTool()]))
    engine = ScriptedEngine(tokenizer, [call("6 * 7"), answer("42"), call("1 + 1"), answer("2")])
    runtime = AgentRuntime(engine, session)
    first = asyncio.run(runtime.run("6*7?")).trajectory
    second = asyncio.run(runtime.run("1+1?")).trajectory
    path = tmp_path / "logs" / "trajectories.jsonl"
    writer = TrajectoryWriter(path)
    writer.write(first)
    writer.write(second)
    assert list(read_trajectories(path)) == [first, second]
    assert first.segments[0].action_ranges == [tuple(r) for r in first.segments[0].action_ranges]


def test_corrupt_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('\n{"episode_id": 3}\n')
    with pytest.raises(TrajectoryReadError, match=r"t\.jsonl:2"):
        list(read_trajectories(path))
