"""The figures registry (docs/figures.toml): read with tomllib, checked field by field, written back by `dump`.

Each table entry holds a marked README table whole: its file, header and rows, each row with every cell after the
first (`values`, keyed by column header), the command that prints the row's figures, how each figure is read from
what the command leaves (`parse`, per column, on the table or overridden on a row), how it is written (`format`),
and the commit, date and machine it was measured at. `exempt` entries name unmarked tables that hold digits but
no measurement, each with its reason. `dump` writes the same layout back (comments survive only in the file's
leading comment block), so `run` can update values and a diff shows what moved. It knows nothing of Markdown.
"""

from __future__ import annotations

import fcntl
import json
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Spec = str | list[str]

_ROW_FIELDS = ("name", "label", "command", "run_dir", "commit", "measured", "machine", "source", "pinned", "note")
_REQUIRED_ROW = ("name", "label", "command", "commit", "measured", "machine")


def column_keys(header: list[str]) -> list[str]:
    """The keys of the columns after the first: each header's text, ` #2`, ` #3`... added where one repeats."""
    keys: list[str] = []
    seen: dict[str, int] = {}
    for text in header[1:]:
        seen[text] = seen.get(text, 0) + 1
        keys.append(text if seen[text] == 1 else f"{text} #{seen[text]}")
    return keys


class RegistryError(ValueError):
    """The registry file is not what this module writes: a missing field, an unknown key, a duplicate name."""


@dataclass
class Row:
    name: str
    label: str
    command: str
    commit: str
    measured: str
    machine: str
    values: dict[str, str]
    run_dir: str = ""
    source: str = ""  # where commit, measured and machine come from: `scripts/figures run`, or how they were found
    pinned: str = ""
    note: str = ""
    parse: dict[str, Spec] = field(default_factory=dict)
    format: dict[str, str] = field(default_factory=dict)


