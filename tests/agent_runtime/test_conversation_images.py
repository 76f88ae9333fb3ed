"""The turn core with images: a prompt and tool feedback that carry images give the token stream OpenRLHF's VLM
path builds for the same conversation (`process_prompt_with_images` on the whole render, with a processor
assembled offline from transformers' `Qwen2VLImageProcessor` and the Qwen3 tokenizer), the transcript records
each image's span and source, each request carries the context's images in pad order, and every way images can
be wrong is an error that names the part (or the engine) and ends nothing else."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from agent_env import FunctionCallEnvironment
from agent_protocol import HFTokenizer, Message, MessageError, get_protocol
from agent_protocol.images import VisionGrid, collapse_image_pads
from agent_runtime import AgentRuntime, AgentSession, SamplingParams
from agent_runtime.conversation import Conversation
from agent_runtime.engine_call import EngineFailure, call_engine
from agent_runtime.engines.base import Generation
from agent_runtime.engines.scripted import ScriptedEngine
from tests.agent_protocol.families.test_qwen3_vl import data_url

PAD = 151655


def run_async(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body on a fresh event loop (the project's tests use no async plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


GRID = VisionGrid(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)  # few pads per image: a fast test


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer(HFTokenizer.from_file(qwen3_tokenizer_file).backend, vision=GRID)


@pytest.fixture(scope="module")
def processor(qwen3_tokenizer_file: Path) -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    transformers = pytest.importorskip("transformers")
    return transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(
            size={"shortest_edge": GRID.min_pixels, "longest_edge": GRID.max_pixels}
        ),
        tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_file=str(qwen3_tokenizer_file)),
        video_processor=transformers.Qwen2VLVideoProcessor(),
    )


def _image(rng: random.Random) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(rng.randint(1, 400), rng.randint(1, 400))}}


TOOLS = [{"type": "function", "function": {"name": "zoom", "parameters": {"type": "object", "properties": {}}}}]
CALL = '<tool_call>\n{"name": "zoom", "arguments": {}}\n</tool_call><|im_end|>'


@pytest.mark.parametrize("seed", range(6))
@run_async
async def test_transcript_equals_openrlhf_processing_of_the_whole_conversation(
    seed: int, tokenizer: HFTokenizer, processor: Any
) -> None:
    vlm_utils = pytest.importorskip("openrlhf.utils.vlm_utils")
    from agent_protocol import coerce_tools

    rng = random.Random(seed)
    protocol = get_protocol("qwen3-vl")
    user = [_image(rng), {"type": "text", "text": "What is here?"}, *[_image(rng) for _ in range(seed % 3)]]
    prompt = [
        Message.from_openai({"role": "system", "content": "Look closely."}),
        Message.from_openai({"role": "user", "content": user}),
    ]
    conversation = Conversation(protocol, tokenizer, max_new_tokens=64, tools=coerce_tools(TOOLS))
    await conversation.open_segment(prompt)
    request = conversation.request(64)
    assert request is not None and list(request.images) == [i.url for m in prompt for i in m.images]
    conversation.accept(_generation(tokenizer, CALL), call_id_prefix="call")
    images = [_image(rng) for _ in range(1 + seed % 2)]
    feedback = [
        Message.from_openai(
            {"role": "tool", "tool_call_id": "call_0", "content": [*images, {"type": "text", "text": "zoomed"}]}
        )
    ]
    ids = await conversation.feedback_ids(feedback)
    conversation.append_feedback(ids, feedback)

    urls = [i.url for m in conversation.messages for i in m.images]
    text = protocol.render_messages(conversation.messages, tools=TOOLS, add_generation_prompt=True)
    theirs, mm, _ = vlm_utils.process_prompt_with_images(processor, text, urls)
    transcript = conversation.transcript
    assert transcript.ids == theirs  # the ids OpenRLHF trains on, built turn by turn
    assert [s.source for s in transcript.images] == urls
    grids = mm["image_grid_thw"].tolist()
    assert [s.end - s.start for s in transcript.images] == [t * h * w // 4 for t, h, w in grids]
    assert all(transcript.ids[s.start : s.end] == [PAD] * (s.end - s.start) for s in transcript.images)
    assert transcript.engine_ids({PAD}) == collapse_image_pads(theirs, {PAD}) == tokenizer.encode(text)
    request = conversation.request(64)
    assert request is not None and list(request.images) == urls


@run_async
async def test_an_episode_with_prompt_images_reaches_the_engine_with_them(tokenizer: HFTokenizer) -> None:
    image = data_url(120, 80)
    engine = ScriptedEngine(tokenizer, ["It is grey.<|im_end|>"])
    session = AgentSession("qwen3-vl", FunctionCallEnvironment(), tokenizer=tokenizer, max_new_tokens=32)
    prompt = [{"role": "user", "content": [_img(image), {"type": "text", "text": "What colour?"}]}]
    result = await AgentRuntime(engine, session, sampling=SamplingParams(max_new_tokens=32)).run(prompt)
    assert result.trajectory.stop_reason == "final_answer", result.trajectory.errors
    assert engine.images_seen == [(image,)]
    (record,) = result.trajectory.segments
    assert [(s.source, s.end - s.start) for s in record.images] == [(image, GRID.pads(120, 80))]


@run_async
async def test_a_text_only_engine_is_not_called_with_images(tokenizer: HFTokenizer, tiny_hf_engine: Any) -> None:
    assert not tiny_hf_engine.accepts_images
    outcome = await call_engine(
        tiny_hf_engine, [1, PAD, 2], SamplingParams(max_new_tokens=2), timeout_s=5, images=("a",)
    )
    assert isinstance(outcome, EngineFailure) and "text-only engine" in outcome.message
    session = AgentSession("qwen3-vl", FunctionCallEnvironment(), tokenizer=tokenizer, max_new_tokens=8)
    prompt = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(9, 9)}}]}]
    result = await AgentRuntime(tiny_hf_engine, session).run(prompt)
    assert result.trajectory.stop_reason == "engine_error"
    assert "text-only engine" in result.trajectory.errors[-1].message
    assert result.trajectory.segments[0].images  # the prompt, its image span included, is kept


def _user(*parts: Any) -> Message:
    return Message.from_openai({"role": "user", "content": list(parts)})


def _img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


@run_async
async def test_image_errors_name_the_part(tokenizer: HFTokenizer, qwen3_tokenizer_file: Path, tmp_path: Path) -> None:
    vl = get_protocol("qwen3-vl")
    text_only_tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    assert text_only_tokenizer.vision is None
    cases: list[tuple[Any, Any, list[Message], str, str]] = [
        (get_protocol("qwen3"), tokenizer, [_user(_img(data_url(5, 5)))], "messages[0].content[0]", "text-only"),
        (vl, text_only_tokenizer, [_user(_img(data_url(5, 5)))], "messages", "no image processor"),
        (vl, tokenizer, [_user({"type": "text", "text": "a"}, _img(str(tmp_path / "gone.png")))],
         "messages[0].content[1]", "cannot be read"),
    ]  # fmt: skip
    # A pad written as text reaches the ids only where text may write control tokens (`special_tokens_in_text`).
    pads_as_text: list[tuple[Any, Any, list[Message], str, str]] = [
        (vl, tokenizer, [_user({"type": "text", "text": "<|image_pad|> as text"})], "messages", "no image behind"),
        (vl, tokenizer, [_user(_img(data_url(5, 5)), {"type": "text", "text": "<|image_pad|>"})], "messages",
         "disagree"),
    ]  # fmt: skip
    for special, group in ((False, cases), (True, pads_as_text)):
        for protocol, tok, prompt, location, problem in group:
            conversation = Conversation(protocol, tok, max_new_tokens=8, special_tokens_in_text=special)
            with pytest.raises(MessageError, match=problem) as info:
                await conversation.open_segment(prompt)
            assert info.value.location == location


@run_async
async def test_an_image_pad_written_in_user_or_tool_text_is_text(tokenizer: HFTokenizer) -> None:
    """By default the pad a user or a tool writes is plain text: the image's own run of pads is the only one."""
    conversation = Conversation(get_protocol("qwen3-vl"), tokenizer, max_new_tokens=8)
    ids = await conversation.open_segment([_user(_img(data_url(5, 5)), {"type": "text", "text": "<|image_pad|>"})])
    assert len(conversation.transcript.images) == 1
    image = conversation.transcript.images[0]
    assert all(i == PAD for i in ids[image.start : image.end])
    assert PAD not in ids[image.end :]
    assert "<|image_pad|>" in tokenizer.decode(ids[image.end :])
    feedback = await conversation.feedback_ids([Message(role="tool", content="<|vision_start|><|image_pad|>")])
    assert PAD not in feedback


