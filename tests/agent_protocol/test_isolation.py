"""agent-protocol stays tiny: importing it pulls in no torch, transformers, jinja2 or HTTP stack."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["torch", "transformers", "jinja2", "numpy", "httpx", "aiohttp", "vllm", "agent_env", "agent_runtime"]


def test_import_pulls_in_nothing_heavy() -> None:
    code = (
        "import sys, json, agent_protocol; agent_protocol.get_protocol('qwen3'); "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_declared_dependencies_are_only_msgspec_and_tokenizers() -> None:
    project = tomllib.loads((ROOT / "packages/agent-protocol/pyproject.toml").read_text())["project"]
    names = sorted(dep.split(">")[0].split("=")[0].split("<")[0].strip() for dep in project["dependencies"])
    assert names == ["msgspec", "tokenizers"]
