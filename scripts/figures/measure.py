"""`run`: re-run chosen rows' commands, read their figures, and update the rows' values, commit, date and machine.

A parse spec reads one number (or any JSON value) from what a command left:

- `json:PATH#KEY` reads the JSON file PATH (relative to the repository root) and follows KEY, dotted
  (`figures.after_rl`, `step_rewards.-1` for the last item of a list);
- `re:REGEX` takes the first group of REGEX's first match in the command's output (stdout and stderr together);
- either may end in `/N` or `*N` (`json:{run_dir}/summary.json#elapsed_s/60`: seconds as minutes).

`{run_dir}` in a command or a spec is the row's `run_dir`. A cell's spec is a string or a list of them, and its
`format` (Python's `str.format`, default `{0}`) writes the values read: `{0:.1%}`, `**{0:.1%}**`,
`{0:.2f} -> {1:.2f}`; one that starts with `=` is an f-string over the list `v` (`={v[0] - v[1]:+d}`).
Rows that share a command run it once. A row is refused, before anything runs, when it is `pinned` (it records
an older state of the code), has no command, or has a cell with a figure and no spec.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from figures.registry import Registry, Row, Spec, TableEntry
from figures.tables import has_figure

_SCALE = re.compile(r"^(?P<body>.*?)(?P<op>[/*])(?P<factor>\d+(?:\.\d+)?)$")


RUN_SOURCE = "scripts/figures run"


class MeasureError(RuntimeError):
    """A row cannot be run, its command failed, or a figure cannot be read from what it left."""


@dataclass(frozen=True)
class Selected:
    entry: TableEntry
    row: Row

    @property
    def name(self) -> str:
        return f"{self.entry.id}.{self.row.name}"


def select(registry: Registry, patterns: list[str], *, runnable: bool = False) -> list[Selected]:
    """Rows named `TABLE` (all its rows) or `TABLE.ROW`; `*` and `?` match as in a shell (`compaction.seed*`).
    With `runnable`, a pattern (not an exact name) leaves out the rows `run` cannot run: pinned or without a
    command; a row named exactly is kept, for `run` to refuse with its reason."""
    chosen: list[Selected] = []
    for pattern in patterns:
        table_pattern, _, row_pattern = pattern.partition(".")
        row_pattern = row_pattern or "*"
        exact = not any(ch in row_pattern for ch in "*?[")
        hits = [
            Selected(entry, row)
            for entry in registry.tables.values()
            if fnmatchcase(entry.id, table_pattern)
            for row in entry.rows
            if fnmatchcase(row.name, row_pattern)
        ]
        if not hits:
            known = ", ".join(f"{e.id}.{r.name}" for e in registry.tables.values() for r in e.rows)
            raise MeasureError(f"`{pattern}` names no row; rows: {known}")
        if runnable and not exact:
            hits = [hit for hit in hits if hit.row.command and not hit.row.pinned]
        chosen += [hit for hit in hits if hit not in chosen]
    return chosen


def refusals(selected: list[Selected]) -> list[str]:
    problems = []
    for item in selected:
        row = item.row
        if row.pinned:
            problems.append(f"{item.name} is pinned: {row.pinned}")
        elif not row.command:
            problems.append(f"{item.name} has no command ({row.note})")
            continue
        for column, cell in row.values.items():
            if item.entry.spec(row, column) is None and has_figure(cell):
                problems.append(f"{item.name}: column `{column}` ({cell!r}) has no parse spec to re-measure it")
    commands: dict[str, tuple[str, str]] = {}  # run_dir -> (command, row)
    for item in selected:
        if item.row.run_dir:
            command = _subst(item.row.command, item.row)
            first = commands.setdefault(item.row.run_dir, (command, item.name))
            if first[0] != command:
                problems.append(f"{item.name} and {first[1]} write {item.row.run_dir} with different commands")
    return problems


def _subst(text: str, row: Row) -> str:
    return text.replace("{run_dir}", row.run_dir)


def _follow(data: Any, key: str, where: str) -> Any:
    for part in key.split("."):
        try:
            data = data[int(part)] if isinstance(data, list) else data[part]
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise MeasureError(f"{where}: no `{part}` in {json.dumps(data)[:200]}") from e
    return data


def read_value(spec: str, output: str, root: Path, since: float | None = None) -> Any:
    """One value, as the module docstring says; a JSON file older than `since` (the command's start) is refused,
    so a command that did not write it cannot pass off an earlier run's figures."""
    body, op, factor = spec, "", 1.0
    if (match := _SCALE.match(spec)) and not spec.startswith("re:"):
        body, op, factor = match["body"], match["op"], float(match["factor"])
    if body.startswith("json:"):
        path, sep, key = body[5:].partition("#")
        if not sep or not key:
            raise MeasureError(f"`{spec}`: a json spec is json:PATH#KEY")
        try:
            if since is not None and (root / path).stat().st_mtime < since - 1:  # coarse file clocks
                raise MeasureError(f"`{spec}`: {path} was not written by this run (it is older than the command)")
            data = json.loads((root / path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise MeasureError(f"`{spec}`: cannot read {path}: {e}") from e
        value = _follow(data, key, f"`{spec}`")
    elif body.startswith("re:"):
        try:
            match = re.search(body[3:], output, re.MULTILINE)
        except re.error as e:
            raise MeasureError(f"`{spec}`: bad regex: {e}") from e
        if match is None or not match.groups():
            raise MeasureError(f"`{spec}`: no match (with a group) in the command's output")
        text = match.group(1)
        try:
            value = int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)
        except ValueError:
            value = text
    else:
        raise MeasureError(f"`{spec}`: a parse spec starts with json: or re:")
    if op:
        if not isinstance(value, int | float):
            raise MeasureError(f"`{spec}`: {value!r} is not a number to scale")
        value = value / factor if op == "/" else value * factor
    return value


def format_cell(spec: Spec, fmt: str, output: str, root: Path, since: float | None = None) -> str:
    """The cell `fmt` writes from the values `spec` reads: `str.format` with the values in order (`{0:.1%}`), or,
    for a format that starts with `=`, an f-string over `v`, the list of values (`={v[0] - v[1]:+d}`)."""
    return apply_format(fmt, [read_value(s, output, root, since) for s in ([spec] if isinstance(spec, str) else spec)])


def span(numbers: list[float], spec: str = ".1f", unit: str = "%") -> str:
    """A range as a README writes one: `59.5-66.5%`, or `0.0%` when every number is the same."""
    low, high = min(numbers), max(numbers)
    return f"{low:{spec}}{unit}" if low == high else f"{low:{spec}}-{high:{spec}}{unit}"


def apply_format(fmt: str, values: list[Any]) -> str:
    """`fmt` applied to `values`: `str.format` (`{0:.1%}`), or after `=` an f-string over `v` that may call `min`,
    `max`, `sum`, `len`, `round` and `span` (`={span(v[0])}` writes `59.5-66.5%`)."""
    try:
        if fmt.startswith("="):  # the registry is the repository's own file, as trusted as the commands it runs
            names = {"v": values, "min": min, "max": max, "sum": sum, "len": len, "round": round, "span": span}
            return str(eval(f"f{fmt[1:]!r}", {"__builtins__": {}}, names))
        return fmt.format(*values)
    except Exception as e:
        raise MeasureError(f"format {fmt!r} does not fit the values {values}: {e}") from e


def measured_cells(item: Selected, output: str, root: Path, since: float | None = None) -> dict[str, str]:
    row, entry = item.row, item.entry
    cells = dict(row.values)
    for column in row.values:
        spec = entry.spec(row, column)
        if spec is not None:
            spec = _subst(spec, row) if isinstance(spec, str) else [_subst(s, row) for s in spec]
            cells[column] = format_cell(spec, entry.fmt(row, column), output, root, since)
    return cells


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def current_commit(root: Path) -> str:
    """HEAD's short hash, with `+changes` when the code (not the docs) differs from it."""
    head = _git(root, "rev-parse", "--short", "HEAD").stdout.strip()
    if not head:
        return "unknown (not a git checkout)"
    dirty = _git(root, "diff", "--quiet", "HEAD", "--", "packages", "apps", "examples", "bench", "recipes")
    return head + ("+changes" if dirty.returncode else "")


def default_machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model or platform.machine()}"


def run_command(command: str, root: Path, echo: Callable[[str], None]) -> str:
    """Run `command` with bash in `root`, echoing and returning its output; a failure raises with its tail."""
    process = subprocess.Popen(
        ["bash", "-c", command], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in process.stdout or ():
        echo(line.rstrip("\n"))
        lines.append(line)
    code = process.wait()
    output = "".join(lines)
    if code:
        raise MeasureError(f"`{command}` exited {code}; its last output:\n{output[-2000:]}")
    return output


def run(
    registry: Registry,
    selected: list[Selected],
    root: Path,
    *,
    machine: str,
    echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
    after_each: Callable[[Selected], object] = lambda item: None,
) -> list[str]:
    """Run the selected rows and update them in `registry`, calling `after_each` after each row (the CLI saves
    there, so a failing command loses no earlier row); returns `name `column`: old -> new` lines of what moved."""
    problems = refusals(selected)
    if problems:
        raise MeasureError("refused, nothing ran:\n  " + "\n  ".join(problems))
    runs: dict[str, tuple[str, str, float]] = {}  # command -> (output, commit, start)
    moved = []
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    for item in selected:
        command = _subst(item.row.command, item.row)
        if command not in runs:
            echo(f"==> {item.name}: {command}")
            commit, started = current_commit(root), time.time()
            runs[command] = (run_command(command, root, echo), commit, started)
        output, commit, started = runs[command]
        cells = measured_cells(item, output, root, started)
        for column, cell in cells.items():
            if cell != item.row.values[column]:
                moved.append(f"{item.name} `{column}`: {item.row.values[column]} -> {cell}")
        item.row.values = cells
        item.row.commit, item.row.measured, item.row.machine = commit, today, machine
        item.row.source = RUN_SOURCE
        after_each(item)
    return moved
