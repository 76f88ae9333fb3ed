"""`apps/serve` as a user runs it: a subprocess serving the tiny random-weight Qwen3 model on the hf engine, the
openai client against it, JSON logs, and a clean stop on Ctrl-C. Also: `--help` explains every option, the demo
recipe is served only for the demo model, and a model named without a recipe gets one derived from its directory."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from agent_protocol import list_protocols
from agent_runtime.serving import ServeConfig, ServeConfigError
from tests.support.calculator_recipe import CALCULATOR_RECIPE_FILE, calculator_recipe
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
    "--max-batch-tokens",
    "--join-ratio",
    "--join-wait-steps",
    "--replicas",
    "--ray-address",
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
        "--recipe", str(CALCULATOR_RECIPE_FILE), "--trajectory-log", str(log),
        "--api-key", "k",
    ]  # fmt: skip
    with ServeProcess(args) as app:
        assert app.url == f"http://127.0.0.1:{port}"
        client = OpenAI(base_url=f"{app.url}/v1", api_key="k", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny-qwen3", "calculator"]
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


def test_the_demo_recipe_is_served_only_for_the_demo_model(tiny_qwen3_dir: Path) -> None:
    app = runpy.run_path(str(APP / "__main__.py"), run_name="serve_app")
    serving_recipe = app["serving_recipe"]
    demo = serving_recipe(app["parse_args"]([]))
    assert demo.name == "demo-calculator" and demo.max_context_tokens == 512
    derived = serving_recipe(app["parse_args"](["--model", str(tiny_qwen3_dir)]))
    assert derived.name == "tiny-qwen3" and derived.protocol == "qwen3"
    assert derived.max_context_tokens == 4096 and derived.max_new_tokens == 2048  # the config's, not the demo's
    assert derived.environment().tools == []  # no tools in agent mode unless a recipe names them
    shorter = serving_recipe(app["parse_args"](["--model", str(tiny_qwen3_dir), "--context-length", "1000"]))
    assert (shorter.max_context_tokens, shorter.max_new_tokens) == (1000, 500)
    chosen = serving_recipe(
        app["parse_args"](["--model", str(tiny_qwen3_dir), "--recipe", str(CALCULATOR_RECIPE_FILE)])
    )
    assert chosen.name == "calculator"


def test_a_model_of_an_unknown_family_is_refused_at_startup(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 8192}))
    (other / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ bos_token }}{{ messages }}"}))
    result = subprocess.run(
        [sys.executable, str(APP), "--model", str(other), "--log-format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    (failure,) = [json.loads(line) for line in result.stderr.splitlines() if '"startup_failed"' in line]
    assert str(other) in failure["error"] and "model_type 'llama'" in failure["error"]
    assert ", ".join(list_protocols()) in failure["error"] and "--recipe" in failure["error"]


def test_the_limits_given_on_the_command_line_reach_the_server() -> None:
    app = runpy.run_path(str(APP / "__main__.py"), run_name="serve_app")
    args = app["parse_args"](
        ["--engine-timeout", "7.5", "--max-request-bytes", "1000", "--request-read-timeout", "2",
         "--max-chars-per-token", "16", "--max-buffered-request-bytes", "5000", "--model", "some/model",
         "--max-image-bytes", "900", "--max-image-pixels", "640", "--max-request-pixels", "700", "--max-images", "5"]
    )  # fmt: skip
    config = app["serve_config"](args, calculator_recipe(), "some/model")
    assert config == ServeConfig(
        model_name="some/model", aliases=("calculator",), engine_timeout_s=7.5, max_request_bytes=1000,
        request_read_timeout_s=2.0, max_chars_per_token=16.0, max_buffered_request_bytes=5000,
        max_image_bytes=900, max_image_pixels=640, max_request_pixels=700, max_images=5,
    )  # fmt: skip
    defaults = app["serve_config"](app["parse_args"]([]), calculator_recipe(), "unused")
    assert defaults.engine_timeout_s == 600.0 and defaults.max_request_bytes == 8 * 1024 * 1024
    for wrong in (["--engine-timeout", "0"], ["--engine-timeout", "nan"], ["--request-read-timeout", "-1"],
                  ["--max-request-bytes", "0"], ["--max-buffered-request-bytes", "10"], ["--max-image-bytes", "0"],
                  ["--max-image-pixels", "-3"], ["--max-request-pixels", "0"], ["--max-images", "0"]):  # fmt: skip
        with pytest.raises(SystemExit) as caught:
            app["parse_args"](wrong)
        assert caught.value.code == 2


def test_the_command_line_defaults_and_bounds_are_the_configs_own() -> None:
    """One place for the settings: every flag's default is `ServeConfig`'s, and the struct refuses what the flags
    refuse (NaN too), so a server built in code cannot take a limit the command line would not."""
    import msgspec

    app = runpy.run_path(str(APP / "__main__.py"), run_name="serve_app")
    args = app["parse_args"]([])
    given = ServeConfig.from_args(args, model_name="m")
    assert given == ServeConfig(model_name="m"), "a flag's default differs from the struct's"
    shown = {field.name for field in msgspec.structs.fields(ServeConfig)} - {"model_name", "aliases", "api_key"}
    assert shown <= set(vars(args)), f"settings without a flag: {sorted(shown - set(vars(args)))}"
    for wrong in ({"engine_timeout_s": float("nan")}, {"max_chars_per_token": float("nan")}, {"max_images": 0},
                  {"transcript_store_tokens": -1}, {"max_buffered_request_bytes": 10}):  # fmt: skip
        with pytest.raises(ServeConfigError):
            ServeConfig(model_name="m", **wrong)
    store = app["parse_args"](["--transcript-store-conversations", "0", "--transcript-store-bytes", "4096"])
    config = app["serve_config"](store, calculator_recipe(), "unused")
    assert (config.transcript_store_conversations, config.transcript_store_bytes) == (0, 4096)
    with pytest.raises(SystemExit) as caught:
        app["parse_args"](["--transcript-store-tokens", "-1"])
    assert caught.value.code == 2


def test_max_batch_tokens_reaches_the_hf_engine_and_is_refused_elsewhere(tiny_qwen3_dir: Path) -> None:
    import asyncio

    app = runpy.run_path(str(APP / "__main__.py"), run_name="serve_app")
    engine = app["build_engine"](app["parse_args"](["--max-batch-tokens", "4096"]), str(tiny_qwen3_dir))
    try:
        assert engine.max_batch_tokens == 4096
    finally:
        asyncio.run(engine.close())
    engine = app["build_engine"](app["parse_args"]([]), str(tiny_qwen3_dir))
    try:
        assert engine.max_batch_tokens is None, "no bound unless asked"
    finally:
        asyncio.run(engine.close())
    openai = ["--engine", "openai", "--engine-url", "http://x/v1", "--model", "m"]
    for wrong in (["--max-batch-tokens", "0"], ["--max-batch-tokens", "4096", *openai]):
        with pytest.raises(SystemExit) as caught:
            app["parse_args"](wrong)
        assert caught.value.code == 2


def test_the_join_rule_reaches_the_hf_engine_and_is_refused_elsewhere(tiny_qwen3_dir: Path) -> None:
    import asyncio

    app = runpy.run_path(str(APP / "__main__.py"), run_name="serve_app")
    args = app["parse_args"](["--join-ratio", "0.5", "--join-wait-steps", "4"])
    engine = app["build_engine"](args, str(tiny_qwen3_dir))
    try:
        assert (engine.join_ratio, engine.join_wait_steps) == (0.5, 4)
    finally:
        asyncio.run(engine.close())
    engine = app["build_engine"](app["parse_args"]([]), str(tiny_qwen3_dir))
    try:
        assert (engine.join_ratio, engine.join_wait_steps) == (1.0, 20), "the engine's defaults unless asked"
    finally:
        asyncio.run(engine.close())
    openai = ["--engine", "openai", "--engine-url", "http://x/v1", "--model", "m"]
    for wrong in (["--join-ratio", "-1"], ["--join-ratio", "nan"], ["--join-wait-steps", "-2"],
                  ["--join-ratio", "1", *openai], ["--join-wait-steps", "3", *openai]):  # fmt: skip
        with pytest.raises(SystemExit) as caught:
            app["parse_args"](wrong)
        assert caught.value.code == 2
