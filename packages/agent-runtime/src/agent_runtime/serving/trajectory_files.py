"""`TrajectoryFiles`: the trajectory JSONL files under one path, indexed lazily by byte offset, read a page at a time.

A path is one JSONL file (a server's ``--trajectory-log``) or a directory, whose ``*.jsonl`` files (at any depth,
sorted by their path; hidden folders and symlinks leading out of it left out; listed again for new files at most
every 2 s) are read one after the other. A file whose first line is a JSON object of another kind (a run's
``metrics.jsonl``, a data set) is no trajectory file: listed as `foreign`, not read on, no line of it counted.
Records are numbered in that order; a page (`TrajectoryFiles.page`) starts at a record number and scans on until
it holds `limit` records that pass the filters, or until it has scanned `max_scan` records, whichever comes first,
and says where to go on. Only the lines a page scans are read, each decoded into a small summary
(`TrajectorySummary`); what stays in memory is a line's byte offset and its summary, never a file. A file that
grows (a server still logging) is read on from where its index stopped; a last line without its newline is left
for later unless it is a whole record already. In a directory, a file's records are numbered before the next
file's, so once a later file has been read, what is appended to an earlier one is not read (restart the viewer to
see it); the last file, a live log, is always read on. A line that is not a trajectory record is skipped and
counted (`malformed`, with the first line numbers), never raised.

`TrajectoryFiles.record` reads one record by its id (``<file number>:<byte offset>``, as a summary gives it, so a
request can only name a line this index found) and returns the view the web page draws (`trajectory_view`).
This module knows files and records; nothing about HTTP.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

from agent_protocol import Tokenizer
from agent_runtime.serving.trajectory_view import trajectory_view
from agent_runtime.trajectory import Trajectory

__all__ = ["TrajectoryFiles", "TrajectoryFilesError", "TrajectoryFilter", "TrajectorySummary"]

MAX_PAGE: Final = 500
MALFORMED_LINES_KEPT: Final = 20
_TASK_LABEL_CHARS: Final = 160
_MIN_CHUNK: Final = 16
_LOOK_EVERY_S: Final = 2.0  # a directory is listed again (new files) at most this often


class TrajectoryFilesError(ValueError):
    """A path that holds no trajectories, or a record id this index does not know."""


class _ErrorHead(msgspec.Struct):
    code: str = ""


class _MessageHead(msgspec.Struct):
    role: str = ""
    content: str | None = None


class _Head(msgspec.Struct):
    """The fields of a record a summary needs; the decoder skips the rest (segments, images) without building them."""

    episode_id: str
    segments: msgspec.Raw  # required (a record has segments), never decoded here
    reward: float = 0.0
    stop_reason: str | None = None
    errors: list[_ErrorHead] = msgspec.field(default_factory=list)
    task: dict[str, Any] = msgspec.field(default_factory=dict)
    messages: list[_MessageHead] = msgspec.field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    compactions: int = 0


_head_decoder: Final = msgspec.json.Decoder(_Head)
_record_decoder: Final = msgspec.json.Decoder(Trajectory)


class TrajectorySummary(msgspec.Struct, frozen=True, kw_only=True):
    """One record as the list shows it. `task` is the task's prompt (or the first user message), `task_key` a
    short hash of it that is equal for the same task in any file, `checkpoint` the file (and the task's ``step``
    or ``checkpoint`` field when the record carries one)."""

    id: str
    index: int
    file: str
    line: int
    episode_id: str
    task: str
    task_key: str
    checkpoint: str
    reward: float
    stop_reason: str | None
    error_codes: list[str]
    turns: int
    tool_calls: int
    compactions: int


class TrajectoryFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What a page keeps: reward within [`min_reward`, `max_reward`], the stop reason, an error code (``none``:
    records without errors), the task (its `task_key`), the file (its number)."""

    min_reward: float | None = None
    max_reward: float | None = None
    stop_reason: str | None = None
    error_code: str | None = None
    task_key: str | None = None
    file: int | None = None

    def keeps(self, summary: TrajectorySummary, file_number: int) -> bool:
        if self.file is not None and file_number != self.file:
            return False
        if self.min_reward is not None and summary.reward < self.min_reward:
            return False
        if self.max_reward is not None and summary.reward > self.max_reward:
            return False
        if self.stop_reason is not None and (summary.stop_reason or "none") != self.stop_reason:
            return False
        if self.error_code is not None:
            if self.error_code == "none":
                if summary.error_codes:
                    return False
            elif self.error_code not in summary.error_codes:
                return False
        return self.task_key is None or summary.task_key == self.task_key


