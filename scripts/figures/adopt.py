"""`adopt`: take a marked README table into the registry as the README now has it, after the table was reshaped.

For a table whose header or rows were edited by hand (a new column, a row relabelled, a new marked table): the
entry's header becomes the README's, and each README row keeps the registry row of the same label (or, failing
that, the one at its position whose label the README no longer has) with its command, specs and provenance, and
takes the README's cells. A row the registry did not have gets a name from its label, no command,
and a note saying so; `run` refuses it until it has a command and parse specs. Column specs of columns that are
gone are dropped. It never runs anything: the figures stay what the README says until `run` re-measures them.
"""

from __future__ import annotations

import re
from pathlib import Path

from figures.registry import Registry, Row, TableEntry, column_keys
from figures.tables import find_tables

ADOPTED = "adopted from the README by `scripts/figures adopt`: give it a command and parse specs, or pin it"


def _slug(label: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", label.lower().replace("`", "")).strip("-")[:40].strip("-") or "row"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def adopt(root: Path, registry: Registry, table_id: str, file: str | None = None) -> list[str]:
    """Update (or create, given `file`) entry `table_id` from its marked table; returns what changed, in words."""
    entry = registry.tables.get(table_id)
    name = file or (entry.file if entry else None)
    if name is None:
        raise LookupError(f"no table `{table_id}` in the registry: name its README (--file) to register it")
    table = next((t for t in find_tables((root / name).read_text(encoding="utf-8")) if t.marker == table_id), None)
    if table is None:
        raise LookupError(f"{name}: no table marked `<!-- figures: {table_id} -->`")
    if entry is None:
        entry = registry.tables[table_id] = TableEntry(id=table_id, file=name, header=table.header, rows=[])
    keys = column_keys(table.header)
    changes = [] if entry.header == table.header else [f"header {entry.header} -> {table.header}"]
    old_keys = entry.keys
    by_label = {row.label: row for row in entry.rows}
    readme_labels = {cells[0] for cells in table.rows if cells}
    rows: list[Row] = []
    taken: set[str] = set()
    for index, cells in enumerate(table.rows):
        if len(cells) != len(table.header):
            raise LookupError(
                f"{name}:{table.line + 2 + index}: {len(cells)} cells, the header has {len(table.header)}"
            )
        label, values = cells[0], dict(zip(keys, cells[1:], strict=True))
        row = by_label.get(label)
        if row is None and index < len(entry.rows) and entry.rows[index].label not in readme_labels:
            row = entry.rows[index]  # relabelled in place
        if row is None:
            row = Row(
                name=_slug(label, taken),
                label=label,
                command="",
                commit="",
                measured="",
                machine="",
                values=values,
                note=ADOPTED,
            )
            changes.append(f"new row `{row.name}` ({label})")
        else:
            if row.label != label:
                changes.append(f"row `{row.name}` relabelled: {row.label!r} -> {label!r}")
            moved = [k for k in keys if row.values.get(k) != values[k]]
            if moved:
                changes.append(f"row `{row.name}`: README cells taken for {moved}")
            row.label, row.values = label, values
            row.parse = {k: v for k, v in row.parse.items() if k in keys}
            row.format = {k: v for k, v in row.format.items() if k in keys}
        if row.name in taken:
            row.name = _slug(row.name, taken)
        taken.add(row.name)
        rows.append(row)
    dropped = [row.name for row in entry.rows if row not in rows]
    if dropped:
        changes.append(f"rows dropped: {dropped}")
    gone = [k for k in old_keys if k not in keys]
    entry.parse = {k: v for k, v in entry.parse.items() if k in keys}
    entry.format = {k: v for k, v in entry.format.items() if k in keys}
    if gone:
        changes.append(f"columns gone (their specs dropped): {gone}")
    entry.header, entry.rows = table.header, rows
    return changes
