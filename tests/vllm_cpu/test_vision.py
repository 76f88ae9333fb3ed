"""`VLLMEngine` with images on the real vLLM (CPU build) against `HFEngine` with images on the same tiny
random-weight Qwen2.5-VL (`tests/support/tiny_qwen_vl.py`, text heads of size 32 for vLLM's CPU attention).

The prompt reaches both engines as training sees it (each image's pads expanded by the tokenizer's vision grid);
vLLM gets the runs collapsed with the decoded images (`multi_modal_data`) and expands them with its own processor,
hf feeds the pixels from the directory's image processor. Greedy ids must be equal token for token and logprobs
within `LOGPROB_TOLERANCE`, for one image, two images of other sizes, a text-only prompt to the vision model, and
requests run concurrently. The module starts its own vLLM engine (about 90 s on a loaded 2-core machine) and
closes it at the end.
"""

from __future__ import annotations

import asyncio
import base64
import io
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_protocol.images import expand_image_pads
from agent_runtime.engines.base import Generation, SamplingParams
from tests.vllm_cpu.conftest import CONTEXT, ENGINE_ARGS, LoopThread
from tests.vllm_cpu.test_engine import LOGPROB_TOLERANCE

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)
ONE = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n<|im_start|>assistant\n"
TWO = (
    "<|im_start|>user\nCompare <|vision_start|><|image_pad|><|vision_end|> with "
    "<|vision_start|><|image_pad|><|vision_end|>.<|im_end|>\n<|im_start|>assistant\n"
)


def data_url(width: int, height: int, seed: int) -> str:
    from PIL import Image

    rng = random.Random(seed)
    image = Image.new("RGB", (width, height))
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(width * height)])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def vl_dir(qwen3_tokenizer_file: Path) -> Path:
    from tests.support.tiny_qwen_vl import TINY_QWEN_VL_HD32_RECIPE, tiny_qwen_vl_path

    return tiny_qwen_vl_path(qwen3_tokenizer_file, recipe=TINY_QWEN_VL_HD32_RECIPE, name="tiny-qwen-vl-hd32")


@pytest.fixture(scope="module")
def vl_vllm(loop: LoopThread, vl_dir: Path) -> Iterator[Any]:
    from agent_runtime.engines.vllm import VLLMEngine

    async def start() -> VLLMEngine:
        return VLLMEngine(vl_dir, dtype="float32", context_length=CONTEXT, enforce_eager=True, engine_args=ENGINE_ARGS)

    engine = loop.run(start(), timeout=900)
    yield engine
    loop.run(engine.close())


@pytest.fixture(scope="module")
def vl_hf(vl_dir: Path) -> Iterator[Any]:
    from agent_runtime.engines.hf import HFEngine

    engine = HFEngine.from_pretrained(vl_dir, device="cpu", dtype="float32", context_length=CONTEXT)
    yield engine
    asyncio.run(engine.close())


def prompt(engine: Any, text: str, urls: list[str]) -> list[int]:
    pads = [engine.tokenizer.vision.pads_for(url) for url in urls]
    ids, _ = expand_image_pads(engine.tokenize(text), pad_id=engine.vision.pad_id, pads=pads, sources=urls)
    return ids


def assert_same(vllm: Generation, hf: Generation) -> float:
    assert vllm.ids == hf.ids
    assert len(set(hf.ids)) > 3, "the tiny model should not just repeat a token"
    assert vllm.finish_reason == hf.finish_reason
    assert vllm.logprobs is not None and hf.logprobs is not None
    return max(abs(x - y) for x, y in zip(vllm.logprobs, hf.logprobs, strict=True))


def test_greedy_with_images_equals_hf(loop: LoopThread, vl_vllm: Any, vl_hf: Any) -> None:
    assert vl_vllm.accepts_images and vl_hf.accepts_images
    cases = [
        (ONE, [data_url(100, 150, seed=1)]),
        (TWO, [data_url(60, 44, seed=2), data_url(200, 90, seed=3)]),
        ("<|im_start|>user\nNo picture here.<|im_end|>\n<|im_start|>assistant\n", []),
    ]
    gaps = []
    for text, urls in cases:
        ids = prompt(vl_hf, text, urls)
        theirs = loop.run(vl_vllm.generate(ids, GREEDY, images=urls))
        ours = asyncio.run(vl_hf.generate(ids, GREEDY, images=urls))
        gaps.append(assert_same(theirs, ours))
    print(f"images: largest |vLLM - HF| logprob difference {max(gaps):.2e}")
    assert max(gaps) <= LOGPROB_TOLERANCE


def test_concurrent_image_requests_equal_hf_alone(loop: LoopThread, vl_vllm: Any, vl_hf: Any) -> None:
    requests = [(ONE, [data_url(100, 150, seed=s)]) for s in (4, 5)] + [
        (TWO, [data_url(90, 90, 6), data_url(40, 80, 7)])
    ]
    prompts = [(prompt(vl_hf, text, urls), urls) for text, urls in requests]

    async def together() -> list[Generation]:
        return list(await asyncio.gather(*(vl_vllm.generate(ids, GREEDY, images=urls) for ids, urls in prompts)))

    for theirs, (ids, urls) in zip(loop.run(together()), prompts, strict=True):
        assert assert_same(theirs, asyncio.run(vl_hf.generate(ids, GREEDY, images=urls))) <= LOGPROB_TOLERANCE
