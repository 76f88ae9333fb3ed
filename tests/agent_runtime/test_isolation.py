"""Heavy backends stay optional: importing agent_runtime (and its engines package) imports no torch, transformers,
vllm or web framework."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "transformers", "vllm", "litestar", "starlette", "uvicorn", "openrlhf"]


def test_import_pulls_in_no_heavy_backend() -> None:
    code = (
        "import sys, json, agent_runtime, agent_runtime.engines, agent_runtime.recipe; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
