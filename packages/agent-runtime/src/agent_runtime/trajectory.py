"""`Trajectory`: the record of one episode, the same record whether it was served or rolled out for training.

It holds the messages view, one token segment per context (more than one after compaction) with its loss mask,
logprobs and action ranges, the rewards and their breakdown, timings and errors. Stored as JSONL, one record per
line (`TrajectoryWriter`, `read_trajectories`). New fields get defaults and go at the end: stored trajectories
are a wire format. This module knows records only; it runs nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import msgspec

from agent_env import RewardBreakdown
from agent_protocol import Message, TranscriptRecord
from agent_runtime.outcomes import ErrorCode, StopReason, TurnFinish

__all__ = ["EpisodeError", "Trajectory", "TrajectoryReadError", "TrajectoryWriter", "Usage", "read_trajectories"]


class EpisodeError(msgspec.Struct, frozen=True, kw_only=True):
    """Something that went wrong during an episode and was recorded instead of raised."""

    code: ErrorCode  # e.g. "engine_error", "invalid_json", "tool_error", "context_exhausted"
    message: str
    turn: int = 0


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts over every segment: `completion_tokens` were generated (loss mask 1), `prompt_tokens` were
    rendered (prompts and feedback), `generations` counts engine calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    generations: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Trajectory(msgspec.Struct, frozen=True, kw_only=True):
    episode_id: str
    protocol: str
    messages: list[Message]
    segments: list[TranscriptRecord]
    reward: float = 0.0
    breakdown: RewardBreakdown | None = None
    final_answer: str | None = None
    stop_reason: StopReason | TurnFinish | None = None  # a tools-mode request's record ends with its finish reason
    turns: int = 0
    tool_calls: int = 0
    compactions: int = 0
    errors: list[EpisodeError] = msgspec.field(default_factory=list)
    usage: Usage = msgspec.field(default_factory=Usage)
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    task: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def last_segment(self) -> TranscriptRecord:
        return self.segments[-1]


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Trajectory)


class TrajectoryReadError(ValueError):
    """A trajectory file has a line that is not a valid record; the message names the file and line."""


class TrajectoryWriter:
    """Appends trajectories to a JSONL file, one line each, safe to call from many tasks and threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, trajectory: Trajectory) -> None:
        line = _encoder.encode(trajectory) + b"\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write per record with O_APPEND: lines never interleave
            finally:
                os.close(fd)


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Yield every record of a JSONL trajectory file; blank lines are skipped."""
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                yield _decoder.decode(line)
            except msgspec.DecodeError as e:
                raise TrajectoryReadError(f"{path}:{number}: not a trajectory record ({e})") from e
