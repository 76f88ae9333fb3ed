"""A tool call's arguments read as one bounded JSON object, with the problem worded for the model.

Families whose calls carry JSON (Hermes / Qwen, Mistral, DeepSeek) all take the arguments the same way: a JSON
object as it is, and a string that holds one (a common model habit) decoded once within `json_limits`' limits;
anything else is a problem the parser turns into an ``invalid_arguments`` issue on the call. This module knows
JSON values; where the arguments sit in a turn, and the issue codes, are each parser's.
"""

from __future__ import annotations

import json
from typing import Any

from agent_protocol.errors import JsonLimitError
from agent_protocol.json_limits import loads_bounded

__all__ = ["arguments_object", "json_kind"]


def arguments_object(value: Any, *, subject: str = '"arguments"') -> tuple[dict[str, Any], str | None]:
    """(the arguments, None), or ({}, what is wrong with them). `subject` names them in the message that says
    they are not an object, as the family's format hint does."""
    if isinstance(value, dict):
        return value, None
    if isinstance(value, str):
        try:
            decoded = loads_bounded(value) if value.strip() else {}
        except JsonLimitError as e:
            return {}, f'"arguments" is a string that holds JSON that cannot be read: {e}.'
        except json.JSONDecodeError:
            decoded = value
        if isinstance(decoded, dict):
            return decoded, None
    return {}, f"{subject} must be a JSON object, not {json_kind(value)}."


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in the words of a message to the model ("an array", "null")."""
    match value:
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case None:
            return "null"
        case _:
            return type(value).__name__
