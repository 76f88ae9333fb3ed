"""docs/ARCHITECTURE.md stays true: every code span in it that names something must resolve.

- a path (`packages/...`, `apps/...`, `tests/...`) exists;
- a `Name` (`file.py`) pair: that file defines the name (a class, a function, a module-level assignment or a
  re-export);
- a bare name (`AgentSession`, `make_recipe`, `tokenizers`): a class, function or module-level name defined in
  `packages/`, a module (ours or an installed one), or a Python builtin;
- a dotted name: `Class.member` (a method, property, class field or attribute set in a method of that class or
  one of its bases in `packages/`), or `module.name` / `module.Class.member` (the module ours or installed);
- an extra (`agent-runtime[serve]`): that package's pyproject declares it;
- a call form (`make_recipe()`) is checked as its name.

Spans that are none of these shapes (`<tool_call>`, `--train.agent_func_path`, `uv run apps/train --help`) are
prose, not names, and are not checked. Installed modules are found on disk (`importlib.util.find_spec` of the
top-level name, then the files below it), never imported, so the check stays fast and torch-free.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
PAIR = re.compile(r"`(\w+)` \(`([\w/.-]+\.py)`\)")
PATH = re.compile(r"(?:packages|apps|tests|bench|scripts|docs|examples)/[\w/.-]*")
EXTRA = re.compile(r"([\w-]+)\[(\w+)\]")
NAME = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?")


@dataclass
class ClassInfo:
    members: set[str] = field(default_factory=set)
    bases: set[str] = field(default_factory=set)


def defined_names(path: Path) -> set[str]:
    """Module-level names of one file: classes, functions, assignments and imported (re-exported) names."""
    names: set[str] = set()
    for node in _tree(path).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.TypeAlias):
            names.add(node.name.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def class_infos(path: Path) -> dict[str, ClassInfo]:
    """Every class of one file (nested ones too) with its members and the simple names of its bases."""
    infos: dict[str, ClassInfo] = {}
    for node in ast.walk(_tree(path)):
        if not isinstance(node, ast.ClassDef):
            continue
        info = infos.setdefault(node.name, ClassInfo())
        info.bases.update(
            b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))
        )
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info.members.add(item.name)
                info.members.update(_self_attributes(item))
            elif isinstance(item, ast.Assign):
                info.members.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                info.members.add(item.target.id)
    return infos


def _self_attributes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(function):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


class Index:
    """What `packages/` defines: modules by dotted name, module-level names, classes by simple name."""

    def __init__(self, root: Path) -> None:
        self.modules: dict[str, Path] = {}
        self.top_level: set[str] = set()
        self.classes: dict[str, ClassInfo] = {}
        for path in sorted(root.glob("packages/*/src/**/*.py")):
            src = next(p for p in path.parents if p.name == "src")
            parts = path.relative_to(src).with_suffix("").parts
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
            self.top_level.update(
                n.name for n in _tree(path).body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            )
            self.top_level.update(defined_names(path) - _imported_names(path))
            for name, info in class_infos(path).items():
                merged = self.classes.setdefault(name, ClassInfo())
                merged.members |= info.members
                merged.bases |= info.bases

    def members(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """Members of the classes called `name`, with those of their bases defined in `packages/`."""
        info = self.classes.get(name)
        if info is None or name in seen:
            return set()
        found = set(info.members)
        for base in info.bases:
            found |= self.members(base, seen | {name})
        return found

    def module_file(self, dotted: str) -> Path | None:
        """The file of a module, ours or installed (found on disk, not imported); None when there is none."""
        if dotted in self.modules:
            return self.modules[dotted]
        top, *rest = dotted.split(".")
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if not rest:
            return Path(spec.origin) if spec.origin else Path(top)
        where = [Path(p) for p in spec.submodule_search_locations or []]
        for i, part in enumerate(rest):
            last = i == len(rest) - 1
            candidates = [d / part / "__init__.py" for d in where] + ([d / f"{part}.py" for d in where] if last else [])
            hit = next((c for c in candidates if c.is_file()), None)
            if hit is None:
                return None
            where = [hit.parent]
        return hit


def _imported_names(path: Path) -> set[str]:
    return {a.asname or a.name for n in _tree(path).body if isinstance(n, ast.ImportFrom) for a in n.names}


def resolve(name: str, index: Index) -> str | None:
    """None when `name` resolves; otherwise why it does not."""
    parts = name.split(".")
    if len(parts) == 1:
        if name in index.top_level or hasattr(builtins, name) or index.module_file(name) is not None:
            return None
        return f"`{name}` names no class, function, module or constant"
    owner, *rest = parts
    if owner in index.classes:
        if len(rest) == 1 and rest[0] in index.members(owner):
            return None
        return f"`{name}`: class {owner} has no member {'.'.join(rest)}"
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        path = index.module_file(module)
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if path.suffix != ".py":
            return f"`{name}`: module {module} has no Python source to check {rest[0]} against"
        if rest[0] not in defined_names(path):
            return f"`{name}`: module {module} defines no {rest[0]}"
        if len(rest) == 1 or (len(rest) == 2 and rest[1] in class_infos(path).get(rest[0], ClassInfo()).members):
            return None
        return f"`{name}`: {module}.{rest[0]} has no member {'.'.join(rest[1:])}"
    return f"`{name}`: {owner} is no class in packages/ and no module"


def check_extra(package: str, extra: str) -> str | None:
    pyproject = ROOT / "packages" / package / "pyproject.toml"
    if not pyproject.is_file():
        return f"`{package}[{extra}]`: no package {package} in packages/"
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"].get("optional-dependencies", {})
    return None if extra in extras else f"`{package}[{extra}]`: {package} declares no extra {extra}"


def check(text: str, index: Index | None = None) -> list[str]:
    """Every problem with `text` (a Markdown page), in the order they appear."""
    index = index or Index(ROOT)
    text = FENCE.sub("", text)
    problems: list[str] = []
    for name, file in PAIR.findall(text):
        path = ROOT / file
        if path.is_file() and name not in defined_names(path):
            problems.append(f"{file} does not define {name}")
    for span in SPAN.findall(text):
        if PATH.fullmatch(span):
            if not (ROOT / span).exists():
                problems.append(f"{span} does not exist")
        elif extra := EXTRA.fullmatch(span):
            problems.append(check_extra(extra[1], extra[2]) or "")
        elif name := NAME.fullmatch(span):
            problems.append(resolve(name[1], index) or "")
    return [p for p in problems if p]


@cache
def _index() -> Index:
    return Index(ROOT)


def test_architecture_doc_matches_the_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert len(PAIR.findall(text)) >= 30
    assert len([s for s in SPAN.findall(FENCE.sub("", text)) if NAME.fullmatch(s)]) >= 70  # the names it checks
    assert check(text, _index()) == []


def test_the_check_names_every_kind_of_drift() -> None:
    bad = (
        "`Nope` (`packages/agent-runtime/src/agent_runtime/session.py`), `packages/missing/file.py`, "
        "`AgentSession.no_such_method`, `NoSuchClass.reset`, `no_such_function`, `NoSuchThing`, "
        "`agent_protocol.no_such_module`, `agent_protocol.types.NoSuchType`, `agent_protocol.types.Message.nope`, "
        "`no_such_module.thing`, `agent-runtime[nope]`, `agent-nope[serve]`, `no_such_call()`"
    )
    assert check(bad, _index()) == [
        "packages/agent-runtime/src/agent_runtime/session.py does not define Nope",
        "`Nope` names no class, function, module or constant",
        "packages/missing/file.py does not exist",
        "`AgentSession.no_such_method`: class AgentSession has no member no_such_method",
        "`NoSuchClass.reset`: NoSuchClass is no class in packages/ and no module",
        "`no_such_function` names no class, function, module or constant",
        "`NoSuchThing` names no class, function, module or constant",
        "`agent_protocol.no_such_module`: module agent_protocol defines no no_such_module",
        "`agent_protocol.types.NoSuchType`: module agent_protocol.types defines no NoSuchType",
        "`agent_protocol.types.Message.nope`: agent_protocol.types.Message has no member nope",
        "`no_such_module.thing`: no_such_module is no class in packages/ and no module",
        "`agent-runtime[nope]`: agent-runtime declares no extra nope",
        "`agent-nope[serve]`: no package agent-nope in packages/",
        "`no_such_call` names no class, function, module or constant",
    ]


def test_the_check_accepts_every_kind_of_real_name() -> None:
    good = (
        "`AgentSession` (`packages/agent-runtime/src/agent_runtime/session.py`), `AgentSession.step`, "
        "`Environment.max_steps` (set in __init__), `Message.tool_calls` (a struct field), "
        "`CompactableSession.reset` (inherited from AgentSession), `make_recipe()`, `tokenizers`, `eval`, "
        "`agent_protocol.types.Message`, `openrlhf.utils.agent.AgentExecutorBase`, `agent-runtime[serve]`, "
        "`<tool_call>`, `--train.agent_func_path`, `uv run apps/train --help`"
    )
    assert check(good, _index()) == []


def test_a_broken_copy_of_the_doc_fails() -> None:
    """The real page with a few names misspelt the way drift happens: a renamed class, method and function."""
    text = DOC.read_text(encoding="utf-8")
    broken = (
        text.replace("`AgentSession.step`", "`AgentSesion.step`")
        .replace("`AgentSession.record`", "`AgentSession.to_record`")
        .replace("`make_recipe`", "`make_recipes`")
    )
    assert broken != text
    assert check(broken, _index()) == [
        "packages/agent-demo/src/agent_demo/recipe.py does not define make_recipes",
        "`make_recipes` names no class, function, module or constant",
        "`AgentSesion.step`: AgentSesion is no class in packages/ and no module",
        "`AgentSession.to_record`: class AgentSession has no member to_record",
    ]
