"""Observations: the wire shape of a failure, tool messages, parse-code passthrough."""

from __future__ import annotations

import json
from typing import get_args

import msgspec

from agent_env.observation import (
    FAILURE_CODES,
    PARSE_CODES,
    REFUSAL_CODES,
    Observation,
    ObservationCode,
    error_content,
)
from agent_protocol.types import IssueCode, ParseIssue


def test_error_content_has_the_documented_shape() -> None:
    body = json.loads(error_content("unknown_tool", "there is no tool named 'x'", "Call one of: a."))
    assert body == {
        "ok": False,
        "error": {"code": "unknown_tool", "message": "there is no tool named 'x'"},
        "hint": "Call one of: a.",
    }
    assert list(body) == ["ok", "error", "hint"]


def test_every_code_has_a_default_hint() -> None:
    for code in get_args(ObservationCode):
        if code == "output_truncated":
            continue
        assert json.loads(error_content(code, "m"))["hint"], code


def test_failure_is_a_tool_message_with_the_call_id() -> None:
    observation = Observation.failure(tool_call_id="call_1", name="calc", code="timeout", message="slow")
    assert not observation.ok and observation.code == "timeout"
    message = observation.to_message()
    assert message.role == "tool"
    assert message.tool_call_id == "call_1"
    assert message.name == "calc"
    assert json.loads(message.content or "")["error"]["code"] == "timeout"


def test_turn_notice_has_no_call_id_or_name() -> None:
    issue = ParseIssue(code="missing_think_end", message="reasoning never closed")
    message = Observation.from_parse_issue(issue, tool_call_id=None, name="").to_message()
    assert message.tool_call_id is None and message.name is None


def test_every_protocol_issue_code_passes_through_unchanged() -> None:
    for code in get_args(IssueCode):
        observation = Observation.from_parse_issue(ParseIssue(code=code, message="m"), tool_call_id="c", name="t")
        assert observation.code == code
        assert json.loads(observation.content)["error"] == {"code": code, "message": "m"}


def test_code_families_are_disjoint_and_known() -> None:
    known = set(get_args(ObservationCode))
    assert known >= PARSE_CODES and known >= REFUSAL_CODES and known >= FAILURE_CODES
    assert not (PARSE_CODES & REFUSAL_CODES) and not (REFUSAL_CODES & FAILURE_CODES)


def test_observation_round_trips_as_json() -> None:
    observation = Observation(tool_call_id="c", name="t", content="5", code="output_truncated")
    decoded = msgspec.json.decode(msgspec.json.encode(observation), type=Observation)
    assert decoded == observation
