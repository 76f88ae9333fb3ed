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
import json
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from agent_protocol import HFTokenizer
from agent_protocol.images import collapse_image_pads, expand_image_pads
from agent_runtime.engines import vllm as vllm_engine_module
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.openai_http import OpenAIEngine
from agent_runtime.engines.vllm import VLLMEngine, vllm_available

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from agent_runtime.engines.hf import HFEngine  # noqa: E402  (after the skips: it imports torch)
from tests.agent_runtime.test_engine_vllm import ReplayingAsyncLLM  # noqa: E402
from tests.support.completions_server import CompletionsServer  # noqa: E402
from tests.support.tiny_qwen_vl import (  # noqa: E402
    IMAGE_PAD,
    TINY_QWEN3_VL_RECIPE,
    offline_processor,
    tiny_qwen_vl_path,
)

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


def assert_greedy_equals_reference(engine: HFEngine, processor: Any, pictures: list[Any]) -> None:
    """The engine's greedy ids and logprobs on `pictures` against `reference` on the processor's own inputs."""
    urls = [data_url(p) for p in pictures]
    inputs = processor(text=[PROMPT], images=pictures, return_tensors="pt")
    prompt = expanded(engine.tokenizer, PROMPT, urls)  # type: ignore[arg-type]
    assert prompt == inputs["input_ids"][0].tolist()  # the engine's contract: pads expanded as the processor does
    assert prompt.count(IMAGE_PAD) == int(inputs["image_grid_thw"].prod(-1).sum()) // 4 > 2
    ours = generate(engine, prompt, GREEDY, urls)
    ids, logits = reference(engine.model, inputs, GREEDY.max_new_tokens, engine.stop_token_ids)
    assert ours.ids == ids
    assert len(set(ids)) > 3, "the tiny model should not just repeat a token"
    assert ours.logprobs is not None
    expected = [float(torch.log_softmax(step, -1)[token]) for step, token in zip(logits, ids, strict=True)]
    assert ours.logprobs == pytest.approx(expected, abs=1e-4)
    # the pixels matter: other pictures of the same sizes change the answer's first distribution
    others = [picture(*p.size, seed=10 + k) for k, p in enumerate(pictures)]
    other_inputs = processor(text=[PROMPT], images=others, return_tensors="pt")
    assert other_inputs["input_ids"].tolist() == inputs["input_ids"].tolist()
    _, other_logits = reference(engine.model, other_inputs, 1, ())
    assert float((other_logits[0] - logits[0]).abs().max()) > 1e-2


def test_greedy_with_images_equals_transformers_processor_and_forward(
    vl_engine: HFEngine, processor: Any, pictures: list[Any]
) -> None:
    assert_greedy_equals_reference(vl_engine, processor, pictures)


def test_qwen3_vl_greedy_with_images_equals_transformers_processor_and_forward(
    qwen3_tokenizer_file: Path, pictures: list[Any]
) -> None:
    """The same check on a tiny Qwen3-VL (patch 16, interleaved 3-D RoPE, deepstack vision features)."""
    model_dir = tiny_qwen_vl_path(qwen3_tokenizer_file, recipe=TINY_QWEN3_VL_RECIPE, name="tiny-qwen3-vl")
    engine = HFEngine.from_pretrained(model_dir, device="cpu", dtype="float32")
    try:
        assert engine.accepts_images and type(engine.model).__name__ == "Qwen3VLForConditionalGeneration"
        assert_greedy_equals_reference(engine, offline_processor(model_dir), pictures)
    finally:
        asyncio.run(engine.close())


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


# -- vllm -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_api() -> dict[str, Any]:
    """vLLM's classes, imported once for the module by the engine's own importer."""
    if not vllm_available():
        pytest.skip("vllm is not installed")
    return vllm_engine_module._import_vllm()


@pytest.fixture(scope="module")
def vllm_processor(vllm_api: dict[str, Any], vl_dir: Path) -> Any:
    """vLLM's own multimodal processor for the tiny model (it runs on a CPU): what vLLM does to a prompt with
    `multi_modal_data` before the model sees it."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    return MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(vl_dir), dtype="float32", max_model_len=4096))


def vllm_expands(processor: Any, prompt: dict[str, Any]) -> list[int]:
    """The ids vLLM's processor makes of a `TokensPrompt` with images (each single pad replaced by its count)."""
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    items = processor.info.parse_mm_data(prompt["multi_modal_data"])
    out = processor.apply(ProcessorInputs(prompt["prompt_token_ids"], items), TimingContext(enabled=False))
    return list(out["prompt_token_ids"])


