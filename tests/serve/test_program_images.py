"""An agent program's images reach the rollout engine: the program's endpoint (`EpisodeEndpoint`, the tools-mode
server on `EpisodeEngine`) takes a vision recipe's image parts as the served model does, and the engine behind the
episode is given the images in pad order (before, `EpisodeEngine` said it took no images, so every such request
was a 400 ``images_not_supported``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import SamplingParams, ScriptedEngine
from tests.agent_protocol.families.test_qwen3_vl import png
from tests.serve.test_serve_images import GRID, PAD_ID, as_data_url, user_with, vision_policy, vision_recipe

pytest.importorskip("openai")


def test_an_agent_programs_image_reaches_the_rollout_engine(tmp_path: Path, tokenizer: HFTokenizer) -> None:
    from agent_runtime.proxy.endpoint import EpisodeEndpoint
    from agent_runtime.proxy.episode_engine import EpisodeEngine

    vision_tokenizer = HFTokenizer(tokenizer.backend, source=tokenizer.source, vision=GRID)
    inner = ScriptedEngine(vision_tokenizer, policy=vision_policy(vision_tokenizer))
    picture = as_data_url(png(56, 56))

    async def ask() -> tuple[int, bytes]:
        episode = EpisodeEngine(inner, SamplingParams(temperature=0.0), max_tokens=1000)
        endpoint = EpisodeEndpoint(vision_recipe(tmp_path), episode, model_name="policy")
        try:
            body = json.dumps({"model": "policy", "messages": [user_with(picture)]}).encode()
            headers = [(b"authorization", f"Bearer {endpoint.key}".encode()), (b"content-type", b"application/json")]
            url = f"http://{endpoint.key}.proxy/v1/chat/completions"
            status, _, raw = await endpoint.forward("POST", url, headers, body)
            return status, raw
        finally:
            await endpoint.close()

    status, raw = asyncio.run(ask())
    assert status == 200, raw
    assert inner.images_seen == [(picture,)]
    (prompt,) = inner.calls
    pads = list(prompt).count(PAD_ID)
    assert json.loads(raw)["choices"][0]["message"]["content"] == f"I see 1 image(s) in {pads} pads."
