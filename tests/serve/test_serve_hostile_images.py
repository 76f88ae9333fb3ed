"""Hostile images through a real server and client: every case of `tests.support.hostile_images` (frame headers
that say fewer pixels than the frames hold, two JPEG frame headers, decompression bombs, truncated and corrupt
bodies, animated GIF/APNG/WebP, palette tricks, TIFF) and a seeded fuzz, in agent, tools and streamed mode, on
the scripted vision engine and on `HFEngine` over the tiny Qwen2.5-VL (the real decoder and image processor).
Each is taken (200) or refused with a 400 naming ``messages[i].content[k]`` and saying why; none is a 500.

The server runs in this process, so its resident memory is this process's: `rss_growth` reads the kernel's
high-water mark (VmHWM, reset before each request) while one request is served, malloc's mmap threshold fixed so
that a freed large block goes back to the kernel and each image's growth is its own. Run with ``-s`` to see the
figure per image; the limit is 1.5x the image budget in bytes (`max_image_pixels` at 4 bytes a pixel, the most
Pillow stores per pixel)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("PIL")

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from tests.agent_protocol.families.test_qwen3_vl import data_url
from tests.serve.conftest import LiveServer, ServerFactory
from tests.serve.test_serve_images import (
    GRID,
    ZOOM_TOOL,
    as_data_url,
    post,
    user_with,
    vision_policy,
    vision_recipe,
)
from tests.support.hostile_images import fuzzed_images, hostile_images

BUDGET = 8_000_000  # pixels per image: the bombs at the budget decode to 32 MB (Pillow's 4 bytes a pixel)
BUDGET_BYTES = 4 * BUDGET
HOSTILE = hostile_images(BUDGET)
PART = "messages[1].content[2]"


@pytest.fixture(scope="module")
def vision_tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    plain = HFTokenizer.from_file(qwen3_tokenizer_file)
    return HFTokenizer(plain.backend, source=plain.source, vision=GRID)


@pytest.fixture(scope="module")
def server(
    start_server: ServerFactory, vision_tokenizer: HFTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> LiveServer:
    engine = ScriptedEngine(vision_tokenizer, policy=vision_policy(vision_tokenizer))
    recipe = vision_recipe(tmp_path_factory.mktemp("zoom"), max_images=None)
    return start_server(engine=engine, recipe=recipe, max_image_pixels=BUDGET)


def body_with(data: bytes, mode: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "Look."}, user_with(data_url(28, 28), as_data_url(data))]
    tools = {"tools": [ZOOM_TOOL]} if mode == "tools" else {}
    return {"messages": messages, **tools, "stream": mode == "stream", **extra}


def check_outcome(response: httpx.Response, expected: str) -> None:
    if expected == "ok":
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == expected and error["param"] == PART and PART in error["message"], error


@pytest.mark.parametrize("mode", ["agent", "tools", "stream"])
@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_image_is_taken_or_a_400_naming_the_part(server: LiveServer, name: str, mode: str) -> None:
    data, expected = HOSTILE[name]
    check_outcome(post(server, body_with(data, mode)), expected)


def test_fuzzed_images_are_never_a_server_error(server: LiveServer) -> None:
    outcomes: dict[str, int] = {}
    for k, data in enumerate(fuzzed_images(70)):
        response = post(server, body_with(data, "tools" if k % 2 else "agent"))
        assert response.status_code in (200, 400), response.text
        if response.status_code == 400:
            error = response.json()["error"]
            assert error["param"] == PART and error["code"] in ("invalid_image", "image_too_large"), error
        key = str(response.status_code) + ("" if response.status_code == 200 else " " + error["code"])
        outcomes[key] = outcomes.get(key, 0) + 1
    print(f"\n70 fuzzed images: {outcomes}")
    assert server.metrics()["server_errors"] == 0


# -- resident memory -------------------------------------------------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    """This process's resident high-water mark (VmHWM), in bytes."""
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\s+(\d+) kB", status.read()).group(1)) * 1024  # type: ignore[union-attr]


def rss_growth(action: Callable[[], Any]) -> tuple[Any, int]:
    """`action()`'s result and how far this process's resident memory rose above where it stood (freed memory
    handed back first) while it ran: the kernel's high-water mark, reset before (``/proc/self/clear_refs``), so a
    peak inside a C call that holds the GIL counts too."""
    gc.collect()
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD fixed: large blocks are mapped and unmapped, never kept
        libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := the current resident size
    base = _rss()
    result = action()
    return result, _peak_rss() - base


