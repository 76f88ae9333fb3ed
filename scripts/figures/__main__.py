"""scripts/figures: every figure in a README table has its command, commit, date and machine in docs/figures.toml.

    uv run scripts/figures list                        # every registered row: its command, commit, date, machine
    uv run scripts/figures check                       # README tables == registry (CI runs this, tests/test_figures.py)
    uv run scripts/figures run demo.seed0 compaction   # re-run rows, update the registry, rewrite the tables
    uv run scripts/figures write                       # rewrite the README tables from the registry (and derived rows)
    uv run scripts/figures adopt demo                  # after reshaping a table by hand: the registry takes its cells

Argument parsing and wiring only: `figures.check` compares and writes, `figures.measure` runs and reads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from figures.adopt import adopt
from figures.check import check, write
from figures.derived import refresh
from figures.measure import MeasureError, Selected, default_machine, refusals, run, select
from figures.registry import RegistryError, Row, load, save, save_rows

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "docs/figures.toml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/figures",
        description=__doc__.split("\n\nArgument parsing")[0],
        epilog="NAME is TABLE (every row) or TABLE.ROW, shell patterns allowed (`compaction.seed*`); "
        "`list` prints them. The registry's header says which tables are registered and how a figure is parsed.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    parser.add_argument("--registry", default=REGISTRY, help=f"relative to the root (default {REGISTRY})")
    sub = parser.add_subparsers(dest="action", required=True)
    listing = sub.add_parser("list", help="every row: table.row, command, commit, date, machine")
    listing.add_argument("names", nargs="*", metavar="NAME")
    sub.add_parser("check", help="fail (exit 1) unless every README table with figures matches the registry")
    runner = sub.add_parser("run", help="re-run rows' commands, update their figures, commit, date, machine")
    runner.add_argument(
        "names",
        nargs="+",
        metavar="NAME",
        help="TABLE or TABLE.ROW, shell patterns allowed; a pattern leaves out pinned rows and rows without a command",
    )
    runner.add_argument(
        "--machine", default=default_machine(), help="how the registry names this machine (default: %(default)s)"
    )
    runner.add_argument("--dry-run", action="store_true", help="print what would run and what is refused")
    runner.add_argument("--no-write", action="store_true", help="update the registry only, not the READMEs")
    adopter = sub.add_parser("adopt", help="take a reshaped (or newly marked) README table into the registry as it is")
    adopter.add_argument("table", metavar="TABLE")
    adopter.add_argument("--file", help="the README holding a table the registry does not have yet")
    writer = sub.add_parser("write", help="rewrite the marked README tables from the registry")
    writer.add_argument("tables", nargs="*", metavar="TABLE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root: Path = args.root.resolve()
    path = root / args.registry
    try:
        registry = load(path)
        if args.action == "check":
            problems = check(root, registry)
            for problem in problems:
                print(problem)
            rows = sum(len(entry.rows) for entry in registry.tables.values())
            print(f"{len(problems)} problem(s); {len(registry.tables)} tables, {rows} rows registered", file=sys.stderr)
            return 1 if problems else 0
        if args.action == "list":
            for item in select(registry, args.names or ["*"]):
                row = item.row
                state = f"pinned: {row.pinned}" if row.pinned else (row.command or f"no command: {row.note}")
                print(f"{item.name}\n    {state}\n    {row.commit}, {row.measured}, {row.machine}")
            return 0
        if args.action == "adopt":
            changes = adopt(root, registry, args.table, args.file)
            save(registry, path)
            print("\n".join(changes) or "nothing changed")
            print(f"updated {args.registry}: now fill in what `check` asks for (commands, parse specs, provenance)")
            return 0
        if args.action == "write":
            unknown = [t for t in args.tables if t not in registry.tables]
            if unknown:
                print(f"scripts/figures: error: no table {unknown}; tables: {sorted(registry.tables)}", file=sys.stderr)
                return 2
            moved = refresh(registry)
            for line in moved:
                print(line)
            if moved:
                save(registry, path)
                print(f"updated {args.registry} (derived rows)")
            for name in write(root, registry, args.tables or None):
                print(f"rewrote {name}")
            return 0
        selected = select(registry, args.names, runnable=True)
        if not selected:
            print("scripts/figures: error: no runnable row (pinned rows and rows without a command are left out)")
            return 2
        if args.dry_run:
            for problem in refusals(selected):
                print(f"refused: {problem}")
            for item in selected:
                print(f"{item.name}: {item.row.command.replace('{run_dir}', item.row.run_dir)}")
            return 0
        done: list[tuple[str, Row]] = []

        def keep(item: Selected) -> None:  # each row saved as it is measured: a later failure loses nothing
            done.append((item.entry.id, item.row))
            save_rows(path, done)

        for line in run(registry, selected, root, machine=args.machine, after_each=keep):
            print(line)
        derived: list[str] = []
        registry = save_rows(path, done, then=lambda latest: derived.extend(refresh(latest)))
        print("\n".join([*derived, f"updated {args.registry} ({len(selected)} rows)"]))
        if not args.no_write:
            for name in write(root, registry):
                print(f"rewrote {name}")
        return 0
    except (RegistryError, MeasureError, LookupError, OSError) as e:
        print(f"scripts/figures: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
