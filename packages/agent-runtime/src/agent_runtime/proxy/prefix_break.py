"""History edits: what each request of an agent program did to the conversations the proxy already holds, and
the fixed training rule each kind gets (`EDIT_RULES`).

Every request after an episode's first is one of nine kinds (`EDIT_KINDS`), and each kind has one rule:

- ``append`` -> ``continue``: the messages extend a stored conversation, whose ids are what the model saw.
- ``reasoning_stripped`` -> ``continue``: the same, but the client sent a turn back without its reasoning (or with
  other reasoning); the store's key leaves reasoning out and the sampled ids keep it as it was sampled.
- ``last_turn_rewritten`` -> ``rollback``: only the last assistant turn of a stored conversation changed (a harness
  cleans the final answer, fixes a call's arguments, mints its own call ids). The stored ids are kept up to that
  turn's start, the rewritten turn is rendered as the template renders it, tokenized alone and not trained (the
  model did not sample it), and the conversation goes on in the same segment. The sampled turn it replaced is
  kept as a segment of its own (its context, only that turn trained): it was sampled, with its logprobs.
- ``new_conversation``, ``branched``, ``history_truncated``, ``messages_dropped``, ``tool_ids_rewritten``,
  ``message_edited`` -> ``new_segment``: the prefix breaks below. The context the model sees is another one
  (rendered from scratch), so its ids open a new segment.

The peers: uni-agent's gateway rolls a rewritten last assistant turn back to the turn's start and continues (the
issue's reference; its gateway source is not in the code index searched here, so its keep-or-drop choice for the
replaced turn could not be read). miles (a fork of slime; its ``SeqTrajectory.calc_prompt_tokens_info`` with
``inherit_last_assistant=False``) does the same: the ids up to the last turn are kept, the rest re-tokenized with
mask 0, and each turn's sampled response stays in its own turn record, which is the choice made here. AReaL's
proxy and slime proper were not checked (not searched for).

The sections below are about the six kinds that are prefix breaks (``new_segment``).

A tools-mode follow-up continues the stored token ids only when the messages it sends up to its last assistant
turn are exactly a conversation the server produced (`TranscriptStore`: roles, contents, tool calls with their
ids and arguments, tool-call ids; `reasoning_content` left out, so a client that drops the reasoning it was sent
still continues the sampled ids), or those messages but a rewritten last assistant turn (rolled back, above).
Anything else is rendered from scratch, and its ids are a new segment of the episode. `diagnose` compares such a
request's messages with every conversation the episode saw before and names the first difference:

- ``new_conversation``: the request holds no assistant turn (a second conversation: a sub-agent, a restart);
- ``branched``: it extends a whole earlier conversation, whose last turn was already continued once (a retry
  from an earlier point, a fork);
- ``history_truncated``: it is an earlier point of a conversation, its tail dropped;
- ``messages_dropped``: messages were removed from inside the history (a sliding window, summarised turns);
- ``tool_ids_rewritten``: only tool-call ids changed (frameworks that mint their own ids);
- ``message_edited``: a message's content, tool calls or role changed (or messages were inserted).

This module knows messages only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from agent_protocol import Message

__all__ = [
    "BREAK_REASONS",
    "EDIT_KINDS",
    "EDIT_RULES",
    "BreakReason",
    "EditKind",
    "EditRule",
    "PrefixBreak",
    "diagnose",
    "same_message",
]

BreakReason = Literal[
    "new_conversation", "branched", "history_truncated", "messages_dropped", "tool_ids_rewritten", "message_edited"
]
BREAK_REASONS: Final[tuple[BreakReason, ...]] = (
    "new_conversation",
    "branched",
    "history_truncated",
    "messages_dropped",
    "tool_ids_rewritten",
    "message_edited",
)

EditKind = Literal[
    "append",
    "reasoning_stripped",
    "last_turn_rewritten",
    "new_conversation",
    "branched",
    "history_truncated",
    "messages_dropped",
    "tool_ids_rewritten",
    "message_edited",
]
EDIT_KINDS: Final[tuple[EditKind, ...]] = ("append", "reasoning_stripped", "last_turn_rewritten", *BREAK_REASONS)
EditRule = Literal["continue", "rollback", "new_segment"]
#: each kind's training rule (see the module docstring for why)
EDIT_RULES: Final[dict[EditKind, EditRule]] = {
    "append": "continue",
    "reasoning_stripped": "continue",
    "last_turn_rewritten": "rollback",
    **dict.fromkeys(BREAK_REASONS, "new_segment"),
}


class PrefixBreak(msgspec.Struct, frozen=True, kw_only=True):
    """One break: the `request` (0-based, in the order the episode's requests finished) that opened `segment`
    (0-based), why, and the index of the first message that differs from the closest earlier conversation."""

    reason: BreakReason
    request: int
    segment: int
    at_message: int = 0


def _form(message: Message, *, ids: bool = True) -> tuple[object, ...]:
    """What the store's key sees of a message (reasoning left out), with or without tool-call ids."""
    calls = tuple((c.id if ids else None, c.name, repr(c.arguments)) for c in message.tool_calls)
    call_id = message.tool_call_id if ids else None
    return (message.role, message.content or "", calls, call_id, message.name)


def same_message(a: Message, b: Message) -> bool:
    """Whether two messages are the same to the store's key (reasoning left out)."""
    return _form(a) == _form(b)


def _common(a: Sequence[Message], b: Sequence[Message]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if _form(x) != _form(y):
            break
        n += 1
    return n


def _dropped(prompt: Sequence[Message], seen: Sequence[Message], at: int) -> bool:
    """Whether the message at `at` of `prompt` comes later in `seen`: the ones between were left out."""
    form = _form(prompt[at])
    return any(_form(m) == form for m in seen[at + 1 :])


def diagnose(prompt: Sequence[Message], seen: Sequence[Sequence[Message]]) -> tuple[BreakReason, int]:
    """Why `prompt` (a request's messages) broke the prefix of every conversation in `seen` (each the whole
    conversation after an earlier request, its generated turn included), and where: the reason and the index of
    the first message that differs from the closest of them."""
    if not any(m.role == "assistant" for m in prompt) or not seen:
        return "new_conversation", 0
    extended = [len(c) for c in seen if len(c) <= len(prompt) and _common(prompt, c) == len(c)]
    if extended:
        return "branched", max(extended)
    closest = max(seen, key=lambda conversation: _common(prompt, conversation))
    at = _common(prompt, closest)
    if at == len(prompt):
        return "history_truncated", at
    ours, theirs = prompt[at], closest[at]
    if _form(ours, ids=False) == _form(theirs, ids=False):
        return "tool_ids_rewritten", at
    if _dropped(prompt, closest, at):
        return "messages_dropped", at
    return "message_edited", at
