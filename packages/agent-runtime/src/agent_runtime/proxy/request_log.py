"""`RequestLog`: every tools-mode request of one agent-program episode, and the episode's segments built from them.

The endpoint of an episode is the tools-mode server (`agent_runtime.serving`); each request it answers writes one
`Trajectory` record (the serving trajectory log), holding the whole conversation's token transcript so far, the
conversation's id (kept across the follow-ups that continued its ids) and how its prompt was prepared
(``prefix_hit``, ``rerender``, ``new``). `RequestLog` is that log, kept in memory. `segments()` reads it:

- a ``prefix_hit`` continues its conversation: its record replaces the conversation's earlier one, whose ids it
  extends (sampled ids kept as sampled, the feedback tokenized alone, loss mask on generated tokens only);
- a ``rollback`` (the client rewrote the conversation's last assistant turn) continues it too, from that turn's
  start; the earlier record, which ends with the sampled turn, stays as a segment of its own in which only that
  turn is trained (the turns before it are trained in the continuing segment), placed before it;
- anything else opens a new segment, and when the episode already has one that is a prefix break, diagnosed
  (`prefix_break.diagnose`) against every conversation seen before.

Each request after the first is counted as one of the edit kinds of `prefix_break.EDIT_KINDS` (`edits()`): a
prefix hit as ``append`` or ``reasoning_stripped`` (its record says so), a rollback as ``last_turn_rewritten``, a
break as its reason.

A cap on conversations (`max_conversations`, from `AgentProgram`): a record that would open one more conversation
than that (a request that is not a ``prefix_hit`` or ``rollback`` of a conversation kept here) is not kept, and
`on_refused` is called with the cap, once per refused record; the conversations already opened go on being
recorded.

`on_record`, when given, is called with each record kept, as it is written (on the loop of the server that writes
it): a served program's turns are streamed to its client from there (`served_program.py`).

`steps()` gives the model's turns as reward steps: each generated assistant message, with the tool messages the
program sent back after it as its observations. This module knows trajectories and messages; it runs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import msgspec

from agent_env import Observation, StepRecord
from agent_protocol import Action, Message, TranscriptRecord
from agent_runtime.proxy.prefix_break import EDIT_KINDS, BreakReason, EditKind, PrefixBreak, diagnose, same_message
from agent_runtime.trajectory import Trajectory, TrajectoryWriter

__all__ = ["RequestLog", "Segment"]

_GENERATED: Final = frozenset({"stop", "tool_calls", "length"})  # a request whose turn was generated ends so
_CONTINUED: Final = frozenset({"prefix_hit", "rollback"})  # how a request that went on with stored ids was prepared


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
    #: a sampled turn that the client rewrote (only that turn trained; the conversation goes on in another)
    rolled_back: bool = False
    #: the token of its last transcript where its training starts: the actions before it are trained in another
    #: segment (a rolled-back turn's context; a branch's stored prefix)
    trained_from: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.record.segments)


class RequestLog(TrajectoryWriter):
    """The serving trajectory log of one episode, in memory (`write` is what the server calls per request)."""

    def __init__(
        self,
        *,
        max_conversations: int | None = None,
        on_refused: Callable[[int], None] | None = None,
        on_record: Callable[[Trajectory], None] | None = None,
    ) -> None:  # no file: the records stay here
        self.records: list[Trajectory] = []
        self.max_conversations = max_conversations
        self.on_refused = on_refused
        self.on_record = on_record
        self.refused = 0
        self._opened: set[str] = set()

    def write(self, trajectory: Trajectory) -> None:
        continued = trajectory.task.get("prepared") in _CONTINUED and trajectory.episode_id in self._opened
        if not continued:
            cap = self.max_conversations
            if cap is not None and len(self._opened) >= cap:
                self.refused += 1
                if self.on_refused is not None:
                    self.on_refused(cap)
                return
            self._opened.add(trajectory.episode_id)
        self.records.append(trajectory)
        if self.on_record is not None:
            self.on_record(trajectory)

    def close(self) -> None:
        return None  # no file to close: the records stay in memory

    def segments(self) -> tuple[list[Segment], list[PrefixBreak]]:
        """The episode's segments in the order they were opened (a rolled-back turn's before the segment that
        goes on without it), and the prefix breaks that opened them."""
        segments, breaks, _ = self._read()
        return segments, breaks

    def edits(self) -> dict[EditKind, int]:
        """How many requests of each edit kind the episode made (every kind present, in `EDIT_KINDS` order)."""
        return self._read()[2]

    def _read(self) -> tuple[list[Segment], list[PrefixBreak], dict[EditKind, int]]:
        order: list[Segment] = []
        by_conversation: dict[str, list[Segment]] = {}
        opened: list[tuple[Segment, _BreakAt]] = []
        counts: dict[EditKind, int] = dict.fromkeys(EDIT_KINDS, 0)
        seen: list[list[Message]] = []
        for index, record in enumerate(self.records):
            prepared = record.task.get("prepared")
            prompt = record.messages[:-1] if generated(record) else record.messages
            current = None
            if prepared in _CONTINUED:
                current = _continued(by_conversation.get(record.episode_id, []), prompt, prepared == "rollback")
            if current is not None:
                if prepared == "rollback":
                    rolled = Segment(current.conversation_id, current.record, current.prompt_messages,
                                     list(current.requests), rolled_back=True,
                                     trained_from=_last_turn(current.record))  # fmt: skip
                    order.insert(order.index(current), rolled)
                    counts["last_turn_rewritten"] += 1
                else:
                    counts["reasoning_stripped" if record.task.get("reasoning_stripped") else "append"] += 1
                current.record = record
                current.requests.append(index)
            else:
                segment = Segment(record.episode_id, record, len(prompt), [index])
                if prepared in _CONTINUED:  # a branch of a stored conversation: its stored turns are trained already
                    segment.trained_from = _last_turn(record) if generated(record) else _tokens(record)
                if order:
                    reason, at = diagnose(prompt, seen)
                    opened.append((segment, _BreakAt(reason, index, at)))
                    counts[reason] += 1
                order.append(segment)
                by_conversation.setdefault(record.episode_id, []).append(segment)
            seen.append(list(record.messages))
        kept = [s for s in order if s.record.segments]
        for segment in kept:
            if segment.trained_from:
                segment.record = _trained_from(segment.record, segment.trained_from)
        breaks = [
            PrefixBreak(reason=found.reason, request=found.request, at_message=found.at,
                        segment=kept.index(segment) if segment in kept else len(kept))
            for segment, found in opened
        ]  # fmt: skip
        return kept, breaks, counts

    def steps(self, segments: list[Segment]) -> list[StepRecord]:
        """The model's turns over `segments`, in order, each with the tool results that answered it. The last
        turn of a segment that a prefix break ended is answered by the tool messages the breaking request sent
        after its last assistant message; results whose ids the program rewrote answer the calls by position."""
        steps: list[StepRecord] = []
        segments = [s for s in segments if not s.rolled_back]  # its turn was rewritten: the rewrite is the step
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


@dataclass(frozen=True)
class _BreakAt:
    reason: BreakReason
    request: int
    at: int


def _continued(candidates: list[Segment], prompt: list[Message], rollback: bool) -> Segment | None:
    """The segment of a conversation (its branches: `candidates`) whose latest record `prompt` goes on from: its
    messages are a prefix of `prompt` (the last one rewritten, for a rollback). Judged by the last message only:
    the server matched the rest by its key."""
    for segment in reversed(candidates):
        messages = segment.record.messages
        n = len(messages)
        if not messages or n > len(prompt):
            continue
        if rollback:
            if messages[-1].role == "assistant" and prompt[n - 1].role == "assistant":
                return segment
        elif same_message(messages[-1], prompt[n - 1]):
            return segment
    return None


def _tokens(record: Trajectory) -> int:
    return len(record.segments[-1].ids) if record.segments else 0


def _last_turn(record: Trajectory) -> int:
    """Where the last generated turn of `record`'s last transcript starts (its length when it has none)."""
    if not record.segments or not record.segments[-1].action_ranges:
        return _tokens(record)
    return record.segments[-1].action_ranges[-1][0]


def _trained_from(record: Trajectory, cut: int) -> Trajectory:
    """`record` with its last transcript only, trained from token `cut` on: the actions before it become context
    (mask 0, no logprobs), as another segment trains them."""
    last = record.segments[-1]
    spans = [s if s.kind != "action" or s.start >= cut else msgspec.structs.replace(s, kind="observation",
             version=None) for s in last.spans]  # fmt: skip
    mask = [0] * cut + last.loss_mask[cut:]
    logprobs = [None] * cut + last.logprobs[cut:]
    masked = TranscriptRecord(ids=last.ids, loss_mask=mask, logprobs=logprobs, spans=spans, images=last.images)
    return msgspec.structs.replace(record, segments=[masked])


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