@run_async
async def test_more_images_than_the_limit_is_an_error_in_the_prompt_and_in_feedback(tokenizer: HFTokenizer) -> None:
    protocol = get_protocol("qwen3-vl")
    conversation = Conversation(protocol, tokenizer, max_new_tokens=8, max_images=2)
    with pytest.raises(MessageError, match="3 images in one context; the model takes at most 2"):
        await conversation.open_segment([_user(*[_img(data_url(5, 5))] * 3)])
    conversation = Conversation(protocol, tokenizer, max_new_tokens=8, max_images=2)
    await conversation.open_segment([_user(_img(data_url(5, 5)), {"type": "text", "text": "x"})])
    conversation.accept(_generation(tokenizer, CALL), call_id_prefix="call")
    tool = Message.from_openai({"role": "tool", "tool_call_id": "c", "content": [_img(data_url(6, 6))] * 2})
    with pytest.raises(MessageError, match="3 images in one context"):
        await conversation.feedback_ids([tool])


def _generation(tokenizer: HFTokenizer, text: str) -> Generation:
    return Generation(ids=tokenizer.encode(text), text=text, logprobs=None, finish_reason="stop")


@run_async
async def test_a_tool_image_reaches_the_transcript_and_the_next_engine_call(tokenizer: HFTokenizer) -> None:
    """The crop tool reads the prompt's image (the session gives the task the prompt's images), its crop comes back
    as the tool message's image, is expanded in the feedback, and the engine's next call carries both images."""
    pytest.importorskip("PIL")
    from agent_env.tools.image_tools import CropTool

    image = data_url(64, 48)
    call = '<tool_call>\n{"name": "crop", "arguments": {"bbox": [0, 0, 16, 16], "zoom": 2}}\n</tool_call><|im_end|>'
    engine = ScriptedEngine(tokenizer, [call, "Grey.<|im_end|>"])
    session = AgentSession("qwen3-vl", FunctionCallEnvironment(tools=[CropTool()]), tokenizer=tokenizer)
    prompt = [{"role": "user", "content": [_img(image), {"type": "text", "text": "What colour is the corner?"}]}]
    result = await AgentRuntime(engine, session, sampling=SamplingParams(max_new_tokens=64)).run(prompt)
    trajectory = result.trajectory
    assert trajectory.stop_reason == "final_answer", trajectory.errors
    (tool,) = [m for m in trajectory.messages if m.role == "tool"]
    (crop,) = [part.url for part in tool.images]
    assert '"ok":false' not in (tool.content or "")
    assert engine.images_seen == [(image,), (image, crop)]
    (record,) = trajectory.segments
    assert [(s.source, s.end - s.start) for s in record.images] == [
        (image, GRID.pads(64, 48)),
        (crop, GRID.pads(32, 32)),
    ]
    assert trajectory.task["images"] == [image]


@run_async
async def test_a_scripted_image_policy_sees_each_calls_images(tokenizer: HFTokenizer) -> None:
    """`ScriptedEngine(image_policy=...)` answers by looking at the call's images, as a vision model would."""
    small, large = data_url(20, 20), data_url(300, 300)

    def look(prompt_ids: Any, images: Any) -> str:
        assert PAD in list(prompt_ids)
        return ("large" if images == (large,) else "small") + "<|im_end|>"

    for image, answer in ((small, "small"), (large, "large")):
        engine = ScriptedEngine(tokenizer, image_policy=look)
        session = AgentSession("qwen3-vl", FunctionCallEnvironment(), tokenizer=tokenizer, max_new_tokens=8)
        result = await AgentRuntime(engine, session).run([{"role": "user", "content": [_img(image)]}])
        assert result.trajectory.final_answer == answer
    with pytest.raises(ValueError, match="not both"):
        ScriptedEngine(tokenizer, policy=lambda ids: "x", image_policy=look)