class MultimodalReplay(ReplayingAsyncLLM):
    """test_engine_vllm's recording stand-in for `AsyncLLM`, with the model config vLLM gives a vision model."""

    multimodal: ClassVar[bool] = True

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        config = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
        self.model_config = SimpleNamespace(
            max_model_len=args.max_model_len or 2048,
            hf_config=SimpleNamespace(image_token_id=config["image_token_id"]),
            is_multimodal_model=self.multimodal,
        )


@pytest.fixture
def replaying_vl(
    vllm_api: dict[str, Any], vl_engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> type[MultimodalReplay]:
    reply = vl_engine.tokenize("Two squares.<|im_end|>")
    stand_in = type("MultimodalReplay", (MultimodalReplay,), {"reply": reply, "instances": []})
    monkeypatch.setattr(vllm_engine_module, "_import_vllm", lambda: {**vllm_api, "AsyncLLM": stand_in})
    return stand_in


def test_vllm_gets_the_pads_collapsed_and_the_images_and_expands_them_back(
    replaying_vl: type[MultimodalReplay], vllm_processor: Any, vl_dir: Path, pictures: list[Any]
) -> None:
    engine = VLLMEngine(vl_dir, context_length=4096)
    assert engine.accepts_images and engine.image_pad_id == IMAGE_PAD
    urls = [data_url(p) for p in pictures]
    prompt = expanded(engine.tokenizer, PROMPT, urls)  # type: ignore[arg-type]
    generation = generate(engine, prompt, GREEDY, urls)
    ((sent, params, _),) = replaying_vl.instances[0].received
    assert sent["prompt_token_ids"] == collapse_image_pads(prompt, {IMAGE_PAD}) == engine.tokenize(PROMPT)
    images = sent["multi_modal_data"]["image"]
    assert [(i.mode, i.size, i.tobytes()) for i in images] == [(p.mode, p.size, p.tobytes()) for p in pictures]
    assert vllm_expands(vllm_processor, sent) == prompt  # vLLM's processor gives back the ids training sees
    assert params.max_tokens == GREEDY.max_new_tokens
    assert generation.ids == engine.tokenize("Two squares.<|im_end|>") and generation.finish_reason == "stop"
    with pytest.raises(ValueError, match="2 runs of image pads for 1 images"):
        generate(engine, prompt, GREEDY, urls[:1])
    with pytest.raises(ValueError, match=r"vllm: image 1: image file .* cannot be read"):
        generate(engine, prompt, GREEDY, [urls[0], "/no/such/image.png"])
    assert len(replaying_vl.instances[0].received) == 1  # refused requests never reached vLLM


def test_vllm_on_a_text_model_refuses_images(
    replaying_vl: type[MultimodalReplay], vl_dir: Path, pictures: list[Any]
) -> None:
    replaying_vl.multimodal = False
    engine = VLLMEngine(vl_dir, context_length=4096)
    assert not engine.accepts_images and engine.image_pad_id is None
    with pytest.raises(ValueError, match="text-only"):
        generate(engine, [1, IMAGE_PAD, 2], GREEDY, [data_url(pictures[0])])
    assert replaying_vl.instances[0].received == []


# -- openai (vLLM's /inference/v1/generate over HTTP) ------------------------------------------------------------


class GenerateServer(CompletionsServer):
    """The tests' completions server with vLLM's token-in-token-out route added: the body is parsed with vLLM's
    own `GenerateRequest`, the images resolved from `content_parts`, the pads expanded by vLLM's multimodal
    processor, and the answer, from an `HFEngine`, built with vLLM's own response classes."""

    def __init__(self, engine: HFEngine, processor: Any) -> None:
        from starlette.routing import Route

        super().__init__(engine, model="tiny-qwen-vl")
        self.processor = processor
        self.generate_bodies: list[dict[str, Any]] = []
        self._server.config.app.router.routes.append(Route("/inference/v1/generate", self._generate, methods=["POST"]))

    async def _generate(self, request: Any) -> Any:
        from starlette.responses import JSONResponse
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionLogProbs,
            ChatCompletionLogProbsContent,
        )
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
            GenerateRequest,
            GenerateResponse,
            GenerateResponseChoice,
        )

        body = await request.json()
        self.generate_bodies.append(body)
        parsed = GenerateRequest.model_validate(body)
        urls = [part["url"] for part in parsed.content_parts or [] if part["type"] == "image_url"]
        pictures = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB") for u in urls]
        ids = vllm_expands(
            self.processor, {"prompt_token_ids": parsed.token_ids, "multi_modal_data": {"image": pictures}}
        )
        given = parsed.sampling_params
        sampling = SamplingParams(
            max_new_tokens=given.max_tokens or 16,
            temperature=given.temperature,
            top_p=given.top_p,
            top_k=given.top_k,
            seed=given.seed,
            stop_token_ids=tuple(given.stop_token_ids or ()),
            logprobs=given.logprobs is not None,
        )
        out = await self.engine.generate(ids, sampling, images=urls)
        logprobs = None
        if out.logprobs is not None:
            steps = [
                ChatCompletionLogProbsContent(token=f"token_id:{t}", logprob=v)
                for t, v in zip(out.ids, out.logprobs, strict=True)
            ]
            logprobs = ChatCompletionLogProbs(content=steps)
        choice = GenerateResponseChoice(index=0, token_ids=out.ids, logprobs=logprobs, finish_reason=out.finish_reason)
        return JSONResponse(GenerateResponse(request_id=parsed.request_id, choices=[choice]).model_dump())


