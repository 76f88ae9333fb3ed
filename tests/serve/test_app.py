"""`apps/serve` as a user runs it: a subprocess serving the tiny random-weight Qwen3 model on the hf engine, the
openai client against it, JSON logs, and a clean stop on Ctrl-C. Also: `--help` explains every option, and the
default recipe is found (or the fallback is logged)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from agent_runtime.serving import ServeConfig, calculator_recipe
from tests.support.serve_process import APP, ServeProcess, free_port

OPTIONS = [
    "--model",
    "--engine",
    "--engine-url",
    "--recipe",
    "--host",
    "--port",
    "--api-key",
    "--max-concurrency",
    "--log-format",
    "--trajectory-log",
    "--engine-timeout",
    "--max-request-bytes",
    "--request-read-timeout",
    "--max-chars-per-token",
    "--max-buffered-request-bytes",
]


def test_help_explains_every_option() -> None:
    result = subprocess.run([sys.executable, str(APP), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for option in OPTIONS:
        assert option in result.stdout
    assert "hf,vllm,openai" in result.stdout


def test_the_app_serves_a_real_model_and_stops_cleanly(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "trajectories.jsonl"
    args = [
        "--model", str(tiny_qwen3_dir), "--port", str(port), "--log-format", "json",
        "--recipe", "agent_runtime.serving.fallback_recipe:calculator_recipe", "--trajectory-log", str(log),
        "--api-key", "k",
    ]  # fmt: skip
    with ServeProcess(args) as app:
        assert app.url == f"http://127.0.0.1:{port}"
        client = OpenAI(base_url=f"{app.url}/v1", api_key="k", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny-qwen3", "calculator-agent"]
        completion = client.chat.completions.create(
            model="tiny-qwen3", messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=4, seed=0
        )
        assert completion.choices[0].finish_reason in ("stop", "length")
        assert completion.usage is not None and completion.usage.completion_tokens > 0
        # random weights: the text is gibberish, but the served tokens are the model's and are logged
        ((record),) = [json.loads(line) for line in log.read_text().splitlines()]
        assert sum(record["segments"][-1]["loss_mask"]) == completion.usage.completion_tokens
    assert app.returncode == 0, app.stderr[-3000:]
    events = [json.loads(line) for line in app.stderr.splitlines() if line.startswith("{")]
    names = [e.get("event") for e in events]
    assert "server_started" in names and "request_served" in names and "server_stopped" in names
    assert all("timestamp" in e and "level" in e for e in events)


def test_the_default_recipe_is_found_or_the_fallback_is_logged() -> None:
    code = (
        "import runpy, sys; sys.argv = ['serve']; "
        f"m = runpy.run_path({str(APP / '__main__.py')!r}, run_name='serve_app'); "
        "m['configure_logging']('json', 'info'); r = m['serving_recipe'](None); print('RECIPE', r.name)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "RECIPE " in result.stdout
    if "demo_recipe_unavailable" in result.stderr:
        assert "RECIPE calculator-agent" in result.stdout


def test_the_limits_given_on_the_command_line_reach_the_server() -> None:
    app = runpy.run_path(str(APP / "__main__.py"), run_name="serve_app")
    args = app["parse_args"](
        ["--engine-timeout", "7.5", "--max-request-bytes", "1000", "--request-read-timeout", "2",
         "--max-chars-per-token", "16", "--max-buffered-request-bytes", "5000", "--model", "some/model"]
    )  # fmt: skip
    config = app["serve_config"](args, calculator_recipe(), "some/model")
    assert config == ServeConfig(
        model_name="some/model", aliases=("calculator-agent",), engine_timeout_s=7.5, max_request_bytes=1000,
        request_read_timeout_s=2.0, max_chars_per_token=16.0, max_buffered_request_bytes=5000,
    )  # fmt: skip
    defaults = app["serve_config"](app["parse_args"]([]), calculator_recipe(), "unused")
    assert defaults.engine_timeout_s == 600.0 and defaults.max_request_bytes == 8 * 1024 * 1024
    for wrong in (["--engine-timeout", "0"], ["--engine-timeout", "nan"], ["--request-read-timeout", "-1"],
                  ["--max-request-bytes", "0"], ["--max-buffered-request-bytes", "10"]):  # fmt: skip
        with pytest.raises(SystemExit) as caught:
            app["parse_args"](wrong)
        assert caught.value.code == 2
