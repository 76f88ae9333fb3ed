"""docs/ARCHITECTURE.md stays true: every path it names exists, and every `Name` (`file.py`) pair names
something that file defines (a class, a function or a module-level assignment)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PAIR = re.compile(r"`(\w+)` \(`([\w/.-]+\.py)`\)")
PATH = re.compile(r"`((?:packages|apps|tests|bench|scripts|docs|examples)/[\w/.-]*)`")
METHOD = re.compile(r"`(\w+)\.(\w+)`")


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def class_methods() -> dict[str, set[str]]:
    methods: dict[str, set[str]] = {}
    for path in (ROOT / "packages").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods.setdefault(node.name, set()).update(
                    item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                )
    return methods


def check(text: str) -> list[str]:
    problems = []
    for name, file in PAIR.findall(text):
        path = ROOT / file
        if not path.is_file():
            problems.append(f"{file} does not exist")
        elif name not in defined_names(path):
            problems.append(f"{file} does not define {name}")
    for file in PATH.findall(text):
        if not (ROOT / file).exists():
            problems.append(f"{file} does not exist")
    methods = class_methods()
    for owner, method in METHOD.findall(text):
        if owner in methods and method not in methods[owner]:
            problems.append(f"{owner} has no method {method}")
    return problems


def test_architecture_doc_matches_the_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert len(PAIR.findall(text)) >= 30
    assert check(text) == []


def test_the_check_catches_drift() -> None:
    bad = (
        "`Nope` (`packages/agent-runtime/src/agent_runtime/session.py`), `packages/missing/file.py`, "
        "`AgentSession.no_such_method`"
    )
    assert check(bad) == [
        "packages/agent-runtime/src/agent_runtime/session.py does not define Nope",
        "packages/missing/file.py does not exist",
        "AgentSession has no method no_such_method",
    ]
