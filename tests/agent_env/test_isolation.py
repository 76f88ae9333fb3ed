"""agent-env imports agent-protocol and third-party libraries only; importing it pulls in no heavy library
(mcp, bm25s, math-verify load on first use)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "agent-env"
UPPER_LAYERS = ("agent_runtime", "agent_train", "apps")


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_imports_an_upper_layer() -> None:
    sources = sorted((PACKAGE / "src" / "agent_env").rglob("*.py"))
    assert len(sources) > 10
    for source in sources:
        assert not imported_roots(source) & set(UPPER_LAYERS), source


def test_dependencies_name_no_upper_layer() -> None:
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    names = [dep.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"]]
    assert "agent-protocol" in names
    assert not {"agent-runtime", "agent-train"} & set(names)
    assert project["version"] == "0.1.0"


def test_importing_the_package_is_light() -> None:
    probe = """
import json, sys
import agent_env, agent_env.tools, agent_env.rewards
heavy = sorted(m for m in ("mcp", "bm25s", "math_verify", "sympy", "torch") if m in sys.modules)
upper = sorted(m for m in sys.modules if m.split(".")[0] in ("agent_runtime", "agent_train", "vllm"))
print(json.dumps({"heavy": heavy, "upper": upper}))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"heavy": [], "upper": []}


def test_every_public_name_resolves_including_the_lazy_ones() -> None:
    import agent_env
    import agent_env.rewards
    import agent_env.tools

    for module in (agent_env, agent_env.tools, agent_env.rewards):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
    assert agent_env.MCPBridge.__name__ == "MCPBridge"
    assert agent_env.MathReward.__name__ == "MathReward"
    assert agent_env.SearchIndex.__name__ == "SearchIndex"