def memory_table(
    target: LiveServer, cases: dict[str, tuple[bytes, str]], mode: str, **extra: Any
) -> Iterator[tuple[str, int]]:
    """Serve each case once; yield (name, resident growth) and print a row per case."""
    print(f"\nresident growth per image, budget {BUDGET} pixels = {BUDGET_BYTES / 2**20:.0f} MiB decoded ({mode}):")
    for name, (data, expected) in cases.items():
        response, growth = rss_growth(lambda data=data: post(target, body_with(data, mode, **extra)))  # type: ignore[misc]
        code = "" if response.status_code == 200 else response.json()["error"]["code"]
        print(
            f"  {name:58} {len(data):>7} B  {response.status_code} {code:15} +{growth / 2**20:6.1f} MiB  "
            f"({growth / BUDGET_BYTES:.2f}x budget)"
        )
        check_outcome(response, expected)
        yield name, growth


def test_resident_memory_per_hostile_image_stays_within_the_budget(server: LiveServer) -> None:
    worst = max(memory_table(server, HOSTILE, "agent"), key=lambda row: row[1])
    print(f"worst: {worst[0]}: {worst[1] / BUDGET_BYTES:.2f}x the budget")
    assert worst[1] <= 1.5 * BUDGET_BYTES, worst


# -- per-request limits ------------------------------------------------------------------------------------------


def test_max_images_has_a_server_default(start_server: ServerFactory, server: LiveServer) -> None:
    """The recipe sets no max_images: the server's default (16) holds, and a recipe's own lowers it."""
    assert httpx.get(f"{server.url}/health", timeout=10).json()["images"]["max_images"] == 16
    response = post(server, {"messages": [user_with(*[data_url(28, 28)] * 17)]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "too_many_images" and "17 images" in error["message"] and "at most 16" in error["message"]
    assert post(server, {"messages": [user_with(*[data_url(28, 28)] * 16)]}).status_code == 200


def test_the_images_of_one_request_share_a_pixel_budget(
    start_server: ServerFactory, vision_tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    engine = ScriptedEngine(vision_tokenizer, policy=vision_policy(vision_tokenizer))
    small = start_server(
        engine=engine, recipe=vision_recipe(tmp_path), max_image_pixels=100 * 100, max_request_pixels=150 * 100
    )
    ok = post(small, {"messages": [user_with(data_url(100, 100), data_url(50, 100))]})
    assert ok.status_code == 200, ok.text
    over = post(small, {"messages": [user_with(data_url(100, 100), data_url(51, 100))]})
    assert over.status_code == 400, over.text
    error = over.json()["error"]
    assert error["code"] == "too_many_image_pixels" and error["param"] == "messages", error
    assert "messages[0].content[2]" in error["message"] and "15100 pixels" in error["message"], error
    assert engine.calls and len(engine.calls) == 1  # the refused request never reached the engine


# -- the real decoder and image processor ------------------------------------------------------------------------


#: the cases the header alone misjudged (the engine's 500s before), and one of each outcome beside them
ENGINE_CASES = (
    "gif: 1x1 screen holding a 7000x7000 frame",
    "jpeg: two frame headers (SOF) before the scan",
    "jpeg: a second frame header after the scan",
    "png: IHDR claims the budget, data of 8x8",
    "bmp: header claims the budget, 100 bytes of pixels",
    "png: decompression bomb over the budget",
    "gif: animated, 3 frames",
)


def test_the_hf_engine_is_served_hostile_images_without_a_500(
    start_server: ServerFactory, qwen3_tokenizer_file: Path, tmp_path: Path
) -> None:
    """`HFEngine` on the tiny Qwen2.5-VL decodes what the server takes (Pillow, then its image processor): the
    images the header alone misjudged (a 1x1 GIF screen holding a 7000x7000 frame, a JPEG with two frame headers)
    were its 500s; now each is a 400 naming the part before the engine sees it. (Every case, with the figures:
    ``bench/bench_hostile_images.py --engine hf``.)"""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import asyncio

    from agent_runtime.engines.hf import HFEngine
    from tests.support.tiny_qwen_vl import tiny_qwen_vl_path

    engine = HFEngine.from_pretrained(tiny_qwen_vl_path(qwen3_tokenizer_file), device="cpu", dtype="float32")
    try:
        served = start_server(engine=engine, recipe=vision_recipe(tmp_path), max_image_pixels=BUDGET)
        sampling = {"max_tokens": 2, "temperature": 0.0}
        warm = post(served, body_with(HOSTILE["gif: animated, 3 frames"][0], "tools", **sampling))
        assert warm.status_code == 200, warm.text  # the model's first run allocates its own buffers
        rows = dict(memory_table(served, {name: HOSTILE[name] for name in ENGINE_CASES}, "tools", **sampling))
        worst = max(rows.items(), key=lambda row: row[1])
        print(f"worst: {worst[0]}: {worst[1] / BUDGET_BYTES:.2f}x the budget")
        assert worst[1] <= 1.5 * BUDGET_BYTES, worst
        assert served.metrics()["server_errors"] == 0
    finally:
        asyncio.run(engine.close())
