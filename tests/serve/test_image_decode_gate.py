"""Requests are checked on worker threads before they take a slot, and checking an image decodes it: the server
decodes at most `CONCURRENT_DECODES` images at once, whatever the number of requests being checked."""

from __future__ import annotations

import base64
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from PIL import Image

from agent_runtime.serving import images as serving_images
from agent_runtime.serving.images import CONCURRENT_DECODES, check_request_images


def png_data_url(side: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_at_most_concurrent_decodes_images_decode_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    decode = serving_images.checked_size  # the real decoder, watched: how many run at once
    lock, running, peak = threading.Lock(), [0], [0]

    def watched(data: bytes, *, max_pixels: int | None) -> tuple[int, int]:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.02)  # long enough for the other threads to arrive
            return decode(data, max_pixels=max_pixels)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(serving_images, "checked_size", watched)
    url = png_data_url(256)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}
    ]

    def check(_: int) -> int:
        return check_request_images(
            messages, text_only=None, grid=None, max_image_bytes=1 << 24, max_image_pixels=1 << 22,
            max_images=4, context_tokens=1 << 20,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=12) as pool:
        assert list(pool.map(check, range(24))) == [1] * 24
    print(f"\n24 requests checked on 12 threads: at most {peak[0]} images decoding at once")
    assert peak[0] == CONCURRENT_DECODES
