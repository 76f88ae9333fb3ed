"""Engines that take images (`accepts_images`), on the tiny random-weight Qwen2.5-VL (`tests/support/tiny_qwen_vl.py`).

`HFEngine` is checked against a reference written here with nothing but transformers: the inputs come from
transformers' own `Qwen2VLProcessor` (which also proves the engine's expanded ids are the processor's), and each
step is a full forward pass of the model without a KV cache, the model computing its own 3-D RoPE positions. The
engine must give the same greedy ids and, as raw logprobs, the log-softmax of those logits.

`VLLMEngine` is checked with vLLM's own request classes and the recording stand-in for `AsyncLLM` of
test_engine_vllm.py: the prompt goes in with each run of pads collapsed, the images as PIL images in
`multi_modal_data`. `OpenAIEngine` sends an image prompt to vLLM's token-in-token-out endpoint
(`/inference/v1/generate`); a real HTTP server here parses it with vLLM's own `GenerateRequest`, expands the pads
as vLLM's processor does and answers from `HFEngine`, so HTTP must give what the engine gives directly.
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

from agent_protocol import HFTokenizer
from agent_protocol.images import collapse_image_pads, expand_image_pads
from agent_runtime.engines.base import Generation, SamplingParams

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from agent_runtime.engines.hf import HFEngine  # noqa: E402  (after the skips: it imports torch)
from tests.support.tiny_qwen_vl import IMAGE_PAD, offline_processor, tiny_qwen_vl_path  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
PROMPT = (
    "<|im_start|>user\nWhat is in <|vision_start|><|image_pad|><|vision_end|> and "
    "<|vision_start|><|image_pad|><|vision_end|>?<|im_end|>\n<|im_start|>assistant\n"
)


def picture(width: int, height: int, seed: int) -> Any:
    """A PIL image of random colours (so different images give different pixels)."""
    rng = random.Random(seed)
    image = Image.new("RGB", (width, height))
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(width * height)])
    return image


def data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def vl_dir(qwen3_tokenizer_file: Path) -> Path:
    return tiny_qwen_vl_path(qwen3_tokenizer_file)


@pytest.fixture(scope="module")
def vl_engine(vl_dir: Path) -> Iterator[HFEngine]:
    engine = HFEngine.from_pretrained(vl_dir, device="cpu", dtype="float32")
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def processor(vl_dir: Path) -> Any:
    return offline_processor(vl_dir)


@pytest.fixture(scope="module")
def pictures() -> list[Any]:
    return [picture(100, 150, seed=1), picture(60, 44, seed=2)]


def expanded(tokenizer: HFTokenizer, text: str, urls: list[str]) -> list[int]:
    """The engine-side prompt: the text's ids with each pad expanded by the tokenizer's vision grid."""
    assert tokenizer.vision is not None
    pads = [tokenizer.vision.pads_for(url) for url in urls]
    ids, _ = expand_image_pads(tokenizer.encode(text), pad_id=IMAGE_PAD, pads=pads, sources=urls)
    return ids


def reference(model: Any, inputs: dict[str, Any], steps: int, stops: tuple[int, ...]) -> tuple[list[int], list[Any]]:
    """Greedy ids and each step's logits, by full forward passes without a cache (the model's own positions)."""
    ids = inputs["input_ids"]
    out: list[int] = []
    logits: list[Any] = []
    with torch.inference_mode():
        for _ in range(steps):
            step = (
                model(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    pixel_values=inputs.get("pixel_values"),
                    image_grid_thw=inputs.get("image_grid_thw"),
                    mm_token_type_ids=(ids == IMAGE_PAD).int(),
                    use_cache=False,
                )
                .logits[0, -1]
                .float()
            )
            token = int(step.argmax())
            out.append(token)
            logits.append(step)
            if token in stops:
                break
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out, logits


def generate(engine: Any, prompt: list[int], sampling: SamplingParams, images: list[str]) -> Generation:
    result: Generation = asyncio.run(engine.generate(prompt, sampling, images=images))
    return result


# -- hf ---------------------------------------------------------------------------------------------------------


def test_the_vision_model_takes_images_and_a_text_model_does_not(
    vl_engine: HFEngine, tiny_hf_engine: HFEngine, vl_dir: Path
) -> None:
    assert vl_engine.accepts_images and vl_engine.vision is not None
    assert not tiny_hf_engine.accepts_images and tiny_hf_engine.vision is None
    assert HFTokenizer.from_file(vl_dir).vision == vl_engine.tokenizer.vision is not None  # type: ignore[attr-defined]
    assert vl_engine.stop_token_ids == (151645, 151643) and vl_engine.context_length == 4096
    without_processor = HFEngine(vl_engine.model, vl_engine.tokenizer)  # no image processor: no images
    assert not without_processor.accepts_images


def test_greedy_with_images_equals_transformers_processor_and_forward(
    vl_engine: HFEngine, processor: Any, pictures: list[Any]
) -> None:
    urls = [data_url(p) for p in pictures]
    inputs = processor(text=[PROMPT], images=pictures, return_tensors="pt")
    prompt = expanded(vl_engine.tokenizer, PROMPT, urls)  # type: ignore[arg-type]
    assert prompt == inputs["input_ids"][0].tolist()  # the engine's contract: pads expanded as the processor does
    assert prompt.count(IMAGE_PAD) == int(inputs["image_grid_thw"].prod(-1).sum()) // 4 > 2
    ours = generate(vl_engine, prompt, GREEDY, urls)
    ids, logits = reference(vl_engine.model, inputs, GREEDY.max_new_tokens, vl_engine.stop_token_ids)
    assert ours.ids == ids
    assert len(set(ids)) > 3, "the tiny model should not just repeat a token"
    assert ours.logprobs is not None
    expected = [float(torch.log_softmax(step, -1)[token]) for step, token in zip(logits, ids, strict=True)]
    assert ours.logprobs == pytest.approx(expected, abs=1e-4)
    # the pixels matter: other pictures of the same sizes change the answer's first distribution
    others = [picture(100, 150, seed=3), picture(60, 44, seed=4)]
    other_inputs = processor(text=[PROMPT], images=others, return_tensors="pt")
    assert other_inputs["input_ids"].tolist() == inputs["input_ids"].tolist()
    _, other_logits = reference(vl_engine.model, other_inputs, 1, ())
    assert float((other_logits[0] - logits[0]).abs().max()) > 1e-2


def test_sampled_logprobs_are_raw_and_a_seed_repeats(vl_engine: HFEngine, processor: Any, pictures: list[Any]) -> None:
    urls = [data_url(p) for p in pictures]
    prompt = expanded(vl_engine.tokenizer, PROMPT, urls)  # type: ignore[arg-type]
    sampling = SamplingParams(max_new_tokens=8, temperature=1.3, top_k=50, top_p=0.95, seed=7)
    first, again = generate(vl_engine, prompt, sampling, urls), generate(vl_engine, prompt, sampling, urls)
    assert first == again
    inputs = processor(text=[PROMPT], images=pictures, return_tensors="pt")
    whole = torch.tensor([prompt + first.ids[:-1]])
    with torch.inference_mode():
        logits = (
            vl_engine.model(
                input_ids=whole,
                pixel_values=inputs["pixel_values"],
                image_grid_thw=inputs["image_grid_thw"],
                mm_token_type_ids=(whole == IMAGE_PAD).int(),
                use_cache=False,
            )
            .logits[0, len(prompt) - 1 :]
            .float()
        )
    raw = torch.log_softmax(logits, -1).gather(1, torch.tensor(first.ids).unsqueeze(1)).squeeze(1).tolist()
    assert first.logprobs == pytest.approx(raw, abs=1e-4)  # before temperature, top-k and top-p


def test_text_prompts_batched_beside_an_image_prompt_equal_each_alone(
    vl_engine: HFEngine, processor: Any, pictures: list[Any]
) -> None:
    urls = [data_url(p) for p in pictures]
    image_prompt = expanded(vl_engine.tokenizer, PROMPT, urls)  # type: ignore[arg-type]
    texts = [vl_engine.tokenize("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"), vl_engine.tokenize("hi")]
    for text in texts:  # a text prompt to the vision model: ordinary 1-D positions, as the model gives itself
        ids, _ = reference(vl_engine.model, {"input_ids": torch.tensor([text])}, 6, vl_engine.stop_token_ids)
        assert asyncio.run(vl_engine.generate(text, SamplingParams(max_new_tokens=6, temperature=0.0))).ids == ids

    assert vl_engine.vision is not None
    patient = HFEngine(
        vl_engine.model, vl_engine.tokenizer, image_processor=vl_engine.vision.image_processor, batch_wait_s=0.2
    )

    async def together() -> list[Generation]:
        jobs = [patient.generate(image_prompt, GREEDY, images=urls)]
        jobs += [patient.generate(t, GREEDY) for t in texts]
        try:
            return list(await asyncio.gather(*jobs))
        finally:
            await patient.close()

    alone = [generate(vl_engine, image_prompt, GREEDY, urls)] + [
        asyncio.run(vl_engine.generate(t, GREEDY)) for t in texts
    ]
    for joint, solo in zip(asyncio.run(together()), alone, strict=True):  # batching moves logprobs by float rounding
        assert (joint.ids, joint.finish_reason) == (solo.ids, solo.finish_reason)
        assert joint.logprobs == pytest.approx(solo.logprobs, abs=1e-4)
    assert patient.batch_sizes == {2: 1, 1: 1}  # the two text prompts did share a batch, the image prompt ran alone


def test_bad_images_and_pad_mismatches_are_clear_errors(
    vl_engine: HFEngine, tiny_hf_engine: HFEngine, pictures: list[Any]
) -> None:
    urls = [data_url(p) for p in pictures]
    prompt = expanded(vl_engine.tokenizer, PROMPT, urls)  # type: ignore[arg-type]
    first_pad = prompt.index(IMAGE_PAD)
    with pytest.raises(ValueError, match=r"image 0 has \d+ pad tokens in the prompt, but its grid 1x\d+x\d+"):
        generate(vl_engine, prompt[:first_pad] + prompt[first_pad + 1 :], GREEDY, urls)
    with pytest.raises(ValueError, match="image 1 has"):
        generate(vl_engine, prompt, GREEDY, [urls[0], data_url(picture(200, 200, seed=5))])
    with pytest.raises(ValueError, match="more image placeholders than the 1 images"):
        generate(vl_engine, prompt, GREEDY, urls[:1])
    with pytest.raises(ValueError, match="image pad tokens but no images"):
        asyncio.run(vl_engine.generate(prompt, GREEDY))
    png = base64.b64decode(urls[0].split(",", 1)[1])
    corrupt = "data:image/png;base64," + base64.b64encode(png[:40] + b"\x00" * 60).decode()
    with pytest.raises(ValueError, match="image 0 cannot be decoded"):
        generate(vl_engine, prompt, GREEDY, [corrupt, urls[1]])
    with pytest.raises(ValueError, match="cannot be read"):
        generate(vl_engine, prompt, GREEDY, ["/no/such/image.png", urls[1]])
    with pytest.raises(ValueError, match="text-only"):
        generate(tiny_hf_engine, prompt, GREEDY, urls)
    assert generate(vl_engine, prompt, GREEDY, urls).ids  # the engine still serves after refusing those
