"""Trajectory records survive JSONL, and a bad line names the file and line."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment
from agent_protocol import HFTokenizer
from agent_runtime import (
    AgentRuntime,
    AgentSession,
    ScriptedEngine,
    Trajectory,
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


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _records(qwen3_tokenizer_file: Path, n: int) -> list[Trajectory]:
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    session = AgentSession(protocol="qwen3", environment=FunctionCallEnvironment(tools=[CalculatorTool()]))
    engine = ScriptedEngine(tokenizer, [answer(str(i)) for i in range(n)])
    runtime = AgentRuntime(engine, session)
    return [asyncio.run(runtime.run(f"say {i}")).trajectory for i in range(n)]


def test_a_rotated_log_is_written_at_its_path_again_within_the_reopen_time(
    qwen3_tokenizer_file: Path, tmp_path: Path
) -> None:
    """The file stays open between writes; moved away (logrotate), its path gets the lines again once the last open
    is REOPEN_S old, and the lines written in between are in the moved file: none is lost."""
    first, second, third = _records(qwen3_tokenizer_file, 3)
    path, moved = tmp_path / "t.jsonl", tmp_path / "t.jsonl.1"
    writer = TrajectoryWriter(path)
    writer.REOPEN_S = 0.2
    writer.write(first)
    path.rename(moved)
    writer.write(second)  # within the reopen time: the open file, now the moved one
    time.sleep(0.25)
    writer.write(third)
    assert list(read_trajectories(moved)) == [first, second]
    assert list(read_trajectories(path)) == [third]
    writer.close()


def test_the_writer_holds_one_descriptor_and_lets_it_go(qwen3_tokenizer_file: Path, tmp_path: Path) -> None:
    (record,) = _records(qwen3_tokenizer_file, 1)
    before = _open_fds()
    writer = TrajectoryWriter(tmp_path / "t.jsonl")
    writer.REOPEN_S = 0.0  # a new open for every line: each must close the one before
    for _ in range(50):
        writer.write(record)
    assert _open_fds() == before + 1
    writer.close()
    assert _open_fds() == before
    writer.write(record)  # a closed writer opens again
    assert _open_fds() == before + 1
    del writer
    gc.collect()
    assert _open_fds() == before  # collected: its file is closed
    assert len(list(read_trajectories(tmp_path / "t.jsonl"))) == 51


def test_a_failed_write_is_raised_and_the_next_one_opens_the_file_again(
    qwen3_tokenizer_file: Path, tmp_path: Path
) -> None:
    first, second = _records(qwen3_tokenizer_file, 2)
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    writer.write(first)
    os.close(writer._fd)  # the descriptor goes bad under it (as it would on a failing device)
    with pytest.raises(OSError):
        writer.write(second)
    writer.write(second)
    assert list(read_trajectories(path)) == [first, second]
    writer.close()