def _task_text(head: _Head) -> str:
    prompt = head.task.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    for message in head.messages:
        if message.role == "user" and message.content:
            return message.content
    return ""


def _foreign(line: bytes) -> bool:
    """Whether `line` is a JSON object of some other kind (no `episode_id` and `segments`): not a broken record."""
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return False
    return isinstance(value, dict) and not ("episode_id" in value and "segments" in value)


def _checkpoint(name: str, task: dict[str, Any]) -> str:
    for key in ("checkpoint", "step"):
        value = task.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return f"{name} {key} {value}"
    return name


@dataclass
class _FileIndex:
    """One file's index: where each record's line starts, its summary, how far the file has been read."""

    number: int
    path: Path
    name: str
    offsets: list[int] = field(default_factory=list)
    summaries: list[TrajectorySummary] = field(default_factory=list)
    read_to: int = 0
    lines: int = 0
    malformed: int = 0
    malformed_lines: list[int] = field(default_factory=list)
    #: a later file has been read: this one's record numbers are fixed, what is appended to it now goes unread
    sealed: bool = False
    #: its first line is a JSON object but no trajectory (a run's metrics, a data set): not read on
    foreign: bool = False

    def extend(self, records: int, first_index: int) -> int:
        """Read on until `records` more records are indexed or the file ends (for now); the number added."""
        added = 0
        if self.sealed:
            return 0
        try:
            size = self.path.stat().st_size
        except OSError:
            return 0
        if size <= self.read_to:
            return 0
        with open(self.path, "rb") as file:
            file.seek(self.read_to)
            while added < records:
                start = file.tell()
                line = file.readline()
                if not line:
                    break
                summary = self._summary(line, start, first_index + added) if line.strip() else None
                if not line.endswith(b"\n") and summary is None:  # a line still being written: left for later
                    break
                self.read_to = file.tell()
                self.lines += 1
                if not line.strip():
                    continue
                if summary is None and not self.offsets and not self.malformed and _foreign(line):
                    self.foreign = self.sealed = True  # e.g. a run's metrics.jsonl: not a trajectory file
                    break
                if summary is None:
                    self.malformed += 1
                    if len(self.malformed_lines) < MALFORMED_LINES_KEPT:
                        self.malformed_lines.append(self.lines)
                    continue
                self.offsets.append(start)
                self.summaries.append(summary)
                added += 1
        return added

    def _summary(self, line: bytes, offset: int, index: int) -> TrajectorySummary | None:
        try:
            head = _head_decoder.decode(line)
        except msgspec.DecodeError:
            return None
        text = _task_text(head)
        reward = head.reward if math.isfinite(head.reward) else 0.0
        return TrajectorySummary(
            id=f"{self.number}:{offset}",
            index=index,
            file=self.name,
            line=self.lines,
            episode_id=head.episode_id,
            task=text if len(text) <= _TASK_LABEL_CHARS else text[: _TASK_LABEL_CHARS - 1] + "…",
            task_key=hashlib.sha1(text.encode()).hexdigest()[:12],
            checkpoint=_checkpoint(self.name, head.task),
            reward=reward,
            stop_reason=head.stop_reason,
            error_codes=sorted({error.code for error in head.errors}),
            turns=head.turns,
            tool_calls=head.tool_calls,
            compactions=head.compactions,
        )


