"""`uv run apps/serve --trajectories PATH` as a user runs it (a subprocess, stopped with Ctrl-C): the viewer alone,
no model loaded, the records' tokens decoded by `--tokenizer`; `--help` explains the flags; a path that does not
exist is a usage error naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agent_protocol import HFTokenizer
from tests.serve.conftest import ServerFactory
from tests.serve.viewer_records import calculator_log
from tests.support.serve_process import APP, ServeProcess, free_port


@pytest.fixture(scope="module")
def log(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return calculator_log(start_server, tmp_path_factory.mktemp("served") / "trajectories.jsonl", questions=1)


def test_help_explains_the_viewer_flags() -> None:
    result = subprocess.run([sys.executable, str(APP), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "--trajectories PATH" in text and "no model is loaded" in text
    assert "--tokenizer PATH" in text


def test_the_viewer_alone_loads_no_model(log: Path, qwen3_tokenizer_file: Path, tokenizer: HFTokenizer) -> None:
    args = ["--trajectories", str(log.parent), "--tokenizer", str(qwen3_tokenizer_file), "--port", str(free_port())]
    with ServeProcess([*args, "--log-format", "json"]) as app:
        page = httpx.get(f"{app.url}/", timeout=10)
        assert page.status_code == 200 and "/static/viewer.js" in page.text
        listing = httpx.get(f"{app.url}/trajectories", timeout=10).json()
        assert [item["file"] for item in listing["items"]] == ["trajectories.jsonl"] * 2
        record = httpx.get(f"{app.url}/trajectories/{listing['items'][0]['id']}", timeout=10).json()
        segment = record["segments"][0]
        assert "".join(segment["pieces"]) == tokenizer.decode(segment["ids"])
        assert httpx.post(f"{app.url}/v1/chat/completions", json={}, timeout=10).status_code == 404  # no model
    assert app.returncode == 0
    assert "engine_loading" not in app.stderr


def test_a_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = subprocess.run(
        [sys.executable, str(APP), "--trajectories", str(missing)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert f"--trajectories {missing}: no such file or directory" in result.stderr