def test_openai_sends_images_to_vllm_generate_and_gets_what_the_engine_gives(
    vl_engine: HFEngine, vllm_processor: Any, vl_dir: Path, pictures: list[Any], tmp_path: Path
) -> None:
    path = tmp_path / "second.png"
    pictures[1].save(path)
    urls = [data_url(pictures[0]), str(path)]  # a data URL as it came, a file sent as bytes
    prompt = expanded(vl_engine.tokenizer, PROMPT, urls)  # type: ignore[arg-type]
    sampled = SamplingParams(max_new_tokens=8, temperature=0.9, top_k=40, seed=3)
    with GenerateServer(vl_engine, vllm_processor) as server:

        async def over_http() -> list[Generation]:
            engine = OpenAIEngine(
                server.base_url, model="tiny-qwen-vl", tokenizer=vl_dir, context_length=4096, max_retries=0
            )
            try:
                assert engine.accepts_images and engine.generate_url.endswith(f":{server.port}/inference/v1/generate")
                return [await engine.generate(prompt, s, images=urls) for s in (GREEDY, sampled)]
            finally:
                await engine.close()

        remote = asyncio.run(over_http())
    direct = [generate(vl_engine, prompt, s, urls) for s in (GREEDY, sampled)]
    for theirs, ours in zip(remote, direct, strict=True):
        assert (theirs.ids, theirs.finish_reason) == (ours.ids, ours.finish_reason)
        assert theirs.logprobs == pytest.approx(ours.logprobs, abs=1e-5)
    body = server.generate_bodies[0]
    assert body["token_ids"] == vl_engine.tokenize(PROMPT)  # collapsed: vLLM expands the pads itself
    assert [p["url"][:22] for p in body["content_parts"]] == ["data:image/png;base64,"] * 2
    assert body["content_parts"][0]["url"] == urls[0]
    assert body["sampling_params"]["logprobs"] == 1 and body["sampling_params"]["detokenize"] is False
    assert server.requests == []  # nothing went to /v1/completions


def test_openai_on_a_text_model_refuses_images(tiny_hf_engine: HFEngine, tiny_qwen3_dir: Path) -> None:
    engine = OpenAIEngine(
        "http://127.0.0.1:9/v1", model="m", tokenizer=tiny_qwen3_dir / "tokenizer.json", context_length=64
    )
    assert not engine.accepts_images

    async def once() -> None:
        try:
            await engine.generate([1, IMAGE_PAD, 2], GREEDY, images=[data_url(picture(8, 8, seed=0))])
        finally:
            await engine.close()

    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(once())
