"""`AgentTask`: one dataset row as it travels through OpenRLHF to the executor, and back.

OpenRLHF hands the executor two things per prompt: the dataset's input column (`prompt`) and its label column
(`label`). A recipe's row holds more than that (a prompt that may be a whole conversation, references for the
rewards, metadata), so the prepared dataset stores the row as one JSON string in the input column::

    {"kind": "agent_task", "prompt": "What is 17 * 23?", "row": {"answer": "391", "difficulty": 2}}

A string keeps the row intact: Hugging Face `datasets` would otherwise infer one Arrow schema for every row's
nested dicts. The executor also accepts what a plain OpenRLHF dataset gives it: a prompt string (a user message)
or a list of chat messages, with the label as the reference answer.

No chat template is applied here or by OpenRLHF (`--data.apply_chat_template` stays off): the executor renders
the prompt with the recipe's protocol, exactly as serving does.

Images: OpenRLHF hands the executor the row's image column (``--data.image_key``) as `images`, apart from the prompt;
a prepared row keeps its images in the task row instead (under `IMAGE_KEY`, where the environment's tools see them
too), read when OpenRLHF passed none. `dataset_images` reads either (one reference or a list; None entries are a
text-only row's, as in OpenRLHF's mixed datasets) and `place_images` puts the images into the prompt where OpenRLHF's
prompt dataset would render them (`openrlhf.datasets.prompts_dataset.preprocess_data` with its chat template): each
``<image>`` tag in a message's text becomes an image part at that place, the text around it stripped and dropped when
empty, exactly as its `_str_to_content_list` does, and a ``{"type": "image"}`` part in a list content is filled in
order. A prompt without any placeholder shows its images first in its first user message (image before text, as the
Qwen-VL chat examples do; OpenRLHF itself needs the tags there).
This module knows rows and JSON, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from agent_protocol import check_image_url, coerce_messages

__all__ = [
    "IMAGE_KEY",
    "IMAGE_TAG",
    "AgentTask",
    "dataset_images",
    "decode_task",
    "encode_task",
    "label_of",
    "place_images",
]

IMAGE_KEY: Final = "images"
"""The row's image column: OpenRLHF's default ``--data.image_key``, and the task row's key for its images."""
IMAGE_TAG: Final = "<image>"
"""Where an image sits in a prompt's text, as OpenRLHF's prompt dataset reads it."""


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


def decode_task(prompt: Any, label: Any = None, *, images: Sequence[str] = (), vision: bool = False) -> AgentTask:
    """The task OpenRLHF's `(prompt, label)` pair stands for, with the row's images placed in its prompt
    (`place_images`): `images` (OpenRLHF's image column, see `dataset_images`), else the task row's `IMAGE_KEY`.
    A prompt that already holds ``image_url`` parts is kept as it is (the row's images are then its tools' to read).
    `vision`: the recipe's protocol shows images (a message list may then hold image parts of its own).

    An `AgentTask` string is decoded as is. Any other string is a user message, and a list is a conversation;
    for both, a non-empty `label` becomes the row's "answer". Raises `ValueError` for anything else, and for
    images given to a text-only recipe."""
    task = _decode(prompt, label, vision=vision)
    refs = tuple(images) or dataset_images(task.row.get(IMAGE_KEY))
    if not refs:
        return task
    if not vision:
        raise ValueError(
            f"the row carries {len(refs)} image(s), and the recipe's protocol is text-only: use a vision-language "
            "protocol such as qwen3-vl"
        )
    if _shows_images(task.prompt):  # the prompt shows its images itself; the row's list is the tools' to read
        return task
    placed = place_images(task.prompt, refs)
    coerce_messages(placed, images=True)  # raises MessageError naming the bad message and part
    return AgentTask(prompt=placed, row=task.row)


def _decode(prompt: Any, label: Any, *, vision: bool) -> AgentTask:
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
        coerce_messages(prompt, images=vision)  # raises MessageError (a ValueError) naming the bad message
        return AgentTask(prompt=[dict(m) for m in prompt], row=_row(label))
    raise ValueError(f"the prompt must be a string or a list of messages, got {type(prompt).__name__}")


def dataset_images(value: Any) -> tuple[str, ...]:
    """The image references of a row's image column as OpenRLHF passes them (`execute(..., images=)`): None, one
    reference or a list of them, None entries left out (a text-only row of a mixed dataset). A reference is a
    ``data:image/...;base64,`` URL, a ``file://`` URL or a local path (`agent_protocol.images.check_image_url`);
    ValueError names the entry otherwise."""
    if value is None:
        return ()
    entries = list(value) if isinstance(value, (list, tuple)) else [value]
    out: list[str] = []
    for k, entry in enumerate(entries):
        if entry is None:
            continue
        try:
            out.append(check_image_url(entry))
        except ValueError as e:
            raise ValueError(f"images[{k}]: {e}") from e
    return tuple(out)


def place_images(prompt: str | list[dict[str, Any]], images: Sequence[str]) -> list[dict[str, Any]]:
    """`prompt` as OpenAI messages with `images` as ``image_url`` parts where OpenRLHF's prompt dataset would
    render them (see the module docstring). ValueError when the prompt's placeholders are not one per image, or
    when a prompt without placeholders has no user message."""
    messages: list[dict[str, Any]] = (
        [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    )
    slots = sum(_slots(m.get("content")) for m in messages)
    if slots == 0:
        first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
        if first is None:
            raise ValueError("the row has images, and its prompt has no user message to show them in")
        content = messages[first].get("content")
        rest = [{"type": "text", "text": content}] if isinstance(content, str) and content else list(content or [])
        messages[first]["content"] = [*(_image_part(url) for url in images), *rest]
        return messages
    if slots != len(images):
        raise ValueError(
            f"the prompt has {slots} image placeholders ({IMAGE_TAG!r}) for the row's {len(images)} images"
        )
    queue = iter(images)
    for message in messages:
        if _slots(message.get("content")):
            message["content"] = _filled(message["content"], queue)
    return messages


def _shows_images(prompt: str | list[dict[str, Any]]) -> bool:
    """Whether a message-list prompt already holds ``image_url`` parts."""
    return isinstance(prompt, list) and any(
        isinstance(part, Mapping) and part.get("type") == "image_url"
        for message in prompt
        if isinstance(content := message.get("content"), list)
        for part in content
    )


def _slots(content: Any) -> int:
    if isinstance(content, str):
        return content.count(IMAGE_TAG)
    if isinstance(content, list):
        return sum(1 for part in content if isinstance(part, Mapping) and part.get("type") == "image")
    return 0


def _filled(content: str | list[Any], queue: Iterator[str]) -> list[Any]:
    """`content` with each placeholder replaced by the next image: a string split at its tags, each piece
    stripped and kept when not empty (OpenRLHF's `_str_to_content_list`), a list's ``image`` parts filled."""
    if isinstance(content, list):
        return [
            _image_part(next(queue)) if isinstance(part, Mapping) and part.get("type") == "image" else part
            for part in content
        ]
    parts: list[Any] = []
    for k, piece in enumerate(content.split(IMAGE_TAG)):
        if k:
            parts.append(_image_part(next(queue)))
        if piece.strip():
            parts.append({"type": "text", "text": piece.strip()})
    return parts


def _image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _row(label: Any) -> dict[str, Any]:
    return {} if label is None or label == "" else {"answer": label}
