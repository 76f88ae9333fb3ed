"""The closed sets of how an episode or a turn ends and of what it records as an error, shared by every layer.

An episode's `stop_reason` is one of `StopReason`: how the environment ended it (`final_answer`, `max_steps`,
`environment_error`), ``done`` for an environment that gave no reason, or the code of the error that ended it.
A tools-mode request, which is one turn of a conversation the client drives, ends with a `TurnFinish` (the
OpenAI ``finish_reason``) or the code of the error that failed it. Every recorded error (`EpisodeError.code`) is
an `ErrorCode`: a parse issue of the model's output, a tool observation's code, an engine failure, the stage
of the episode that raised, or a budget that ran out. Training counts each code on its own
(`agent_error_<code>`); `ERROR_CODES` lists them.

This module holds types only.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from agent_env import ObservationCode
from agent_env import StopReason as EnvironmentStopReason
from agent_protocol import IssueCode
from agent_runtime.errors import EngineErrorCode

__all__ = [
    "ERROR_CODES",
    "STOP_REASONS",
    "EndCode",
    "EndingCode",
    "ErrorCode",
    "StageCode",
    "StopReason",
    "TurnFinish",
    "literal_values",
]

StageCode = Literal[
    "decode_error", "parse_error", "environment_error", "reward_error", "render_error", "internal_error"
]
"""An exception from foreign code in a stage of a turn: the tokenizer's decode, the protocol's parser, the
environment, a reward, the protocol's renderer or the tokenizer's encode; `internal_error` anywhere else."""

EndCode = Literal["context_exhausted", "compaction_failed", "invalid_prompt", "client_disconnected"]
"""A budget or a precondition that ended the episode: no room for another turn or for the feedback, an empty
summary, a prompt that could not be rendered at all, a streaming client that went away mid-episode."""

EndingCode = EngineErrorCode | StageCode | EndCode
"""The error codes that end an episode (or fail a tools-mode request) and so are its stop reason too."""

ErrorCode = IssueCode | ObservationCode | EndingCode
StopReason = EnvironmentStopReason | Literal["done"] | EndingCode
TurnFinish = Literal["stop", "tool_calls", "length"]


def literal_values(annotation: object) -> tuple[str, ...]:
    """Every string of a Literal or a union of Literals, in order, once each."""
    values: dict[str, None] = {}
    for arg in get_args(annotation):
        if isinstance(arg, str):
            values[arg] = None
        else:
            values.update(dict.fromkeys(literal_values(arg)))
    return tuple(values)


ERROR_CODES: Final[tuple[str, ...]] = literal_values(ErrorCode)
STOP_REASONS: Final[tuple[str, ...]] = literal_values(StopReason)