class TrajectoryFiles:
    """The trajectories under `path` (see the module docstring). `tokenizer`, when given, decodes each token into
    its piece for `record`; without one a token shows its id only. A `path` that does not exist yet is allowed
    with `allow_missing` (a server's log before its first request); otherwise it is a `TrajectoryFilesError`."""

    def __init__(self, path: str | Path, *, tokenizer: Tokenizer | None = None, allow_missing: bool = False) -> None:
        if not str(path):
            raise TrajectoryFilesError("the trajectories' path is empty")
        self.root = Path(path).expanduser().resolve()
        if not self.root.exists() and not allow_missing:
            raise TrajectoryFilesError(f"{path}: no such file or directory")
        if self.root.exists() and not (self.root.is_file() or self.root.is_dir()):
            raise TrajectoryFilesError(f"{path}: neither a file nor a directory")
        self.tokenizer = tokenizer
        self._files: list[_FileIndex] = []
        self._known: set[Path] = set()
        self._lock = threading.Lock()  # pages are read off the event loop, possibly two at once
        self._pieces: dict[int, str] = {}
        self._looked = -math.inf

    def _discover(self) -> None:
        """Add the files that appeared since the last look (a directory's new files go after the known ones)."""
        now = time.monotonic()
        if self._files and now - self._looked < _LOOK_EVERY_S:
            return
        self._looked = now
        if self.root.is_file():
            found = [self.root]
        elif self.root.is_dir():
            found = sorted(
                p.resolve()
                for p in self.root.rglob("*.jsonl")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(self.root).parts)
            )
            found = [p for p in found if p.is_relative_to(self.root)]  # a symlink out of the directory: left out
        else:
            found = []
        for path in found:
            if path not in self._known:
                self._known.add(path)
                name = path.name if path == self.root else str(path.relative_to(self.root))
                self._files.append(_FileIndex(number=len(self._files), path=path, name=name))

    def _records(self, start: int, max_scan: int, chunk: int) -> Iterator[tuple[_FileIndex, TrajectorySummary]]:
        """Records from number `start` on, at most `max_scan` of them, reading files on as needed, `chunk` records
        at a time (a file is read to its end before the next one is looked at: its records' numbers come first)."""
        base = scanned = 0
        for number, index in enumerate(self._files):
            if number > 0 and not self._files[number - 1].sealed:  # the ones before were read to their end
                self._files[number - 1].sealed = True
            position = max(start - base, 0)
            while scanned < max_scan:
                if position >= len(index.summaries):
                    wanted = position - len(index.summaries) + min(max_scan - scanned, chunk)
                    if index.extend(wanted, base + len(index.summaries)) == 0:
                        break
                    continue
                yield index, index.summaries[position]
                position += 1
                scanned += 1
            if scanned >= max_scan:
                return
            base += len(index.summaries)

    def page(
        self, offset: int = 0, limit: int = 50, where: TrajectoryFilter | None = None, *, max_scan: int = 5000
    ) -> dict[str, Any]:
        """Up to `limit` summaries of records numbered `offset` on that pass `where`, scanning at most `max_scan`
        records; `next_offset` is where the next page starts, `done` whether every record has been scanned."""
        if offset < 0:
            raise TrajectoryFilesError(f"offset must be at least 0, got {offset}")
        if not 1 <= limit <= MAX_PAGE:
            raise TrajectoryFilesError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        where = where or TrajectoryFilter()
        with self._lock:
            self._discover()
            items: list[TrajectorySummary] = []
            next_offset = offset
            for index, summary in self._records(offset, max(max_scan, limit), max(limit, _MIN_CHUNK)):
                next_offset = summary.index + 1
                if where.keeps(summary, index.number):
                    items.append(summary)
                    if len(items) == limit:
                        break
            indexed = sum(len(f.summaries) for f in self._files)
            done = next_offset >= indexed and all(f.sealed or not f.path.exists() or f.read_to >= f.path.stat().st_size
                                                  for f in self._files)  # fmt: skip
            return {
                "items": items,
                "next_offset": next_offset,
                "done": done,
                "indexed": indexed,
                "files": [
                    {"number": f.number, "name": f.name, "records": len(f.summaries), "foreign": f.foreign}
                    for f in self._files
                ],
                "malformed": sum(f.malformed for f in self._files),
                "malformed_lines": [{"file": f.name, "line": line} for f in self._files for line in f.malformed_lines][
                    :MALFORMED_LINES_KEPT
                ],
            }

    def record(self, record_id: str) -> dict[str, Any]:
        """The view of the record `record_id` (``<file>:<offset>`` as a summary gives it); a
        `TrajectoryFilesError` for an id this index never gave."""
        number_text, _, offset_text = record_id.partition(":")
        if not (number_text.isdigit() and offset_text.isdigit()):
            raise TrajectoryFilesError(f"{record_id!r} is not a trajectory id (<file>:<offset>)")
        number, offset = int(number_text), int(offset_text)
        with self._lock:
            if number >= len(self._files):
                raise TrajectoryFilesError(f"no trajectory {record_id!r}")
            index = self._files[number]
            position = bisect.bisect_left(index.offsets, offset)
            if position == len(index.offsets) or index.offsets[position] != offset:
                raise TrajectoryFilesError(f"no trajectory {record_id!r}")
            summary = index.summaries[position]
        with open(index.path, "rb") as file:
            file.seek(offset)
            line = file.readline()
        try:
            trajectory = _record_decoder.decode(line)
        except msgspec.DecodeError as e:
            raise TrajectoryFilesError(f"{index.name}:{summary.line}: not a trajectory record ({e})") from e
        view = trajectory_view(trajectory, self._piece if self.tokenizer is not None else None)
        return {"summary": summary, **view}

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None and self.tokenizer is not None:
            piece = self.tokenizer.decode([token])
            if len(self._pieces) < 1_000_000:
                self._pieces[token] = piece
        return piece or ""
