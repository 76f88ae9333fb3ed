"""The layering protocol < env < runtime < demo < train < apps, checked on every import statement and on every
declared dependency, and every import of another layer going through that layer's face (its `__init__`'s
`__all__`). A violation fails CI."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["agent_protocol", "agent_env", "agent_runtime", "agent_demo", "agent_train"]  # bottom to top
PACKAGES = {name: ROOT / "packages" / name.replace("_", "-") for name in LAYERS}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def violations(layer_index: int, files: list[Path]) -> list[str]:
    above = set(LAYERS[layer_index + 1 :])
    return [
        f"{file.relative_to(ROOT) if file.is_relative_to(ROOT) else file} imports {module}"
        for file in files
        for module in sorted(imported_modules(file) & above)
    ]


@pytest.mark.parametrize("layer", LAYERS)
def test_no_package_imports_a_higher_layer(layer: str) -> None:
    files = sorted((PACKAGES[layer] / "src").rglob("*.py"))
    assert files, f"no sources found for {layer}"
    assert violations(LAYERS.index(layer), files) == []


@pytest.mark.parametrize("layer", LAYERS)
def test_declared_dependencies_point_down(layer: str) -> None:
    project = tomllib.loads((PACKAGES[layer] / "pyproject.toml").read_text())["project"]
    deps = {d.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for d in project["dependencies"]}
    ours = {d.replace("-", "_") for d in deps} & set(LAYERS)
    assert ours <= set(LAYERS[: LAYERS.index(layer)]), f"{layer} depends on {sorted(ours)}"
    # and each lower layer is a version range, so layers release on their own
    for dep in project["dependencies"]:
        if dep.split(">")[0].strip().replace("-", "_") in LAYERS:
            assert ">=" in dep and "<" in dep, f"{layer}: {dep!r} should be a version range"


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom agent_runtime.session import AgentSession\nimport agent_protocol\n")
    assert violations(LAYERS.index("agent_env"), [bad]) == [f"{bad} imports agent_runtime"]
    assert violations(LAYERS.index("agent_runtime"), [bad]) == []


# Package faces: a layer relies on another only through a face, a package's `__init__` (the package or one of its
# subpackages), and only on names that face lists in `__all__`. So `__all__` says all that the layers above use,
# and a module below can be renamed or split without breaking them. Tests may reach inside; sources and apps may not.
FACE_CHECKED = [*(PACKAGES[layer] / "src" for layer in LAYERS), ROOT / "apps"]


def face_exports(module: str) -> set[str] | None:
    """The names `module`'s `__init__` lists in `__all__`, or None when `module` is not a package of ours."""
    top = module.split(".")[0]
    init = PACKAGES[top] / "src" / Path(*module.split(".")) / "__init__.py"
    if not init.is_file():
        return None
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            assert isinstance(node.value, ast.List | ast.Tuple), f"{init}: __all__ is not a literal list"
            return {ast.literal_eval(element) for element in node.value.elts}
    return set()


def face_violations(file: Path) -> list[str]:
    """Every import in `file` of another layer that does not go through a face, or names what the face does not
    export."""
    shown = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file
    own = next((layer for layer in LAYERS if PACKAGES[layer] in file.parents), None)
    found: list[str] = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), filename=str(file))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imports = [(node.module, [alias.name for alias in node.names])]
        elif isinstance(node, ast.Import):
            imports = [(alias.name, []) for alias in node.names]
        else:
            continue
        for module, names in imports:
            if module.split(".")[0] not in LAYERS or module.split(".")[0] == own:
                continue
            exported = face_exports(module)
            if exported is None:
                found.append(f"{shown}:{node.lineno} imports {module}, not a package face")
            else:
                found.extend(f"{shown}:{node.lineno} imports {name} from {module}, not in its __all__"
                             for name in names if name not in exported)  # fmt: skip
    return found


def test_every_cross_package_import_goes_through_a_package_face() -> None:
    files = sorted(file for folder in FACE_CHECKED for file in folder.rglob("*.py"))
    found = [problem for file in files for problem in face_violations(file)]
    assert found == [], "\n".join(found)


def test_the_face_checker_catches_a_reach_inside(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from agent_protocol.types import Message\nfrom agent_protocol import Message as M, not_exported\n"
        "import agent_runtime.engines\nfrom agent_runtime.engines import HFEngine\n"
    )
    assert face_violations(bad) == [
        f"{bad}:1 imports agent_protocol.types, not a package face",
        f"{bad}:2 imports not_exported from agent_protocol, not in its __all__",
    ]
