"""`trajectory_view`: one `Trajectory` as the trajectory viewer draws it (plain JSON-ready dicts and lists).

Each segment (one context) keeps its tokens exactly as recorded, in parallel lists: `ids`, `loss_mask` (1: the
trainer learns from the token), `logprobs` (the sampler's, None where the token was not sampled) and, when a
tokenizer is at hand, `pieces` (each token decoded on its own). Its spans, its images' placeholder ranges, and
the range of its summary turn when the segment was compacted: the last action of every segment but the last (and
of the last when the episode ended on its summary, ``compaction_failed``), as the local trainer reads it
(`agent_train.local.rollout.summary_ranges`), marked only when the messages show a summary for each new segment
(a context policy that drops tool results opens segments without one). Its spans carry each action span's policy
version (`Span.version`, absent where untracked), and the record its versions, the engine's version when it was
built and its staleness (None where untracked). The messages (tool calls with their
results and images), the reward breakdown, the errors and the rest of the record come along as recorded.

Images are shown only from inline ``data:`` URLs; an image the record names by a file path or ``file://`` URL is
listed by name and never read: the viewer serves no file but the trajectory files it was given.
This module knows records; nothing about files or HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from agent_protocol import Message, TranscriptRecord
from agent_runtime.trajectory import Trajectory

__all__ = ["compaction_summaries", "trajectory_view"]


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:image/"):
        return {"src": url}
    return {"src": None, "name": url if len(url) <= 200 else url[:199] + "…"}


def compaction_summaries(messages: Sequence[Message]) -> list[str]:
    """The summaries the messages show, in order: an assistant turn without tool calls whose text a later user
    message quotes (a compaction policy's resume message holds the summary it resumes from)."""
    found: list[str] = []
    for at, message in enumerate(messages):
        text = (message.content or "").strip()
        if message.role != "assistant" or message.tool_calls or not text:
            continue
        if any(m.role == "user" and text in (m.content or "") for m in messages[at + 1 :]):
            found.append(text)
    return found


def _summary_range(segment: TranscriptRecord, ends_with_summary: bool) -> list[int] | None:
    actions = segment.action_ranges
    if not (actions and ends_with_summary):
        return None
    start, end = actions[-1]
    return [start, end]


def _message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(message)
    out.pop("images", None)
    out["images"] = [_image(part.url) for part in message.images]
    return out


def trajectory_view(trajectory: Trajectory, piece: Callable[[int], str] | None = None) -> dict[str, Any]:
    """The view of `trajectory` (see the module docstring); `piece` decodes one token id (None: ids only)."""
    summaries = compaction_summaries(trajectory.messages)
    last = len(trajectory.segments) - 1
    summarized = last > 0 and len(summaries) >= last
    segments = []
    for index, segment in enumerate(trajectory.segments):
        ends_with_summary = summarized and (index < last or trajectory.stop_reason == "compaction_failed")
        segments.append(
            {
                "ids": segment.ids,
                "pieces": [piece(token) for token in segment.ids] if piece is not None else None,
                "loss_mask": segment.loss_mask,
                "logprobs": segment.logprobs,
                "spans": [msgspec.to_builtins(span) for span in segment.spans],
                "images": [{"start": i.start, "end": i.end, **_image(i.source)} for i in segment.images],
                "summary_range": _summary_range(segment, ends_with_summary),
                "summary": summaries[index - 1] if summarized and 0 < index <= len(summaries) else None,
            }
        )
    breakdown = msgspec.to_builtins(trajectory.breakdown) if trajectory.breakdown is not None else None
    return {
        "episode_id": trajectory.episode_id,
        "protocol": trajectory.protocol,
        "reward": trajectory.reward,
        "breakdown": breakdown,
        "final_answer": trajectory.final_answer,
        "stop_reason": trajectory.stop_reason,
        "turns": trajectory.turns,
        "tool_calls": trajectory.tool_calls,
        "compactions": trajectory.compactions,
        "errors": [msgspec.to_builtins(error) for error in trajectory.errors],
        "usage": msgspec.to_builtins(trajectory.usage),
        "timings": trajectory.timings,
        "task": trajectory.task,
        "policy_versions": trajectory.policy_versions,
        "policy_version": trajectory.policy_version,
        "staleness": trajectory.staleness,
        "messages": [_message(message) for message in trajectory.messages],
        "segments": segments,
    }
