"""Hostile images against a real server: the status, error code and resident-memory growth of the server process
for each case of `tests.support.hostile_images`, and a seeded fuzz's outcomes.

The server (the qwen3-vl vision recipe of tests/serve, a scripted engine or `HFEngine` on the tiny Qwen2.5-VL)
runs in this process on a real socket and is sent one request per image by httpx; the growth is the kernel's
resident high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` before each request) minus the
resident size before it, so a peak inside Pillow or torch counts. malloc's mmap threshold is fixed at 128 KiB,
so a freed large block goes back to the kernel and each image's growth is its own, not hidden in reused pages.
The budget is the server's `max_image_pixels` at 4 bytes a pixel (what Pillow stores per pixel); the figure to
watch is each row's ratio to it.

    uv run python bench/bench_hostile_images.py [--engine scripted|hf] [--budget 8000000] [--mode agent|tools]

On the commit before a change, point the packages there and run the same script (the cases come from this tree):

    PYTHONPATH=/tmp/base/packages/agent-protocol/src:/tmp/base/packages/agent-env/src:\\
/tmp/base/packages/agent-runtime/src uv run python bench/bench_hostile_images.py --engine hf
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    with open("/proc/self/status") as status:
        found = re.search(r"VmHWM:\s+(\d+) kB", status.read())
    assert found is not None
    return int(found.group(1)) * 1024


def growth_of(send: Any) -> tuple[httpx.Response, int]:
    gc.collect()
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD fixed: large blocks are mapped and unmapped, never kept
        libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    base = _rss()
    response = send()
    return response, _peak_rss() - base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("scripted", "hf"), default="scripted")
    parser.add_argument("--budget", type=int, default=8_000_000, help="max_image_pixels of the server")
    parser.add_argument("--mode", choices=("agent", "tools"), default="tools")
    parser.add_argument("--fuzz", type=int, default=70, help="fuzzed images to send after the named cases")
    args = parser.parse_args()

    import structlog

    from agent_protocol import HFTokenizer
    from agent_runtime import LLMEngine, ScriptedEngine
    from agent_runtime.serving import ServeConfig, create_app
    from tests.serve.conftest import MODEL, LiveServer
    from tests.serve.test_serve_images import GRID, ZOOM_TOOL, as_data_url, user_with, vision_policy, vision_recipe
    from tests.support.hostile_images import fuzzed_images, hostile_images
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    plain = HFTokenizer.from_file(qwen3_tokenizer_path())
    engine: LLMEngine
    if args.engine == "hf":
        from agent_runtime.engines.hf import HFEngine
        from tests.support.tiny_qwen_vl import tiny_qwen_vl_path

        engine = HFEngine.from_pretrained(tiny_qwen_vl_path(qwen3_tokenizer_path()), device="cpu", dtype="float32")
    else:
        tokenizer = HFTokenizer(plain.backend, source=plain.source, vision=GRID)
        engine = ScriptedEngine(tokenizer, policy=vision_policy(tokenizer))
    recipe = vision_recipe(Path(tempfile.mkdtemp()), max_images=None)
    server = LiveServer(create_app(engine, recipe, ServeConfig(model_name=MODEL, max_image_pixels=args.budget)))
    server.start()
    budget_bytes = 4 * args.budget

    def send(data: bytes) -> httpx.Response:
        messages = [{"role": "system", "content": "Look."}, user_with(as_data_url(data))]
        body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0.0}
        if args.mode == "tools":
            body["tools"] = [ZOOM_TOOL]
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=600)

    cases = hostile_images(args.budget)
    send(cases["gif: animated, 3 frames"][0])  # warm-up: the engine's first run allocates its own buffers
    print(
        f"engine {args.engine}, {args.mode} mode, budget {args.budget} pixels = {budget_bytes / 2**20:.1f} MiB "
        f"decoded; resident growth of the server process per request"
    )
    print(f"{'case':62} {'bytes':>7}  status {'code':22} {'growth':>10}  ratio  expected")
    worst = ("", 0)
    server_errors = 0
    for name, (data, expected) in cases.items():
        response, growth = growth_of(lambda data=data: send(data))
        code = "" if response.status_code == 200 else response.json().get("error", {}).get("code", "?")
        server_errors += response.status_code >= 500
        worst = max(worst, (name, growth), key=lambda row: row[1])
        print(
            f"{name:62} {len(data):>7}  {response.status_code}    {code:22} {growth / 2**20:>6.1f} MiB  "
            f"{growth / budget_bytes:5.2f}  {expected}"
        )
    outcomes: dict[str, int] = {}
    for data in fuzzed_images(args.fuzz):
        response = send(data)
        key = str(response.status_code)
        if response.status_code != 200:
            key += " " + str(response.json().get("error", {}).get("code"))
        outcomes[key] = outcomes.get(key, 0) + 1
        server_errors += response.status_code >= 500
    print(f"{args.fuzz} fuzzed images: {dict(sorted(outcomes.items()))}")
    print(f"worst growth: {worst[0]}: {worst[1] / 2**20:.1f} MiB = {worst[1] / budget_bytes:.2f}x the budget")
    print(f"5xx answers: {server_errors}")
    server.stop()
    close = getattr(engine, "close", None)
    if close is not None:
        asyncio.run(close())


if __name__ == "__main__":
    main()
