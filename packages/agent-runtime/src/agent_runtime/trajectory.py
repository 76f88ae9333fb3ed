"""`Trajectory`: the record of one episode, the same record whether it was served or rolled out for training.

It holds the messages view, one token segment per context (more than one after compaction) with its loss mask,
logprobs and action ranges, the rewards and their breakdown, timings and errors. Stored as JSONL, one record per
line (`TrajectoryWriter`, `read_trajectories`). New fields get defaults and go at the end: stored trajectories
are a wire format. `build_trajectory` is the one place a record is made (agent mode's session, a tools-mode
request, an agent program's episode): it counts the usage from the segments and takes the reward from the
breakdown, the same way for all three.

Policy versions: an engine that tracks them (`LLMEngine.policy_version`) tags each action span with the version
its tokens were sampled with; the record keeps the distinct versions its tokens carry (`policy_versions`), the
engine's version when it was built (`policy_version`), and their difference (`staleness`: how many updates the
oldest token is behind). A record from an engine that tracks none, or from before versions, has neither. This
module knows records only; it runs nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import msgspec

from agent_env import RewardBreakdown
from agent_protocol import Message, Span, TranscriptRecord
from agent_runtime.outcomes import ErrorCode, StopReason, TurnFinish

__all__ = [
    "EpisodeError",
    "Trajectory",
    "TrajectoryReadError",
    "TrajectoryWriter",
    "Usage",
    "build_trajectory",
    "policy_versions_of",
    "read_trajectories",
    "usage_of",
]


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
    """One episode's record (the module docstring). `policy_versions`: the distinct policy versions of its action
    tokens, sorted (empty: untracked); `policy_version`: the engine's version when the record was built."""

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
    policy_versions: list[int] = msgspec.field(default_factory=list)
    policy_version: int | None = None

    @property
    def last_segment(self) -> TranscriptRecord:
        return self.segments[-1]

    @property
    def staleness(self) -> int | None:
        """How many policy versions the oldest sampled token is behind the engine's version when the record was
        built (0: every token from the current policy); None when either is unknown."""
        if self.policy_version is None or not self.policy_versions:
            return None
        return self.policy_version - self.policy_versions[0]


class _Segment(Protocol):
    """A token segment, live (`TokenTranscript`) or stored (`TranscriptRecord`)."""

    @property
    def ids(self) -> Sequence[int]: ...
    @property
    def spans(self) -> Sequence[Span]: ...


def usage_of(segments: Iterable[_Segment], *, generations: int) -> Usage:
    """The token counts of `segments`: the loss mask is 1 exactly on the action spans, so their lengths (not a sum
    over every token's mask) are the completion tokens."""
    completion = total = 0
    for segment in segments:
        completion += sum(s.end - s.start for s in segment.spans if s.kind == "action")
        total += len(segment.ids)
    return Usage(prompt_tokens=total - completion, completion_tokens=completion, generations=generations)


def policy_versions_of(segments: Iterable[_Segment]) -> list[int]:
    """The distinct policy versions the action spans of `segments` carry, sorted (empty when none does)."""
    return sorted({s.version for segment in segments for s in segment.spans if s.version is not None})


def build_trajectory(
    *,
    episode_id: str,
    protocol: str,
    messages: Sequence[Message],
    segments: Sequence[TranscriptRecord],
    generations: int,
    stop_reason: StopReason | TurnFinish | None = None,
    breakdown: RewardBreakdown | None = None,
    final_answer: str | None = None,
    turns: int = 0,
    tool_calls: int = 0,
    compactions: int = 0,
    errors: Sequence[EpisodeError] = (),
    timings: Mapping[str, float] | None = None,
    task: Mapping[str, Any] | None = None,
    policy_version: int | None = None,
) -> Trajectory:
    """The record of one episode or request (see the module docstring): `usage` counted from `segments` and
    `generations`, `reward` the breakdown's total (0 unscored), `policy_versions` read from the segments' spans;
    `policy_version` is the engine's now (`LLMEngine.policy_version`). Copies the sequences it is given."""
    return Trajectory(
        episode_id=episode_id,
        protocol=protocol,
        messages=list(messages),
        segments=list(segments),
        reward=breakdown.total if breakdown is not None else 0.0,
        breakdown=breakdown,
        final_answer=final_answer,
        stop_reason=stop_reason,
        turns=turns,
        tool_calls=tool_calls,
        compactions=compactions,
        errors=list(errors),
        usage=usage_of(segments, generations=generations),
        timings=dict(timings or {}),
        task=dict(task) if task is not None else {},
        policy_versions=policy_versions_of(segments),
        policy_version=policy_version,
    )


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Trajectory)


class TrajectoryReadError(ValueError):
    """A trajectory file has a line that is not a valid record; the message names the file and line."""


class TrajectoryWriter:
    """Appends trajectories to a JSONL file, one line each, safe to call from many tasks, threads and processes:
    every line is one ``O_APPEND`` write, so lines never interleave.

    The file stays open between writes and is opened again at its path when the last open is `REOPEN_S` old, so a
    log that is moved or deleted (rotated) is written at its path again within that time, and the lines written
    meanwhile are in the moved file, not lost. (Opening and closing it for every line took a 5 KB line's write from
    3 to 7 us in a micro-benchmark.) A failed write is raised and the file opened again at the next one.
    `close()` closes it; so does collecting the writer."""

    REOPEN_S: float = 1.0  # seconds

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fd = -1
        self._opened_at = 0.0
        self._closer: weakref.finalize[Any, TrajectoryWriter] | None = None

    def write(self, trajectory: Trajectory) -> None:
        line = _encoder.encode(trajectory) + b"\n"
        with self._lock:
            now = time.monotonic()
            if self._closer is None or now - self._opened_at >= self.REOPEN_S:
                self._reopen(now)
            try:
                os.write(self._fd, line)
            except OSError:
                self._close()  # the next write opens the path again (a bad descriptor, a full disk freed)
                raise

    def close(self) -> None:
        """Close the file (a later write opens it again)."""
        with self._lock:
            self._close()

    def _reopen(self, now: float) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._close()
        self._fd, self._opened_at = fd, now
        self._closer = weakref.finalize(self, os.close, fd)

    def _close(self) -> None:
        closer, self._closer, self._fd = self._closer, None, -1
        if closer is not None:
            with contextlib.suppress(OSError):  # a descriptor gone bad is closed already
                closer()


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
