"""Dataset preparation: prompts/messages and labels as the JSONL OpenRLHF's prompt dataset reads.

Every output line is ``{"agent_task": "<AgentTask JSON>", "label": "<answer as text>"}``; the launcher passes
``--data.input_key agent_task --data.label_key label`` and leaves ``--data.apply_chat_template`` off, because the
executor renders prompts with the recipe's protocol (see `task.py`). Input rows are JSON objects with a "prompt"
(a non-empty string, or a list of OpenAI-style messages) and optionally "answer"/"label"/"references" and any
metadata the rewards read; other key names are mapped with `prompt_key` / `label_key`. A row for a vision-language
recipe carries its images as `image_url` parts of its messages or in an "images" list (see `task.py` for where
they go); preparing a text-only recipe's dataset refuses a row with images, naming the field.

A bad row stops the preparation with a `DatasetError` that names the file, the line and the field
(``train.jsonl:7: field 'prompt[1].role': ...``); nothing is written then. Output is written atomically.
This module knows rows, files and `AgentTask`; it knows nothing about OpenRLHF beyond the two column names.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog

from agent_protocol import MessageError, coerce_messages
from agent_runtime import Recipe, iter_jsonl
from agent_train.errors import DatasetError
from agent_train.task import encode_task, label_of

__all__ = [
    "INPUT_KEY",
    "LABEL_KEY",
    "openrlhf_record",
    "prepare_jsonl_dataset",
    "prepare_recipe_dataset",
    "read_rows",
    "recipe_rows",
    "write_dataset",
]

logger = structlog.get_logger(__name__)

INPUT_KEY: Final = "agent_task"
"""The prepared dataset's input column (`--data.input_key`)."""
LABEL_KEY: Final = "label"
"""The prepared dataset's label column (`--data.label_key`)."""

LocatedRow = tuple[str, Mapping[str, Any]]


def openrlhf_record(row: Mapping[str, Any], where: str, *, images: bool = True) -> dict[str, str]:
    """The output line for `row`; `where` ("file:line") prefixes every error. `images=False` refuses a row with
    images (a text-only recipe's dataset)."""
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if "prompt" not in row:
        raise DatasetError(f"{where}: field 'prompt' is missing (a string or a list of messages)")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DatasetError(f"{where}: field 'prompt' is an empty string")
    elif isinstance(prompt, list):
        if not prompt:
            raise DatasetError(f"{where}: field 'prompt' is an empty list of messages")
        try:
            coerce_messages(prompt, images=images)
        except MessageError as e:
            field = "prompt" + e.location.removeprefix("messages")
            raise DatasetError(f"{where}: field '{field}': {e.problem}") from e
    else:
        raise DatasetError(
            f"{where}: field 'prompt' must be a string or a list of messages, got {type(prompt).__name__}"
        )
    if not images and row.get("images"):
        raise DatasetError(f"{where}: field 'images': the recipe's chat protocol is text-only; this row has images")
    try:
        return {INPUT_KEY: encode_task(row), LABEL_KEY: label_of(row)}
    except (msgspec.EncodeError, TypeError, ValueError) as e:  # a value JSON cannot hold
        raise DatasetError(f"{where}: the row cannot be written as JSON ({e})") from e


def read_rows(path: str | Path, *, prompt_key: str = "prompt", label_key: str | None = None) -> Iterator[LocatedRow]:
    """The rows of a JSONL file with their "file:line", `prompt_key` renamed to "prompt" and `label_key` to
    "answer". Blank lines are skipped; a line that is not a JSON object, or lacks a named key, raises."""
    for where, row in iter_jsonl(path, DatasetError):
        yield where, _renamed(row, where, prompt_key=prompt_key, label_key=label_key)


def _renamed(row: dict[str, Any], where: str, *, prompt_key: str, label_key: str | None) -> dict[str, Any]:
    if prompt_key != "prompt":
        if prompt_key not in row:
            raise DatasetError(f"{where}: field '{prompt_key}' (the prompt) is missing")
        row = {**{k: v for k, v in row.items() if k != prompt_key}, "prompt": row[prompt_key]}
    if label_key is not None and label_key != "answer":
        if label_key not in row:
            raise DatasetError(f"{where}: field '{label_key}' (the label) is missing")
        row = {**{k: v for k, v in row.items() if k != label_key}, "answer": row[label_key]}
    return row


def write_dataset(rows: Iterable[LocatedRow], output: str | Path, *, images: bool = True) -> int:
    """Write the prepared lines of `rows` to `output` atomically; returns how many. Nothing is written when a
    row is bad, or when there are no rows. `images=False`: a row with images is bad (a text-only recipe)."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            for where, row in rows:
                file.write(json.dumps(openrlhf_record(row, where, images=images), ensure_ascii=False) + "\n")
                count += 1
        if count == 0:
            raise DatasetError(f"no rows to write to {output}: the dataset is empty")
        os.chmod(scratch, 0o644)  # mkstemp creates 0600; the file is read by Ray workers, maybe as another user
        os.replace(scratch, output)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
    logger.info("dataset_written", path=str(output), rows=count)
    return count


def prepare_jsonl_dataset(
    source: str | Path, output: str | Path, *, prompt_key: str = "prompt", label_key: str | None = None
) -> int:
    """Prepare a JSONL file of prompts and labels for OpenRLHF; returns the number of rows."""
    return write_dataset(read_rows(source, prompt_key=prompt_key, label_key=label_key), output)


def recipe_rows(recipe: Recipe, split: str) -> Iterator[LocatedRow]:
    """The rows of a recipe's `split`: a JSONL file (or `<dir>/<split>.jsonl`) with line numbers, or the rows a
    callable dataset gives, named by index."""
    source = recipe.dataset
    if source is None:
        raise DatasetError(f"recipe {recipe.name!r} defines no dataset; pass a JSONL file of prompts instead")
    if callable(source):
        for index, row in enumerate(source(split)):
            yield f"{recipe.name}:{split}[{index}]", row
        return
    path = Path(source)
    yield from read_rows(path / f"{split}.jsonl" if path.is_dir() else path)


def prepare_recipe_dataset(recipe: Recipe, output: str | Path, *, split: str = "train") -> int:
    """Prepare a recipe's dataset split for OpenRLHF; returns the number of rows. A text-only recipe's rows may
    not carry images."""
    return write_dataset(recipe_rows(recipe, split), output, images=recipe.chat_protocol().accepts_images)
