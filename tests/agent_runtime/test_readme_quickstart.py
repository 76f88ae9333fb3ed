"""The agent-runtime README's complete inference loop runs as written (`AgentSession(environment=..., protocol=...,
context=CompactionPolicy())`, `AgentRuntime(engine, session, max_context_tokens=96000)`) on a real `hf` engine. The
only change made to the code block is the model path, which points at the tests' tiny random-weight Qwen3 (the real
tokenizer and chat template); a random model answers nonsense, so what is checked is that the loop runs to its final
event, not what the answer says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "packages" / "agent-runtime" / "README.md"
PLACEHOLDER = "path/to/qwen3-model"


def quickstart() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## A complete inference loop", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README lost its inference loop"
    return match.group(1)


def test_the_readme_inference_loop_runs_as_written(tiny_qwen3_dir: Path) -> None:
    pytest.importorskip("torch")
    code = quickstart()
    assert "context=CompactionPolicy()" in code and "max_context_tokens=96000" in code and PLACEHOLDER in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(PLACEHOLDER, str(tiny_qwen3_dir)), str(README), "exec"), {"__name__": "readme"})
    printed = out.getvalue()
    final = printed[printed.rfind("\nanswer ") + 1 :]  # the answer of a random model may hold newlines
    assert final.startswith("answer ") and re.search(r" reward -?\d+(\.\d+)?\s*$", final), printed[-2000:]
