"""`AgentTask`: one dataset row as it travels through OpenRLHF to the executor, and back.

OpenRLHF hands the executor two things per prompt: the dataset's input column (`prompt`) and its label column
(`label`). A recipe's row holds more than that (a prompt that may be a whole conversation, references for the
rewards, metadata), so the prepared dataset stores the row as one JSON string in the input column::

    {"kind": "agent_task", "prompt": "What is 17 * 23?", "row": {"answer": "391", "difficulty": 2}}

A string keeps the row intact: Hugging Face `datasets` would otherwise infer one Arrow schema for every row's
nested dicts. The executor also accepts what a plain OpenRLHF dataset gives it: a prompt string (a user message)
or a list of chat messages, with the label as the reference answer.

No chat template is applied here or by OpenRLHF (`--data.apply_chat_template` stays off): the executor renders
the prompt with the recipe's protocol, exactly as serving does. This module knows rows and JSON, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from agent_protocol import coerce_messages

__all__ = ["AgentTask", "decode_task", "encode_task", "label_of"]


class AgentTask(msgspec.Struct, frozen=True, kw_only=True, tag="agent_task", tag_field="kind"):
    """A dataset row for one episode: `prompt` (a user message or OpenAI-style messages) and the rest of the
    `row`, which the session gets as its task (references for the rewards, metadata)."""

    prompt: str | list[dict[str, Any]]
    row: dict[str, Any] = msgspec.field(default_factory=dict)


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(AgentTask)
_LABEL_KEYS: Final = ("answer", "label", "references")


def encode_task(row: Mapping[str, Any]) -> str:
    """The input-column string for `row`, which must hold a "prompt" (checked by the dataset preparation)."""
    rest = {key: value for key, value in row.items() if key != "prompt"}
    return _encoder.encode(AgentTask(prompt=row["prompt"], row=rest)).decode()


def label_of(row: Mapping[str, Any]) -> str:
    """The label-column string: the row's answer/label/references as text ("" when it has none). OpenRLHF only
    logs it; rewards read the references from the task row itself."""
    for key in _LABEL_KEYS:
        value = row.get(key)
        if value is None:
            continue
        return value if isinstance(value, str) else _encoder.encode(value).decode()
    return ""


def decode_task(prompt: Any, label: Any = None) -> AgentTask:
    """The task OpenRLHF's `(prompt, label)` pair stands for.

    An `AgentTask` string is decoded as is. Any other string is a user message, and a list is a conversation;
    for both, a non-empty `label` becomes the row's "answer". Raises `ValueError` for anything else."""
    if isinstance(prompt, str):
        if prompt.startswith('{"kind":"agent_task"'):
            try:
                return _decoder.decode(prompt)
            except msgspec.ValidationError as e:
                raise ValueError(f"malformed agent task in the prompt column: {e}") from e
        if not prompt:
            raise ValueError("the prompt is empty")
        return AgentTask(prompt=prompt, row=_row(label))
    if isinstance(prompt, list):
        coerce_messages(prompt)  # raises MessageError (a ValueError) naming the bad message
        return AgentTask(prompt=[dict(m) for m in prompt], row=_row(label))
    raise ValueError(f"the prompt must be a string or a list of messages, got {type(prompt).__name__}")


def _row(label: Any) -> dict[str, Any]:
    return {} if label is None or label == "" else {"answer": label}
