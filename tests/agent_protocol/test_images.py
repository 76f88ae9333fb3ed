"""Images (`agent_protocol.images`): image references, header sizes, the Qwen2-VL pad count, and token-in-token-out
with images checked against what OpenRLHF's VLM path builds (`openrlhf.utils.vlm_utils.process_prompt_with_images`
and `dedup_media_tokens`) with a processor assembled offline: transformers' `Qwen2VLImageProcessor` and the Qwen3
tokenizer, which carries the vision tokens. The comparisons with transformers, PIL and OpenRLHF are skipped where
those are not installed (agent-protocol's lone run)."""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent_protocol import HFTokenizer, MessageError, TokenTranscript, TranscriptRecord, get_protocol
from agent_protocol.images import (
    ImageSpan,
    VisionGrid,
    check_image_url,
    collapse_image_pads,
    expand_image_pads,
    image_grid,
    image_size,
    read_image,
)
from agent_protocol.protocols.qwen_vl import IMAGE_PAD, image_urls
from tests.agent_protocol.families.test_qwen3_vl import data_url, png

PAD, VIDEO_PAD, VISION_START, VISION_END = 151655, 151656, 151652, 151653

# -- references -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        data_url(3, 5),
        "file:///x/a.png",
        "a.png",
        "C:\\pics\\a.png",
        "data:IMAGE/PNG;charset=x;BASE64,\n" + base64.encodebytes(png(1, 1)).decode(),
    ],
    ids=["data", "file", "relative", "windows", "params_and_line_breaks"],
)
def test_accepted_references(url: str) -> None:
    assert check_image_url(url) == url


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "non-empty string"),
        (None, "non-empty string"),
        ("data:image/png,rawbytes", "base64-encoded"),
        ("data:image/png;base64,%%%", "cannot be decoded"),
        ("data:application/pdf;base64,JVBERi0=", "not an image"),
        ("data:;base64,aGk=", "'text/plain' is not an image"),
        ("data:image/png;base64," + base64.b64encode(b"GIF89a").decode(), "header is cut off"),
        ("mailto:a@b.c", "unsupported image URL scheme 'mailto'"),
        ("https://example.com/a.png", "not fetched"),
        ("s3://bucket/a.png", "unsupported image URL scheme 's3'"),
        ("file://", "must name a file"),
    ],
)
def test_refused_references(url: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_image_url(url)


def test_read_image_reads_paths_and_file_urls(tmp_path: Path) -> None:
    path = tmp_path / "a b.png"
    path.write_bytes(png(7, 3))
    assert image_size(read_image(str(path))) == image_size(read_image(path.as_uri())) == (7, 3)
    with pytest.raises(ValueError, match="cannot be read"):
        read_image(str(tmp_path / "missing.png"))
    (tmp_path / "x.txt").write_text("not an image")
    with pytest.raises(ValueError, match="not a PNG"):
        read_image(str(tmp_path / "x.txt"))


def test_message_round_trip_keeps_parts_in_order() -> None:
    from agent_protocol import Message

    content = [
        {"type": "image_url", "image_url": {"url": "a.png"}},
        {"type": "text", "text": "one "},
        {"type": "image_url", "image_url": {"url": "b.png"}},
        {"type": "image_url", "image_url": {"url": "c.png"}},
        {"type": "text", "text": "two"},
    ]
    message = Message.from_openai({"role": "user", "content": content})
    assert message.content == "one two" and [(i.url, i.offset) for i in message.images] == [
        ("a.png", 0),
        ("b.png", 4),
        ("c.png", 4),
    ]
    assert message.to_openai()["content"] == content
    assert Message.from_openai(message.to_openai()) == message
    assert msgspec.json.decode(msgspec.json.encode(message), type=Message) == message
    plain = Message.from_openai({"role": "user", "content": [{"type": "text", "text": "x"}]})
    assert plain.images == () and plain.to_openai()["content"] == "x"  # text-only: content stays a string


def test_a_bad_part_names_message_and_part() -> None:
    from agent_protocol import coerce_messages

    bad = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": ""}}]}
    with pytest.raises(MessageError) as info:
        coerce_messages([{"role": "user", "content": "x"}, bad], images=True)
    assert info.value.location == "messages[1].content[1].image_url.url"


# -- header sizes against PIL ------------------------------------------------------------------------------------

SIZES = [(1, 1), (7, 3), (300, 200), (1023, 17), (4000, 3000), (65535 // 64, 9)]


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "JPEG-progressive", "GIF", "WEBP", "WEBP-lossless", "BMP"])
def test_image_size_reads_the_header_as_pil_does(fmt: str) -> None:
    image_module = pytest.importorskip("PIL.Image")
    for width, height in SIZES:
        buffer = io.BytesIO()
        image = image_module.new("RGB", (width, height), (200, 10, 10))
        kind, _, variant = fmt.partition("-")
        options: dict[str, Any] = {"progressive": True} if variant == "progressive" else {}
        if variant == "lossless":
            options["lossless"] = True
        image.save(buffer, kind, **options)
        data = buffer.getvalue()
        assert image_size(data) == image_module.open(io.BytesIO(data)).size == (width, height), (fmt, width, height)


# -- the pad count against transformers' Qwen2VLImageProcessor ------------------------------------------------------

GRIDS = {
    "qwen2-vl": VisionGrid(),
    "qwen3-vl-like": VisionGrid(patch_size=16, merge_size=2, min_pixels=65536, max_pixels=16777216),
    "small-max": VisionGrid(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64),
}


def _sizes(count: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    edges = [(1, 1), (1, 200), (200, 1), (28, 28), (27, 29), (14, 2800), (3000, 4000), (10000, 60), (56, 56)]
    return edges + [(rng.randint(1, 4000), rng.randint(1, 4000)) for _ in range(count)]


def _aspect_ok(width: int, height: int) -> bool:
    return max(width, height) / min(width, height) <= 200


@pytest.mark.parametrize("name", GRIDS)
def test_smart_resize_equals_transformers(name: str) -> None:
    module = pytest.importorskip("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    grid = GRIDS[name]
    for width, height in _sizes(3000, 7):
        if not _aspect_ok(width, height):
            with pytest.raises(ValueError, match="aspect ratio"):
                grid.smart_resize(height, width)
            continue
        factor = grid.patch_size * grid.merge_size
        expected = module.smart_resize(height, width, factor, grid.min_pixels, grid.max_pixels)
        assert grid.smart_resize(height, width) == tuple(expected), (width, height)


@pytest.mark.parametrize("name", GRIDS)
def test_pad_count_equals_the_image_processor(name: str) -> None:
    """The processor itself, on real images: its `image_grid_thw` row, and the pads a processor puts in the text."""
    pytest.importorskip("torch")
    image_module = pytest.importorskip("PIL.Image")
    transformers = pytest.importorskip("transformers")
    grid = GRIDS[name]
    # `size` as a new dict: given min_pixels/max_pixels, transformers 5.15 writes them into the class's default
    # `size` dict, changing every Qwen2VLImageProcessor built after it in the process
    size = {"shortest_edge": grid.min_pixels, "longest_edge": grid.max_pixels}
    processor = transformers.Qwen2VLImageProcessor(patch_size=grid.patch_size, merge_size=grid.merge_size, size=size)
    sizes = [s for s in _sizes(16, 11) if _aspect_ok(*s)]
    for width, height in sizes:
        image = image_module.new("RGB", (width, height), (1, 2, 3))
        thw = processor(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
        assert list(grid.grid(width, height)) == thw, (width, height)
        assert grid.pads(width, height) == thw[0] * thw[1] * thw[2] // grid.merge_size**2


def test_grid_from_preprocessor_config() -> None:
    assert VisionGrid.from_preprocessor_config({}) == VisionGrid()
    qwen3_vl = {"patch_size": 16, "merge_size": 2, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
    assert VisionGrid.from_preprocessor_config(qwen3_vl) == GRIDS["qwen3-vl-like"]
    old = {"min_pixels": 3136, "max_pixels": 12845056, "size": {"shortest_edge": 1, "longest_edge": 2}}
    assert VisionGrid.from_preprocessor_config(old) == VisionGrid(max_pixels=12845056)


def test_a_tokenizer_declares_its_image_grid(qwen3_tokenizer_file: Path) -> None:
    """`image_grid` reads what a tokenizer declares (`SeesImages`): the grid, None for a text-only model, and None
    for a tokenizer that declares nothing at all."""
    text_only = HFTokenizer.from_file(qwen3_tokenizer_file)
    grid = VisionGrid(patch_size=16)
    assert image_grid(text_only) is None
    assert image_grid(HFTokenizer(text_only.backend, vision=grid)) is grid

    class Undeclared:
        def encode(self, text: str) -> list[int]:
            return []

    assert image_grid(Undeclared()) is None


# -- expansion and collapse ---------------------------------------------------------------------------------------


def test_expand_then_collapse_is_the_text_ids() -> None:
    ids = [1, VISION_START, PAD, VISION_END, 2, VISION_START, PAD, VISION_END, VISION_START, PAD, VISION_END]
    expanded, spans = expand_image_pads(ids, pad_id=PAD, pads=[3, 1, 2], sources=["a", "b", "c"])
    assert spans == [
        ImageSpan(start=2, end=5, source="a"),
        ImageSpan(start=8, end=9, source="b"),
        ImageSpan(start=11, end=13, source="c"),
    ]
    assert all(expanded[s.start : s.end] == [PAD] * (s.end - s.start) for s in spans)
    assert collapse_image_pads(expanded, {PAD}) == ids
    with pytest.raises(ValueError, match="2 image placeholders for 3 images"):
        expand_image_pads(ids[:8], pad_id=PAD, pads=[1, 1, 1], sources=["a", "b", "c"])
    with pytest.raises(ValueError, match="at least one"):
        expand_image_pads(ids, pad_id=PAD, pads=[1, 0, 1], sources=["a", "b", "c"])


def test_collapse_equals_openrlhf_dedup_media_tokens() -> None:
    vlm_utils = pytest.importorskip("openrlhf.utils.vlm_utils")
    rng = random.Random(3)
    for _ in range(300):
        ids = [rng.choice([PAD, VIDEO_PAD, 5, 6, VISION_START]) for _ in range(rng.randint(0, 30))]
        pads = rng.choice([{PAD}, {PAD, VIDEO_PAD}])
        assert collapse_image_pads(ids, pads) == vlm_utils.dedup_media_tokens(ids, pads)


# -- token in, token out with images, against OpenRLHF's VLM path ----------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


@pytest.fixture(scope="module")
def processor(qwen3_tokenizer_file: Path) -> Any:
    """A Qwen2-VL processor assembled offline: the image (and video) processor defaults and the Qwen3 tokenizer."""
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    transformers = pytest.importorskip("transformers")
    text = transformers.PreTrainedTokenizerFast(tokenizer_file=str(qwen3_tokenizer_file))
    return transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(
            size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
        ),
        tokenizer=text,
        video_processor=transformers.Qwen2VLVideoProcessor(),
    )


TOOLS = [{"type": "function", "function": {"name": "zoom", "parameters": {"type": "object", "properties": {}}}}]


def _episode(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A prompt with images and one tool result with images, image sizes drawn from `seed`."""
    rng = random.Random(seed)

    def image() -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": data_url(rng.randint(1, 900), rng.randint(1, 900))}}

    prompt = [
        {"role": "system", "content": "Look closely."},
        {
            "role": "user",
            "content": [image(), {"type": "text", "text": "What is here?"}, *[image()] * rng.randint(0, 2)],
        },
    ]
    feedback = [{"role": "tool", "content": [{"type": "text", "text": "zoomed:"}, image()] + [image()] * (seed % 2)}]
    return prompt, feedback


def _ours(tokenizer: HFTokenizer, text: str, urls: list[str]) -> tuple[list[int], list[ImageSpan]]:
    grid = VisionGrid()
    return expand_image_pads(tokenizer.encode(text), pad_id=PAD, pads=[grid.pads_for(u) for u in urls], sources=urls)


@pytest.mark.parametrize("seed", range(12))
def test_expanded_ids_equal_openrlhf_process_prompt_with_images(
    seed: int, tokenizer: HFTokenizer, processor: Any
) -> None:
    vlm_utils = pytest.importorskip("openrlhf.utils.vlm_utils")
    protocol = get_protocol("qwen3-vl")
    assert tokenizer.token_to_id(IMAGE_PAD) == PAD
    prompt, feedback = _episode(seed)
    transcript = TokenTranscript()
    engine_prompts = []
    for text, urls, append in (
        (protocol.render_prompt(prompt, tools=TOOLS), image_urls(prompt), transcript.append_prompt),
        (protocol.render_feedback(feedback), image_urls(feedback), transcript.append_observation),
    ):
        ids, spans = _ours(tokenizer, text, urls)
        theirs, mm, _ = vlm_utils.process_prompt_with_images(processor, text, urls)
        assert ids == theirs  # the ids OpenRLHF trains on
        assert vlm_utils.dedup_media_tokens(theirs, {PAD}) == tokenizer.encode(text)  # the ids vLLM is given
        grids = mm["image_grid_thw"].tolist()
        assert [s.end - s.start for s in spans] == [t * h * w // 4 for t, h, w in grids]
        append(ids, images=spans)
        if append == transcript.append_prompt:
            transcript.append_action(tokenizer.encode("<tool_call>\n{}\n</tool_call>"))
        engine_prompts.append(vlm_utils.dedup_media_tokens(list(transcript.ids), {PAD}))
    record = transcript.record()
    assert [s.source for s in record.images] == image_urls(prompt) + image_urls(feedback)
    assert all(record.ids[s.start : s.end] == [PAD] * (s.end - s.start) for s in record.images)
    assert sum(1 for i in record.ids if i == PAD) == sum(s.end - s.start for s in record.images)
    assert transcript.engine_ids({PAD}) == engine_prompts[-1]
    assert msgspec.json.decode(msgspec.json.encode(record), type=TranscriptRecord) == record


def test_records_without_images_still_decode() -> None:
    old = b'{"ids": [1, 2], "loss_mask": [0, 1], "logprobs": [null, -0.5], "spans": []}'
    record = msgspec.json.decode(old, type=TranscriptRecord)
    assert record.images == [] and TokenTranscript.from_record(record).engine_ids({PAD}) == [1, 2]


def test_image_spans_must_lie_in_the_appended_ids() -> None:
    transcript = TokenTranscript()
    with pytest.raises(ValueError, match="outside the 3 ids"):
        transcript.append_prompt([1, PAD, 2], images=[ImageSpan(start=1, end=4, source="a")])
    transcript.append_prompt([1, PAD, PAD, 2], images=[ImageSpan(start=1, end=3, source="a")])
    transcript.append_action([7])
    transcript.append_observation([PAD, 3], images=[ImageSpan(start=0, end=1, source="b")])
    assert transcript.images == [ImageSpan(start=1, end=3, source="a"), ImageSpan(start=5, end=6, source="b")]
    assert transcript.engine_ids({PAD}) == [1, PAD, 2, 7, PAD, 3]


def test_a_hostile_megabyte_data_url_is_refused_at_once_with_a_short_message() -> None:
    """Megabytes of a data URL with no comma, or a megabyte 'type', are refused by string operations (the regular
    expression this replaced took seconds on them); the message quotes at most 40 characters of the type."""
    import time

    for url, problem in (
        ("data:image/png;base64" + "A" * 8_000_000, "not a data URL"),
        ("data:" + "x" * 8_000_000 + ",AAAA", "is not an image"),
    ):
        started = time.perf_counter()
        with pytest.raises(ValueError, match=problem) as info:
            check_image_url(url)
        assert time.perf_counter() - started < 0.5 and len(str(info.value)) < 120
