"""Library code configures no logging: no module under packages/*/src calls `structlog.configure`,
`logging.basicConfig` or `logging.config.*Config` except in an entry point (a ``__main__.py`` or ``cli.py`` module,
or an ``if __name__ == "__main__":`` block). The apps configure logging; a library that did would override them.
(`tests/agent_train/test_local_evaluate.py` checks the same by calling the evaluation command in process.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGURING = {"structlog.configure", "structlog.configure_once", "logging.basicConfig", "logging.config.dictConfig",
               "logging.config.fileConfig"}  # fmt: skip
ENTRY_MODULES = {"__main__.py", "cli.py"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _is_main_guard(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def configuring_calls(path: Path) -> list[str]:
    """`file:line name` for each logging-configuring call of a library module, outside a `__main__` guard."""
    if path.name in ENTRY_MODULES:
        return []
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if _is_main_guard(node):
            return
        if isinstance(node, ast.Call) and _dotted(node.func) in CONFIGURING:
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} "
                         f"{_dotted(node.func)}")  # fmt: skip
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def test_no_library_module_configures_logging() -> None:
    files = sorted(ROOT.glob("packages/*/src/**/*.py"))
    assert files
    assert [call for file in files for call in configuring_calls(file)] == []


def test_the_check_finds_a_library_call_and_spares_an_entry_point(tmp_path: Path) -> None:
    library = tmp_path / "evaluate.py"
    library.write_text(
        "import logging\nimport structlog\n\ndef main():\n    structlog.configure(processors=[])\n"
        "    logging.basicConfig()\n\nif __name__ == '__main__':\n    structlog.configure()\n"
    )
    assert configuring_calls(library) == [f"{library}:5 structlog.configure", f"{library}:6 logging.basicConfig"]
    entry = tmp_path / "cli.py"
    entry.write_text("import structlog\nstructlog.configure()\n")
    assert configuring_calls(entry) == []
