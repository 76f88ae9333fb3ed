"""Derived rows: cells computed from other registered rows (a range over seeds), never from a command of their own.

A derived row has `command = ""` and every figure's spec is `row:TABLE.ROW#COLUMN` (ROW a shell pattern:
`train-demo.seed[012]`), which reads the first number of that column's cell in each matching row (`66.5%` is
66.5) as one list; its format (`={span(v[0])}`: `59.5-66.5%`, `0.0%` when all agree) writes the cell.
`refresh` recomputes every derived row after `run` measured its sources (its commit, date and machine become
theirs); `stale` is `check`'s half: a derived cell that its sources no longer give is a problem.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from figures.measure import MeasureError, apply_format
from figures.registry import Registry, Row, TableEntry

_FIRST_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def is_derived(entry: TableEntry, row: Row) -> bool:
    specs = [entry.spec(row, column) for column in entry.keys]
    flat = [s for spec in specs if spec is not None for s in ([spec] if isinstance(spec, str) else spec)]
    return not row.command and bool(flat) and all(s.startswith("row:") for s in flat)


def _sources(registry: Registry, spec: str) -> list[tuple[Row, str]]:
    pattern, sep, column = spec[4:].partition("#")
    table_id, _, row_pattern = pattern.partition(".")
    entry = registry.tables.get(table_id)
    if not sep or entry is None or column not in entry.keys:
        raise MeasureError(f"`{spec}`: a row spec is row:TABLE.ROW#COLUMN, naming a registered table and column")
    rows = [row for row in entry.rows if fnmatchcase(row.name, row_pattern or "*")]
    if not rows:
        raise MeasureError(f"`{spec}`: no row of `{table_id}` matches `{row_pattern}`")
    return [(row, row.values[column]) for row in rows]


def _numbers(registry: Registry, spec: str) -> list[float]:
    numbers = []
    for row, cell in _sources(registry, spec):
        match = _FIRST_NUMBER.search(cell.replace(",", ""))
        if match is None:
            raise MeasureError(f"`{spec}`: row `{row.name}`'s cell {cell!r} holds no number")
        numbers.append(float(match.group()))
    return numbers


def derived_cells(registry: Registry, entry: TableEntry, row: Row) -> dict[str, str]:
    cells = dict(row.values)
    for column in entry.keys:
        spec = entry.spec(row, column)
        if spec is not None:
            values = [_numbers(registry, s) for s in ([spec] if isinstance(spec, str) else spec)]
            cells[column] = apply_format(entry.fmt(row, column), values)
    return cells


def _provenance(registry: Registry, entry: TableEntry, row: Row) -> tuple[str, str, str]:
    sources: list[Row] = []
    for column in entry.keys:
        spec = entry.spec(row, column)
        for s in [] if spec is None else [spec] if isinstance(spec, str) else spec:
            sources += [source for source, _ in _sources(registry, s) if source not in sources]
    return (
        ", ".join(dict.fromkeys(r.commit for r in sources)),
        max(r.measured for r in sources),
        "; ".join(dict.fromkeys(r.machine for r in sources)),
    )


def refresh(registry: Registry) -> list[str]:
    """Recompute every derived row; returns `table.row `column`: old -> new` for what moved."""
    moved = []
    for entry in registry.tables.values():
        for row in entry.rows:
            if not is_derived(entry, row):
                continue
            cells = derived_cells(registry, entry, row)
            moved += [
                f"{entry.id}.{row.name} `{column}`: {row.values[column]} -> {cell}"
                for column, cell in cells.items()
                if cell != row.values[column]
            ]
            row.values = cells
            row.commit, row.measured, row.machine = _provenance(registry, entry, row)
            row.source = "derived: its source rows' commits, latest date and machines"
    return moved


def stale(registry: Registry) -> list[str]:
    problems = []
    for entry in registry.tables.values():
        for row in entry.rows:
            if not is_derived(entry, row):
                continue
            try:
                cells = derived_cells(registry, entry, row)
            except MeasureError as e:
                problems.append(f"registry: derived row {entry.id}.{row.name}: {e}")
                continue
            problems += [
                f"registry: derived row {entry.id}.{row.name}, column `{column}`: {row.values[column]!r}, but its "
                f"source rows give {cell!r} (`scripts/figures write` recomputes it)"
                for column, cell in cells.items()
                if cell != row.values[column]
            ]
    return problems
