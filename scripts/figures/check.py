"""`check` and `write`: the READMEs' tables against the registry, and the registry's tables written into them.

The scope rule (also in docs/figures.toml's header): every table in the scanned Markdown files (`SCANNED`) that
holds a digit outside code spans is either marked `<!-- figures: ID -->` and registered whole, or exempt by its
file and header with a reason. A marked table equals its entry: the same header, the same rows in the same order,
every cell the same text. Each problem is one line naming the file, the line and what to do.
"""

from __future__ import annotations

from pathlib import Path

from figures.derived import stale
from figures.registry import Registry, TableEntry
from figures.tables import Table, find_tables, has_figure, markers_in, rewrite_table

SCANNED = (
    "README.md",
    "packages/*/README.md",
    "apps/*/README.md",
    "examples/**/README.md",
    "bench/**/*.md",
    "docs/*.md",
)


def scanned_files(root: Path) -> list[str]:
    found = {path.relative_to(root).as_posix() for pattern in SCANNED for path in root.glob(pattern)}
    return sorted(found)


def _compare(entry: TableEntry, table: Table, where: str) -> list[str]:
    problems = []
    if table.header != entry.header:
        problems.append(f"{where}: header {table.header} != registry {entry.header}")
        return problems
    readme = [row[0] if row else "" for row in table.rows]
    registered = [row.label for row in entry.rows]
    if readme != registered:
        missing = [label for label in readme if label not in registered]
        gone = [label for label in registered if label not in readme]
        problems.append(
            f"{where}: rows differ from the registry (README-only: {missing}; registry-only: {gone}"
            + ("; same rows, other order" if not missing and not gone else "")
            + ")"
        )
        return problems
    for row in entry.rows:
        unknown = [field for field in ("commit", "measured", "machine") if not getattr(row, field)]
        if unknown and any(has_figure(cell) for cell in row.values.values()):
            problems.append(f"{where}: row `{row.name}` has figures but no {', '.join(unknown)} in the registry")
    for cells, row in zip(table.rows, entry.rows, strict=True):
        if len(cells) != len(entry.header):
            problems.append(f"{where}: row `{row.name}` has {len(cells)} cells, the header {len(entry.header)}")
            continue
        for column, cell in zip(entry.keys, cells[1:], strict=True):
            if cell != row.values[column]:
                problems.append(
                    f"{where}: row `{row.name}`, column `{column}`: README {cell!r} != registry "
                    f"{row.values[column]!r} (re-measure with `scripts/figures run {entry.id}.{row.name}`, "
                    "or `scripts/figures write` to put the registry's value back)"
                )
    return problems


def check(root: Path, registry: Registry, files: list[str] | None = None) -> list[str]:
    """Every problem found; an empty list when the READMEs and the registry agree."""
    files = scanned_files(root) if files is None else files
    problems: list[str] = []
    seen: dict[str, str] = {}
    used_exempt: set[int] = set()
    for name in files:
        text = (root / name).read_text(encoding="utf-8")
        tables = {table.marker_line: table for table in find_tables(text) if table.marker_line is not None}
        for line, marker in markers_in(text):
            where = f"{name}:{line + 1}"
            if line not in tables:
                problems.append(f"{where}: marker `{marker}` is not followed by a table")
            elif marker in seen:
                problems.append(f"{where}: marker `{marker}` already marks a table in {seen[marker]}")
            elif marker not in registry.tables:
                problems.append(f"{where}: table `{marker}` is not in the registry (add an entry to docs/figures.toml)")
            elif registry.tables[marker].file != name:
                problems.append(f"{where}: table `{marker}` is registered for {registry.tables[marker].file}")
            else:
                problems += _compare(registry.tables[marker], tables[line], f"{name}:{tables[line].line}")
            seen.setdefault(marker, where)
        for table in find_tables(text):
            if table.marker is not None or not any(has_figure(cell) for row in table.rows for cell in row):
                continue
            matches = [i for i, ex in enumerate(registry.exempt) if ex.file == name and ex.header == table.header]
            if matches:
                used_exempt.update(matches)
            else:
                problems.append(
                    f"{name}:{table.line}: a table with figures ({' | '.join(table.header)}) is neither marked "
                    "`<!-- figures: ID -->` and registered, nor exempt in docs/figures.toml"
                )
    for table_id, entry in registry.tables.items():
        if table_id not in seen and entry.file in files:
            problems.append(f"registry: table `{table_id}` has no `<!-- figures: {table_id} -->` in {entry.file}")
        elif entry.file not in files:
            problems.append(f"registry: table `{table_id}` names {entry.file}, which is not a scanned file")
    for i, ex in enumerate(registry.exempt):
        if i not in used_exempt and ex.file in files:
            problems.append(f"registry: exempt table {ex.header} in {ex.file} matches no table with figures")
    return problems + stale(registry)


def write(root: Path, registry: Registry, table_ids: list[str] | None = None) -> list[str]:
    """Rewrite the marked tables from the registry; returns the files changed."""
    changed = []
    by_file: dict[str, list[TableEntry]] = {}
    for table_id in table_ids if table_ids is not None else list(registry.tables):
        entry = registry.tables[table_id]
        by_file.setdefault(entry.file, []).append(entry)
    for name, entries in by_file.items():
        path = root / name
        text = original = path.read_text(encoding="utf-8")
        for entry in entries:
            table = next((t for t in find_tables(text) if t.marker == entry.id), None)
            if table is None:
                raise LookupError(f"{name}: no table marked `<!-- figures: {entry.id} -->`")
            text = rewrite_table(text, table, entry.header, [entry.cells(row) for row in entry.rows])
        if text != original:
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed
