"""Images through a real server and the official openai client: a vision-language recipe (the qwen3-vl protocol,
the Qwen3 tokenizer with a small image grid, a `ScriptedEngine` that reads its prompt) takes OpenAI image parts in
agent mode and tools mode; the engine is given the images and prompt ids holding each image's pads expanded
exactly as OpenRLHF's `process_prompt_with_images` expands them (on the official template's render), and tool
results that carry images reach the client as image parts. Every image the server does not take is a 400 naming
``messages[i].content[k]``; a text-only recipe, tokenizer or engine refuses images saying so; nothing is a 500."""

from __future__ import annotations

import base64
import json
import random
import struct
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_env import FunctionCallEnvironment, ToolOutput, tool
from agent_protocol import HFTokenizer, Tokenizer
from agent_protocol.images import VisionGrid
from agent_runtime import ScriptedEngine
from agent_runtime.recipe import Recipe
from tests.agent_protocol.families.test_qwen3_vl import data_url, official, png
from tests.serve.conftest import MODEL, LiveServer, ServerFactory

PAD_ID = 151655  # <|image_pad|> in the Qwen3 tokenizer
VISION_START_ID = 151652
GRID = VisionGrid(max_pixels=28 * 28 * 64, min_pixels=28 * 28 * 4)
ZOOMED = png(56, 28)  # what the zoom tool shows: bytes (sent on as a data URL) ...
ZOOM_FILE_IMAGE = png(28, 84)  # ... and a file it wrote (a path)


def noisy_png(width: int, height: int) -> bytes:
    """An RGB PNG of random pixels: it does not compress, so its size is about 3 * width * height bytes."""
    rng = random.Random(0)
    rows = b"".join(b"\x00" + rng.randbytes(3 * width) for _ in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def as_data_url(png_bytes: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(png_bytes).decode()}"


def image_part(url: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def user_with(*urls: Any, text: str = "What is in this picture?") -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}, *[image_part(u) for u in urls]]}


def zoom_tool(folder: Path) -> Any:
    @tool
    def zoom(factor: int = 2) -> ToolOutput:
        """Zoom into the picture.

        Args:
            factor: How much to zoom in.
        """
        path = folder / "zoomed.png"
        path.write_bytes(ZOOM_FILE_IMAGE)
        return ToolOutput(f"zoomed in {factor}x", images=[ZOOMED, str(path)])

    return zoom


ZOOM_TOOL = {
    "type": "function",
    "function": {"name": "zoom", "parameters": {"type": "object", "properties": {"factor": {"type": "integer"}}}},
}
ZOOM_CALL = '<tool_call>\n{"name": "zoom", "arguments": {"factor": 2}}\n</tool_call><|im_end|>'


def vision_policy(tokenizer: Tokenizer) -> Callable[[Sequence[int]], str]:
    """Answers a qwen3-vl prompt by reading it: "zoom" in the question -> a zoom call; a tool result -> what the
    zoom showed; anything else -> how many images and image pads the prompt holds."""

    def policy(prompt_ids: Sequence[int]) -> str:
        ids = list(prompt_ids)
        images, pads = ids.count(VISION_START_ID), ids.count(PAD_ID)
        last = tokenizer.decode(ids).rsplit("<|im_start|>", 2)[-2]
        if last.startswith("user\n<tool_response>"):
            return f"The zoom showed {images} images in {pads} pads.<|im_end|>"
        if "zoom" in last.lower():
            return ZOOM_CALL
        return f"I see {images} image(s) in {pads} pads.<|im_end|>"

    return policy


@pytest.fixture(scope="module")
def vision_tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    plain = HFTokenizer.from_file(qwen3_tokenizer_file)
    return HFTokenizer(plain.backend, source=plain.source, vision=GRID)


@pytest.fixture(scope="module")
def processor(qwen3_tokenizer_file: Path) -> Any:
    """A Qwen2-VL processor assembled offline with the same image grid: the reference for the expanded ids."""
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    transformers = pytest.importorskip("transformers")
    size = {"shortest_edge": GRID.min_pixels, "longest_edge": GRID.max_pixels}
    return transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(size=size),
        tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_file=str(qwen3_tokenizer_file)),
        video_processor=transformers.Qwen2VLVideoProcessor(),
    )


def vision_recipe(folder: Path, **changes: Any) -> Recipe:
    zoom = zoom_tool(folder)
    fields: dict[str, Any] = {
        "name": "vision-agent",
        "protocol": "qwen3-vl",
        "environment": lambda: FunctionCallEnvironment(tools=[zoom], max_steps=4),
        "max_new_tokens": 256,
        "max_context_tokens": 8192,
        "max_images": 3,
    }
    return Recipe(**{**fields, **changes})


@pytest.fixture(scope="module")
def engine(vision_tokenizer: HFTokenizer) -> ScriptedEngine:
    return ScriptedEngine(vision_tokenizer, policy=vision_policy(vision_tokenizer))


@pytest.fixture(scope="module")
def server(start_server: ServerFactory, engine: ScriptedEngine, tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    # small limits, so that the oversized cases need no megabytes
    return start_server(
        engine=engine,
        recipe=vision_recipe(tmp_path_factory.mktemp("zoom")),
        max_image_bytes=20_000,
        max_image_pixels=300 * 300,
    )


def post(server: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=30)


def expected_ids(processor: Any, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    """OpenRLHF's ids for the official template's render of `messages` (with the generation prompt)."""
    vlm_utils = pytest.importorskip("openrlhf.utils.vlm_utils")
    urls = [p["image_url"]["url"] for m in messages if isinstance(m["content"], list) for p in m["content"]
            if p["type"] == "image_url"]  # fmt: skip
    ids, _, _ = vlm_utils.process_prompt_with_images(processor, official(messages, tools, generation=True), urls)
    return list(ids)


def zoom_spec_as_rendered() -> list[dict[str, Any]]:
    spec = zoom_tool(Path(".")).spec
    return [{"type": "function", "function": {"name": spec.name, "description": spec.description,
                                              "parameters": spec.parameters}}]  # fmt: skip


# -- accepted images ---------------------------------------------------------------------------------------------


def test_agent_mode_gives_the_engine_the_image_and_its_expanded_pads(
    server: LiveServer, engine: ScriptedEngine, processor: Any
) -> None:
    url = data_url(300, 200)
    messages = [user_with(url)]
    reply = server.client().chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]

    prompt = expected_ids(processor, messages, zoom_spec_as_rendered())
    assert list(engine.calls[-1]) == prompt
    assert engine.images_seen[-1] == (url,)
    pads = prompt.count(PAD_ID)
    assert pads == GRID.pads(300, 200) and pads > 1
    assert reply.choices[0].message.content == f"I see 1 image(s) in {pads} pads."
    assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)


def test_base64_wrapped_in_lines_is_taken(server: LiveServer, engine: ScriptedEngine) -> None:
    head, _, payload = data_url(90, 60).partition(",")
    wrapped = head + "," + "\r\n".join(payload[i : i + 76] for i in range(0, len(payload), 76))
    response = post(server, {"messages": [user_with(wrapped)]})
    assert response.status_code == 200, response.text
    assert engine.images_seen[-1] == (wrapped,)
    assert response.json()["choices"][0]["message"]["content"] == f"I see 1 image(s) in {GRID.pads(90, 60)} pads."


def test_tools_mode_takes_images_in_user_and_tool_messages(
    server: LiveServer, engine: ScriptedEngine, processor: Any
) -> None:
    client = server.client()
    photo, crop = data_url(120, 90), data_url(64, 64)
    messages: list[Any] = [user_with(photo, text="Please zoom in.")]
    before = server.metrics()["transcript_prefix_hits"]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[ZOOM_TOOL])  # type: ignore[list-item]
    (call,) = first.choices[0].message.tool_calls or []
    assert call.function.name == "zoom" and first.choices[0].finish_reason == "tool_calls"
    assert list(engine.calls[-1]) == expected_ids(processor, messages, [ZOOM_TOOL])
    assert engine.images_seen[-1] == (photo,)

    messages.append(first.choices[0].message)
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "zoomed"}, image_part(crop)]}
    )
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[ZOOM_TOOL])  # type: ignore[list-item]
    pads = GRID.pads(120, 90) + GRID.pads(64, 64)
    assert second.choices[0].message.content == f"The zoom showed 2 images in {pads} pads."
    assert engine.images_seen[-1] == (photo, crop)
    assert server.metrics()["transcript_prefix_hits"] == before + 1  # token-in-token-out across the image turn
    assert list(engine.calls[-1]).count(PAD_ID) == pads


def test_a_follow_up_with_another_image_is_not_a_prefix_hit(server: LiveServer, engine: ScriptedEngine) -> None:
    client = server.client()
    messages: list[Any] = [user_with(data_url(56, 56), text="zoom please")]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[ZOOM_TOOL])  # type: ignore[list-item]
    (call,) = first.choices[0].message.tool_calls or []
    other = [user_with(data_url(84, 56), text="zoom please"), first.choices[0].message]
    other.append({"role": "tool", "tool_call_id": call.id, "content": "zoomed"})
    before = server.metrics()
    client.chat.completions.create(model=MODEL, messages=other, tools=[ZOOM_TOOL])  # type: ignore[arg-type]
    after = server.metrics()
    assert after["transcript_prefix_hits"] == before["transcript_prefix_hits"]
    assert after["transcript_rerenders"] == before["transcript_rerenders"] + 1
    assert engine.images_seen[-1] == (other[0]["content"][1]["image_url"]["url"],)


def stream_events(server: LiveServer, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The agent events and the answer of a streamed agent-mode request."""
    events, answer = [], ""
    body = {"model": MODEL, "messages": messages, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("agent_event"):
                events.append(chunk["agent_event"])
            for choice in chunk.get("choices", []):
                answer += choice["delta"].get("content") or ""
    return events, answer


def test_agent_mode_streams_the_images_a_tool_returned(server: LiveServer, engine: ScriptedEngine) -> None:
    photo = data_url(100, 100)
    events, answer = stream_events(server, [user_with(photo, text="Zoom into this.")])
    (result,) = [e for e in events if e["type"] == "tool_result"]
    assert result["ok"] and result["content"] == "zoomed in 2x"
    assert result["images"] == [image_part(as_data_url(ZOOMED)), image_part(as_data_url(ZOOM_FILE_IMAGE))]
    # the model saw them too, after the user's photo
    seen = engine.images_seen[-1]
    assert seen[0] == photo and len(seen) == 3
    pads = GRID.pads(100, 100) + GRID.pads(56, 28) + GRID.pads(28, 84)
    assert answer == f"The zoom showed 3 images in {pads} pads."


# -- refused images ----------------------------------------------------------------------------------------------

REFUSED: dict[str, tuple[Any, str, str]] = {
    # name: (url, code, a phrase of the message)
    "broken base64": ("data:image/png;base64,!!not*base64!!", "invalid_image", "base64"),
    "not an image type": ("data:text/plain;base64,aGVsbG8gd29ybGQ=", "invalid_image", "not an image"),
    "not an image": (as_data_url(b"hello world, not a picture"), "invalid_image", "not a PNG"),
    "cut header": (as_data_url(png(8, 8)[:20]), "invalid_image", "cut off"),
    "no comma": ("data:image/png;base64" + "A" * 400, "invalid_image", "not a data URL"),
    "not base64": ("data:image/png," + data_url(8, 8).partition(",")[2], "invalid_image", "base64-encoded"),
    "https": ("https://example.com/cat.png", "unsupported_image_url", "not fetched"),
    "a URL urlparse refuses": ("http://[::1/x.png", "unsupported_image_url", "not fetched"),
    "http": ("http://169.254.169.254/latest/meta-data", "unsupported_image_url", "not fetched"),
    "file url": ("file:///etc/passwd", "unsupported_image_url", "reads no files"),
    "absolute path": ("/etc/hostname", "unsupported_image_url", "reads no files"),
    "relative path": ("images/cat.png", "unsupported_image_url", "reads no files"),
    "over the byte limit": (as_data_url(noisy_png(90, 90)), "image_too_large", "at most 20000 bytes"),
    "over the pixel limit": (data_url(400, 300), "image_too_large", "at most 90000 pixels"),
    "aspect ratio": (data_url(2, 500), "invalid_image", "aspect ratio"),
}


@pytest.mark.parametrize("mode", ["agent", "tools", "stream"])
@pytest.mark.parametrize("name", REFUSED)
def test_a_refused_image_is_a_400_naming_the_part(server: LiveServer, name: str, mode: str) -> None:
    url, code, phrase = REFUSED[name]
    messages = [{"role": "system", "content": "Look."}, user_with(data_url(28, 28), url)]
    body: dict[str, Any] = {"messages": messages}
    if mode == "tools":
        body["tools"] = [ZOOM_TOOL]
    if mode == "stream":
        body["stream"] = True
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "messages[1].content[2]", error
    assert "messages[1].content[2]" in error["message"] and phrase in error["message"], error


def test_a_malformed_image_part_names_the_part(server: LiveServer) -> None:
    for part, where in (
        ({"type": "image_url", "image_url": {"url": 42}}, "messages[0].content[1].image_url.url"),
        ({"type": "image_url"}, "messages[0].content[1]"),
        ({"type": "image_url", "image_url": ["x"]}, "messages[0].content[1].image_url"),
    ):
        response = post(server, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == where


@pytest.mark.parametrize("mode", ["agent", "tools"])
def test_more_images_than_the_recipe_takes(server: LiveServer, mode: str) -> None:
    messages = [user_with(data_url(28, 28), data_url(28, 56)), user_with(data_url(56, 28), data_url(56, 56))]
    body: dict[str, Any] = {"messages": messages, **({"tools": [ZOOM_TOOL]} if mode == "tools" else {})}
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "too_many_images" and error["param"] == "messages"
    assert "4 images" in error["message"] and "at most 3" in error["message"]


def test_images_are_counted_before_any_is_decoded(server: LiveServer) -> None:
    broken = "data:image/png;base64,!!"
    response = post(server, {"messages": [user_with(*[data_url(28, 28)] * 3, broken)]})
    assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_images", response.text


def test_images_whose_pads_alone_overflow_the_context(
    start_server: ServerFactory, engine: ScriptedEngine, tmp_path: Path
) -> None:
    small = start_server(engine=engine, recipe=vision_recipe(tmp_path, max_context_tokens=100, max_images=None))
    big = data_url(280, 280)  # the grid's largest: 64 pads
    assert GRID.pads(280, 280) == 64
    calls = len(engine.calls)
    response = post(small, {"messages": [user_with(big, big)]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "messages[0].content[2]" in error["message"] and "128 tokens" in error["message"]
    assert len(engine.calls) == calls


def test_an_image_where_the_template_has_none_is_a_400(server: LiveServer) -> None:
    messages = [{"role": "system", "content": [image_part(data_url(28, 28))]}, {"role": "user", "content": "hi"}]
    response = post(server, {"messages": messages})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("messages[0]")


def test_nothing_sent_was_a_server_error(server: LiveServer) -> None:
    metrics = server.metrics()
    assert metrics["server_errors"] == 0 and metrics["client_errors"] > 0
    assert httpx.get(f"{server.url}/health", timeout=10).json()["images"] == {
        "accepted": True,
        "max_image_bytes": 20_000,
        "max_images": 3,
    }


# -- text-only models --------------------------------------------------------------------------------------------


class TextOnlyEngine(ScriptedEngine):
    name = "text-only"
    accepts_images = False


@pytest.mark.parametrize("model", ["qwen3 protocol", "no image grid", "text-only engine"])
@pytest.mark.parametrize("mode", ["agent", "tools"])
def test_a_text_only_model_refuses_images_saying_so(
    start_server: ServerFactory,
    vision_tokenizer: HFTokenizer,
    qwen3_tokenizer_file: Path,
    tmp_path: Path,
    model: str,
    mode: str,
) -> None:
    policy = vision_policy(vision_tokenizer)
    recipe = vision_recipe(tmp_path, protocol="qwen3" if model == "qwen3 protocol" else "qwen3-vl")
    engine: ScriptedEngine
    if model == "qwen3 protocol":
        engine, says = ScriptedEngine(vision_tokenizer, policy=policy), "chat protocol (qwen3)"
    elif model == "no image grid":
        engine, says = ScriptedEngine(HFTokenizer.from_file(qwen3_tokenizer_file), policy=policy), "image processor"
    else:
        engine, says = TextOnlyEngine(vision_tokenizer, policy=policy), "engine (text-only)"
    server = start_server(engine=engine, recipe=recipe)
    assert httpx.get(f"{server.url}/health", timeout=10).json()["images"]["accepted"] is False

    body: dict[str, Any] = {"messages": [user_with(data_url(28, 28))]}
    if mode == "tools":
        body["tools"] = [ZOOM_TOOL]
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages[0].content[1]" and error["code"] == "images_not_supported"
    assert "text-only" in error["message"] and says in error["message"], error["message"]
    assert engine.calls == []
    # text still works
    ok = post(server, {"messages": [{"role": "user", "content": "hello"}]})
    assert ok.status_code == 200, ok.text


# -- a real vision-language model --------------------------------------------------------------------------------


def test_the_hf_engine_on_a_tiny_vision_model_is_served_images(
    start_server: ServerFactory, qwen3_tokenizer_file: Path, tmp_path: Path
) -> None:
    """The server in front of `HFEngine` on the tiny random Qwen2.5-VL: an image in tools mode reaches the model as
    OpenRLHF's processor expands it (the prompt's token count), and the model answers."""
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    pytest.importorskip("transformers")
    import asyncio

    from agent_runtime.engines.hf import HFEngine
    from tests.support.tiny_qwen_vl import offline_processor, tiny_qwen_vl_path

    model_dir = tiny_qwen_vl_path(qwen3_tokenizer_file)
    engine = HFEngine.from_pretrained(model_dir, device="cpu", dtype="float32")
    try:
        assert engine.accepts_images
        server = start_server(engine=engine, recipe=vision_recipe(tmp_path))
        messages = [user_with(as_data_url(noisy_png(60, 45)))]
        body = {"messages": messages, "tools": [ZOOM_TOOL], "max_tokens": 4, "temperature": 0.0}
        response = post(server, body)
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert usage["prompt_tokens"] == len(expected_ids(offline_processor(model_dir), messages, [ZOOM_TOOL]))
        assert 1 <= usage["completion_tokens"] <= 4
    finally:
        asyncio.run(engine.close())