@dataclass
class TableEntry:
    id: str
    file: str
    header: list[str]
    rows: list[Row]
    note: str = ""
    parse: dict[str, Spec] = field(default_factory=dict)
    format: dict[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return column_keys(self.header)

    def spec(self, row: Row, column: str) -> Spec | None:
        return row.parse.get(column, self.parse.get(column))

    def fmt(self, row: Row, column: str) -> str:
        return row.format.get(column, self.format.get(column, "{0}"))

    def cells(self, row: Row) -> list[str]:
        return [row.label, *(row.values[column] for column in self.keys)]


@dataclass
class Exempt:
    file: str
    header: list[str]
    reason: str


@dataclass
class Registry:
    preamble: str
    tables: dict[str, TableEntry]
    exempt: list[Exempt]


def _where(*parts: object) -> str:
    return ".".join(str(p) for p in parts)


def _strings(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise RegistryError(f"{where}: expected a table of strings")
    return dict(value)


def _specs(value: Any, where: str) -> dict[str, Spec]:
    if not isinstance(value, dict):
        raise RegistryError(f"{where}: expected a table")
    for key, spec in value.items():
        ok = isinstance(spec, str) or (isinstance(spec, list) and spec and all(isinstance(s, str) for s in spec))
        if not ok:
            raise RegistryError(f"{where}.{key}: a parse spec is a string or a non-empty list of strings")
    return dict(value)


def _unknown(data: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    extra = sorted(set(data) - set(known))
    if extra:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(extra)} (known: {', '.join(known)})")


def _row(data: Any, entry_header: list[str], where: str) -> Row:
    if not isinstance(data, dict):
        raise RegistryError(f"{where}: expected a table")
    _unknown(data, (*_ROW_FIELDS, "values", "parse", "format"), where)
    for key in _REQUIRED_ROW:
        if not isinstance(data.get(key), str):
            raise RegistryError(f"{where}: `{key}` (a string) is required")
    values = _strings(data.get("values", {}), f"{where}.values")
    columns = column_keys(entry_header)
    if sorted(values) != sorted(columns):
        missing, extra = sorted(set(columns) - set(values)), sorted(set(values) - set(columns))
        raise RegistryError(f"{where}.values: must hold every column but the first; missing {missing}, extra {extra}")
    if not data["command"] and not data.get("note"):
        raise RegistryError(f"{where}: an empty command needs a `note` saying where the figures came from")
    strings = {key: data.get(key, "") for key in _ROW_FIELDS}
    for key, value in strings.items():
        if not isinstance(value, str):
            raise RegistryError(f"{where}.{key}: expected a string")
    return Row(
        **strings,
        values={column: values[column] for column in columns},
        parse=_specs(data.get("parse", {}), f"{where}.parse"),
        format=_strings(data.get("format", {}), f"{where}.format"),
    )


def _table(table_id: str, data: Any) -> TableEntry:
    where = f"tables.{table_id}"
    if not isinstance(data, dict):
        raise RegistryError(f"{where}: expected a table")
    _unknown(data, ("file", "header", "note", "parse", "format", "rows"), where)
    header = data.get("header")
    if not isinstance(data.get("file"), str) or not (
        isinstance(header, list) and len(header) >= 2 and all(isinstance(h, str) for h in header)
    ):
        raise RegistryError(f"{where}: `file` (a string) and `header` (two or more strings) are required")
    rows = [_row(row, header, _where(where, "rows", i)) for i, row in enumerate(data.get("rows", []))]
    for attr in ("name", "label"):
        seen = [getattr(row, attr) for row in rows]
        dupes = sorted({value for value in seen if seen.count(value) > 1})
        if dupes:
            raise RegistryError(f"{where}: row {attr}s must be unique; repeated: {dupes}")
    parse = _specs(data.get("parse", {}), f"{where}.parse")
    fmt = _strings(data.get("format", {}), f"{where}.format")
    for column in [*parse, *fmt, *(c for row in rows for c in [*row.parse, *row.format])]:
        if column not in column_keys(header):
            raise RegistryError(f"{where}: parse/format names `{column}`, which is not a column after the first")
    note = data.get("note", "")
    if not isinstance(note, str):
        raise RegistryError(f"{where}.note: expected a string")
    return TableEntry(
        id=table_id, file=data["file"], header=list(header), rows=rows, note=note, parse=parse, format=fmt
    )


def loads(text: str) -> Registry:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"not valid TOML: {e}") from e
    _unknown(data, ("tables", "exempt"), "registry")
    exempt = []
    for i, item in enumerate(data.get("exempt", [])):
        where = f"exempt.{i}"
        if not isinstance(item, dict):
            raise RegistryError(f"{where}: expected a table")
        _unknown(item, ("file", "header", "reason"), where)
        header = item.get("header")
        if not (isinstance(item.get("file"), str) and isinstance(header, list) and item.get("reason")):
            raise RegistryError(f"{where}: `file`, `header` (the header's cells) and a `reason` are required")
        exempt.append(Exempt(file=item["file"], header=[str(h) for h in header], reason=str(item["reason"])))
    tables = {table_id: _table(table_id, entry) for table_id, entry in data.get("tables", {}).items()}
    lines = text.split("\n")
    preamble = []
    for line in lines:
        if not line.startswith("#"):
            break
        preamble.append(line)
    return Registry(preamble="\n".join(preamble), tables=tables, exempt=exempt)


def load(path: Path) -> Registry:
    return loads(path.read_text(encoding="utf-8"))


def _s(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's."""
    return json.dumps(value, ensure_ascii=False)


def _value(value: Spec) -> str:
    return _s(value) if isinstance(value, str) else "[" + ", ".join(_s(v) for v in value) + "]"


def _mapping(header: str, mapping: dict[str, Spec] | dict[str, str]) -> list[str]:
    if not mapping:
        return []
    return ["", f"[{header}]", *(f"{_s(key)} = {_value(value)}" for key, value in mapping.items())]


def dumps(registry: Registry) -> str:
    out: list[str] = [registry.preamble] if registry.preamble else []
    for item in registry.exempt:
        out += ["", "[[exempt]]", f"file = {_s(item.file)}", f"header = {_value(item.header)}"]
        out.append(f"reason = {_s(item.reason)}")
    for table_id, entry in registry.tables.items():
        prefix = f"tables.{_s(table_id) if not table_id.replace('-', '').replace('_', '').isalnum() else table_id}"
        out += ["", "", f"[{prefix}]", f"file = {_s(entry.file)}", f"header = {_value(entry.header)}"]
        if entry.note:
            out.append(f"note = {_s(entry.note)}")
        out += _mapping(f"{prefix}.parse", entry.parse) + _mapping(f"{prefix}.format", entry.format)
        for row in entry.rows:
            out += ["", f"[[{prefix}.rows]]"]
            out += [
                f"{key} = {_s(getattr(row, key))}" for key in _ROW_FIELDS if key in _REQUIRED_ROW or getattr(row, key)
            ]
            out += _mapping(f"{prefix}.rows.values", row.values)
            out += _mapping(f"{prefix}.rows.parse", row.parse) + _mapping(f"{prefix}.rows.format", row.format)
    return "\n".join(out).lstrip("\n") + "\n"


def save(registry: Registry, path: Path) -> None:
    text = dumps(registry)
    loads(text)  # what is written must read back
    path.write_text(text, encoding="utf-8")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the registry, so that two `run`s (two long trainings side by side) each add their
    rows to what the other wrote instead of saving over it."""
    with open(path, "rb") as handle:  # the registry file itself: written in place, the same inode stays locked
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_rows(path: Path, rows: list[tuple[str, Row]], then: Callable[[Registry], object] = lambda r: None) -> Registry:
    """Put `rows` ((table id, row) pairs) into the registry as it is on disk now, call `then` on it, save it."""
    with locked(path):
        registry = load(path)
        for table_id, row in rows:
            entry = registry.tables.get(table_id)
            index = next((i for i, old in enumerate(entry.rows) if old.name == row.name), None) if entry else None
            if entry is None or index is None:
                raise RegistryError(
                    f"{path}: row {table_id}.{row.name} is gone from the registry; its figures: {row.values}"
                )
            entry.rows[index] = row
        then(registry)
        save(registry, path)
    return registry
