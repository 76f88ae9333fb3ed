"""The layering protocol < env < runtime < demo < train < apps, checked on every import statement and on every
declared dependency. A violation fails CI."""

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
