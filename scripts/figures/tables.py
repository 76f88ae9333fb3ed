"""Markdown tables as the READMEs write them: found, split into cells, and rewritten cell by cell.

A table is a run of lines that start with `|`, its second line the `|---|` separator, outside fenced code blocks.
Its marker is an HTML comment `<!-- figures: ID -->` on the last non-blank line before the header. Rewriting
keeps every line that does not change byte for byte: the text around a table, its separator, and each row whose
cells are the same. It knows nothing of the registry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = re.compile(r"^<!--\s*figures:\s*(\S+)\s*-->\s*$")
_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


@dataclass(frozen=True)
class Table:
    """One table of a Markdown text: `start` is the header's line index (0-based), `end` one past its last row."""

    marker: str | None
    marker_line: int | None
    start: int
    end: int
    header: list[str]
    rows: list[list[str]]

    @property
    def line(self) -> int:
        """The header's line number, 1-based, as an editor shows it."""
        return self.start + 1


def split_row(line: str) -> list[str]:
    """The cells of one table line, stripped; `\\|` is a pipe inside a cell, as in GitHub's Markdown."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", body)]


def render_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def find_tables(text: str) -> list[Table]:
    lines = text.split("\n")
    tables: list[Table] = []
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.startswith("|") or i + 1 >= len(lines) or not _SEPARATOR.match(lines[i + 1]):
            i += 1
            continue
        end = i + 2
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        marker, marker_line = None, None
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        if before >= 0 and (match := MARKER.match(lines[before].strip())):
            marker, marker_line = match.group(1), before
        tables.append(
            Table(
                marker=marker,
                marker_line=marker_line,
                start=i,
                end=end,
                header=split_row(line),
                rows=[split_row(row) for row in lines[i + 2 : end]],
            )
        )
        i = end
    return tables


def markers_in(text: str) -> list[tuple[int, str]]:
    """Every figures marker (line index, id), a table after it or not: a marker with no table is an error."""
    found: list[tuple[int, str]] = []
    in_fence = False
    for index, line in enumerate(text.split("\n")):
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := MARKER.match(line.strip())):
            found.append((index, match.group(1)))
    return found


_NUMBER = re.compile(r"(?<![\w./-])\d")


def has_figure(cell: str) -> bool:
    """A cell holds a figure when a number starts outside code spans and words: `--lr 1e-4` is a flag, Qwen3 and
    qwen2_5 are names, `0.99 ms` and `400` are figures."""
    return _NUMBER.search(_CODE_SPAN.sub("", cell)) is not None


def rewrite_table(text: str, table: Table, header: list[str], rows: list[list[str]]) -> str:
    """`text` with `table`'s header and rows replaced; lines whose cells do not change are kept as they are."""
    lines = text.split("\n")
    old = {tuple(split_row(line)): line for line in lines[table.start + 2 : table.end]}
    head = lines[table.start] if split_row(lines[table.start]) == header else render_row(header)
    separator = lines[table.start + 1]
    if len(split_row(separator)) != len(header):
        separator = "|" + "---|" * len(header)
    body = [old.get(tuple(cells), render_row(cells)) for cells in rows]
    return "\n".join([*lines[: table.start], head, separator, *body, *lines[table.end :]])
