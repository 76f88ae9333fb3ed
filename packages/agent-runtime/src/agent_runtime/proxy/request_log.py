"""`RequestLog`: every tools-mode request of one agent-program episode, and the episode's segments built from them.

The endpoint of an episode is the tools-mode server (`agent_runtime.serving`); each request it answers writes one
`Trajectory` record (the serving trajectory log), holding the whole conversation's token transcript so far, the
conversation's id (kept across the follow-ups that continued its ids) and how its prompt was prepared
(``prefix_hit``, ``rerender``, ``new``). `RequestLog` is that log, kept in memory. `segments()` reads it:

- a ``prefix_hit`` continues its conversation: its record replaces the conversation's earlier one, whose ids it
  extends (sampled ids kept as sampled, the feedback tokenized alone, loss mask on generated tokens only);
- anything else opens a new segment, and when the episode already has one that is a prefix break, diagnosed
  (`prefix_break.diagnose`) against every conversation seen before.

A cap on conversations (`max_conversations`, from `AgentProgram`): a record that would open one more conversation
than that (a request that is not a ``prefix_hit`` of a conversation kept here) is not kept, and `on_refused` is
called with the cap, once per refused record; the conversations already opened go on being recorded.

`steps()` gives the model's turns as reward steps: each generated assistant message, with the tool messages the
program sent back after it as its observations. This module knows trajectories and messages; it runs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import msgspec

from agent_env import Observation, StepRecord
from agent_protocol import Action, Message
from agent_runtime.proxy.prefix_break import PrefixBreak, diagnose
from agent_runtime.trajectory import Trajectory, TrajectoryWriter

__all__ = ["RequestLog", "Segment"]

_GENERATED: Final = frozenset({"stop", "tool_calls", "length"})  # a request whose turn was generated ends so


def generated(record: Trajectory) -> bool:
    """Whether the request of `record` got a generated turn (else it failed before or in the engine)."""
    return record.stop_reason in _GENERATED


@dataclass
class Segment:
    """One context of the episode: the conversation's latest request record, and how many of its messages were
    the prompt of its first request (the rest were generated here or sent back as feedback)."""

    conversation_id: str
    record: Trajectory
    prompt_messages: int
    requests: list[int] = field(default_factory=list)

    @property
    def trained_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.record.segments)


class RequestLog(TrajectoryWriter):
    """The serving trajectory log of one episode, in memory (`write` is what the server calls per request)."""

    def __init__(
        self, *, max_conversations: int | None = None, on_refused: Callable[[int], None] | None = None
    ) -> None:  # no file: the records stay here
        self.records: list[Trajectory] = []
        self.max_conversations = max_conversations
        self.on_refused = on_refused
        self.refused = 0
        self._opened: set[str] = set()

    def write(self, trajectory: Trajectory) -> None:
        continued = trajectory.task.get("prepared") == "prefix_hit" and trajectory.episode_id in self._opened
        if not continued:
            cap = self.max_conversations
            if cap is not None and len(self._opened) >= cap:
                self.refused += 1
                if self.on_refused is not None:
                    self.on_refused(cap)
                return
            self._opened.add(trajectory.episode_id)
        self.records.append(trajectory)

    def segments(self) -> tuple[list[Segment], list[PrefixBreak]]:
        """The episode's segments in the order they were opened, and the prefix breaks that opened them."""
        segments: dict[str, Segment] = {}
        breaks: list[PrefixBreak] = []
        seen: list[list[Message]] = []
        for index, record in enumerate(self.records):
            conversation_id = record.episode_id
            current = segments.get(conversation_id)
            if record.task.get("prepared") == "prefix_hit" and current is not None:
                current.record = record
                current.requests.append(index)
            else:
                prompt = record.messages[:-1] if generated(record) else record.messages
                if segments:
                    reason, at = diagnose(prompt, seen)
                    breaks.append(PrefixBreak(reason=reason, request=index, segment=len(segments), at_message=at))
                segments[conversation_id] = Segment(conversation_id, record, len(prompt), [index])
            seen.append(list(record.messages))
        return [s for s in segments.values() if s.record.segments], breaks

    def steps(self, segments: list[Segment]) -> list[StepRecord]:
        """The model's turns over `segments`, in order, each with the tool results that answered it. The last
        turn of a segment that a prefix break ended is answered by the tool messages the breaking request sent
        after its last assistant message; results whose ids the program rewrote answer the calls by position."""
        steps: list[StepRecord] = []
        for index, segment in enumerate(segments):
            turns = list(_turns(segment.record.messages[segment.prompt_messages :]))
            if turns and not turns[-1][1] and index + 1 < len(segments):
                following = segments[index + 1]
                turns[-1] = (turns[-1][0], _answers(following.record.messages[: following.prompt_messages]))
            for message, observations in turns:
                action = Action(
                    content=message.content or "",
                    reasoning_content=message.reasoning_content,
                    tool_calls=message.tool_calls,
                )
                steps.append(StepRecord(index=len(steps), action=action, observations=_matched(action, observations)))
        return steps


def _observation(message: Message) -> Observation:
    return Observation(
        tool_call_id=message.tool_call_id,
        name=message.name or "",
        content=message.content or "",
        images=tuple(image.url for image in message.images),
    )


def _turns(messages: list[Message]) -> Iterator[tuple[Message, tuple[Observation, ...]]]:
    """Each assistant message of `messages` with the tool messages that follow it, as observations."""
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if message.role != "assistant":
            continue
        observations: list[Observation] = []
        while index < len(messages) and messages[index].role == "tool":
            observations.append(_observation(messages[index]))
            index += 1
        yield message, tuple(observations)


def _answers(prompt: list[Message]) -> tuple[Observation, ...]:
    """The tool messages after the last assistant message of a request's prompt (none when it has none)."""
    last = max((i for i, m in enumerate(prompt) if m.role == "assistant"), default=None)
    if last is None:
        return ()
    return tuple(_observation(m) for m in prompt[last + 1 :] if m.role == "tool")


def _matched(action: Action, observations: tuple[Observation, ...]) -> tuple[Observation, ...]:
    """`observations` with the ids of the calls they answer, by position, where the program changed the ids."""
    ids = [call.id for call in action.tool_calls]
    return tuple(
        msgspec.structs.replace(o, tool_call_id=ids[i]) if o.tool_call_id not in ids and i < len(ids) else o
        for i, o in enumerate(observations)
    )
